// Chooses the reduction kernel table once, from the running CPU or RINGZERO_CPU_ISA.
#include "reduce.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ringzero {

const ReduceTable* reduce_table_baseline();
#if defined(RINGZERO_HAVE_X86_ISAS)
const ReduceTable* reduce_table_avx2();
const ReduceTable* reduce_table_avx512();
#endif

namespace {

struct Chosen {
  const ReduceTable* table;
  const char* name;
};

Chosen choose() {
  const char* forced = std::getenv("RINGZERO_CPU_ISA");
  std::string want = forced ? forced : "";
#if defined(RINGZERO_HAVE_X86_ISAS)
  __builtin_cpu_init();
  const bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                        __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
  const bool has_avx512 = has_avx2 && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd");
  if (want.empty()) want = has_avx512 ? "avx512" : has_avx2 ? "avx2" : "baseline";
  if (want == "avx512" && has_avx512) return {reduce_table_avx512(), "avx512"};
  if (want == "avx2" && has_avx2) return {reduce_table_avx2(), "avx2"};
  if (want == "avx512" || want == "avx2")
    throw std::runtime_error("RINGZERO_CPU_ISA=" + want + " but this CPU lacks it; use baseline");
#endif
  if (!want.empty() && want != "baseline")
    throw std::runtime_error("RINGZERO_CPU_ISA must be baseline, avx2 or avx512, got '" + want + "'");
  return {reduce_table_baseline(), "baseline"};
}

const Chosen& chosen() {
  static const Chosen c = choose();
  return c;
}

}  // namespace

void reduce_n(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op,
              int divisor) {
  chosen().table->reduce_n(dst, srcs, nsrc, count, dtype, op, divisor);
}

void divide_inplace(void* dst, size_t count, DType dtype, int divisor) {
  chosen().table->divide_inplace(dst, count, dtype, divisor);
}

void quantize_blocks(const float* x, size_t n, int bits, size_t block, uint8_t* q, float* scales) {
  chosen().table->quantize_blocks(x, n, bits, block, q, scales);
}

void dequantize_blocks(const uint8_t* q, const float* scales, size_t n, int bits, size_t block, float* out) {
  chosen().table->dequantize_blocks(q, scales, n, bits, block, out);
}

const char* reduce_isa() { return chosen().name; }

}  // namespace ringzero
