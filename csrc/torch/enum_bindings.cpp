// ringzero._C's enum tables: the names and values of the enums of csrc/core/types.h, so that Python
// builds its enums from them (python/ringzero/comm/types.py) instead of keeping integers in step by
// hand. Only pybind11 here (no torch headers: this file compiles in a second).
#include <pybind11/pybind11.h>

#include "core/types.h"
#include "cuda/peer_types.h"  // plain C++: cuda::Algo, tied to AllReduceAlgo below

namespace py = pybind11;
using namespace ringzero;

// The CUDA path takes the RINGZERO_ALLREDUCE_ALGO choice as it is (python/ringzero/comm/cuda.py), so
// the CUDA algorithms keep the values of the shared-memory ones.
static_assert(static_cast<int>(cuda::Algo::Auto) == static_cast<int>(AllReduceAlgo::Auto), "Algo::Auto");
static_assert(static_cast<int>(cuda::Algo::OneShot) == static_cast<int>(AllReduceAlgo::OneShot), "Algo::OneShot");
static_assert(static_cast<int>(cuda::Algo::TwoShot) == static_cast<int>(AllReduceAlgo::TwoShot), "Algo::TwoShot");
static_assert(static_cast<int>(cuda::Algo::Ring) == static_cast<int>(AllReduceAlgo::Ring), "Algo::Ring");

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
}
