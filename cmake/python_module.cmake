# ringzero._C: the only C++ that includes torch. Built against the torch of the Python that runs the build
# (setup.py and gpu_check.sh pass Python3_EXECUTABLE), from that torch's headers and libraries, as
# torch.utils.cpp_extension does. Not through find_package(Torch): for a CUDA build of torch that package
# insists on a complete CUDA toolkit (its legacy FindCUDA, nvrtc, the nvcc flags of every architecture
# torch was built for), even for the CPU path, and fails where the toolkit is partial or nvcc is a wrapper.
find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
          "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(int(torch.version.cuda is not None))"
  OUTPUT_VARIABLE _torch_facts OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _torch_found)
if(NOT _torch_found EQUAL 0)
  message(FATAL_ERROR "ringzero: ${Python3_EXECUTABLE} cannot import torch; install torch 2.10-2.15 first")
endif()
string(REPLACE "\n" ";" _torch_facts "${_torch_facts}")
list(GET _torch_facts 0 RINGZERO_TORCH_DIR)
list(GET _torch_facts 1 RINGZERO_TORCH_VERSION)
list(GET _torch_facts 2 RINGZERO_TORCH_CXX11_ABI)
list(GET _torch_facts 3 RINGZERO_TORCH_HAS_CUDA)

set(RINGZERO_TORCH_INCLUDE_DIRS "${RINGZERO_TORCH_DIR}/include" "${RINGZERO_TORCH_DIR}/include/torch/csrc/api/include")
set(RINGZERO_TORCH_LIBS c10 torch_cpu torch torch_python)
if(RINGZERO_WITH_CUDA)
  if(NOT RINGZERO_TORCH_HAS_CUDA)
    message(FATAL_ERROR "ringzero: the CUDA path needs a CUDA build of torch; torch ${RINGZERO_TORCH_VERSION} is a CPU build (RINGZERO_CUDA=0 builds the CPU path)")
  endif()
  list(APPEND RINGZERO_TORCH_LIBS c10_cuda torch_cuda)
endif()
set(RINGZERO_TORCH_LIBRARIES "")
foreach(_lib ${RINGZERO_TORCH_LIBS})
  find_library(_path_${_lib} ${_lib} PATHS "${RINGZERO_TORCH_DIR}/lib" NO_DEFAULT_PATH REQUIRED)
  list(APPEND RINGZERO_TORCH_LIBRARIES "${_path_${_lib}}")
endforeach()

set(RINGZERO_TORCH_SOURCES
  csrc/torch/module.cpp
  csrc/torch/shm_direct.cpp
  csrc/torch/adam_bindings.cpp
  csrc/torch/cuda_bindings.cpp
  csrc/torch/backend.cpp
  csrc/torch/backend_ops.cpp
  csrc/torch/backend_cuda.cpp
  csrc/torch/backend_bindings.cpp
  csrc/torch/enum_bindings.cpp
)
Python3_add_library(_C MODULE WITH_SOABI ${RINGZERO_TORCH_SOURCES})
target_include_directories(_C SYSTEM PRIVATE ${RINGZERO_TORCH_INCLUDE_DIRS})
target_link_libraries(_C PRIVATE ringzero_core ${RINGZERO_TORCH_LIBRARIES})
target_compile_options(_C PRIVATE -O2)
target_compile_definitions(_C PRIVATE TORCH_EXTENSION_NAME=_C TORCH_API_INCLUDE_EXTENSION_H
                           _GLIBCXX_USE_CXX11_ABI=${RINGZERO_TORCH_CXX11_ABI})
# The standard this torch's headers need (C++20 from torch 2.15 on); the torch-free layers stay C++17.
include(${CMAKE_CURRENT_LIST_DIR}/torch_cxx_standard.cmake)
ringzero_torch_cxx_standard("${RINGZERO_TORCH_DIR}/include" RINGZERO_TORCH_CXX_STANDARD)
set_target_properties(_C PROPERTIES CXX_STANDARD ${RINGZERO_TORCH_CXX_STANDARD} CXX_STANDARD_REQUIRED ON)
message(STATUS "ringzero: torch ${RINGZERO_TORCH_VERSION} (${RINGZERO_TORCH_DIR}), compiling ringzero._C as C++${RINGZERO_TORCH_CXX_STANDARD}")
if(RINGZERO_WITH_CUDA AND TARGET ringzero_cuda)
  target_compile_definitions(_C PRIVATE RINGZERO_WITH_CUDA=1)
  target_link_libraries(_C PRIVATE ringzero_cuda)
endif()

# OpenMP for the CPU Adam step's at::parallel_for. torch's header implements it inline with
# `#pragma omp parallel` when torch was built with OpenMP; compiled without -fopenmp it silently runs
# on one thread. The pragma must bind to torch's own OpenMP runtime (the file torch ships), so that
# torch.set_num_threads() governs our threads too and two thread pools never fight over the cores:
# link that file, not the compiler's libgomp. Only the one source that calls at::parallel_for is
# compiled with -fopenmp.
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c "import torch; print(int('OpenMP' in torch.__config__.parallel_info()))"
  OUTPUT_VARIABLE _torch_openmp OUTPUT_STRIP_TRAILING_WHITESPACE)
file(GLOB _torch_gomp "${RINGZERO_TORCH_DIR}/lib/libgomp*.so*" "${RINGZERO_TORCH_DIR}/../torch.libs/libgomp*.so*")
if(_torch_openmp STREQUAL "1" AND _torch_gomp AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  list(GET _torch_gomp 0 _torch_gomp)
  set_source_files_properties(csrc/torch/adam_bindings.cpp PROPERTIES COMPILE_OPTIONS "-fopenmp")
  target_link_libraries(_C PRIVATE "${_torch_gomp}")
  message(STATUS "ringzero: CPU Adam threads through torch's OpenMP runtime (${_torch_gomp})")
else()
  message(STATUS "ringzero: torch's OpenMP runtime not found (or not GCC): the CPU Adam step runs on one thread")
endif()
