# colossal_add_test(<name> SOURCES <files...> LIBS <targets...> [MPI_RANKS <n...>] [TIMEOUT <s>]
#                   [LABELS <labels...>] [DEFER_COPIES_RANKS <n...>]
#                   [GROUPED_P2P_RANKS <n...>] [SHARDS <n>])
#
# Builds one GoogleTest executable. Without MPI_RANKS it is registered once as <name>, run as a
# plain process with tests/test_main.cpp (Kokkos initialised). With MPI_RANKS it links
# tests/mpi_test_main.cpp and is registered once per rank count as <name>/np<N> under mpiexec
# (--oversubscribe, root allowed), with PROCESSORS set; counts above COLOSSAL_TEST_MAX_RANKS are
# skipped so a small machine still runs the rest. Tests are labelled "unit" (single process) or
# "mpi", plus any LABELS given; the sanitizer run selects -L unit. DEFER_COPIES_RANKS registers
# <name>/np<N>/deferred-copies too (label "defer"): the same run with COLOSSAL_DEFER_COPIES=1, so
# ZeRO offload's host-device copies are done at the last moment a GPU's could be
# (core::CopyQueue) and a read before the copy's wait gets stale values, as on a GPU at random.
# GROUPED_P2P_RANKS registers <name>/np<N>/grouped-p2p (label "grouped"): the same run with
# COLOSSAL_TEST_GROUPED_P2P=1, so MPI follows NCCL's point-to-point rule (synchronous sends,
# messages matched in issue order) and the pipeline exchanges its messages in groups, as on NCCL.
# SHARDS (single-process tests only) registers <name>/shard<i> for i in 1..n instead of <name>,
# each running its share of the cases (GoogleTest's GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX), so a
# long binary of short cases spreads over ctest's -j slots instead of ending the run alone
# (test_cli: 3 minutes, mostly waiting on the programs it starts). Its cases must not share files
# across shards (test_cli's folder is per shard).
#
# Tests run OpenBLAS's Haswell (AVX2) kernels whatever the CPU (COLOSSAL_TEST_OPENBLAS_CORETYPE;
# empty: the kernels OpenBLAS picks). The parity tolerances were set from runs on those kernels:
# on AVX-512 CPUs OpenBLAS picks its SkylakeX kernels, whose other summation order moves a few
# trained weights just past them (test_model2d/np4: worst difference 1.09e-4 against 1e-4;
# test_tensor_parallel/np4: 129 weights above 1e-6 against 120), rounding and not a wrong result,
# so the rounding is pinned rather than the tolerances widened.
set(COLOSSAL_TEST_OPENBLAS_CORETYPE "Haswell" CACHE STRING
    "OPENBLAS_CORETYPE the tests run with (empty: OpenBLAS's own choice for this CPU)")
set(_colossal_test_blas_env "")
if(COLOSSAL_TEST_OPENBLAS_CORETYPE)
  set(_colossal_test_blas_env ";OPENBLAS_CORETYPE=${COLOSSAL_TEST_OPENBLAS_CORETYPE}")
endif()

# The two GoogleTest mains are compiled once per build, not once per test binary: 51 copies
# cost 135 CPU seconds at g++ -O3 (about a minute of a 2-core build), 10 s each under nvcc.
function(_colossal_test_main_objects)
  if(TARGET colossal_test_main)
    return()
  endif()
  add_library(colossal_test_main OBJECT ${PROJECT_SOURCE_DIR}/tests/test_main.cpp)
  target_link_libraries(colossal_test_main PRIVATE GTest::gtest colossal::deps::kokkos)
  add_library(colossal_mpi_test_main OBJECT ${PROJECT_SOURCE_DIR}/tests/mpi_test_main.cpp)
  target_link_libraries(colossal_mpi_test_main PRIVATE GTest::gtest colossal::deps::kokkos
                        MPI::MPI_CXX)
endfunction()

function(colossal_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT;SHARDS"
                        "SOURCES;LIBS;MPI_RANKS;LABELS;DEFER_COPIES_RANKS;GROUPED_P2P_RANKS"
                        ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(ARG_SHARDS AND ARG_MPI_RANKS)
    message(FATAL_ERROR "colossal_add_test(${name}): SHARDS is for single-process tests only")
  endif()
  _colossal_test_main_objects()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  if(NOT ARG_MPI_RANKS)
    target_link_libraries(${name} PRIVATE colossal_test_main colossal::deps::kokkos)
    if(NOT ARG_LABELS)
      set(ARG_LABELS unit)
    endif()
    set(env "COLOSSAL_SOURCE_DIR=${PROJECT_SOURCE_DIR};COLOSSAL_BIN_DIR=${CMAKE_BINARY_DIR}/bin${_colossal_test_blas_env}")
    if(NOT ARG_SHARDS)
      add_test(NAME ${name} COMMAND ${name})
      set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}"
        ENVIRONMENT "${env}")
      return()
    endif()
    foreach(shard RANGE 1 ${ARG_SHARDS})
      math(EXPR index "${shard} - 1")
      add_test(NAME ${name}/shard${shard} COMMAND ${name})
      set_tests_properties(${name}/shard${shard} PROPERTIES TIMEOUT ${ARG_TIMEOUT}
        LABELS "${ARG_LABELS}"
        ENVIRONMENT "${env};GTEST_TOTAL_SHARDS=${ARG_SHARDS};GTEST_SHARD_INDEX=${index}")
    endforeach()
    return()
  endif()
  target_link_libraries(${name} PRIVATE colossal_mpi_test_main colossal::deps::kokkos MPI::MPI_CXX)
  set(runs "")
  foreach(np IN LISTS ARG_MPI_RANKS)
    list(APPEND runs "${np}:")
  endforeach()
  foreach(np IN LISTS ARG_DEFER_COPIES_RANKS)
    list(APPEND runs "${np}:deferred-copies")
  endforeach()
  foreach(np IN LISTS ARG_GROUPED_P2P_RANKS)
    list(APPEND runs "${np}:grouped-p2p")
  endforeach()
  foreach(run IN LISTS runs)
    string(REPLACE ":" ";" run "${run}")
    list(GET run 0 np)
    list(LENGTH run parts)
    set(test ${name}/np${np})
    set(labels "mpi;${ARG_LABELS}")
    set(extra_env "")
    if(parts GREATER 1)
      list(GET run 1 variant)
      if(variant STREQUAL "deferred-copies")
        set(test ${test}/${variant})
        set(labels "mpi;defer")
        set(extra_env ";COLOSSAL_DEFER_COPIES=1")
      elseif(variant STREQUAL "grouped-p2p")
        set(test ${test}/${variant})
        set(labels "mpi;grouped")
        set(extra_env ";COLOSSAL_TEST_GROUPED_P2P=1")
      endif()
    endif()
    if(np GREATER COLOSSAL_TEST_MAX_RANKS)
      continue()
    endif()
    add_test(NAME ${test}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
    # RESOURCE_LOCK: a binary's runs write the same files under /tmp (run directories, token
    # files), so two of them never run at once (np1 beside np1/deferred-copies under -j2 failed
    # to open metrics.h5 and read a token file being rewritten).
    set_tests_properties(${test} PROPERTIES TIMEOUT ${ARG_TIMEOUT} PROCESSORS ${np}
      RESOURCE_LOCK ${name} LABELS "${labels}"
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1;COLOSSAL_SOURCE_DIR=${PROJECT_SOURCE_DIR};COLOSSAL_BIN_DIR=${CMAKE_BINARY_DIR}/bin${_colossal_test_blas_env}${extra_env}")
  endforeach()
endfunction()
