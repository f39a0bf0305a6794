// The multi-tensor Adam kernel and the sum-of-squares pass of layer 2 (csrc/cuda/adam.cu), without
// torch, against the CPU kernel of layer 1 (csrc/core/adam.h) on the same inputs: every dtype
// combination the launcher accepts, sizes 0, 1, primes and chunk boundaries (kAdamChunkElems), more
// tensors than one launch holds (kAdamTensorsPerLaunch), per-tensor steps, AMSGrad, a 16-bit copy of
// the parameters, scalars from device memory, a step skipped by found_inf, and operands that start 2, 4,
// 8 or 12 bytes past an aligned address (torch views with a storage offset: the kernel's scalar path). One step from the same
// state each time, so the bound is per step: the GPU computes the bias corrections in float32 (powf,
// rsqrtf) where the CPU uses double, which moves a float32 result by a few ulp; a 16-bit result may
// round the other way (1 ulp of its type). Runs on a GPU (gpu_check.sh) and on the CPU grid (CI).
// Without a CUDA device it prints SKIP and exits 77 (the CPU grid is always one).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "core/adam.h"
#include "cuda/adam.h"
#include "cuda_test_util.h"

using namespace ringzero;
using namespace ringzero::test;

namespace {

// ulp of a value stored as t, at magnitude |v|.
double ulp(DType t, double v) {
  const int mant = t == DType::F32 ? 23 : t == DType::BF16 ? 7 : 10;
  const double a = std::max(std::fabs(v), t == DType::F16 ? std::ldexp(1.0, -14) : 1e-30);
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - mant);
}

// One element of one step, against two references, at `scale` (the sum of the magnitudes of the
// update's terms in double, from the values before the step: an update that nearly cancels the old
// value leaves a result whose own ulp says nothing of the error):
// - the CPU kernel of layer 1, within the bound tests/cpp/test_adam.cpp holds that kernel to against
//   float64 (1e-5 relative for float32: its vector rsqrt and coefficient order; measured here up to
//   108 float32 roundings of the scale, 6.4e-6), plus 1 ulp of a 16-bit result;
// - the float64 update, within 64 float32 roundings of the scale (the device computes the bias
//   corrections in float32 with powf/rsqrtf: measured on the CPU grid up to 18), plus 1 ulp of a
//   16-bit result (rounding to the storage type).
constexpr double kCpuRel = 1e-5, kFloat64Roundings = 64;
bool within(DType t, double got, double want, double scale, double rel) {
  double tol = rel * scale + 1e-30;
  if (t != DType::F32) tol += ulp(t, std::max(std::fabs(got), std::fabs(want)));
  return std::fabs(got - want) <= tol;
}

