// The network ring driver: plans a collective as a list of (transfer, reduction) steps, one per chunk
// slice and ring step, then posts them on two streams (see ring_driver.h).
#include "nccl/ring_driver.h"

#include <algorithm>
#include <string>

#include "core/chunks.h"
#include "core/errors.h"
#include "cuda/reduce.h"

namespace ringzero::nccl {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CommError(std::string("ringzero ring driver: ") + what + ": " + cudaGetErrorString(e));
}

struct ChunkRef {
  char* base;    // first byte of the chunk
  size_t count;  // elements
};

int mod(int k, int n) { return ((k % n) + n) % n; }

}  // namespace

RingDriver::RingDriver(int rank, int nranks, size_t slice_bytes)
    : rank_(rank), nranks_(nranks), slice_bytes_(slice_bytes) {
  if (nranks < 1 || rank < 0 || rank >= nranks)
    throw InvalidArgument("ringzero ring driver: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  if (slice_bytes < 64 || slice_bytes % 16 != 0)
    throw InvalidArgument("ringzero ring driver: slice_bytes must be a multiple of 16 and at least 64; "
                          "set RINGZERO_RING_SLICE_BYTES accordingly");
  check(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaStreamCreateWithFlags(&reduce_, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int b = 0; b < 2; ++b) {
    check(cudaMalloc(&tmp_[b], slice_bytes), "cudaMalloc of a receive buffer");
    check(cudaEventCreateWithFlags(&tmp_free_[b], cudaEventDisableTiming), "cudaEventCreate");
  }
  check(cudaEventCreateWithFlags(&recv_done_, cudaEventDisableTiming), "cudaEventCreate");
}

RingDriver::~RingDriver() {
  cudaStreamSynchronize(comm_);
  cudaStreamSynchronize(reduce_);
  for (cudaEvent_t e : reduced_) cudaEventDestroy(e);
  for (int b = 0; b < 2; ++b) {
    cudaEventDestroy(tmp_free_[b]);
    cudaFree(tmp_[b]);
  }
  cudaEventDestroy(recv_done_);
  cudaStreamDestroy(comm_);
  cudaStreamDestroy(reduce_);
}

void RingDriver::begin(DType dtype, ReduceOp op, size_t slices_per_chunk, cudaStream_t caller) {
  dtype_ = dtype;
  op_ = op;
  esize_ = dtype_size(dtype);
  caller_ = caller;
  steps_.clear();
  while (reduced_.size() < slices_per_chunk) {
    cudaEvent_t e;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    reduced_.push_back(e);
  }
  reduced_set_.assign(reduced_.size(), false);
  tmp_free_set_[0] = tmp_free_set_[1] = false;
  stream_order(caller, comm_);
  stream_order(caller, reduce_);
}

template <class SendF, class RecvF, class DstF, class SrcF>
void RingDriver::add_pass(int nsteps, size_t chunk_count, SendF send_chunk, RecvF recv_chunk, DstF dst_chunk,
                          SrcF src_chunk, bool reduce, bool first_send_after_reduce, bool divide_last) {
  const size_t slice_elems = std::max<size_t>(1, slice_bytes_ / esize_);
  const size_t nslices = ceil_div(chunk_count, slice_elems);  // chunk_count: the largest chunk
  int tmp = 0;
  for (int t = 0; t < nsteps; ++t) {
    const ChunkRef s = send_chunk(t), r = recv_chunk(t);
    for (size_t j = 0; j < nslices; ++j) {
      Step st;
      const Range sr = slice_range(s.count, slice_elems, j), rr = slice_range(r.count, slice_elems, j);
      if (sr.count) {
        st.send = s.base + sr.offset * esize_;
        st.send_bytes = sr.count * esize_;
        st.send_after_reduce = t > 0 ? reduce : first_send_after_reduce;
      }
      st.slice = static_cast<int>(j);
      if (rr.count) {
        st.recv_bytes = rr.count * esize_;
        if (reduce) {
          st.reduce = true;
          st.tmp = tmp;
          tmp ^= 1;
          st.recv = static_cast<char*>(tmp_[st.tmp]);
          st.dst = dst_chunk(t) + rr.offset * esize_;
          st.src = src_chunk(t) + rr.offset * esize_;
          st.divisor = divide_last && t == nsteps - 1 && op_ == ReduceOp::Avg ? nranks_ : 1;
        } else {
          st.recv = r.base + rr.offset * esize_;
        }
      }
      steps_.push_back(st);  // even when empty: every rank has the same steps (lockstep loopback)
    }
  }
}

void RingDriver::plan_all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, cudaStream_t caller) {
  const int n = nranks_, r = rank_;
  char* b = static_cast<char*>(buf);
  auto chunk = [&](int k) {
    const Range c = chunk_range(count, n, mod(k, n), dtype_size(dtype));
    return ChunkRef{b + c.offset * dtype_size(dtype), c.count};
  };
  const size_t largest = chunk_range(count, n, 0, dtype_size(dtype)).count;
  begin(dtype, op, ceil_div(largest, std::max<size_t>(1, slice_bytes_ / dtype_size(dtype))), caller);
  if (n == 1 || count == 0) return;
  // Reduce-scatter: step t sends chunk r-t, folds chunk r-t-1 in place; rank r ends owning chunk r+1.
  add_pass(n - 1, largest, [&](int t) { return chunk(r - t); }, [&](int t) { return chunk(r - t - 1); },
           [&](int t) { return chunk(r - t - 1).base; }, [&](int t) { return chunk(r - t - 1).base; },
           true, false, true);
  // All-gather: step t sends chunk r+1-t (the first one just reduced), receives chunk r-t in place.
  add_pass(n - 1, largest, [&](int t) { return chunk(r + 1 - t); }, [&](int t) { return chunk(r - t); },
           [&](int) { return b; }, [&](int) { return b; }, false, true, false);
}

void RingDriver::plan_reduce_scatter(const void* in, void* work, void* out, size_t count, DType dtype, ReduceOp op,
                                     cudaStream_t caller) {
  const int n = nranks_, r = rank_;
  const size_t es = dtype_size(dtype), slice_elems = std::max<size_t>(1, slice_bytes_ / es);
  begin(dtype, op, ceil_div(count, slice_elems), caller);
  if (count == 0) return;
  if (n == 1) {
    check(cudaMemcpyAsync(out, in, count * es, cudaMemcpyDeviceToDevice, comm_), "copy");
    return;
  }
  auto block = [&](const void* base, int k) {
    return ChunkRef{static_cast<char*>(const_cast<void*>(base)) + mod(k, n) * count * es, count};
  };
  // Step t sends block r-t-1 (the input at t = 0, then the partial sum made at t-1) and folds block
  // r-t-2 of the input with what arrives; the last step (block r) writes `out`.
  add_pass(n - 1, count, [&](int t) { return t == 0 ? block(in, r - 1) : block(work, r - t - 1); },
           [&](int t) { return block(work, r - t - 2); },
           [&](int t) { return t == n - 2 ? static_cast<char*>(out) : block(work, r - t - 2).base; },
           [&](int t) { return block(in, r - t - 2).base; }, true, false, true);
}

void RingDriver::plan_all_gather(const void* in, void* out, size_t count, DType dtype, cudaStream_t caller) {
  const int n = nranks_, r = rank_;
  const size_t es = dtype_size(dtype), slice_elems = std::max<size_t>(1, slice_bytes_ / es);
  begin(dtype, ReduceOp::Sum, ceil_div(count, slice_elems), caller);
  if (count == 0) return;
  auto block = [&](int k) { return ChunkRef{static_cast<char*>(out) + mod(k, n) * count * es, count}; };
  check(cudaMemcpyAsync(block(r).base, in, count * es, cudaMemcpyDeviceToDevice, comm_), "copy");
  add_pass(n - 1, count, [&](int t) { return block(r - t); }, [&](int t) { return block(r - t - 1); },
           [&](int) { return static_cast<char*>(out); }, [&](int) { return static_cast<char*>(out); }, false,
           false, false);
}

void RingDriver::post_transfers(size_t i, Transport& t) {
  const Step& st = steps_.at(i);
  if (st.send && st.send_after_reduce && reduced_set_[st.slice])
    check(cudaStreamWaitEvent(comm_, reduced_[st.slice], 0), "wait for the reduced slice");
  if (st.reduce && tmp_free_set_[st.tmp])
    check(cudaStreamWaitEvent(comm_, tmp_free_[st.tmp], 0), "wait for a free receive buffer");
  const int right = (rank_ + 1) % nranks_, left = (rank_ + nranks_ - 1) % nranks_;
  if (st.send) t.send(rank_, st.send, st.send_bytes, right, comm_);
  if (st.recv) t.recv(rank_, st.recv, st.recv_bytes, left, comm_);
}

void RingDriver::post_reduce(size_t i) {
  const Step& st = steps_.at(i);
  if (!st.reduce) return;
  check(cudaEventRecord(recv_done_, comm_), "cudaEventRecord");
  check(cudaStreamWaitEvent(reduce_, recv_done_, 0), "wait for the received slice");
  const void* srcs[2] = {st.src, tmp_[st.tmp]};
  check(cuda::launch_reduce(st.dst, srcs, 2, st.recv_bytes / esize_, dtype_, op_, st.divisor, reduce_),
        "launching the reduction");
  check(cudaEventRecord(reduced_[st.slice], reduce_), "cudaEventRecord");
  check(cudaEventRecord(tmp_free_[st.tmp], reduce_), "cudaEventRecord");
  reduced_set_[st.slice] = true;
  tmp_free_set_[st.tmp] = true;
}

void RingDriver::finish() {
  stream_order(comm_, caller_);
  stream_order(reduce_, caller_);
}

void run_ring(RingDriver& driver, Transport& transport) {
  for (size_t i = 0; i < driver.num_steps(); ++i) {
    transport.group_start();
    driver.post_transfers(i, transport);
    transport.group_end();
    driver.post_reduce(i);
  }
  driver.finish();
}

void run_rings(const std::vector<RingDriver*>& drivers, Transport& transport) {
  size_t steps = drivers.empty() ? 0 : drivers[0]->num_steps();
  for (RingDriver* d : drivers)
    if (d->num_steps() != steps) throw InvalidArgument("ringzero ring driver: simulated ranks planned different collectives");
  for (size_t i = 0; i < steps; ++i) {
    transport.group_start();
    for (RingDriver* d : drivers) d->post_transfers(i, transport);
    transport.group_end();
    for (RingDriver* d : drivers) d->post_reduce(i);
  }
  for (RingDriver* d : drivers) d->finish();
}

}  // namespace ringzero::nccl
