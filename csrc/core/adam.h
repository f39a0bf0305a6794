// The CPU Adam/AdamW kernel and the fused sum-of-squares pass (gradient norm and inf check), over an
// element range of flat buffers. Pure functions: threads come from the caller (layer 4 splits ranges
// with at::parallel_for). Compiled once per instruction set like reduce.h; the same choice
// (RINGZERO_CPU_ISA or the running CPU) picks the table.
#pragma once
#include "types.h"

namespace ringzero {

// Scalars of one Adam step, already combined by the caller (so the kernel does no pow/branch per
// element). For torch.optim.Adam/AdamW semantics:
//   grad_scale   = inv_scale * clip_coef, negated when maximize
//   l2           = weight_decay for Adam (coupled, added to the gradient), 0 for AdamW
//   decay        = 1 - lr * weight_decay for AdamW (decoupled), 1 for Adam
//   step_size    = lr / (1 - beta1^step)
//   inv_bc2_sqrt = 1 / sqrt(1 - beta2^step)
struct AdamCoeffs {
  float beta1, beta2, eps;
  float grad_scale, l2, decay, step_size, inv_bc2_sqrt;
};

// Coefficients for one step, as torch.optim.AdamW computes them (bias corrections in double).
AdamCoeffs adam_coeffs(double lr, double beta1, double beta2, double eps, double weight_decay, double step,
                       bool adamw, bool maximize, double inv_scale, double clip_coef);

// Flat buffers of one step. param is updated in place (float32 master, or a 16-bit parameter updated
// without a master); exp_avg, exp_avg_sq and max_exp_avg_sq (null unless AMSGrad) share moment_dtype;
// param_out (may be null) receives the updated parameter rounded to out_dtype.
struct AdamBuffers {
  void* param;
  const void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  void* max_exp_avg_sq;
  void* param_out;
  DType param_dtype;   // F32, BF16 or F16
  DType grad_dtype;    // F32, BF16 or F16
  DType moment_dtype;  // F32 or BF16
  DType out_dtype;     // BF16, F16 or F32 (ignored when param_out is null)
};

// One Adam step on elements [begin, end), one pass: each element's grad, param and moments are read
// once and written once. Bytes moved per parameter: grad (2|4) + param 2x(2|4) + moments 2x2x(2|4)
// (+2x(2|4) AMSGrad) + param_out (2|4); float32 everything, no copy: 4 + 8 + 16 = 28 B.
// Throws InvalidArgument on an unsupported dtype combination.
void adam_step(const AdamBuffers& b, size_t begin, size_t end, const AdamCoeffs& c);

// Sum of x[i]^2 over [begin, end): float32 within 512-element blocks (32 lanes, each adding at most 16
// squares: relative error below 1e-6), double across blocks; a non-finite total is summed again in
// double, so no finite float32/16-bit input can overflow it: the result is non-finite exactly when some
// element is inf or NaN. Bytes moved: one read of x.
double sum_squares(const void* x, DType dtype, size_t begin, size_t end);

// The instruction set of the Adam table in use (same as reduce_isa()).
const char* adam_isa();

struct AdamTable {
  void (*adam_step)(const AdamBuffers&, size_t, size_t, const AdamCoeffs&);
  double (*sum_squares)(const void*, DType, size_t, size_t);
};

}  // namespace ringzero
