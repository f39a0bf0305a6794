// The collectives RingzeroBackend runs itself: CPU tensors on the shared-memory communicator (csrc/core)
// or, for a group spanning hosts, on the hosts engine (backend_hosts.h), CUDA tensors on the CUDA lane
// (backend_cuda.h). Each op validates its arguments on the caller's thread
// (a clear ValueError/TypeError naming the argument), decides whether our kernels on that device can
// take it, and submits one body written against ShmComm's vocabulary, which both communicators speak.
// Non-contiguous tensors are staged through a contiguous copy inside the body: on the worker thread
// (CPU), so that ops queued earlier have written them first, or on the lane's stream (CUDA).
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <optional>
#include <type_traits>

#include "backend.h"
#include "core/errors.h"
#include "dtype_map.h"
#include "torch_compat.h"

namespace ringzero {
namespace {

// Data movement does not look at values: a dtype our kernels lack moves as bytes.
struct Elements {
  DType dtype;
  size_t per_element;  // core elements per tensor element
};
Elements movement(const at::Tensor& t) {
  if (auto d = core_dtype(t.scalar_type())) return {*d, 1};
  return {DType::U8, static_cast<size_t>(t.element_size())};
}

bool dense(const at::Tensor& t) { return t.layout() == at::kStrided; }

// Data movement our kernels on t's device take: any dense tensor on CPU; on CUDA, a dtype the kernels
// know or a whole number of 32-bit words (the CUDA lane moves other dtypes as words).
bool movable(const at::Tensor& t) {
  if (!dense(t)) return false;
  if (!t.is_cuda()) return true;
  const auto d = core_dtype(t.scalar_type());
  return (d && cuda_reducible(*d)) || (t.numel() * t.element_size()) % 4 == 0;
}

const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* op, const char* arg = "tensors") {
  TORCH_CHECK_VALUE(ts.size() == 1, "ringzero ", op, ": ", arg, " must hold exactly one tensor per rank, got ",
                    ts.size(), "; run one process per device");
  return ts[0];
}

void same_kind(const at::Tensor& a, const at::Tensor& b, const char* op, const char* what) {
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "ringzero ", op, ": ", what, " has dtype ", b.scalar_type(),
                   " but the input has ", a.scalar_type(), "; use one dtype");
  TORCH_CHECK_VALUE(a.device() == b.device(), "ringzero ", op, ": ", what, " is on ", b.device(),
                    " but the input is on ", a.device(), "; put them on one device");
}

// How a reduction runs on our kernels: the core op and dtype, and PREMUL_SUM's factor (applied to a
// staged copy of the input, then summed). native is false where our kernels cannot take it (bitwise
// ops, dtypes outside the eight we reduce, sparse tensors); the inner backend then runs it.
struct Reduction {
  bool native = false;
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;
  bool premul = false;
  double factor = 1.0;
  at::Tensor factor_tensor;

  // A contiguous buffer holding what this rank contributes (`t` itself when it already is one).
  // Whether stage(t) is t itself (no copy): the engine across hosts may then run a deferred tail after the
  // op's first segment (CallOpts::tail_may_wait).
  bool stages_in_place(const at::Tensor& t) const { return !premul && t.is_contiguous(); }
  at::Tensor stage(const at::Tensor& t) const {
    if (!premul) return t.contiguous();
    return (factor_tensor.defined() ? t.mul(factor_tensor.to(t.device())) : t.mul(factor)).contiguous();
  }
  // Whether our kernels on the device of `t` reduce it (the CUDA ones take five of the eight dtypes).
  bool native_on(const at::Tensor& t) const { return native && (!t.is_cuda() || cuda_reducible(dtype)); }
};

Reduction reduction(const c10d::ReduceOp& rop, const std::vector<at::Tensor>& ts, const char* op) {
  Reduction r;
  const at::Tensor& t0 = ts.at(0);
  for (const auto& t : ts) same_kind(t0, t, op, "a tensor");
  const auto dt = core_dtype(t0.scalar_type());
  bool dense_all = true;
  for (const auto& t : ts) dense_all = dense_all && dense(t);
  switch (rop.op_) {
    case c10d::ReduceOp::SUM: r.op = ReduceOp::Sum; break;
    case c10d::ReduceOp::AVG: r.op = ReduceOp::Avg; break;
    case c10d::ReduceOp::PRODUCT: r.op = ReduceOp::Prod; break;
    case c10d::ReduceOp::MIN: r.op = ReduceOp::Min; break;
    case c10d::ReduceOp::MAX: r.op = ReduceOp::Max; break;
    case c10d::ReduceOp::PREMUL_SUM: {
      TORCH_CHECK_VALUE(at::isFloatingType(t0.scalar_type()), "ringzero ", op,
                        ": PREMUL_SUM needs a floating-point tensor, got ", t0.scalar_type(), "; use SUM");
      const auto* s = dynamic_cast<const torch_compat::PreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK_VALUE(s, "ringzero ", op, ": PREMUL_SUM without its factor; build the op with "
                        "torch.distributed._make_nccl_premul_sum(factor)");
      r.op = ReduceOp::Sum;
      r.premul = true;
      r.factor = s->double_factor;
      r.factor_tensor = s->tensor_factor;
      break;
    }
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      return r;  // bitwise: the inner backend's
    default:
      TORCH_CHECK_VALUE(false, "ringzero ", op, ": unknown reduce op ", static_cast<int>(rop.op_),
                        "; use SUM, AVG, MIN, MAX, PRODUCT or PREMUL_SUM");
  }
  if (dt && dense_all) {
    r.native = true;
    r.dtype = *dt;
  }
  return r;
}

