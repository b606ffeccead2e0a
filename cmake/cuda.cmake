# The GPU path: CUDA (and NCCL) when found, nothing otherwise.
#
# TROUPE_CUDA=AUTO (default) builds the GPU path when nvcc is found (on PATH,
# through CUDACXX, or under /usr/local/cuda); ON requires it; OFF skips it.
# It sets TROUPE_HAVE_CUDA and TROUPE_HAVE_NCCL and the imported target
# troupe_cuda (CUDA runtime and NCCL, private to the library).
#
# Kernels are built for the H100/H200 (sm_90 machine code) plus compute_80
# PTX that the driver compiles for any newer GPU; override with
# -DCMAKE_CUDA_ARCHITECTURES=...

set(TROUPE_CUDA AUTO CACHE STRING "Build the GPU path: AUTO, ON or OFF")
set_property(CACHE TROUPE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(TROUPE_HAVE_CUDA OFF)
set(TROUPE_HAVE_NCCL OFF)

if(NOT TROUPE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "90-real;80-virtual")
    endif()
    enable_language(CUDA)
    # CMake releases older than the CUDA 12 compilers do not know nvcc's C++20 flag.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit)
  endif()
  if(CUDAToolkit_FOUND)
    set(TROUPE_HAVE_CUDA ON)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    add_library(troupe_cuda INTERFACE)
    target_link_libraries(troupe_cuda INTERFACE CUDA::cudart)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(TROUPE_HAVE_NCCL ON)
      target_include_directories(troupe_cuda INTERFACE ${NCCL_INCLUDE_DIR})
      target_link_libraries(troupe_cuda INTERFACE ${NCCL_LIBRARY})
    endif()
    message(STATUS "troupe: GPU path with CUDA ${CUDAToolkit_VERSION} for "
                   "${CMAKE_CUDA_ARCHITECTURES}; NCCL: ${TROUPE_HAVE_NCCL}")
  elseif(TROUPE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TROUPE_CUDA=ON but no CUDA toolkit was found")
  else()
    message(STATUS "troupe: no CUDA found, building without the GPU path")
  endif()
endif()
