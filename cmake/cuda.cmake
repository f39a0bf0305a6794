# Layers 2-3: CUDA kernels and the NCCL driver, compiled with nvcc alone (no torch), for sm_80 and
# sm_90 unless TORCH_CUDA_ARCH_LIST says otherwise.
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)
if(DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT "$ENV{TORCH_CUDA_ARCH_LIST}" STREQUAL "")
  string(REPLACE " " ";" _archs "$ENV{TORCH_CUDA_ARCH_LIST}")
  set(RINGZERO_CUDA_ARCHS "")
  foreach(a ${_archs})
    string(REPLACE "." "" a "${a}")
    string(REPLACE "+PTX" "" a "${a}")
    list(APPEND RINGZERO_CUDA_ARCHS ${a})
  endforeach()
else()
  set(RINGZERO_CUDA_ARCHS 80 90)
endif()
message(STATUS "ringzero: building CUDA sources for sm_${RINGZERO_CUDA_ARCHS}")

set(RINGZERO_CUDA_SOURCES
  csrc/cuda/adam.cu
)
if(RINGZERO_CUDA_SOURCES)
  add_library(ringzero_cuda STATIC ${RINGZERO_CUDA_SOURCES})
  set_target_properties(ringzero_cuda PROPERTIES CUDA_ARCHITECTURES "${RINGZERO_CUDA_ARCHS}")
  target_include_directories(ringzero_cuda PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/csrc)
endif()