// Copies `buf` into `user` when the collective had to work on a stand-in.
void write_back(const at::Tensor& user, const at::Tensor& buf) {
  if (!buf.is_same(user)) user.copy_(buf.view(user.sizes()));
}

// A contiguous output for the kernels to write (the tensor itself when it already is one).
at::Tensor writable(const at::Tensor& t) { return t.is_contiguous() ? t : at::empty(t.sizes(), t.options()); }

template <class Comm>
void all_gather_one(Comm& c, const at::Tensor& input, const at::Tensor& output) {
  at::Tensor in = input.contiguous();
  at::Tensor out = writable(output);
  const Elements e = movement(input);
  c.all_gather(in.data_ptr(), out.data_ptr(), in.numel() * e.per_element, e.dtype);
  write_back(output, out);
}

template <class Comm>
void reduce_scatter_one(Comm& c, const Reduction& red, const at::Tensor& input, const at::Tensor& output) {
  at::Tensor in = red.stage(input);
  at::Tensor out = writable(output);
  c.reduce_scatter(in.data_ptr(), out.data_ptr(), out.numel(), red.dtype, red.op);
  write_back(output, out);
}

at::Tensor flat_cat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  for (const auto& t : ts) flat.push_back(t.reshape(-1));
  return at::cat(flat);
}

// The data of the root's list of a gather or scatter across hosts, when every tensor is contiguous: the
// engine then moves each block in place (HostsComm::gather_blocks), else one flat buffer is joined or split.
std::optional<std::vector<void*>> block_ptrs(const std::vector<at::Tensor>& ts) {
  std::vector<void*> ptrs;
  for (const auto& t : ts) {
    if (!t.is_contiguous()) return std::nullopt;
    ptrs.push_back(t.data_ptr());
  }
  return ptrs;
}

