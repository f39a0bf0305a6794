// Layer-4 bindings of the fused Adam step and the sum-of-squares pass: hard tensor checks (Python
// validates first with friendlier messages), the CPU thread split (at::parallel_for over chunks of
// every tensor in the list), and the CUDA launchers when built with CUDA.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <optional>
#include <vector>

#include "core/adam.h"
#include "core/errors.h"
#if defined(RINGZERO_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/adam.h"
#endif

namespace py = pybind11;
using namespace ringzero;

namespace {

// Elements per CPU chunk. at::parallel_for hands each thread one contiguous run of chunks, so the size
// costs no scheduling; it sets the smallest tensor that is split over threads (a 32K-element tensor
// already runs on two) and the summation order of sum_squares (one partial per chunk, added in order,
// whatever the thread count). A multiple of the 512-element staging block, so blocks stay aligned.
constexpr int64_t kChunkElems = 1 << 14;

DType float_dtype(const at::Tensor& t, const char* arg) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::F32;
    case at::kBFloat16: return DType::BF16;
    case at::kHalf: return DType::F16;
    default: TORCH_CHECK_TYPE(false, arg, " has dtype ", t.scalar_type(), "; use float32, bfloat16 or float16");
  }
}

void check_like(const at::Tensor& t, const at::Tensor& ref, const char* arg) {
  TORCH_CHECK_VALUE(t.is_contiguous(), arg, " must be contiguous");
  TORCH_CHECK_VALUE(t.device() == ref.device(), arg, " is on ", t.device(), " but param is on ", ref.device());
  TORCH_CHECK_VALUE(t.numel() == ref.numel(), arg, " has ", t.numel(), " elements, param ", ref.numel());
}

struct Chunk {
  size_t tensor;
  int64_t begin, end;
};

std::vector<Chunk> chunks_of(const std::vector<AdamBuffers>& bufs, const std::vector<int64_t>& counts) {
  std::vector<Chunk> out;
  for (size_t k = 0; k < bufs.size(); ++k)
    for (int64_t b = 0; b < counts[k]; b += kChunkElems) out.push_back({k, b, std::min(counts[k], b + kChunkElems)});
  return out;
}

const float* scalar_ptr(const std::optional<at::Tensor>& t, const at::Tensor& ref, const char* arg) {
  if (!t) return nullptr;
  TORCH_CHECK_VALUE(t->numel() == 1 && t->scalar_type() == at::kFloat && t->device() == ref.device(), arg,
                    " must be a one-element float32 tensor on ", ref.device());
  return t->data_ptr<float>();
}

