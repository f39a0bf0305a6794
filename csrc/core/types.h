// Element types, reduction operators, collective kinds and all-reduce algorithms shared by every layer.
// This is the one table: ringzero._C exports each enum's names and values (csrc/torch/enum_bindings.cpp)
// and python/ringzero/comm/types.py builds its enums from them (tests/house/test_structure.py checks that no
// integer table is kept in Python). Values are contiguous from 0; the name functions cover them all.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ringzero {

enum class DType : int32_t { F32 = 0, F64 = 1, BF16 = 2, F16 = 3, I8 = 4, U8 = 5, I32 = 6, I64 = 7 };
constexpr int kNumDTypes = 8;

// Avg is Sum followed by a division by the number of contributors, done once at the final write.
enum class ReduceOp : int32_t { Sum = 0, Avg = 1, Min = 2, Max = 3, Prod = 4 };
constexpr int kNumReduceOps = 5;

// The shared-memory all-reduce algorithms, the one list: (enum name, name as RINGZERO_ALLREDUCE_ALGO and
// _C.cpu_all_reduce_algorithms() give it, the function of csrc/core that runs it, one file each). Auto (0)
// is the selector's choice (csrc/core/select.h); the others follow in list order. CPU values only: the
// CUDA path maps a choice to cuda::Algo by name (csrc/torch/cuda_algo.h), so a CPU-only algorithm needs no
// CUDA value.
#define RINGZERO_CPU_ALL_REDUCE_ALGOS(X)     \
  X(OneShot, "oneshot", all_reduce_one_shot) \
  X(TwoShot, "twoshot", all_reduce_two_shot) \
  X(Ring, "ring", all_reduce_ring)
#define RINGZERO_ALGO_ENUM_(value, name, fn) value,
#define RINGZERO_ALGO_NAME_(value, name, fn) name,
enum class AllReduceAlgo : int32_t { Auto = 0, RINGZERO_CPU_ALL_REDUCE_ALGOS(RINGZERO_ALGO_ENUM_) };
inline constexpr const char* kAllReduceAlgoNames[] = {"auto", RINGZERO_CPU_ALL_REDUCE_ALGOS(RINGZERO_ALGO_NAME_)};
constexpr int kNumAllReduceAlgos = static_cast<int>(sizeof(kAllReduceAlgoNames) / sizeof(kAllReduceAlgoNames[0]));

// What a rank called: carried in fingerprints (shared memory, and the network paths with
// RINGZERO_DEBUG=1) so that ranks calling different collectives are told apart, and named in errors.
enum class CollectiveKind : int32_t {
  Barrier = 0, AllReduce = 1, ReduceScatter = 2, AllGather = 3, AllGatherV = 4, Broadcast = 5, Reduce = 6,
  // On tensors from ringzero.empty, read from the peers directly ([Note: registered tensors], shm_window.cpp),
  // and the allocation itself.
  AllReduceRegistered = 7, ReduceScatterRegistered = 8, AllGatherRegistered = 9, CreateWindow = 10,
  AllToAll = 11, Gather = 12, Scatter = 13
};
constexpr int kNumCollectiveKinds = 14;

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::F64: case DType::I64: return 8;
    case DType::BF16: case DType::F16: return 2;
    case DType::I8: case DType::U8: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  static const char* names[] = {"float32", "float64", "bfloat16", "float16",
                                "int8",    "uint8",   "int32",    "int64"};
  int i = static_cast<int>(t);
  return (i >= 0 && i < kNumDTypes) ? names[i] : "unknown";
}

inline const char* op_name(ReduceOp op) {
  static const char* names[] = {"SUM", "AVG", "MIN", "MAX", "PRODUCT"};
  int i = static_cast<int>(op);
  return (i >= 0 && i < kNumReduceOps) ? names[i] : "unknown";
}

inline const char* algo_name(AllReduceAlgo algo) {
  int i = static_cast<int>(algo);
  return (i >= 0 && i < kNumAllReduceAlgos) ? kAllReduceAlgoNames[i] : "unknown";
}

inline const char* collective_name(CollectiveKind kind) {
  static const char* names[] = {"barrier",        "all_reduce",     "reduce_scatter",
                                "all_gather",     "all_gather_v",   "broadcast",
                                "reduce",         "all_reduce_registered", "reduce_scatter_registered",
                                "all_gather_registered", "create_window", "all_to_all",
                                "gather",         "scatter"};
  int i = static_cast<int>(kind);
  return (i >= 0 && i < kNumCollectiveKinds) ? names[i] : "unknown";
}

}  // namespace ringzero
