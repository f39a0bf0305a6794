// Host side of the peer-memory collectives: allocation, IPC export/import, algorithm choice and the
// launch shared by real and simulated ranks. Plain C++ over the CUDA runtime (the kernels live in .cu).
#include "cuda/peer_comm.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/errors.h"

namespace ringzero::cuda {
namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::string msg = std::string("ringzero CUDA: ") + what + ": " + cudaGetErrorString(e);
  // What the CUDA runtime says on a machine without a GPU or driver ("CUDA driver version is
  // insufficient ...") names neither; say it plainly.
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
    msg += " (this process sees no usable CUDA GPU: no device, or no NVIDIA driver; the CUDA collectives need one)";
  throw CommError(msg);
}

// Signal first (its own 128-byte lines), staging after it at a 256-byte boundary.
constexpr size_t kSignalBytes = (sizeof(Signal) + 255) / 256 * 256;

void validate(int nranks, const PeerConfig& cfg) {
  if (nranks < 1 || nranks > kMaxRanks)
    throw InvalidArgument("ringzero CUDA: nranks must be in [1, " + std::to_string(kMaxRanks) + "], got " +
                          std::to_string(nranks));
  if (cfg.staging_bytes < (64u << 10) || cfg.staging_bytes % 4096 != 0)
    throw InvalidArgument("ringzero CUDA: staging_bytes must be a multiple of 4096 and at least 65536, got " +
                          std::to_string(cfg.staging_bytes) + "; set RINGZERO_CUDA_BUFFER_BYTES accordingly");
  if (cfg.ring_channels < 1 || cfg.ring_channels > kMaxChannels)
    throw InvalidArgument("ringzero CUDA: ring_channels must be in [1, " + std::to_string(kMaxChannels) + "]");
  if (cfg.max_blocks < 1 || cfg.max_blocks > kMaxBlocks)
    throw InvalidArgument("ringzero CUDA: max_blocks must be in [1, " + std::to_string(kMaxBlocks) + "]");
  if (ring_slot_bytes(cfg.staging_bytes, cfg.ring_channels) < 4096)
    throw InvalidArgument("ringzero CUDA: staging_bytes / (ring_channels * 4) must be at least 4096 bytes");
  if (cfg.timeout_s <= 0) throw InvalidArgument("ringzero CUDA: timeout_s must be positive");
}

void* alloc_rank(const PeerConfig& cfg, Signal** signal, char** staging) {
  void* base = nullptr;
  cuda_ok(cudaMalloc(&base, kSignalBytes + cfg.staging_bytes), "cudaMalloc of the staging buffer");
  // Counters start at zero on every rank before any handle is shared (the memset completes first).
  cuda_ok(cudaMemset(base, 0, kSignalBytes), "zeroing the signal block");
  cuda_ok(cudaDeviceSynchronize(), "zeroing the signal block");
  *signal = static_cast<Signal*>(base);
  *staging = static_cast<char*>(base) + kSignalBytes;
  return base;
}

// Blocks per rank for one-shot/two-shot: enough to cover the slice with a few packs per thread,
// never more than max_blocks (fewer blocks means fewer flags for tiny messages).
int blocks_for(const PeerConfig& cfg, size_t bytes) {
  const size_t per_block = static_cast<size_t>(kThreads) * 16 * 4;
  const size_t slice = bytes < cfg.staging_bytes ? bytes : cfg.staging_bytes;
  size_t b = (slice + per_block - 1) / per_block;
  if (b < 1) b = 1;
  return static_cast<int>(b < static_cast<size_t>(cfg.max_blocks) ? b : cfg.max_blocks);
}


}  // namespace

// ---- TimeoutRecord -------------------------------------------------------------------------------
const char* wait_name(int32_t what) {
  switch (static_cast<WaitKind>(what)) {
    case WaitKind::Barrier: return "a barrier";
    case WaitKind::RingData: return "ring data";
    case WaitKind::RingCredit: return "a ring credit (a freed FIFO slot)";
  }
  return "a flag";
}