// The step over lists of flat tensors (list entry k: param[k], grad[k], ... of equal numel). CPU:
// lr/step/inv_scale/clip_coef arrive as numbers (Python reads CPU scalars for free) and found_inf was
// checked by the caller. CUDA: the *_t tensors, when given, are read on the device, and step_ts (empty,
// or one one-element float32 tensor per entry) gives each entry its own step count; one launch covers
// up to kAdamTensorsPerLaunch entries. CPU only: with counts_t (a float32 CPU tensor: FusedAdam's step
// counts) entry k takes its step from counts_t[count_idx[k]] + 1 (not from `step`), and that count is
// advanced after the step: here rather than by torch ops from Python, which cost more than a small step
// inside the profiler scope torch.optim wraps step() in.
void adam_step_list(std::vector<at::Tensor> params, std::vector<at::Tensor> grads, std::vector<at::Tensor> exp_avgs,
                    std::vector<at::Tensor> exp_avg_sqs, std::vector<at::Tensor> max_exp_avg_sqs,
                    std::vector<at::Tensor> param_outs, double lr, double beta1, double beta2, double eps,
                    double weight_decay, double step, bool adamw, bool maximize, double inv_scale, double clip_coef,
                    std::optional<at::Tensor> lr_t, std::optional<at::Tensor> step_t,
                    std::optional<at::Tensor> inv_scale_t, std::optional<at::Tensor> clip_coef_t,
                    std::optional<at::Tensor> found_inf_t, std::vector<at::Tensor> step_ts,
                    std::optional<at::Tensor> counts_t, std::vector<int64_t> count_idx) {
  const size_t n = params.size();
  TORCH_CHECK_VALUE(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n,
                    "params, grads, exp_avgs and exp_avg_sqs must have the same length");
  TORCH_CHECK_VALUE(max_exp_avg_sqs.empty() || max_exp_avg_sqs.size() == n, "max_exp_avg_sqs: one per param or none");
  TORCH_CHECK_VALUE(param_outs.empty() || param_outs.size() == n, "param_outs: one per param or none");
  TORCH_CHECK_VALUE(step_ts.empty() || step_ts.size() == n, "step_ts: one per param or none");
  TORCH_CHECK_VALUE(!counts_t || params.empty() || params[0].device().is_cpu(), "counts_t is for CPU params only");
  if (n == 0) return;
  std::vector<AdamBuffers> bufs(n);
  std::vector<int64_t> counts(n);
  const bool on_cpu = params[0].device().is_cpu();
  for (size_t k = 0; k < n; ++k) {
    const at::Tensor& p = params[k];
    TORCH_CHECK_VALUE(p.is_contiguous() && p.device() == params[0].device(), "params must be contiguous, on one device");
    check_like(grads[k], p, "grad");
    check_like(exp_avgs[k], p, "exp_avg");
    check_like(exp_avg_sqs[k], p, "exp_avg_sq");
    TORCH_CHECK_TYPE(exp_avgs[k].scalar_type() == exp_avg_sqs[k].scalar_type(), "exp_avg and exp_avg_sq dtypes differ");
    AdamBuffers& b = bufs[k];
    b.param = p.data_ptr();
    b.grad = grads[k].data_ptr();
    b.exp_avg = exp_avgs[k].data_ptr();
    b.exp_avg_sq = exp_avg_sqs[k].data_ptr();
    b.param_dtype = float_dtype(p, "param");
    b.grad_dtype = float_dtype(grads[k], "grad");
    b.moment_dtype = float_dtype(exp_avgs[k], "exp_avg");
    TORCH_CHECK_TYPE(b.moment_dtype != DType::F16, "moments must be float32 or bfloat16");
    b.max_exp_avg_sq = nullptr;
    if (!max_exp_avg_sqs.empty()) {
      check_like(max_exp_avg_sqs[k], p, "max_exp_avg_sq");
      TORCH_CHECK_TYPE(max_exp_avg_sqs[k].scalar_type() == exp_avgs[k].scalar_type(), "max_exp_avg_sq dtype differs from exp_avg");
      b.max_exp_avg_sq = max_exp_avg_sqs[k].data_ptr();
    }
    b.param_out = nullptr;
    b.out_dtype = DType::F32;
    if (!param_outs.empty()) {
      check_like(param_outs[k], p, "param_out");
      b.param_out = param_outs[k].data_ptr();
      b.out_dtype = float_dtype(param_outs[k], "param_out");
    }
    counts[k] = p.numel();
  }
  if (on_cpu) {
    TORCH_CHECK_VALUE(!lr_t && !step_t && !inv_scale_t && !clip_coef_t && !found_inf_t && step_ts.empty(),
                      "CPU step: pass lr, step, inv_scale, clip_coef as numbers (found_inf is checked in Python)");
    float* step_counts = nullptr;
    if (counts_t) {
      TORCH_CHECK_VALUE(counts_t->device().is_cpu() && counts_t->scalar_type() == at::kFloat &&
                            counts_t->is_contiguous() && count_idx.size() == n,
                        "counts_t must be a contiguous float32 CPU tensor and count_idx have one index per param");
      for (int64_t i : count_idx)
        TORCH_CHECK_INDEX(i >= 0 && i < counts_t->numel(), "count_idx entry ", i, " is outside counts_t (",
                          counts_t->numel(), " elements)");
      step_counts = counts_t->data_ptr<float>();
    } else {
      TORCH_CHECK_VALUE(count_idx.empty(), "count_idx needs counts_t");
    }
    std::vector<AdamCoeffs> coeffs(n);
    for (size_t k = 0; k < n; ++k) {
      const double s = step_counts ? static_cast<double>(step_counts[count_idx[k]]) + 1.0 : step;
      coeffs[k] = adam_coeffs(lr, beta1, beta2, eps, weight_decay, s, adamw, maximize, inv_scale, clip_coef);
    }
    const std::vector<Chunk> chunks = chunks_of(bufs, counts);
    {
      py::gil_scoped_release nogil;
      at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const Chunk& ch = chunks[i];
          adam_step(bufs[ch.tensor], ch.begin, ch.end, coeffs[ch.tensor]);
        }
      });
    }
    if (step_counts)
      for (int64_t i : count_idx) step_counts[i] += 1.0f;
    return;
  }
