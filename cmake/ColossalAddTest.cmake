# colossal_add_test(<name> SOURCES <files...> LIBS <targets...> [MPI_RANKS <n...>] [TIMEOUT <s>]
#                   [LABELS <labels...>])
#
# Builds one GoogleTest executable. Without MPI_RANKS it is registered once as <name>, run as a
# plain process with tests/test_main.cpp (Kokkos initialised). With MPI_RANKS it uses
# tests/mpi_test_main.cpp and is registered once per rank count as <name>/np<N> under mpiexec
# (--oversubscribe, root allowed), with PROCESSORS set; counts above COLOSSAL_TEST_MAX_RANKS are
# skipped so a small machine still runs the rest. Tests are labelled "unit" (single process) or
# "mpi", plus any LABELS given; the sanitizer run selects -L unit.
function(colossal_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS;MPI_RANKS;LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  if(NOT ARG_MPI_RANKS)
    target_sources(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/test_main.cpp)
    target_link_libraries(${name} PRIVATE colossal::deps::kokkos)
    add_test(NAME ${name} COMMAND ${name})
    if(NOT ARG_LABELS)
      set(ARG_LABELS unit)
    endif()
    set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}"
      ENVIRONMENT "COLOSSAL_SOURCE_DIR=${PROJECT_SOURCE_DIR};COLOSSAL_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
    return()
  endif()
  target_sources(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/mpi_test_main.cpp)
  target_link_libraries(${name} PRIVATE colossal::deps::kokkos MPI::MPI_CXX)
  foreach(np IN LISTS ARG_MPI_RANKS)
    if(np GREATER COLOSSAL_TEST_MAX_RANKS)
      continue()
    endif()
    add_test(NAME ${name}/np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${name}/np${np} PROPERTIES TIMEOUT ${ARG_TIMEOUT} PROCESSORS ${np}
      LABELS "mpi;${ARG_LABELS}"
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1;COLOSSAL_SOURCE_DIR=${PROJECT_SOURCE_DIR};COLOSSAL_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
  endforeach()
endfunction()
