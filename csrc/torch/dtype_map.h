// torch dtype <-> core DType (layer 4). One table for every torch-facing file; module.cpp's to_dtype
// adds the error for the dtypes outside it.
#pragma once
#include <c10/core/ScalarType.h>

#include <optional>

#include "core/types.h"

namespace ringzero {

// The eight dtypes the core kernels reduce; nullopt for any other.
inline std::optional<DType> core_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::F32;
    case at::kDouble: return DType::F64;
    case at::kBFloat16: return DType::BF16;
    case at::kHalf: return DType::F16;
    case at::kChar: return DType::I8;
    case at::kByte: return DType::U8;
    case at::kInt: return DType::I32;
    case at::kLong: return DType::I64;
    default: return std::nullopt;
  }
}

// The torch dtype of a core DType (the inverse of core_dtype over its eight).
inline at::ScalarType scalar_type_of(DType d) {
  switch (d) {
    case DType::F32: return at::kFloat;
    case DType::F64: return at::kDouble;
    case DType::BF16: return at::kBFloat16;
    case DType::F16: return at::kHalf;
    case DType::I8: return at::kChar;
    case DType::U8: return at::kByte;
    case DType::I32: return at::kInt;
    case DType::I64: return at::kLong;
  }
  return at::kByte;
}

}  // namespace ringzero
