// ringzero._C's enum tables: the names and values of the enums of csrc/core/types.h, so that Python
// builds its enums from them (python/ringzero/comm/types.py) instead of keeping integers in step by
// hand. Only pybind11 here (no torch headers: this file compiles in a second).
#include <pybind11/pybind11.h>

#include "core/select.h"
#include "core/types.h"
#include "cuda_algo.h"  // plain C++: compiled here too, so a CPU-only build checks the mapping

namespace py = pybind11;
using namespace ringzero;

namespace {

// {name(value): value} for the values 0 .. count-1 of an enum with a name function.
template <typename Enum, typename NameFn>
py::dict table(int count, NameFn name) {
  py::dict d;
  for (int i = 0; i < count; ++i) d[py::str(name(static_cast<Enum>(i)))] = i;
  return d;
}

}  // namespace

void bind_enums(py::module_& m) {
  m.attr("REDUCE_OPS") = table<ReduceOp>(kNumReduceOps, op_name);
  m.attr("DTYPES") = table<DType>(kNumDTypes, dtype_name);
  m.attr("ALL_REDUCE_ALGOS") = table<AllReduceAlgo>(kNumAllReduceAlgos, algo_name);
  m.attr("COLLECTIVE_KINDS") = table<CollectiveKind>(kNumCollectiveKinds, collective_name);
  // The CPU all-reduce algorithms the extension runs (RINGZERO_CPU_ALL_REDUCE_ALGOS, Auto left out): the
  // tests iterate these, so a new algorithm is tested without a hand-kept list.
  m.def("cpu_all_reduce_algorithms", [] {
    py::list names;
    for (int i = 1; i < kNumAllReduceAlgos; ++i) names.append(algo_name(static_cast<AllReduceAlgo>(i)));
    return names;
  });
  // The CPU selector's thresholds (csrc/core/select.h), by field name, for tests that probe the boundaries.
  const CpuThresholds& t = kCpuThresholds;
  py::dict th;
  th["one_shot_max_bytes"] = t.one_shot_max_bytes;
  th["registered_min_bytes"] = t.registered_min_bytes;
  th["single_copy_min_bytes"] = t.single_copy_min_bytes;
  th["single_copy_end_bytes"] = t.single_copy_end_bytes;
  th["registered_stream_bytes"] = t.registered_stream_bytes;
  th["stage_stream_min_bytes"] = t.stage_stream_min_bytes;
  th["stage_reprobe_calls"] = t.stage_reprobe_calls;
  th["stage_reprobe_bytes"] = t.stage_reprobe_bytes;
  th["a2a_stream_own_bytes"] = t.a2a_stream_own_bytes;
  m.attr("CPU_THRESHOLDS") = th;
  // How the CUDA path reads a RINGZERO_ALLREDUCE_ALGO choice (the cuda::Algo value), for the tests.
  m.def("cuda_algo_of", [](int algo) { return static_cast<int>(cuda_algo_of(algo)); }, py::arg("algo"));
}
