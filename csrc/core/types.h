// Element types and reduction operators shared by every layer. Values match the Python enums in
// python/ringzero/comm/types.py (one table, checked by tests/test_api.py).
#pragma once
#include <cstddef>
#include <cstdint>

namespace ringzero {

enum class DType : int32_t { F32 = 0, F64 = 1, BF16 = 2, F16 = 3, I8 = 4, U8 = 5, I32 = 6, I64 = 7 };
constexpr int kNumDTypes = 8;

// Avg is Sum followed by a division by the number of contributors, done once at the final write.
enum class ReduceOp : int32_t { Sum = 0, Avg = 1, Min = 2, Max = 3, Prod = 4 };
constexpr int kNumReduceOps = 5;

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

}  // namespace ringzero
