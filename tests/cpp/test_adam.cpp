// C++ tests of the CPU Adam kernel and the sum-of-squares pass without torch: every instruction-set
// table against a scalar float64 reference of torch.optim.AdamW's update, for float32 and 16-bit
// operands, AMSGrad and sizes 0, 1 and primes. Tolerances are relative to the float32/16-bit rounding.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/adam.h"
#include "core/half.h"
#include "test_util.h"

using namespace ringzero;

namespace ringzero {
const AdamTable* adam_table_baseline();
const AdamTable* adam_table_avx2();
const AdamTable* adam_table_avx512();
}  // namespace ringzero

// Values stored in `dtype`, kept as raw bytes; read back as double.
struct Buf {
  DType t;
  std::vector<uint8_t> bytes;
  Buf(DType dt, const std::vector<double>& v) : t(dt), bytes(v.size() * dtype_size(dt)) {
    for (size_t i = 0; i < v.size(); ++i) set(i, v[i]);
  }
  void set(size_t i, double x) { put(bytes.data(), i, t, x); }
  double get(size_t i) const { return ringzero::get(bytes.data(), i, t); }
  void* data() { return bytes.data(); }
};

static double rel_eps(DType t) { return t == DType::F32 ? 1e-5 : t == DType::BF16 ? 1e-2 : 2e-3; }

static void check_adam(const AdamTable* tab, const char* isa, size_t n, DType pt, DType gt, DType mt, bool ams,
                       bool adamw, std::mt19937& rng) {
  std::normal_distribution<double> nd;
  std::vector<double> p(n), g(n), m(n), v(n), x(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = nd(rng); g[i] = nd(rng); m[i] = 0.1 * nd(rng);
    v[i] = 0.01 * std::fabs(nd(rng)); x[i] = v[i] * 1.5 * (i % 2);
  }
  Buf P(pt, p), G(gt, g), M(mt, m), V(mt, v), X(mt, x), O(DType::BF16, std::vector<double>(n));
  // The reference starts from the values as stored (already rounded to their dtypes).
  for (size_t i = 0; i < n; ++i) { p[i] = P.get(i); g[i] = G.get(i); m[i] = M.get(i); v[i] = V.get(i); x[i] = X.get(i); }
  const double lr = 1e-2, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.1, step = 3, inv_scale = 0.5, clip = 0.8;
  AdamCoeffs c = adam_coeffs(lr, b1, b2, eps, wd, step, adamw, /*maximize=*/false, inv_scale, clip);
  AdamBuffers b{P.data(), G.data(), M.data(), V.data(), ams ? X.data() : nullptr, O.data(), pt, gt, mt, DType::BF16};
  tab->adam_step(b, 0, n, c);
  const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
  for (size_t i = 0; i < n; ++i) {
    double pi = p[i], gi = g[i] * inv_scale * clip;
    if (!adamw) gi += wd * pi; else pi *= 1 - lr * wd;
    const double mi = b1 * m[i] + (1 - b1) * gi, vi = b2 * v[i] + (1 - b2) * gi * gi;
    const double vd = ams ? std::max(x[i], vi) : vi;
    pi -= lr / bc1 * mi / (std::sqrt(vd / bc2) + eps);
    const double tol_p = rel_eps(pt) * (1 + std::fabs(pi)) + (mt == DType::F32 ? 0 : 1e-2 * lr);
    CHECK(std::fabs(P.get(i) - pi) <= tol_p, "%s n=%zu p[%zu]=%g want %g", isa, n, i, P.get(i), pi);
    // Errors scale with the inputs of the blend (the lerp can cancel), not with its result.
    CHECK(std::fabs(M.get(i) - mi) <= rel_eps(mt) * (std::fabs(m[i]) + std::fabs(gi)), "%s m[%zu]", isa, i);
    CHECK(std::fabs(V.get(i) - vi) <= rel_eps(mt) * vi, "%s v[%zu]", isa, i);
    // A float16 parameter is rounded twice (float16, then bfloat16); the kernel rounds the float32 result once.
    if (pt != DType::F16)
      CHECK(O.get(i) == static_cast<double>(bf16_to_f32(f32_to_bf16(static_cast<float>(P.get(i))))),
          "%s param_out[%zu] is not param rounded to bfloat16", isa, i);
    if (ams) CHECK(std::fabs(X.get(i) - vd) <= rel_eps(mt) * (1e-6 + vd), "%s vmax[%zu]", isa, i);
  }
}

static void check_sum_squares(const AdamTable* tab, const char* isa, size_t n, DType t, std::mt19937& rng) {
  std::normal_distribution<double> nd;
  std::vector<double> x(n);
  for (auto& e : x) e = nd(rng);
  Buf X(t, x);
  double want = 0;
  for (size_t i = 0; i < n; ++i) want += X.get(i) * X.get(i);
  const double got = tab->sum_squares(X.data(), t, 0, n);
  // float32 lanes of at most 16 squares each (adam.h): relative error below 1e-6 of the sum.
  CHECK(std::fabs(got - want) <= 1e-6 * want + 1e-30, "%s sum_squares n=%zu got %.17g want %.17g", isa, n, got, want);
  if (n > 0 && t != DType::F16) {
    // Finite squares beyond float32 overflow a lane; the kernel must sum again in double, finite.
    const double saved = X.get(n / 2);
    X.set(n / 2, 1e20);
    const double big = tab->sum_squares(X.data(), t, 0, n);
    const double big_want = want - saved * saved + X.get(n / 2) * X.get(n / 2);
    CHECK(std::isfinite(big) && std::fabs(big - big_want) <= 1e-6 * big_want, "%s sum_squares n=%zu of 1e20: %g",
          isa, n, big);
    X.set(n / 2, saved);
  }
  if (n > 0) {
    X.set(n / 2, INFINITY);
    CHECK(!std::isfinite(tab->sum_squares(X.data(), t, 0, n)), "%s inf not seen", isa);
    X.set(n / 2, NAN);
    CHECK(!std::isfinite(tab->sum_squares(X.data(), t, 0, n)), "%s nan not seen", isa);
  }
}

int main() {
  struct Isa { const char* name; const AdamTable* tab; };
  std::vector<Isa> isas{{"baseline", adam_table_baseline()}};
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    isas.push_back({"avx2", adam_table_avx2()});
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    isas.push_back({"avx512", adam_table_avx512()});
  std::mt19937 rng(1234);
  const DType fl[] = {DType::F32, DType::BF16, DType::F16};
  int cases = 0;
  for (const auto& isa : isas)
    for (size_t n : {size_t(0), size_t(1), size_t(13), size_t(1031), size_t(4099)}) {
      for (DType pt : fl)
        for (DType gt : fl)
          for (DType mt : {DType::F32, DType::BF16})
            for (bool ams : {false, true}) {
              check_adam(isa.tab, isa.name, n, pt, gt, mt, ams, /*adamw=*/(n % 2) == 1, rng);
              ++cases;
            }
      for (DType t : fl) { check_sum_squares(isa.tab, isa.name, n, t, rng); ++cases; }
    }
  std::printf("test_adam: %d cases over %zu instruction sets, %d failures\n", cases, isas.size(), g_failures);
  return g_failures ? 1 : 0;
}