#if defined(RINGZERO_WITH_CUDA)
  TORCH_CHECK_VALUE(params[0].is_cuda(), "params must be CPU or CUDA tensors, got ", params[0].device());
  const c10::cuda::CUDAGuard guard(params[0].device());
  AdamDeviceScalars d;
  d.lr = scalar_ptr(lr_t, params[0], "lr");
  d.step = scalar_ptr(step_t, params[0], "step");
  d.inv_scale = scalar_ptr(inv_scale_t, params[0], "inv_scale");
  d.clip_coef = scalar_ptr(clip_coef_t, params[0], "clip_coef");
  d.found_inf = scalar_ptr(found_inf_t, params[0], "found_inf");
  const AdamHostScalars h{float(lr), float(beta1), float(beta2), float(eps), float(weight_decay), float(step),
                          adamw, maximize, float(inv_scale), float(clip_coef)};
  std::vector<AdamTensor> tensors(n);
  for (size_t k = 0; k < n; ++k)
    tensors[k] = {bufs[k], static_cast<size_t>(counts[k]),
                  step_ts.empty() ? nullptr : scalar_ptr(step_ts[k], params[0], "step_ts entry")};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const cudaError_t err = adam_step_multi_cuda(tensors.data(), n, h, d, stream);
  TORCH_CHECK(err == cudaSuccess, "adam_step_multi_cuda failed: ", cudaGetErrorString(err));
#else
  TORCH_CHECK_VALUE(false, "params are on ", params[0].device(), " but ringzero was built without CUDA");
#endif
}

// out (one-element float32 tensor) += sum of squares of every tensor (times scale: CPU only, 1 on
// CUDA); found_inf (optional, same device) set to 1 when an element is inf or NaN. CPU: one partial per chunk, added in double in order.
void sum_squares_list(at::Tensor out, std::vector<at::Tensor> xs, std::optional<at::Tensor> found_inf,
                      double scale) {
  TORCH_CHECK_VALUE(out.numel() == 1 && out.scalar_type() == at::kFloat, "out must be a one-element float32 tensor");
  for (const auto& x : xs) {
    TORCH_CHECK_VALUE(x.is_contiguous() && x.device() == out.device(), "tensors must be contiguous, on ", out.device());
    float_dtype(x, "tensor");
  }
  if (found_inf) scalar_ptr(found_inf, out, "found_inf");
  TORCH_CHECK_VALUE(scale == 1.0 || out.device().is_cpu(), "scale is for CPU tensors (on CUDA, scale out after)");
  if (out.device().is_cpu()) {
    std::vector<AdamBuffers> bufs(xs.size());
    std::vector<int64_t> counts(xs.size());
    for (size_t k = 0; k < xs.size(); ++k) {
      bufs[k].grad = xs[k].data_ptr();
      bufs[k].grad_dtype = float_dtype(xs[k], "tensor");
      counts[k] = xs[k].numel();
    }
    const std::vector<Chunk> chunks = chunks_of(bufs, counts);
    std::vector<double> partial(chunks.size());
    {
      py::gil_scoped_release nogil;
      at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const AdamBuffers& x = bufs[chunks[i].tensor];
          partial[i] = sum_squares(x.grad, x.grad_dtype, chunks[i].begin, chunks[i].end);
        }
      });
    }
    double total = 0;
    for (double p : partial) total += p;  // fixed order: the same result for any thread count
    // Written through the pointer: a torch op here costs more than summing a small tensor.
    float* o = out.data_ptr<float>();
    *o = static_cast<float>(static_cast<double>(*o) + total * scale);
    if (found_inf && !std::isfinite(total)) found_inf->fill_(1.0);
    return;
  }