TimeoutRecord::TimeoutRecord() {
  void* p = nullptr;
  cuda_ok(cudaHostAlloc(&p, sizeof(RunStatus), cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc of the timeout record");
  host_ = static_cast<RunStatus*>(p);
  std::memset(host_, 0, sizeof(RunStatus));
  void* d = nullptr;
  cuda_ok(cudaHostGetDevicePointer(&d, p, 0), "mapping the timeout record");
  device_ = static_cast<RunStatus*>(d);
}

TimeoutRecord::~TimeoutRecord() {
  if (host_) cudaFreeHost(host_);
}

const RunStatus* TimeoutRecord::timed_out() const {
  const volatile RunStatus* s = host_;
  if (s->code != kTimedOut) return nullptr;
  std::atomic_thread_fence(std::memory_order_acquire);  // the kernel wrote the fields before the code
  return host_;
}

void TimeoutRecord::check(double timeout_s) const {
  const RunStatus* s = timed_out();
  if (!s) return;
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", timeout_s);
  std::string msg = "ringzero CUDA: rank " + std::to_string(s->rank) + " (block " + std::to_string(s->block) +
                    ") waited more than " + secs + " s for " + wait_name(s->what) +
                    " of rank " + std::to_string(s->peer) + " (flag " + std::to_string(s->flag) + ", want " +
                    std::to_string(s->target) + ")";
  if (s->culprit != s->peer)
    msg += ", which was waiting itself (first rank along the chain of waits: " + std::to_string(s->culprit) + ")";
  msg += ": rank " + std::to_string(s->culprit) +
         " never arrived (it died, hangs, or called a different collective). The kernel returned early; this "
         "communicator is unusable now (its flags no longer agree with the peers'), the process and its CUDA "
         "context are fine.";
  throw CommTimeoutError(msg);
}

Algo choose_algo(const PeerConfig& cfg, size_t bytes) {
  if (bytes <= cfg.one_shot_max_bytes) return Algo::OneShot;
  if (bytes <= cfg.two_shot_max_bytes) return Algo::TwoShot;
  return Algo::Ring;
}

void run_collective(Coll coll, const PeerConfig& cfg, const PeerTable& peers, const RankBuffers* ranks,
                    int grid_y, size_t count, DType dtype, ReduceOp op, Algo algo, cudaStream_t stream) {
  const int n = peers.nranks;
  const size_t esize = dtype_size(dtype);
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16 && dtype != DType::I32 &&
      dtype != DType::I64)
    throw InvalidArgument(std::string("ringzero CUDA collectives take float32, bfloat16, float16, int32 or int64, got ") +
                          dtype_name(dtype));
  if (count == 0) return;
  if (peers.status == nullptr || peers.claim == nullptr)
    throw InvalidArgument("ringzero CUDA: the peer table has no timeout record (PeerTable::status, ::claim)");
  if (n == 1) {  // nothing to exchange: a copy (Avg over one rank is the identity)
    const size_t bytes = count * esize;
    for (int y = 0; y < grid_y; ++y)
      if (ranks[y].in != ranks[y].out)
        cuda_ok(cudaMemcpyAsync(ranks[y].out, ranks[y].in, bytes, cudaMemcpyDeviceToDevice, stream), "copy");
    return;
  }
  CollArgs a{};
  a.peers = peers;
  for (int y = 0; y < grid_y; ++y) a.ranks[y] = ranks[y];
  a.count = count;
  a.divisor = op == ReduceOp::Avg ? n : 1;
  a.timeout_ns = static_cast<uint64_t>(cfg.timeout_s * 1e9);
  cudaError_t e;
  if (coll == Coll::AllReduce) {
    if (algo == Algo::Auto) algo = choose_algo(cfg, count * esize);
    if (algo == Algo::OneShot || algo == Algo::TwoShot) {
      a.nblocks = blocks_for(cfg, count * esize);
      e = algo == Algo::OneShot ? launch_one_shot(a, grid_y, dtype, op, stream)
                                : launch_two_shot(a, grid_y, dtype, op, stream);
    } else {
      a.nblocks = cfg.ring_channels;
      e = launch_ring(RingKind::AllReduce, a, grid_y, dtype, op, stream);
    }
  } else {
    a.nblocks = cfg.ring_channels;
    e = launch_ring(coll == Coll::ReduceScatter ? RingKind::ReduceScatter : RingKind::AllGather, a, grid_y, dtype,
                    op, stream);
  }
  if (e == cudaErrorCooperativeLaunchTooLarge)
    throw InvalidArgument("ringzero CUDA: " + std::to_string(grid_y) + " simulated ranks x " +
                          std::to_string(a.nblocks) + " blocks do not fit on this GPU at once; lower ring_channels");
  cuda_ok(e, "launching a collective kernel");
}

void run_all_to_all(const PeerConfig& cfg, const PeerTable& peers, const RankBuffers* ranks, int grid_y,
                    const AllToAllArgs& v, DType dtype, cudaStream_t stream) {
  const size_t esize = dtype_size(dtype);
  if (esize != 1 && esize != 2 && esize != 4 && esize != 8)
    throw InvalidArgument(std::string("ringzero CUDA all_to_all: unknown dtype ") + dtype_name(dtype));
  if (peers.status == nullptr || peers.claim == nullptr)
    throw InvalidArgument("ringzero CUDA: the peer table has no timeout record (PeerTable::status, ::claim)");
  for (int y = 0; y < grid_y; ++y) {
    if (v.send_counts[y] == nullptr)
      throw InvalidArgument("ringzero CUDA all_to_all: rank " + std::to_string(ranks[y].rank) + " has no send counts");
    // The kernel stages the input one slice at a time while outputs are written: an output that
    // overlaps the input would overwrite input elements of later slices before they are staged.
    const char* in = static_cast<const char*>(ranks[y].in);
    const char* out = static_cast<const char*>(ranks[y].out);
    if (v.in_elems[y] && v.out_elems[y] && in < out + v.out_elems[y] * esize && out < in + v.in_elems[y] * esize)
      throw InvalidArgument("ringzero CUDA all_to_all: rank " + std::to_string(ranks[y].rank) +
                            "'s output overlaps its input");
  }
  // Even when no rank sends anything the kernel runs: only the device knows the counts.
  CollArgs a{};
  a.peers = peers;
  for (int y = 0; y < grid_y; ++y) a.ranks[y] = ranks[y];
  a.divisor = 1;
  a.nblocks = cfg.max_blocks;
  a.timeout_ns = static_cast<uint64_t>(cfg.timeout_s * 1e9);
  const cudaError_t e = launch_all_to_all(a, v, grid_y, dtype, stream);
  if (e == cudaErrorCooperativeLaunchTooLarge)
    throw InvalidArgument("ringzero CUDA: " + std::to_string(grid_y) + " simulated ranks do not fit on this GPU at once");
  cuda_ok(e, "launching the all-to-all kernel");
}

// ---- PeerComm ----------------------------------------------------------------------------------
PeerComm::PeerComm(int rank, int nranks, const PeerConfig& cfg) : rank_(rank), cfg_(cfg) {
  validate(nranks, cfg);
  if (rank < 0 || rank >= nranks)
    throw InvalidArgument("ringzero CUDA: rank " + std::to_string(rank) + " is not in [0, " + std::to_string(nranks) + ")");
  table_.nranks = nranks;
  table_.staging_bytes = cfg.staging_bytes;
  base_ = alloc_rank(cfg, &table_.signal[rank], &table_.staging[rank]);
  table_.status = timeouts_.device();
  table_.claim = &table_.signal[rank]->timeout_claim;
}

PeerComm::~PeerComm() {
  // Callers synchronise all ranks before destruction (Python: a barrier in close()); a peer still
  // writing flags here after that would be a bug of the caller.
  cudaDeviceSynchronize();
  for (void* p : opened_) cudaIpcCloseMemHandle(p);
  if (base_) cudaFree(base_);
}

std::string PeerComm::ipc_handle() const {
  cudaIpcMemHandle_t h;
  cuda_ok(cudaIpcGetMemHandle(&h, base_), "cudaIpcGetMemHandle");
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

void PeerComm::open_peers(const std::vector<std::string>& handles) {
  if (static_cast<int>(handles.size()) != table_.nranks)
    throw InvalidArgument("ringzero CUDA: open_peers needs one handle per rank");
  if (ready_) throw InvalidArgument("ringzero CUDA: open_peers called twice");
  for (int q = 0; q < table_.nranks; ++q) {
    if (q == rank_) continue;
    if (handles[q].size() != sizeof(cudaIpcMemHandle_t))
      throw InvalidArgument("ringzero CUDA: IPC handle of rank " + std::to_string(q) + " has the wrong size");
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handles[q].data(), sizeof(h));
    void* p = nullptr;
    cuda_ok(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
          ("opening the IPC handle of rank " + std::to_string(q)).c_str());
    opened_.push_back(p);
    table_.signal[q] = static_cast<Signal*>(p);
    table_.staging[q] = static_cast<char*>(p) + kSignalBytes;
  }
  ready_ = true;
}

void PeerComm::run(Coll coll, const void* in, void* out, size_t count, DType dtype, ReduceOp op, Algo algo,
                   cudaStream_t stream) {
  if (!ready_ && table_.nranks > 1) throw InvalidArgument("ringzero CUDA: call open_peers before a collective");
  check();
  RankBuffers me{in, out, rank_};
  run_collective(coll, cfg_, table_, &me, 1, count, dtype, op, algo, stream);
}

void PeerComm::all_to_all(const void* in, size_t in_elems, void* out, size_t out_elems, const int64_t* send_counts,
                          DType dtype, cudaStream_t stream) {
  if (!ready_ && table_.nranks > 1) throw InvalidArgument("ringzero CUDA: call open_peers before a collective");
  check();
  RankBuffers me{in, out, rank_};
  AllToAllArgs v{};
  v.send_counts[0] = send_counts;
  v.in_elems[0] = in_elems;
  v.out_elems[0] = out_elems;
  run_all_to_all(cfg_, table_, &me, 1, v, dtype, stream);
}

// ---- SimWorld ----------------------------------------------------------------------------------
SimWorld::SimWorld(int nranks, const PeerConfig& cfg) : cfg_(cfg) {
  validate(nranks, cfg);
  const int most = ring_max_channels(nranks);
  if (most < 1) throw InvalidArgument("ringzero CUDA: no GPU, or too many simulated ranks for its SMs");
  if (cfg_.ring_channels > most) cfg_.ring_channels = most;  // all ranks' channels resident at once
  table_.nranks = nranks;
  table_.staging_bytes = cfg.staging_bytes;
  for (int q = 0; q < nranks; ++q) bases_.push_back(alloc_rank(cfg, &table_.signal[q], &table_.staging[q]));
  table_.status = timeouts_.device();
  table_.claim = &table_.signal[0]->timeout_claim;  // one launch runs all simulated ranks: one claim
}

SimWorld::~SimWorld() {
  cudaDeviceSynchronize();
  for (void* p : bases_) cudaFree(p);
}

void SimWorld::run(Coll coll, const std::vector<const void*>& ins, const std::vector<void*>& outs, size_t count,
                   DType dtype, ReduceOp op, Algo algo, cudaStream_t stream) {
  const int n = table_.nranks;
  if (static_cast<int>(ins.size()) != n || static_cast<int>(outs.size()) != n)
    throw InvalidArgument("ringzero CUDA: SimWorld.run needs one input and one output per simulated rank");
  check();
  RankBuffers ranks[kMaxRanks];
  for (int q = 0; q < n; ++q) ranks[q] = RankBuffers{ins[q], outs[q], q};
  run_collective(coll, cfg_, table_, ranks, n, count, dtype, op, algo, stream);
}

void SimWorld::all_to_all(const std::vector<const void*>& ins, const std::vector<size_t>& in_elems,
                          const std::vector<void*>& outs, const std::vector<size_t>& out_elems,
                          const std::vector<const int64_t*>& send_counts, DType dtype, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(table_.nranks);
  if (ins.size() != n || in_elems.size() != n || outs.size() != n || out_elems.size() != n || send_counts.size() != n)
    throw InvalidArgument("ringzero CUDA: SimWorld.all_to_all needs one input, output and count table per simulated rank");
  check();
  RankBuffers ranks[kMaxRanks];
  AllToAllArgs v{};
  for (size_t q = 0; q < n; ++q) {
    ranks[q] = RankBuffers{ins[q], outs[q], static_cast<int>(q)};
    v.send_counts[q] = send_counts[q];
    v.in_elems[q] = in_elems[q];
    v.out_elems[q] = out_elems[q];
  }
  run_all_to_all(cfg_, table_, ranks, table_.nranks, v, dtype, stream);
}

}  // namespace ringzero::cuda
