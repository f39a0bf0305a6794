// Chooses the Adam kernel table with the same instruction set as the reduction kernels (reduce.cpp
// owns the choice: RINGZERO_CPU_ISA or the running CPU), and computes the per-step coefficients.
#include "adam.h"

#include <cmath>
#include <cstring>

#include "errors.h"
#include "reduce.h"

namespace ringzero {

const AdamTable* adam_table_baseline();
#if defined(RINGZERO_HAVE_X86_ISAS)
const AdamTable* adam_table_avx2();
const AdamTable* adam_table_avx512();
#endif

namespace {

const AdamTable* table() {
  static const AdamTable* t = [] {
    const char* isa = reduce_isa();
#if defined(RINGZERO_HAVE_X86_ISAS)
    if (std::strcmp(isa, "avx512") == 0) return adam_table_avx512();
    if (std::strcmp(isa, "avx2") == 0) return adam_table_avx2();
#endif
    (void)isa;
    return adam_table_baseline();
  }();
  return t;
}

}  // namespace

AdamCoeffs adam_coeffs(double lr, double beta1, double beta2, double eps, double weight_decay, double step,
                       bool adamw, bool maximize, double inv_scale, double clip_coef) {
  if (!(step >= 1)) throw InvalidArgument("adam step must be >= 1 (the step count after incrementing)");
  AdamCoeffs c;
  c.beta1 = static_cast<float>(beta1);
  c.beta2 = static_cast<float>(beta2);
  c.eps = static_cast<float>(eps);
  c.grad_scale = static_cast<float>(inv_scale * clip_coef * (maximize ? -1.0 : 1.0));
  c.l2 = adamw ? 0.0f : static_cast<float>(weight_decay);
  c.decay = adamw ? static_cast<float>(1.0 - lr * weight_decay) : 1.0f;
  c.step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, step)));
  c.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(beta2, step)));
  return c;
}

void adam_step(const AdamBuffers& b, size_t begin, size_t end, const AdamCoeffs& c) {
  table()->adam_step(b, begin, end, c);
}

double sum_squares(const void* x, DType dtype, size_t begin, size_t end) {
  return table()->sum_squares(x, dtype, begin, end);
}

const char* adam_isa() { return reduce_isa(); }

}  // namespace ringzero
