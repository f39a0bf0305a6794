# ringzero._C: the only C++ that includes torch. Found through torch.utils.cmake_prefix_path (setup.py
# passes it as CMAKE_PREFIX_PATH).
find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)
# A CUDA torch's CMake config looks for the toolkit with the legacy FindCUDA, which guesses it from nvcc's
# folder and fails where the nvcc on PATH is a wrapper outside the toolkit: hand it what CUDAToolkit finds.
if(NOT DEFINED CUDA_TOOLKIT_ROOT_DIR)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND CUDAToolkit_LIBRARY_ROOT)
    set(CUDA_TOOLKIT_ROOT_DIR "${CUDAToolkit_LIBRARY_ROOT}")
  endif()
endif()
find_package(Torch REQUIRED)
find_library(TORCH_PYTHON_LIBRARY torch_python PATHS "${TORCH_INSTALL_PREFIX}/lib" REQUIRED)

set(RINGZERO_TORCH_SOURCES
  csrc/torch/module.cpp
  csrc/torch/adam_bindings.cpp
  csrc/torch/cuda_bindings.cpp
  csrc/torch/backend.cpp
  csrc/torch/backend_ops.cpp
  csrc/torch/backend_bindings.cpp
)
Python3_add_library(_C MODULE WITH_SOABI ${RINGZERO_TORCH_SOURCES})
target_link_libraries(_C PRIVATE ringzero_core ${TORCH_LIBRARIES} ${TORCH_PYTHON_LIBRARY})
target_compile_options(_C PRIVATE -O2)
# The standard this torch's headers need (C++20 from torch 2.15 on); the torch-free layers stay C++17.
include(${CMAKE_CURRENT_LIST_DIR}/torch_cxx_standard.cmake)
list(GET TORCH_INCLUDE_DIRS 0 _torch_include)
ringzero_torch_cxx_standard("${_torch_include}" RINGZERO_TORCH_CXX_STANDARD)
set_target_properties(_C PROPERTIES CXX_STANDARD ${RINGZERO_TORCH_CXX_STANDARD} CXX_STANDARD_REQUIRED ON)
message(STATUS "ringzero: torch ${Torch_VERSION} headers, compiling ringzero._C as C++${RINGZERO_TORCH_CXX_STANDARD}")
target_compile_definitions(_C PRIVATE TORCH_EXTENSION_NAME=_C)
if(RINGZERO_WITH_CUDA AND TARGET ringzero_cuda)
  target_compile_definitions(_C PRIVATE RINGZERO_WITH_CUDA=1)
  target_link_libraries(_C PRIVATE ringzero_cuda)
endif()