void split_into(const at::Tensor& flat, const std::vector<at::Tensor>& ts) {
  int64_t off = 0;
  for (const auto& t : ts) {
    t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

}  // namespace

template <class Body>
c10::intrusive_ptr<c10d::Work> RingzeroBackend::submit(const at::Device& device, c10d::OpType type,
                                                       std::vector<at::Tensor> outputs, std::vector<at::Tensor> inputs,
                                                       CallOpts call, Body body) {
  if (device.is_cuda()) {  // route() set the lane up; the kernels' timeout is RINGZERO_TIMEOUT_S
    std::vector<at::Tensor> used = outputs;
    used.insert(used.end(), inputs.begin(), inputs.end());
    return track(cuda_->launch(type, std::move(outputs), used, ++seq_, [body](CudaComm& c) { body(c); }));
  }
  if (hosts_) {  // a group spanning hosts: the engine's rings wait up to RINGZERO_TIMEOUT_S per call
    std::shared_ptr<SerialExecutor::State> state = executor_.state();
    const bool tail_may_wait = call.tail_may_wait;
    return enqueue_on(executor_, type, std::move(outputs), [this, body, state, tail_may_wait](RingzeroWork& work) {
      // What a deferrable all-reduce needs ([Note: the engine's deferred tail], backend_hosts.h).
      auto self = c10::intrusive_ptr<RingzeroWork>::unsafe_reclaim_from_nonowning(&work);
      // The tail runs in the next op's first segment (or before it): a few of its waits, each ending after
      // the timeout, at most.
      const double bound_s = 4 * config_.timeout_s + 10;
      hosts_.run({[state] {
                    std::lock_guard<std::mutex> lock(state->mu);
                    return !state->queue.empty();
                  },
                  [self](std::exception_ptr error) { self->complete(error); }, [self, bound_s] { self->hand_off(bound_s); },
                  tail_may_wait},
                 [&] { body(hosts_); });
    }, !call.async_op);
  }
  return enqueue(type, std::move(outputs), call, [body](ShmComm& c) { body(c); });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  const at::Tensor& t = single(tensors, "allreduce");
  const Reduction red = reduction(opts.reduceOp, tensors, "allreduce");
  if (auto* inner = route(t.device(), "allreduce", red.native_on(t))) {
    check_contiguous_for_inner(tensors, "allreduce", "tensor");
    return track(inner->allreduce(tensors, opts));
  }
  const AllReduceAlgo algo = config_.all_reduce_algo;
  CallOpts call = call_opts(opts);
  call.tail_may_wait = red.stages_in_place(t);
  return submit(t.device(), c10d::OpType::ALLREDUCE, {t}, {}, call, [t, red, algo](auto& c) {
    at::Tensor buf = red.stage(t);
    if constexpr (std::is_same_v<std::decay_t<decltype(c)>, HostsComm>) {
      if (buf.is_same(t)) return c.all_reduce_deferrable(buf.data_ptr(), buf.numel(), red.dtype, red.op);
    }
    c.all_reduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), red.dtype, red.op, algo);
    write_back(t, buf);
  });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "ringzero allreduce_coalesced: tensors must not be empty");
  const Reduction red = reduction(opts.reduceOp, tensors, "allreduce_coalesced");
  if (auto* inner = route(tensors[0].device(), "allreduce_coalesced", red.native_on(tensors[0]))) {
    check_contiguous_for_inner(tensors, "allreduce_coalesced", "tensor");
    return track(inner->allreduce_coalesced(tensors, opts));
  }
  const AllReduceAlgo algo = config_.all_reduce_algo;
  // One collective over the concatenation: one synchronisation for many small tensors.
  return submit(tensors[0].device(), c10d::OpType::ALLREDUCE_COALESCED, tensors, {}, call_opts(opts),
                [tensors, red, algo](auto& c) {
    std::vector<at::Tensor> staged;
    for (const auto& t : tensors) staged.push_back(red.premul ? red.stage(t) : t);
    at::Tensor flat = flat_cat(staged);
    c.all_reduce(flat.data_ptr(), flat.data_ptr(), flat.numel(), red.dtype, red.op, algo);
    split_into(flat, tensors);
  });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  const at::Tensor& t = single(tensors, "reduce");
  TORCH_CHECK_VALUE(opts.rootRank >= 0 && opts.rootRank < getSize(), "ringzero reduce: root rank ", opts.rootRank,
                    " is outside the group of size ", getSize());
  TORCH_CHECK_VALUE(opts.rootTensor == 0, "ringzero reduce: rootTensor must be 0 (one tensor per rank)");
  const Reduction red = reduction(opts.reduceOp, tensors, "reduce");
  if (auto* inner = route(t.device(), "reduce", red.native_on(t))) {
    check_contiguous_for_inner(tensors, "reduce", "tensor");
    return track(inner->reduce(tensors, opts));
  }
  const int root = static_cast<int>(opts.rootRank);
  return submit(t.device(), c10d::OpType::REDUCE, {t}, {}, call_opts(opts), [t, red, root](auto& c) {
    at::Tensor buf = red.stage(t);
    c.reduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), red.dtype, red.op, root);
    if (c.rank() == root) write_back(t, buf);
  });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = single(tensors, "broadcast");
  TORCH_CHECK_VALUE(opts.rootRank >= 0 && opts.rootRank < getSize(), "ringzero broadcast: root rank ",
                    opts.rootRank, " is outside the group of size ", getSize());
  TORCH_CHECK_VALUE(opts.rootTensor == 0, "ringzero broadcast: rootTensor must be 0 (one tensor per rank)");
  if (auto* inner = route(t.device(), "broadcast", dense(t))) return track(inner->broadcast(tensors, opts));
  const int root = static_cast<int>(opts.rootRank);
  return submit(t.device(), c10d::OpType::BROADCAST, {t}, {}, call_opts(opts), [t, root](auto& c) {
    at::Tensor buf = t.contiguous();
    const Elements e = movement(t);
    c.broadcast(buf.data_ptr(), buf.numel() * e.per_element, e.dtype, root);
    write_back(t, buf);
  });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& opts) {
  same_kind(input, output, "all_gather_into_tensor", "output");
  TORCH_CHECK_VALUE(output.numel() == input.numel() * getSize(), "ringzero all_gather_into_tensor: output has ",
                    output.numel(), " elements but must have world_size * input.numel() = ", getSize(), " * ",
                    input.numel());
  if (auto* inner = route(input.device(), "all_gather_into_tensor", movable(input) && dense(output)))
    return track(inner->_allgather_base(output, input, opts));
  return submit(input.device(), c10d::OpType::_ALLGATHER_BASE, {output}, {input}, call_opts(opts),
                [output, input](auto& c) { all_gather_one(c, input, output); });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(!inputs.empty() && outputs.size() == inputs.size(), "ringzero allgather_into_tensor_coalesced: "
                    "needs as many outputs as inputs (got ", outputs.size(), " and ", inputs.size(), ")");
  bool ok = true;
  for (size_t i = 0; i < inputs.size(); ++i) {
    same_kind(inputs[0], inputs[i], "allgather_into_tensor_coalesced", "an input");
    same_kind(inputs[i], outputs[i], "allgather_into_tensor_coalesced", "an output");
    TORCH_CHECK_VALUE(outputs[i].numel() == inputs[i].numel() * getSize(), "ringzero allgather_into_tensor_coalesced: "
                      "outputs[", i, "] must have world_size * inputs[", i, "].numel() elements");
    ok = ok && movable(inputs[i]) && dense(outputs[i]);
  }
  if (auto* inner = route(inputs[0].device(), "allgather_into_tensor_coalesced", ok))
    return track(inner->allgather_into_tensor_coalesced(outputs, inputs, opts));
  return submit(inputs[0].device(), c10d::OpType::COALESCED, outputs, inputs, call_opts(opts), [outputs, inputs](auto& c) {
    for (size_t i = 0; i < inputs.size(); ++i) all_gather_one(c, inputs[i], outputs[i]);
  });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  const at::Tensor& input = single(inputs, "all_gather", "input_tensors");
  TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                    "ringzero all_gather: tensor_list must hold world_size = ", getSize(), " tensors");
  std::vector<size_t> counts;
  bool ok = movable(input);
  for (const auto& o : outputs[0]) {
    same_kind(input, o, "all_gather", "a tensor of tensor_list");
    counts.push_back(static_cast<size_t>(o.numel()));
    ok = ok && dense(o);
  }
  TORCH_CHECK_VALUE(counts[getRank()] == static_cast<size_t>(input.numel()), "ringzero all_gather: tensor_list[",
                    getRank(), "] has ", counts[getRank()], " elements but this rank's input has ", input.numel());
  const bool even = std::all_of(counts.begin(), counts.end(), [&](size_t n) { return n == counts[0]; });
  // Uneven sizes are the inner backend's on CUDA (the CUDA lane has no all_gather_v).
  if (auto* inner = route(input.device(), "all_gather", ok && (even || !input.is_cuda())))
    return track(inner->allgather(outputs, inputs, opts));
  const std::vector<at::Tensor> outs = outputs[0];
  return submit(input.device(), c10d::OpType::ALLGATHER, outs, {input}, call_opts(opts), [outs, input, counts, even](auto& c) {
    const Elements e = movement(input);
    at::Tensor in = input.contiguous();
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    at::Tensor flat = at::empty({static_cast<int64_t>(total)}, input.options());
    if (even) {
      c.all_gather(in.data_ptr(), flat.data_ptr(), in.numel() * e.per_element, e.dtype);
    } else {  // uneven sizes are allowed: the sizes of tensor_list say who sends what
      std::vector<size_t> scaled;
      for (size_t n : counts) scaled.push_back(n * e.per_element);
      c.all_gather_v(in.data_ptr(), flat.data_ptr(), scaled, e.dtype);
    }
    split_into(flat, outs);
  });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  same_kind(input, output, "reduce_scatter_tensor", "output");
  TORCH_CHECK_VALUE(input.numel() == output.numel() * getSize(), "ringzero reduce_scatter_tensor: input has ",
                    input.numel(), " elements but must have world_size * output.numel() = ", getSize(), " * ",
                    output.numel());
  const Reduction red = reduction(opts.reduceOp, {input}, "reduce_scatter_tensor");
  if (auto* inner = route(input.device(), "reduce_scatter_tensor", red.native_on(input) && dense(output)))
    return track(inner->_reduce_scatter_base(output, input, opts));
  return submit(input.device(), c10d::OpType::_REDUCE_SCATTER_BASE, {output}, {input}, call_opts(opts),
                [output, input, red](auto& c) { reduce_scatter_one(c, red, input, output); });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(!inputs.empty() && outputs.size() == inputs.size(), "ringzero reduce_scatter_tensor_coalesced: "
                    "needs as many outputs as inputs (got ", outputs.size(), " and ", inputs.size(), ")");
  for (size_t i = 0; i < inputs.size(); ++i) {
    same_kind(inputs[i], outputs[i], "reduce_scatter_tensor_coalesced", "an output");
    TORCH_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * getSize(), "ringzero reduce_scatter_tensor_coalesced: "
                      "inputs[", i, "] must have world_size * outputs[", i, "].numel() elements");
  }
  const Reduction red = reduction(opts.reduceOp, inputs, "reduce_scatter_tensor_coalesced");
  bool ok = red.native_on(inputs[0]);
  for (const auto& o : outputs) ok = ok && dense(o);
  if (auto* inner = route(inputs[0].device(), "reduce_scatter_tensor_coalesced", ok))
    return track(inner->reduce_scatter_tensor_coalesced(outputs, inputs, opts));
  return submit(inputs[0].device(), torch_compat::kReduceScatterTensorCoalesced, outputs, inputs, call_opts(opts),
                [outputs, inputs, red](auto& c) {
                   for (size_t i = 0; i < inputs.size(); ++i) reduce_scatter_one(c, red, inputs[i], outputs[i]);
                 });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ReduceScatterOptions& opts) {
  const at::Tensor& output = single(outputs, "reduce_scatter", "output");
  TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                    "ringzero reduce_scatter: input_list must hold world_size = ", getSize(), " tensors");
  const std::vector<at::Tensor> ins = inputs[0];
  for (const auto& i : ins) same_kind(output, i, "reduce_scatter", "a tensor of input_list");
  const Reduction red = reduction(opts.reduceOp, ins, "reduce_scatter");
  bool even = dense(output);
  for (const auto& i : ins) even = even && i.numel() == output.numel();
  // Uneven blocks are the inner backend's (our reduce-scatter takes equal blocks).
  if (auto* inner = route(output.device(), "reduce_scatter", red.native_on(output) && even))
    return track(inner->reduce_scatter(outputs, inputs, opts));
  return submit(output.device(), c10d::OpType::REDUCE_SCATTER, {output}, ins, call_opts(opts), [output, ins, red](auto& c) {
    std::vector<at::Tensor> staged;
    for (const auto& i : ins) staged.push_back(red.premul ? red.stage(i) : i);
    Reduction staged_red = red;
    staged_red.premul = false;  // the blocks are premultiplied already
    reduce_scatter_one(c, staged_red, flat_cat(staged), output);
  });
}