struct Operand {
  DType t;
  size_t n;
  std::vector<char> host;    // the CPU kernel's copy
  std::vector<char> before;  // the values before the step
  std::unique_ptr<DevBuf> dev;
  size_t off;  // bytes from the aligned allocation to the operand, as a torch view's storage offset
  Operand(DType dt, size_t count, std::mt19937& g, double scale, bool positive, size_t offset)
      : t(dt), n(count), off(offset / dtype_size(dt) * dtype_size(dt)) {
    host.assign(n * dtype_size(t) + 8, 0);
    std::normal_distribution<double> nd;
    for (size_t i = 0; i < n; ++i) put(host, i, t, positive ? std::fabs(nd(g)) * scale : nd(g) * scale);
    dev.reset(new DevBuf(n * dtype_size(t) + off));
    CUDA_OK(cudaMemcpy(device(), host.data(), n * dtype_size(t), cudaMemcpyHostToDevice));
    before = host;
  }
  void* device() const { return static_cast<char*>(dev->p) + off; }
  double old(size_t i) const { return get(before, i, t); }
  // Elements where the device result is outside within() of the CPU kernel's or of the float64 one.
  size_t bad_against_device(const char* what, const std::vector<double>& exact, const std::vector<double>& scale) const {
    std::vector<char> got(host.size());
    CUDA_OK(cudaMemcpy(got.data(), device(), n * dtype_size(t), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const double a = get(got, i, t), b = get(host, i, t);
      if ((!within(t, a, b, scale[i], kCpuRel) ||
           !within(t, a, exact[i], scale[i], kFloat64Roundings * std::ldexp(1.0, -24))) &&
          bad++ < 3)
        std::fprintf(stderr, "  %s (%s) element %zu: device %.9g, CPU %.9g, float64 %.9g (scale %.3g)\n", what,
                     dtype_name(t), i, a, b, exact[i], scale[i]);
    }
    return bad;
  }
};

struct Combo {
  DType param, grad, moment;
};

// One tensor's operands, on host and device.
struct Tensor {
  size_t n;
  Operand p, g, m, v;
  std::unique_ptr<Operand> vmax, out;
  // `offset`: every operand starts that many bytes past an aligned address, rounded down to a whole
  // element of its dtype (so a tensor may mix aligned and misaligned operands).
  Tensor(const Combo& c, size_t count, std::mt19937& rng, bool amsgrad, bool copy16, size_t offset)
      : n(count), p(c.param, count, rng, 1.0, false, offset), g(c.grad, count, rng, 0.1, false, offset),
        m(c.moment, count, rng, 0.01, false, offset), v(c.moment, count, rng, 1e-3, true, offset) {
    if (amsgrad) vmax.reset(new Operand(c.moment, count, rng, 1e-3, true, offset));
    if (copy16) out.reset(new Operand(DType::BF16, count, rng, 1.0, false, offset));
  }
  AdamBuffers buffers(bool device) {
    auto at = [device](Operand* o) -> void* { return !o ? nullptr : device ? o->device() : o->host.data(); };
    return AdamBuffers{at(&p), at(&g), at(&m), at(&v), at(vmax.get()), at(out.get()),
                       p.t, g.t, m.t, DType::BF16};
  }
  // Checks every operand against the CPU kernel and the float64 update (torch.optim.Adam/AdamW's).
  size_t bad(const AdamHostScalars& h, double step) const {
    const double gs = static_cast<double>(h.inv_scale) * h.clip_coef, l2 = h.adamw ? 0.0 : h.weight_decay;
    const double decay = h.adamw ? 1.0 - static_cast<double>(h.lr) * h.weight_decay : 1.0;
    const double b1 = h.beta1, b2 = h.beta2, step_size = h.lr / (1 - std::pow(b1, step));
    const double bc2_sqrt = std::sqrt(1 - std::pow(b2, step));
    std::vector<double> sm(n), sv(n), sp(n), m1(n), v1(n), vd(n), p1(n);
    for (size_t i = 0; i < n; ++i) {
      const double grad = g.old(i) * gs + l2 * p.old(i);
      const double grad_mag = std::fabs(g.old(i)) * gs + std::fabs(l2 * p.old(i));
      m1[i] = b1 * m.old(i) + (1 - b1) * grad;
      v1[i] = b2 * v.old(i) + (1 - b2) * grad * grad;
      vd[i] = vmax ? std::max(vmax->old(i), v1[i]) : v1[i];
      p1[i] = p.old(i) * decay - step_size * m1[i] / (std::sqrt(vd[i]) / bc2_sqrt + h.eps);
      sm[i] = b1 * std::fabs(m.old(i)) + (1 - b1) * grad_mag;
      sv[i] = b2 * std::fabs(v.old(i)) + (1 - b2) * grad_mag * grad_mag;
      sp[i] = std::fabs(p.old(i)) * decay + step_size * sm[i] / (std::sqrt(vd[i]) / bc2_sqrt + h.eps);
    }
    size_t b = p.bad_against_device("param", p1, sp) + m.bad_against_device("exp_avg", m1, sm) +
               v.bad_against_device("exp_avg_sq", v1, sv);
    if (vmax) b += vmax->bad_against_device("max_exp_avg_sq", vd, sv);
    if (out) b += out->bad_against_device("param_out", p1, sp);
    return b;
  }
};

const size_t kSizes[] = {0, 1, 7, 1031, kAdamChunkElems - 1, kAdamChunkElems, kAdamChunkElems + 1, 40009};

// One multi-tensor step on the device against the CPU kernel, tensor by tensor.
void step_case(const Combo& c, int ntensors, bool amsgrad, bool adamw, bool copy16, bool device_scalars,
               bool per_tensor_steps, std::mt19937& rng) {
  std::vector<std::unique_ptr<Tensor>> ts;
  std::vector<float> steps;
  for (int k = 0; k < ntensors; ++k) {
    const size_t n = kSizes[(k * 5 + ntensors) % (sizeof kSizes / sizeof kSizes[0])];
    const size_t offsets[] = {0, 2, 0, 4, 8, 0, 12};  // torch views with a storage offset, among aligned ones
    ts.emplace_back(new Tensor(c, n, rng, amsgrad, copy16, offsets[(k * 3 + ntensors) % 7]));
    steps.push_back(per_tensor_steps ? static_cast<float>(1 + (k * 37) % 1000) : 7.0f);
  }
  const float lr = 1e-2f, wd = 0.05f, inv_scale = 0.5f, clip = 0.75f;
  const AdamHostScalars truth{lr, 0.9f, 0.999f, 1e-8f, wd, 7.0f, adamw, false, inv_scale, clip};
  AdamHostScalars h = truth;
  AdamDeviceScalars d{};
  DevBuf dev_scalars(sizeof(float) * (2 + ntensors));
  std::vector<char> hs(sizeof(float) * (2 + ntensors));
  auto* f = reinterpret_cast<float*>(hs.data());
  f[0] = lr;
  f[1] = 7.0f;
  for (int k = 0; k < ntensors; ++k) f[2 + k] = steps[k];
  dev_scalars.upload(hs);
  const float* dev_f = static_cast<const float*>(dev_scalars.p);
  if (device_scalars) {
    h.lr = 123.0f;  // must not be used
    h.step = 999.0f;
    d.lr = dev_f;
    d.step = dev_f + 1;
  }
  std::vector<AdamTensor> launch;
  for (int k = 0; k < ntensors; ++k)
    launch.push_back(AdamTensor{ts[k]->buffers(true), ts[k]->n, per_tensor_steps ? dev_f + 2 + k : nullptr});
  CUDA_OK(adam_step_multi_cuda(launch.data(), launch.size(), h, d, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  for (int k = 0; k < ntensors; ++k) {
    const AdamCoeffs co = adam_coeffs(lr, 0.9, 0.999, 1e-8, wd, steps[k], adamw, false, inv_scale, clip);
    adam_step(ts[k]->buffers(false), 0, ts[k]->n, co);
    const size_t bad = ts[k]->bad(truth, steps[k]);
    CHECK(bad == 0, "adam %s/%s/%s tensor %d of %d (n=%zu, step %g)%s%s%s%s: %zu values beyond the bound",
          dtype_name(c.param), dtype_name(c.grad), dtype_name(c.moment), k, ntensors, ts[k]->n, steps[k],
          amsgrad ? " amsgrad" : "", adamw ? " adamw" : " adam", copy16 ? " bf16-copy" : "",
          device_scalars ? " device-scalars" : "", bad);
  }
}

// found_inf set: the launch writes nothing.
void skipped_step(std::mt19937& rng) {
  Tensor t(Combo{DType::F32, DType::F32, DType::F32}, 40009, rng, true, true, 0);
  const std::vector<char> before = t.p.dev->download();
  DevBuf inf(sizeof(float));
  std::vector<char> one(sizeof(float));
  *reinterpret_cast<float*>(one.data()) = 1.0f;
  inf.upload(one);
  AdamHostScalars h{1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, true, false, 1.0f, 1.0f};
  AdamDeviceScalars d{};
  d.found_inf = static_cast<const float*>(inf.p);
  CUDA_OK(adam_step_cuda(t.buffers(true), t.n, h, d, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  CHECK(t.p.dev->download() == before, "a step with found_inf set changed the parameters");
}

// sum of squares of several tensors of every 16/32-bit dtype against the CPU pass (float32 partial
// sums in any order: a relative bound of n * 2^-23 of the sum, all terms being non-negative).
void sum_squares_case(std::mt19937& rng) {
  const DType types[] = {DType::F32, DType::BF16, DType::F16};
  std::vector<std::unique_ptr<Operand>> xs;
  std::vector<const void*> ptrs;
  std::vector<DType> dts;
  std::vector<size_t> counts;
  double want = 0;
  size_t total = 0;
  for (int k = 0; k < 40; ++k) {  // more than one launch's table
    const size_t n = kSizes[k % (sizeof kSizes / sizeof kSizes[0])];
    xs.emplace_back(new Operand(types[k % 3], n, rng, 1.0, false, (k % 7) * 2));  // offsets 0-12 bytes
    ptrs.push_back(xs.back()->device());
    dts.push_back(types[k % 3]);
    counts.push_back(n);
    want += sum_squares(xs.back()->host.data(), types[k % 3], 0, n);
    total += n;
  }
  DevBuf out(sizeof(float)), found(sizeof(float));
  std::vector<char> zero(sizeof(float), 0);
  out.upload(zero);
  found.upload(zero);
  CUDA_OK(sum_squares_multi_cuda(ptrs.data(), dts.data(), counts.data(), ptrs.size(), static_cast<float*>(out.p),
                                 static_cast<float*>(found.p), nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const double got = *reinterpret_cast<const float*>(out.download().data());
  const double found_inf = *reinterpret_cast<const float*>(found.download().data());
  CHECK(std::fabs(got - want) <= total * std::ldexp(1.0, -23) * want, "sum of squares %g, CPU %g", got, want);
  CHECK(found_inf == 0, "found_inf set on finite inputs");
}

}  // namespace

int main() {
  skip_without_gpu("test_cuda_adam");
  const unsigned seed = 20261127;
  std::printf("test_cuda_adam: seed %u\n", seed);
  std::mt19937 rng(seed);
  const DType fp[] = {DType::F32, DType::BF16, DType::F16};
  int variant = 0;
  for (DType p : fp)
    for (DType g : fp)
      for (DType m : {DType::F32, DType::BF16}) {
        const Combo c{p, g, m};
        const int v = variant++;
        // every combination once with a few tensors; flags rotate so each appears with each dtype
        step_case(c, 3, v % 2 == 0, v % 3 != 0, v % 4 == 1, v % 5 == 2, v % 2 == 1, rng);
      }
  // more tensors than one launch, with their own steps and device scalars
  step_case(Combo{DType::F32, DType::BF16, DType::F32}, kAdamTensorsPerLaunch + 7, true, true, true, true, true, rng);
  skipped_step(rng);
  sum_squares_case(rng);
  return finish();
}
