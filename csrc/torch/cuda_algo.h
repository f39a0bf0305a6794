// From the CPU all-reduce algorithm a RINGZERO_ALLREDUCE_ALGO choice names (AllReduceAlgo, csrc/core/types.h)
// to the CUDA path's (cuda::Algo, csrc/cuda/peer_types.h): by name, so that each device keeps its own enum
// and a CPU-only algorithm needs no CUDA value. Plain C++ (layer 4 sees both layers).
#pragma once
#include "core/types.h"
#include "cuda/peer_types.h"

namespace ringzero {

// The CUDA algorithm of the same name; Auto (the CUDA selector's choice) for a CPU-only one or a value
// out of range.
inline cuda::Algo cuda_algo_of(int cpu_algo) {
  switch (static_cast<AllReduceAlgo>(cpu_algo)) {
    case AllReduceAlgo::OneShot: return cuda::Algo::OneShot;
    case AllReduceAlgo::TwoShot: return cuda::Algo::TwoShot;
    case AllReduceAlgo::Ring: return cuda::Algo::Ring;
    default: return cuda::Algo::Auto;
  }
}
inline cuda::Algo cuda_algo_of(AllReduceAlgo algo) { return cuda_algo_of(static_cast<int>(algo)); }

}  // namespace ringzero