// Gather and scatter run on our kernels for CPU tensors only (the CUDA lane has none: CUDA tensors go to the
// inner NCCL), so their bodies never meet a CudaComm. The all-to-all has a CUDA kernel (one host).
template <class Comm>
constexpr bool kMovesBlocks = !std::is_base_of_v<CudaComm, std::decay_t<Comm>>;

bool RingzeroBackend::cuda_moves_blocks(const at::Device& device, const char* op) {
  if (!device.is_cuda() || !shm_) return false;
  CudaLane* lane = cuda_lane(device, op, true);
  return lane && !lane->peers().spans_hosts;
}

// [Note: the CUDA all-to-all's counts]
// The CUDA all-to-all kernel places each block by its sender's count and has no way to report that a
// receiver expected another (no error channel without the host reading the device's counts), so before
// it runs the ranks' send and receive counts meet on the host: one small all-gather on the group's shared
// memory, queued behind the group's CPU ops like any of them and waited for here. Ranks whose split sizes
// disagree all raise CollectiveMismatch naming the pair before any kernel runs, as the CPU path does from
// its first slice ([Note: the all-to-all's count table], csrc/core/shm_alltoall.cpp); ringzero.* does the
// same through comm/exchange.py. The price is one host synchronisation per call, which an MoE layer pays
// anyway to learn its split sizes.
void RingzeroBackend::agree_on_splits(const std::vector<size_t>& send, const std::vector<size_t>& recv, const char* op) {
  const size_t n = static_cast<size_t>(getSize());
  std::vector<int64_t> mine(send.begin(), send.end());
  mine.insert(mine.end(), recv.begin(), recv.end());
  std::vector<int64_t> table(n * 2 * n);
  enqueue(c10d::OpType::ALLGATHER, {}, CallOpts{std::chrono::milliseconds(0), false}, [&](ShmComm& c) {  // 0: the group's timeout
    c.all_gather(mine.data(), table.data(), 2 * n, DType::I64);
  })->wait();
  for (size_t q = 0; q < n; ++q)
    for (size_t p = 0; p < n; ++p) {
      const int64_t sent = table[q * 2 * n + p], expected = table[p * 2 * n + n + q];
      if (sent != expected)
        throw CollectiveMismatchError("ringzero " + std::string(op) + " on group rank " + std::to_string(getRank()) +
                                      ": the ranks' split sizes disagree: group rank " + std::to_string(q) + " sends " +
                                      std::to_string(sent) + " elements to group rank " + std::to_string(p) +
                                      ", which expects " + std::to_string(expected) + " from it (rank q's "
                                      "input_split_sizes[p] must equal rank p's output_split_sizes[q])");
    }
}

