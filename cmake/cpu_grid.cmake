# The CPU grid (csrc/cuda/cpu_grid; docs/design.md, "One kernel source, two back ends"): layer 2's CUDA
# source, the peer-memory host code and layer 3's loopback ring driver compiled by the host C++ compiler,
# and the CUDA C++ tests (tests/cpp/test_cuda*.cu, unchanged) run on it in ctest. Needs no nvcc and no
# GPU. A build with -fsanitize=thread in CMAKE_CXX_FLAGS is the ThreadSanitizer run (tools/test.sh
# builds it apart).
set(_cpu_grid_gen ${CMAKE_CURRENT_BINARY_DIR}/cpu_grid)
# Every .cu file of csrc/cuda: a kernel file not listed here fails tools/cpu_grid_coverage.py.
set(RINGZERO_CPU_GRID_CU adam reduce oneshot twoshot ring quantize alltoall)
set(_cpu_grid_sources
  csrc/cuda/cpu_grid/grid.cpp
  csrc/cuda/cpu_grid/runtime.cpp
  csrc/cuda/cpu_grid/fiber.cpp
  csrc/cuda/peer_comm.cpp
  csrc/nccl/loopback.cpp
  csrc/nccl/ring_driver.cpp
)
# A .cu file is CUDA to CMake; a generated one-line .cpp includes it as C++ (one source, two builds).
foreach(cu ${RINGZERO_CPU_GRID_CU})
  file(CONFIGURE OUTPUT ${_cpu_grid_gen}/${cu}.cpp
       CONTENT "// Generated: csrc/cuda/${cu}.cu compiled for the CPU grid.\n#include \"cuda/${cu}.cu\"\n")
  list(APPEND _cpu_grid_sources ${_cpu_grid_gen}/${cu}.cpp)
endforeach()
add_library(ringzero_cpu_grid STATIC ${_cpu_grid_sources})
target_include_directories(ringzero_cpu_grid BEFORE PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/csrc/cuda/cpu_grid/include
                           ${CMAKE_CURRENT_SOURCE_DIR}/csrc)
target_compile_definitions(ringzero_cpu_grid PUBLIC RINGZERO_CPU_GRID=1)
target_compile_options(ringzero_cpu_grid PRIVATE -O2 -Wall -Wno-unused-parameter -Wno-sign-compare)
target_link_libraries(ringzero_cpu_grid PUBLIC ringzero_core Threads::Threads)

if(RINGZERO_BUILD_TESTS)
  # The CUDA C++ tests as they are, on the CPU grid. Each writes the kernels it launched to
  # cpu_grid_kernels_<test>.txt; the coverage test then checks every kernel of csrc/cuda ran.
  set(_cpu_grid_tests cuda cuda_fuzz cuda_timeout cuda_adam cuda_quantize cuda_alltoall)
  set(_cpu_grid_logs "")
  add_custom_target(cpu_grid_tests)  # builds just the CPU-grid tests (the ThreadSanitizer build)
  foreach(t ${_cpu_grid_tests})
    file(CONFIGURE OUTPUT ${_cpu_grid_gen}/test_${t}.cpp
         CONTENT "// Generated: tests/cpp/test_${t}.cu on the CPU grid.\n#include \"test_${t}.cu\"\n")
    add_executable(cpu_grid_test_${t} ${_cpu_grid_gen}/test_${t}.cpp)
    target_include_directories(cpu_grid_test_${t} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tests/cpp)
    target_compile_options(cpu_grid_test_${t} PRIVATE -O2)
    target_link_libraries(cpu_grid_test_${t} PRIVATE ringzero_cpu_grid)
    add_dependencies(cpu_grid_tests cpu_grid_test_${t})
    set(_log ${CMAKE_CURRENT_BINARY_DIR}/cpu_grid_kernels_${t}.txt)
    list(APPEND _cpu_grid_logs ${_log})
    add_test(NAME cpu_grid_${t} COMMAND cpu_grid_test_${t})
    set_tests_properties(cpu_grid_${t} PROPERTIES ENVIRONMENT "RINGZERO_CPU_GRID_KERNEL_LOG=${_log}"
                         LABELS cpu_grid FIXTURES_SETUP cpu_grid_logs TIMEOUT 1500)
  endforeach()
  # The missing-rank test times its waits (0.5 s each, and a grace for the rank a waiter's peer is stuck
  # on): beside the fuzz under ThreadSanitizer (ctest -j 2) its threads starved, and it named the waiting
  # peer instead of the absent rank (a clean-clone run). It runs alone.
  set_tests_properties(cpu_grid_cuda_timeout PROPERTIES RUN_SERIAL TRUE)
  # The grid's own rules, grid only (they queue host work, fork children): streams and events against
  # CUDA's semantics; device memory and IPC as a GPU allows them (the host kept out, IPC's rules,
  # closed mappings).
  foreach(t streams memory)
    add_executable(cpu_grid_test_${t} tests/cpp/test_cpu_grid_${t}.cpp)
    target_include_directories(cpu_grid_test_${t} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tests/cpp)
    target_link_libraries(cpu_grid_test_${t} PRIVATE ringzero_cpu_grid)
    add_dependencies(cpu_grid_tests cpu_grid_test_${t})
    add_test(NAME cpu_grid_${t} COMMAND cpu_grid_test_${t})
    set_tests_properties(cpu_grid_${t} PROPERTIES LABELS cpu_grid TIMEOUT 300)
  endforeach()
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  add_test(NAME cpu_grid_coverage COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/tools/cpu_grid_coverage.py
           --src ${CMAKE_CURRENT_SOURCE_DIR}/csrc/cuda ${_cpu_grid_logs})
  set_tests_properties(cpu_grid_coverage PROPERTIES LABELS cpu_grid FIXTURES_REQUIRED cpu_grid_logs)
endif()
