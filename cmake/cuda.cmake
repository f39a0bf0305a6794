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

find_package(CUDAToolkit REQUIRED)

# NCCL (layer 3) from the nvidia-nccl-cu13 wheel: RINGZERO_NCCL_ROOT, else asked of the Python found on
# PATH. Without it the ring driver still builds (loopback transport only) and says so.
set(RINGZERO_NCCL_ROOT "" CACHE PATH "Folder with include/nccl.h and lib/libnccl.so* (the nvidia.nccl wheel)")
if(NOT RINGZERO_NCCL_ROOT)
  # The Python the build was started with (setup.py passes it), else the one on PATH.
  if(Python3_EXECUTABLE)
    set(RINGZERO_PYTHON "${Python3_EXECUTABLE}")
  else()
    find_program(RINGZERO_PYTHON NAMES python3 python)
  endif()
  if(RINGZERO_PYTHON)
    execute_process(COMMAND ${RINGZERO_PYTHON} -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])"
                    OUTPUT_VARIABLE _nccl_root OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    set(RINGZERO_NCCL_ROOT "${_nccl_root}")
  endif()
endif()
set(RINGZERO_WITH_NCCL OFF)
if(RINGZERO_NCCL_ROOT)
  find_path(RINGZERO_NCCL_INCLUDE nccl.h PATHS ${RINGZERO_NCCL_ROOT}/include NO_DEFAULT_PATH)
  find_library(RINGZERO_NCCL_LIBRARY NAMES nccl libnccl.so.2 PATHS ${RINGZERO_NCCL_ROOT}/lib NO_DEFAULT_PATH)
  if(RINGZERO_NCCL_INCLUDE AND RINGZERO_NCCL_LIBRARY)
    set(RINGZERO_WITH_NCCL ON)
  endif()
endif()
message(STATUS "ringzero: NCCL ${RINGZERO_WITH_NCCL} (${RINGZERO_NCCL_ROOT})")

set(RINGZERO_CUDA_SOURCES
  csrc/cuda/adam.cu
  csrc/cuda/reduce.cu
  csrc/cuda/oneshot.cu
  csrc/cuda/twoshot.cu
  csrc/cuda/ring.cu
  csrc/cuda/alltoall.cu
  csrc/cuda/quantize.cu
  csrc/cuda/peer_comm.cpp
  csrc/nccl/loopback.cpp
  csrc/nccl/ring_driver.cpp
)
if(RINGZERO_WITH_NCCL)
  list(APPEND RINGZERO_CUDA_SOURCES csrc/nccl/nccl_transport.cpp)
endif()
if(RINGZERO_CUDA_SOURCES)
  add_library(ringzero_cuda STATIC ${RINGZERO_CUDA_SOURCES})
  set_target_properties(ringzero_cuda PROPERTIES CUDA_ARCHITECTURES "${RINGZERO_CUDA_ARCHS}")
  target_include_directories(ringzero_cuda PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/csrc)
  target_link_libraries(ringzero_cuda PUBLIC CUDA::cudart ringzero_core)
  if(RINGZERO_WITH_NCCL)
    target_include_directories(ringzero_cuda PUBLIC ${RINGZERO_NCCL_INCLUDE})
    target_link_libraries(ringzero_cuda PUBLIC ${RINGZERO_NCCL_LIBRARY})
    target_compile_definitions(ringzero_cuda PUBLIC RINGZERO_WITH_NCCL=1)
  endif()
endif()

# The CUDA C++ tests: built wherever nvcc is; without a GPU they exit 77, which ctest reports as a skip.
if(RINGZERO_BUILD_TESTS)
  enable_testing()
  add_executable(test_cuda tests/cpp/test_cuda.cu)
  set_target_properties(test_cuda PROPERTIES CUDA_ARCHITECTURES "${RINGZERO_CUDA_ARCHS}")
  target_link_libraries(test_cuda PRIVATE ringzero_cuda)
  add_test(NAME cuda COMMAND test_cuda)
  set_tests_properties(cuda PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
  # The fuzz (RINGZERO_FUZZ_SEED / RINGZERO_FUZZ_CASES; it prints its seed), the missing-rank test and
  # the multi-tensor Adam against the CPU kernel, the block quantization against the CPU loops.
  foreach(t cuda_fuzz cuda_timeout cuda_adam cuda_quantize cuda_alltoall)
    add_executable(test_${t} tests/cpp/test_${t}.cu)
    set_target_properties(test_${t} PROPERTIES CUDA_ARCHITECTURES "${RINGZERO_CUDA_ARCHS}")
    target_link_libraries(test_${t} PRIVATE ringzero_cuda)
    add_test(NAME ${t} COMMAND test_${t})
    set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
  endforeach()
  # The torch-free CUDA benchmark (run by benchmarks/gpu_check.sh, not by ctest).
  add_executable(bench_cuda_kernels benchmarks/bench_cuda_kernels.cu)
  set_target_properties(bench_cuda_kernels PROPERTIES CUDA_ARCHITECTURES "${RINGZERO_CUDA_ARCHS}")
  target_link_libraries(bench_cuda_kernels PRIVATE ringzero_cuda)
  target_include_directories(bench_cuda_kernels PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tests/cpp)
endif()
