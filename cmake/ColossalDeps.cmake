# Finds the HPC stack and exposes it as colossal::deps::* targets, so that folders link by name.

# --- Kokkos --------------------------------------------------------------------------------
# Debian's Trilinos Kokkos 3.4 exports Kokkos::kokkos with a non-existent include directory
# (/usr/lib/include), which fails at generate time. When that is the case we build our own
# interface target from Kokkos_INCLUDE_DIRS / Kokkos_LIBRARIES; a standalone Kokkos 4.x (OpenMP,
# CUDA) exports a correct target and is used as is.
find_package(Kokkos REQUIRED)
add_library(colossal_kokkos INTERFACE)
add_library(colossal::deps::kokkos ALIAS colossal_kokkos)
set(_colossal_kokkos_target_ok TRUE)
if(TARGET Kokkos::kokkos)
  get_target_property(_kokkos_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  if(_kokkos_inc)
    foreach(_dir IN LISTS _kokkos_inc)
      if(NOT _dir MATCHES "^\\$<" AND NOT EXISTS "${_dir}")
        set(_colossal_kokkos_target_ok FALSE)
      endif()
    endforeach()
  endif()
else()
  set(_colossal_kokkos_target_ok FALSE)
endif()
if(_colossal_kokkos_target_ok)
  target_link_libraries(colossal_kokkos INTERFACE Kokkos::kokkos)
else()
  message(STATUS "colossal: Kokkos::kokkos has a broken include path; using Kokkos_INCLUDE_DIRS")
  # SYSTEM: Kokkos 3.4 headers warn under C++20 (-Wvolatile, -Wdeprecated-enum-enum-conversion).
  target_include_directories(colossal_kokkos SYSTEM INTERFACE ${Kokkos_INCLUDE_DIRS})
  foreach(_lib IN LISTS Kokkos_LIBRARIES)
    find_library(_colossal_lib_${_lib} NAMES ${_lib} REQUIRED)
    target_link_libraries(colossal_kokkos INTERFACE ${_colossal_lib_${_lib}})
  endforeach()
  target_link_libraries(colossal_kokkos INTERFACE ${CMAKE_DL_LIBS})
endif()

# --- BLAS (cblas interface; OpenBLAS on Debian) --------------------------------------------
find_path(COLOSSAL_CBLAS_INCLUDE_DIR cblas.h
  PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas /usr/include)
find_library(COLOSSAL_BLAS_LIBRARY NAMES openblas REQUIRED)
add_library(colossal_blas INTERFACE)
add_library(colossal::deps::blas ALIAS colossal_blas)
target_include_directories(colossal_blas SYSTEM INTERFACE ${COLOSSAL_CBLAS_INCLUDE_DIR})
target_link_libraries(colossal_blas INTERFACE ${COLOSSAL_BLAS_LIBRARY})

# --- MPI, parallel HDF5, yaml-cpp, nlohmann-json -----------------------------------------------
find_package(MPI REQUIRED COMPONENTS C CXX)
set(HDF5_PREFER_PARALLEL ON)
find_package(HDF5 REQUIRED COMPONENTS C)
if(NOT HDF5_IS_PARALLEL)
  message(WARNING "colossal: HDF5 is not the parallel build; checkpoints will be written by gather "
                  "on rank 0. Install libhdf5-openmpi-dev for collective writes.")
endif()
add_library(colossal_hdf5 INTERFACE)
add_library(colossal::deps::hdf5 ALIAS colossal_hdf5)
target_include_directories(colossal_hdf5 SYSTEM INTERFACE ${HDF5_INCLUDE_DIRS})
target_link_libraries(colossal_hdf5 INTERFACE ${HDF5_C_LIBRARIES} MPI::MPI_C)
target_compile_definitions(colossal_hdf5 INTERFACE $<$<BOOL:${HDF5_IS_PARALLEL}>:COLOSSAL_HDF5_PARALLEL>)
find_package(yaml-cpp REQUIRED)
# Hugging Face safetensors headers and config.json (Debian nlohmann-json3-dev, header-only).
find_package(nlohmann_json 3 REQUIRED)

# --- CUDA toolkit: cuBLAS and NCCL (compile and link even without a GPU) -----------------
set(COLOSSAL_HAVE_CUDA OFF)
if(NOT COLOSSAL_ENABLE_CUDA STREQUAL "OFF")
  if(EXISTS /usr/local/cuda AND NOT CUDAToolkit_ROOT)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  find_path(COLOSSAL_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(COLOSSAL_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(CUDAToolkit_FOUND AND TARGET CUDA::cublas AND COLOSSAL_NCCL_INCLUDE_DIR AND COLOSSAL_NCCL_LIBRARY)
    set(COLOSSAL_HAVE_CUDA ON)
    add_library(colossal_cuda INTERFACE)
    add_library(colossal::deps::cuda ALIAS colossal_cuda)
    target_include_directories(colossal_cuda SYSTEM INTERFACE ${COLOSSAL_NCCL_INCLUDE_DIR})
    # cuBLAS is linked only when Kokkos runs on CUDA (every product is on the device there). A
    # host build with the toolkit opens it at run time, for hardware.gemm: cublas only
    # (core/gemm_cublas.cpp): loaded at start-up, libcublasLt alone kept 146 MB resident in
    # every CPU run. Its headers come with CUDA::cudart's include directory.
    if("CUDA" IN_LIST Kokkos_DEVICES)
      target_link_libraries(colossal_cuda INTERFACE CUDA::cublas)
    endif()
    target_link_libraries(colossal_cuda INTERFACE CUDA::cudart ${COLOSSAL_NCCL_LIBRARY})
    target_compile_definitions(colossal_cuda INTERFACE COLOSSAL_HAVE_CUDA)
  elseif(COLOSSAL_ENABLE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "COLOSSAL_ENABLE_CUDA=ON but the CUDA toolkit with cuBLAS and NCCL was not "
                        "found (looked in ${CUDAToolkit_ROOT}); set CUDAToolkit_ROOT or use OFF/AUTO.")
  endif()
endif()
