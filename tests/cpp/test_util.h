// Helpers shared by the C++ tests: a CHECK that counts failures and goes on, and element access of
// any dtype through double.
#pragma once
#include <cstdint>
#include <cstdio>

#include "core/half.h"
#include "core/types.h"

namespace ringzero {

static int g_failures = 0;
#define CHECK(cond, ...)                                      \
  do {                                                        \
    if (!(cond)) {                                            \
      ++g_failures;                                           \
      std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                      \
      std::fprintf(stderr, "\n");                             \
    }                                                         \
  } while (0)

// ---- element helpers: store/load any dtype from double ----
static void put(void* p, size_t i, DType t, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v)); break;
    case DType::F16: static_cast<_Float16*>(p)[i] = static_cast<_Float16>(static_cast<float>(v)); break;
    case DType::I8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case DType::U8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DType::I32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::I64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
  }
}
static double get(const void* p, size_t i, DType t) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return static_cast<float>(static_cast<const _Float16*>(p)[i]);
    case DType::I8: return static_cast<const int8_t*>(p)[i];
    case DType::U8: return static_cast<const uint8_t*>(p)[i];
    case DType::I32: return static_cast<const int32_t*>(p)[i];
    case DType::I64: return static_cast<const int64_t*>(p)[i];
  }
  return 0;
}

}  // namespace ringzero