namespace {

// Element counts of the blocks of an all_to_all_single along dim 0: `splits` rows each (even: size(0) /
// world rows each) of `t`'s rows; `what` names the tensor and its argument in messages.
std::vector<size_t> block_counts(const at::Tensor& t, const std::vector<int64_t>& splits, int world, const char* what,
                                 const char* arg) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t row = rows == 0 ? 0 : t.numel() / rows;
  std::vector<size_t> counts;
  if (splits.empty()) {
    TORCH_CHECK_VALUE(rows % world == 0, "ringzero all_to_all_single: ", what, "'s first dimension (", rows,
                      ") is not divisible by the world size ", world, "; pass ", arg);
    counts.assign(world, static_cast<size_t>(rows / world * row));
    return counts;
  }
  TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == world, "ringzero all_to_all_single: ", arg, " has ",
                    splits.size(), " entries but the group has ", world, " ranks");
  int64_t sum = 0;
  for (int64_t s : splits) {
    TORCH_CHECK_VALUE(s >= 0, "ringzero all_to_all_single: ", arg, " holds a negative size (", s, ")");
    sum += s;
    counts.push_back(static_cast<size_t>(s * row));
  }
  TORCH_CHECK_VALUE(sum == rows, "ringzero all_to_all_single: ", arg, " sums to ", sum, " but ", what,
                    "'s first dimension is ", rows);
  return counts;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> RingzeroBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_splits,
                                                              std::vector<int64_t>& input_splits,
                                                              const c10d::AllToAllOptions& opts) {
  same_kind(input, output, "all_to_all_single", "output");
  const bool ok = dense(input) && dense(output) && (input.is_cpu() || cuda_moves_blocks(input.device(), "alltoall_base"));
  if (auto* inner = route(output.device(), "alltoall_base", ok))
    return track(inner->alltoall_base(output, input, output_splits, input_splits, opts));
  const int64_t in_row = input.dim() == 0 || input.size(0) == 0 ? 0 : input.numel() / input.size(0);
  const int64_t out_row = output.dim() == 0 || output.size(0) == 0 ? 0 : output.numel() / output.size(0);
  TORCH_CHECK_VALUE(in_row == 0 || out_row == 0 || in_row == out_row, "ringzero all_to_all_single: a row of the input ",
                    "holds ", in_row, " elements but a row of the output ", out_row, "; give both the same shape past dim 0");
  const std::vector<size_t> send = block_counts(input, input_splits, getSize(), "input", "input_split_sizes");
  const std::vector<size_t> recv = block_counts(output, output_splits, getSize(), "output", "output_split_sizes");
  if (input.is_cuda()) agree_on_splits(send, recv, "all_to_all_single");
  return submit(input.device(), c10d::OpType::ALLTOALL_BASE, {output}, {input}, call_opts(opts),
                [output, input, send, recv](auto& c) {
    const Elements e = movement(input);
    std::vector<size_t> s = send, r = recv;
    for (auto& x : s) x *= e.per_element;
    for (auto& x : r) x *= e.per_element;
    at::Tensor in = input.contiguous();
    at::Tensor out = writable(output);
    c.all_to_all_v(in.data_ptr(), out.data_ptr(), s, r, e.dtype);
    write_back(output, out);
  });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == getSize() && static_cast<int>(inputs.size()) == getSize(),
                    "ringzero all_to_all: output_tensor_list and input_tensor_list must hold world_size = ", getSize(),
                    " tensors each (got ", outputs.size(), " and ", inputs.size(), ")");
  bool ok = true;
  std::vector<size_t> send, recv;
  for (int q = 0; q < getSize(); ++q) {
    same_kind(inputs[0], inputs[q], "all_to_all", "a tensor of input_tensor_list");
    same_kind(inputs[0], outputs[q], "all_to_all", "a tensor of output_tensor_list");
    ok = ok && dense(inputs[q]) && dense(outputs[q]);
    send.push_back(static_cast<size_t>(inputs[q].numel()));
    recv.push_back(static_cast<size_t>(outputs[q].numel()));
  }
  ok = ok && (inputs[0].is_cpu() || cuda_moves_blocks(inputs[0].device(), "alltoall"));
  if (auto* inner = route(inputs[0].device(), "alltoall", ok)) return track(inner->alltoall(outputs, inputs, opts));
  if (inputs[0].is_cuda()) agree_on_splits(send, recv, "all_to_all");
  return submit(inputs[0].device(), c10d::OpType::ALLTOALL, outputs, inputs, call_opts(opts),
                [outputs, inputs, send, recv](auto& c) {
    const Elements e = movement(inputs[0]);
    std::vector<size_t> s = send, r = recv;
    for (auto& x : s) x *= e.per_element;
    for (auto& x : r) x *= e.per_element;
    at::Tensor in = flat_cat(inputs);
    size_t total = 0;
    for (size_t x : recv) total += x;
    at::Tensor flat = at::empty({static_cast<int64_t>(total)}, inputs[0].options());
    c.all_to_all_v(in.data_ptr(), flat.data_ptr(), s, r, e.dtype);
    split_into(flat, outputs);
  });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  const at::Tensor& input = single(inputs, "gather", "tensor");
  TORCH_CHECK_VALUE(opts.rootRank >= 0 && opts.rootRank < getSize(), "ringzero gather: root rank ", opts.rootRank,
                    " is outside the group of size ", getSize());
  const int root = static_cast<int>(opts.rootRank);
  bool ok = input.is_cpu() && dense(input);
  std::vector<at::Tensor> outs;
  if (getRank() == root) {
    TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                      "ringzero gather: gather_list on the root must hold world_size = ", getSize(), " tensors");
    outs = outputs[0];
    for (const auto& o : outs) {
      same_kind(input, o, "gather", "a tensor of gather_list");
      TORCH_CHECK_VALUE(o.numel() == input.numel(), "ringzero gather: a tensor of gather_list has ", o.numel(),
                        " elements but the input has ", input.numel(), "; gather takes tensors of one size");
      ok = ok && dense(o);
    }
  } else {
    TORCH_CHECK_VALUE(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                      "ringzero gather: gather_list must be empty (None) on a rank other than the root");
  }
  if (auto* inner = route(input.device(), "gather", ok)) return track(inner->gather(outputs, inputs, opts));
  return submit(input.device(), c10d::OpType::GATHER, outs, {input}, call_opts(opts), [outs, input, root](auto& c) {
    if constexpr (kMovesBlocks<decltype(c)>) {
      const Elements e = movement(input);
      at::Tensor in = input.contiguous();
      const bool is_root = c.rank() == root;
      if constexpr (std::is_same_v<std::decay_t<decltype(c)>, HostsComm>) {
        if (auto ptrs = is_root ? block_ptrs(outs) : std::nullopt) {
          c.gather_blocks(in.data_ptr(), *ptrs, in.numel() * e.per_element, e.dtype, root);
          return;
        }
      }
      at::Tensor flat = is_root ? at::empty({in.numel() * static_cast<int64_t>(outs.size())}, input.options())
                                : at::empty({0}, input.options());
      c.gather(in.data_ptr(), flat.data_ptr(), in.numel() * e.per_element, e.dtype, root);
      if (is_root) split_into(flat, outs);
    }
  });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  const at::Tensor& output = single(outputs, "scatter", "tensor");
  TORCH_CHECK_VALUE(opts.rootRank >= 0 && opts.rootRank < getSize(), "ringzero scatter: root rank ", opts.rootRank,
                    " is outside the group of size ", getSize());
  const int root = static_cast<int>(opts.rootRank);
  bool ok = output.is_cpu() && dense(output);
  std::vector<at::Tensor> ins;
  if (getRank() == root) {
    TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                      "ringzero scatter: scatter_list on the root must hold world_size = ", getSize(), " tensors");
    ins = inputs[0];
    for (const auto& i : ins) {
      same_kind(output, i, "scatter", "a tensor of scatter_list");
      TORCH_CHECK_VALUE(i.numel() == output.numel(), "ringzero scatter: a tensor of scatter_list has ", i.numel(),
                        " elements but the output has ", output.numel(), "; scatter takes tensors of one size");
      ok = ok && dense(i);
    }
  } else {
    TORCH_CHECK_VALUE(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                      "ringzero scatter: scatter_list must be empty (None) on a rank other than the root");
  }
  if (auto* inner = route(output.device(), "scatter", ok)) {
    check_contiguous_for_inner(outputs, "scatter", "output tensor");
    return track(inner->scatter(outputs, inputs, opts));
  }
  return submit(output.device(), c10d::OpType::SCATTER, {output}, ins, call_opts(opts), [output, ins, root](auto& c) {
    if constexpr (kMovesBlocks<decltype(c)>) {
      const Elements e = movement(output);
      at::Tensor out = writable(output);
      if constexpr (std::is_same_v<std::decay_t<decltype(c)>, HostsComm>) {
        if (auto ptrs = c.rank() == root ? block_ptrs(ins) : std::nullopt) {
          c.scatter_blocks(*ptrs, out.data_ptr(), out.numel() * e.per_element, e.dtype, root);
          write_back(output, out);
          return;
        }
      }
      at::Tensor in = c.rank() == root ? flat_cat(ins) : at::empty({0}, output.options());
      c.scatter(in.data_ptr(), out.data_ptr(), out.numel() * e.per_element, e.dtype, root);
      write_back(output, out);
    }
  });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const at::Tensor& t = single(tensors, "send");
  TORCH_CHECK_VALUE(dst >= 0 && dst < getSize() && dst != getRank(), "ringzero send: dst ", dst,
                    " must be another rank of the group (size ", getSize(), ")");
  // CUDA tensors: NCCL's (our CUDA path has no point-to-point channel yet).
  if (auto* inner = route(t.device(), "send", t.is_cpu() && p2p_ && tag == 0 && dense(t), false))
    return track(inner->send(tensors, dst, tag));
  const double timeout_s = config_.timeout_s;
  return enqueue_on(peer_executor(true, dst), c10d::OpType::SEND, {t}, [this, t, dst, timeout_s] {
    at::Tensor buf = t.contiguous();
    p2p_->send(buf.data_ptr(), buf.numel() * buf.element_size(), dst, timeout_s);
  });
}

