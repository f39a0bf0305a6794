# The C++ standard a torch release's headers need, read off the headers (a feature check, no version
# table): 20 where ATen/ATen.h refuses anything before C++20 (torch 2.15 on), else 17. One rule for the
# real build (python_module.cmake) and for tools/torch_compat.sh, which runs this file as a script:
#   cmake -DTORCH_INCLUDE_DIR=<site-packages>/torch/include -P cmake/torch_cxx_standard.cmake   # prints 17 or 20
function(ringzero_torch_cxx_standard include_dir out_var)
  set(_aten "${include_dir}/ATen/ATen.h")
  if(NOT EXISTS "${_aten}")
    message(FATAL_ERROR "ringzero: ${_aten} not found; is ${include_dir} torch's include folder?")
  endif()
  file(STRINGS "${_aten}" _cxx20_guard REGEX "__cplusplus < 202002L|C\\+\\+20 or later")
  if(_cxx20_guard)
    set(${out_var} 20 PARENT_SCOPE)
  else()
    set(${out_var} 17 PARENT_SCOPE)
  endif()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE AND DEFINED TORCH_INCLUDE_DIR)
  ringzero_torch_cxx_standard("${TORCH_INCLUDE_DIR}" _std)
  message("${_std}")
endif()
