// bfloat16 <-> float32 by bit manipulation (round to nearest even, NaN kept quiet), written as plain
// integer ops so the compiler vectorises them. float16 uses the compiler's _Float16, which becomes
// F16C instructions on x86-64-v3 and above. Internal linkage on purpose: each ISA translation unit must
// keep its own copy (an inline function shared across them could be linked as the AVX-512 one).
#pragma once
#include <cstdint>
#include <cstring>

namespace ringzero {

static inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  // NaN: keep the sign and force a quiet NaN rather than letting rounding carry into the exponent.
  // Written as a select, not a branch, so that loops storing through it vectorise.
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

}  // namespace ringzero