c10::intrusive_ptr<c10d::Work> RingzeroBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const at::Tensor& t = single(tensors, "recv");
  TORCH_CHECK_VALUE(src >= 0 && src < getSize() && src != getRank(), "ringzero recv: src ", src,
                    " must be another rank of the group (size ", getSize(), ")");
  if (auto* inner = route(t.device(), "recv", t.is_cpu() && p2p_ && tag == 0 && dense(t), false))
    return track(inner->recv(tensors, src, tag));
  const double timeout_s = config_.timeout_s;
  pending_recvs_[src].fetch_add(1);
  try {
    return enqueue_on(peer_executor(false, src), c10d::OpType::RECV, {t}, [this, t, src, timeout_s] {
      struct Done {  // however the read ends, this recv no longer waits for src's next message
        std::atomic<int>& pending;
        ~Done() { pending.fetch_sub(1); }
      } done{pending_recvs_[src]};
      at::Tensor buf = writable(t);
      recv_from(buf, src, timeout_s);
      write_back(t, buf);
    });
  } catch (...) {
    pending_recvs_[src].fetch_sub(1);  // never queued
    throw;
  }
}

void RingzeroBackend::recv_from(const at::Tensor& buf, int src, double timeout_s) {
  std::lock_guard<std::mutex> lock(recv_locks_[src]);
  p2p_->recv(buf.data_ptr(), buf.numel() * buf.element_size(), src, timeout_s);
}