#if defined(RINGZERO_WITH_CUDA)
  const c10::cuda::CUDAGuard guard(out.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  float* fi = found_inf ? found_inf->data_ptr<float>() : nullptr;
  std::vector<const void*> ptrs;
  std::vector<DType> dtypes;
  std::vector<size_t> counts;
  for (const auto& x : xs) {
    ptrs.push_back(x.data_ptr());
    dtypes.push_back(float_dtype(x, "tensor"));
    counts.push_back(static_cast<size_t>(x.numel()));
  }
  const cudaError_t err = sum_squares_multi_cuda(ptrs.data(), dtypes.data(), counts.data(), xs.size(),
                                                 out.data_ptr<float>(), fi, stream);
  TORCH_CHECK(err == cudaSuccess, "sum_squares_multi_cuda failed: ", cudaGetErrorString(err));
#else
  TORCH_CHECK_VALUE(false, "out is on ", out.device(), " but ringzero was built without CUDA");
#endif
}

// The memory traffic of a float32 Adam step with no maths: p, m, v += g (four streams read, three
// written, 28 B per element, the step's own access pattern and thread split), for the benchmarks' floor:
// with it the floor does not rest only on how the machine serves torch's two- and three-stream ops.
void adam_traffic(at::Tensor p, at::Tensor g, at::Tensor m, at::Tensor v) {
  for (const at::Tensor* t : {&p, &g, &m, &v})
    TORCH_CHECK_VALUE(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->is_contiguous() &&
                          t->numel() == p.numel(),
                      "adam_traffic_: four contiguous float32 CPU tensors of one size");
  float* pp = p.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  float* mp = m.data_ptr<float>();
  float* vp = v.data_ptr<float>();
  py::gil_scoped_release nogil;
  at::parallel_for(0, p.numel(), kChunkElems, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float x = gp[i];
      pp[i] += x;
      mp[i] += x;
      vp[i] += x;
    }
  });
}

}  // namespace

void bind_adam(py::module& m) {
  m.def("adam_isa", &adam_isa, "Instruction set of the CPU Adam kernel in use");
  m.def("adam_step_list_", &adam_step_list, py::arg("params"), py::arg("grads"), py::arg("exp_avgs"),
        py::arg("exp_avg_sqs"), py::arg("max_exp_avg_sqs"), py::arg("param_outs"), py::arg("lr"), py::arg("beta1"),
        py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("step"), py::arg("adamw"),
        py::arg("maximize"), py::arg("inv_scale"), py::arg("clip_coef"), py::arg("lr_t") = py::none(),
        py::arg("step_t") = py::none(), py::arg("inv_scale_t") = py::none(), py::arg("clip_coef_t") = py::none(),
        py::arg("found_inf_t") = py::none(), py::arg("step_ts") = std::vector<at::Tensor>{},
        py::arg("counts_t") = py::none(), py::arg("count_idx") = std::vector<int64_t>{},
        "One fused Adam/AdamW step over lists of flat tensors (see ringzero.ops.adam_step_)");
  m.def("adam_traffic_", &adam_traffic, py::arg("p"), py::arg("g"), py::arg("m"), py::arg("v"),
        "p, m, v += g: a float32 Adam step's memory traffic without its maths (the benchmarks' floor)");
  m.def("sum_squares_list_", &sum_squares_list, py::arg("out"), py::arg("tensors"), py::arg("found_inf") = py::none(),
        py::arg("scale") = 1.0,
        "out += sum of squares of the tensors; found_inf = 1 if any element is inf or NaN");
}