// [Note: receive from any source] (backend.h). The wait polls the channels from the other ranks.
c10::intrusive_ptr<c10d::Work> RingzeroBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const at::Tensor& t = single(tensors, "recv (any source)");
  if (auto* inner = route(t.device(), "recvAnysource", t.is_cpu() && p2p_ && tag == 0 && dense(t), false))
    return track(inner->recvAnysource(tensors, tag));
  const double timeout_s = config_.timeout_s;
  return enqueue_on(any_source_executor_, c10d::OpType::RECVANYSOURCE, {t}, [this, t, timeout_s](RingzeroWork& work) {
    at::Tensor buf = writable(t);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    auto no_recv_queued = [this](int r) { return pending_recvs_[r].load() == 0; };
    for (;;) {
      const double left_s = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      const int src = p2p_->wait_any_source(no_recv_queued, std::max(left_s, 0.0));
      std::unique_lock<std::mutex> lock(recv_locks_[src]);
      // A recv() from src may have been posted, or run, since the look: then its message is not ours.
      if (!no_recv_queued(src) || !p2p_->has_message(src)) continue;
      p2p_->recv(buf.data_ptr(), buf.numel() * buf.element_size(), src, timeout_s);
      work.set_source_rank(src);
      break;
    }
    write_back(t, buf);
  });
}

// A host barrier on shared memory (it blocks the host until every rank arrived, which is what callers of
// dist.barrier want). When the group has a CUDA lane, each rank first waits for its CUDA work queued so
// far (the current stream's and the lane's), so that, as after NCCL's barrier, it has finished.
c10::intrusive_ptr<c10d::Work> RingzeroBackend::barrier(const c10d::BarrierOptions& opts) {
  if (auto* inner = route(at::Device(at::kCPU), "barrier", true)) return track(inner->barrier(opts));
  std::function<void()> cuda_done;
  {
    std::lock_guard<std::mutex> lock(cuda_mu_);
    if (cuda_) cuda_done = cuda_->host_fence();
  }
  if (hosts_)
    return enqueue_on(executor_, c10d::OpType::BARRIER, {}, [this, cuda_done] {
      hosts_.run({}, [&] {  // a tail left before runs in the barrier's engine call, or after cuda_done threw
        if (cuda_done) cuda_done();
        hosts_.barrier();
      });
    }, !opts.asyncOp);
  return enqueue(c10d::OpType::BARRIER, {}, call_opts(opts), [cuda_done](ShmComm& c) {
    if (cuda_done) cuda_done();
    c.barrier();
  });
}

}  // namespace ringzero
