// Collectives among the ranks of one host over one shared-memory segment (layer 1, no torch).
//
// Segment layout: a header page, one control block per rank (its own 128-byte lines: progress counters
// and the fingerprint of its current collective), then per rank two staging slots of slot_bytes.
// Every collective is a sequence of slices; slice k uses slot parity k % 2, and a rank writes its slot
// for slice k only after every rank has finished reading slice k - 2 (the `done` counter). So one
// synchronisation per phase suffices and no collective needs a trailing barrier.
// The first phase of every collective waits for all ranks and compares their fingerprints (op, dtype,
// count, root, sequence number): a mismatch raises CollectiveMismatchError on every rank.
#pragma once
#include <atomic>
#include <exception>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "select.h"
#include "shm_segment.h"
#include "shm_window.h"
#include "types.h"

namespace ringzero {

struct WaitWord;      // shm_wait.h
class ShmWindow;      // shm_window.h
class SliceContext;   // slice_context.h: what the algorithms' files use of a communicator

// AllReduceAlgo, CollectiveKind and collective_name() are in types.h (shared with Python through _C); which
// algorithm and path a call takes is the selector's (select.h), the all-reduces run in allreduce_*.cpp.

struct Fingerprint {
  uint64_t seq;
  int32_t kind;
  int32_t dtype;
  int32_t op;
  int32_t root;
  uint64_t count;
};

class ShmComm {
 public:
  // Bytes of the segment for `nranks` ranks with slots of `slot_bytes`.
  static size_t segment_bytes(int nranks, size_t slot_bytes);

  // Rank `rank` of `nranks` on this host. The creator (rank 0 by convention) passes an empty `name`
  // and shares name() with the others; it calls unlink() once all have opened. `group_ranks[i]` is the
  // rank of local rank i in the caller's process group, used only in messages.
  ShmComm(const std::string& name, int rank, int nranks, size_t slot_bytes, double timeout_s,
          std::vector<int> group_ranks);
  ~ShmComm();
  ShmComm(const ShmComm&) = delete;
  ShmComm& operator=(const ShmComm&) = delete;

  const std::string& name() const { return seg_.name(); }
  void unlink() { seg_.unlink(); }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  size_t slot_bytes() const { return slot_bytes_; }
  uint64_t seq() const { return seq_; }
  uint64_t probes() const { return probes_; }
  // Staged collectives of two ranks, 64 KiB and more: 0 never stream their staging, 1 always, 2 (the
  // default) while the last placement probe found two last-level caches. This rank's own: the probes run
  // whatever it is.
  void set_stage_streaming(int mode);
  bool stage_other_cache() const { return stage_other_cache_; }
  double probe_ns() const { return probe_ns_; }
  void set_timeout(double timeout_s) { timeout_s_ = timeout_s; }
  // Whether waits may spin before they sleep: on by default when every rank has a core (never
  // otherwise); a caller whose rank computes on other threads while it waits (an async call's worker,
  // the c10d backend's worker thread) turns it off to leave them the core, and may turn it on again for
  // a blocking call. [Note: waiting in the shared-memory collectives] in shm_wait.h.
  void set_spin(bool spin) { spin_ = spin && spin_allowed_; }
  // How many distinct cpus the host's ranks may run on, together (the union of their affinity masks):
  // waits may spin when that is at least the number of ranks. The constructor assumes this process's
  // own affinity, which undercounts once a launcher has bound each rank to its own cores. Resets spin().
  void set_host_cpus(int cpus) { spin_ = spin_allowed_ = nranks_ <= cpus; }
  bool spin() const { return spin_; }
  // Single copy ([Note: single copy between a host's ranks], shm_single_copy.cpp): a large all-gather
  // reads each peer's input straight from its memory (process_vm_readv) instead of through the slots.
  // The ranks decide together, once, at the first call that could use it: on only if every rank allows
  // it (set_single_copy(false): RINGZERO_SINGLE_COPY=0) and the kernel lets every rank read every peer.
  // Call before the first all-gather; later calls do not change a decision made.
  void set_single_copy(bool allowed) { single_copy_allowed_ = allowed; }
  // 0: not yet decided, 1: in use, 2: off (a rank did not allow it, or the kernel refused).
  int single_copy() const { return static_cast<int>(single_copy_); }
  // All-gathers that read their peers' inputs directly so far (the rest staged).
  uint64_t single_copy_calls() const { return single_copy_calls_; }

  // All pointers are this process's memory; counts are elements. `in` may equal `out` where shapes
  // allow (all_reduce, broadcast, reduce). Every rank of the host must call the same collective with
  // the same dtype, count (per rank) and root.
  void all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                  AllReduceAlgo algo = AllReduceAlgo::Auto);
  // in: nranks * count_per_rank elements, out: count_per_rank elements (this rank's block).
  void reduce_scatter(const void* in, void* out, size_t count_per_rank, DType dtype, ReduceOp op);
  // in: count elements, out: nranks * count elements in rank order.
  void all_gather(const void* in, void* out, size_t count, DType dtype);
  // in: counts[rank] elements, out: sum(counts) elements, rank q's block at sum(counts[:q]).
  void all_gather_v(const void* in, void* out, const std::vector<size_t>& counts, DType dtype);
  // in: sum(send_counts) elements, block q (send_counts[q]) for rank q, in rank order; out:
  // sum(recv_counts) elements, rank q's block for this rank (recv_counts[q]) at sum(recv_counts[:q]).
  // Rank q's send_counts[p] must equal rank p's recv_counts[q]: otherwise every rank raises
  // CollectiveMismatchError naming the pair. `in` and `out` must not overlap. [Note: the all-to-all's
  // count table] in shm_alltoall.cpp.
  void all_to_all_v(const void* in, void* out, const std::vector<size_t>& send_counts,
                    const std::vector<size_t>& recv_counts, DType dtype);
  // in: count elements; only root's out (nranks * count elements, rank order) is written.
  void gather(const void* in, void* out, size_t count, DType dtype, int root);
  // root's in: nranks * count elements, block q for rank q; every rank's out: count elements.
  void scatter(const void* in, void* out, size_t count, DType dtype, int root);
  void broadcast(void* buf, size_t count, DType dtype, int root);
  // Only `root`'s out is written.
  void reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, int root);
  void barrier();

  // Registered memory ([Note: registered tensors], shm_window.cpp): every local rank calls it together with
  // the same `bytes`; returns this rank's handle on one new segment holding a region of `bytes` per rank
  // (its own: region(rank())). all_reduce (in place), reduce_scatter and all_gather then read an input
  // that lies in such a region straight from the peers' regions.
  std::shared_ptr<ShmWindow> create_window(size_t bytes);
  // ZeRO++'s dequantizing all-gather is a free function beside the collectives: shm_quantized.h.

  // Steps outside the segment. set_away(peers): this rank now waits on `peers` (group ranks, at most
  // two: a ring's neighbours) over the network, as in the hierarchical all-reduce's cross-host step;
  // set_away({}) when it is back. A local peer that times out waiting for this rank names them. abort(reason):
  // such a step failed; every local rank's wait (now or later) raises CommTimeout quoting `reason`, the
  // same as after a timeout here. Both only publish; neither waits.
  void set_away(const std::vector<int>& peers);
  void abort(const std::string& reason) { abort_all(reason); }

  // The algorithm Auto picks for this message size (exposed for tests and the benchmark): the selector's
  // (select.h).
  AllReduceAlgo choose_all_reduce(size_t bytes) const;

  // This rank's last kHistory collectives, oldest first, for the flight recorder (comm/flight.py):
  // the callers' fast path records nothing itself. Times are steady-clock seconds (CLOCK_MONOTONIC,
  // the clock of Python's time.perf_counter); seconds < 0 while the op runs.
  struct OpRecord {
    enum Status : int32_t { Running = 0, Ok = 1, Failed = 2 };
    uint64_t seq;
    CollectiveKind kind;
    DType dtype;
    uint64_t count;
    double start_s;
    double seconds;
    Status status;
  };
  static constexpr int kHistory = 64;
  std::vector<OpRecord> history() const;
  // Seconds spent inside collectives since construction.
  double busy_s() const { return busy_s_; }

 public:
  struct Header;   // defined in shm_slots.h
  struct Control;

 private:
  friend class SliceContext;
  // One slice of a collective, as run_slices hands it to the collective's steps.
  struct Slice {
    size_t index;   // 0 for the collective's first slice
    size_t offset;  // elements: this slice of the count run_slices was given
    size_t count;
    uint64_t k;     // this rank's slice counter: slot parity k & 1
  };
  static constexpr int kWaitAll = -1;   // run_slices' wait_on: every rank, every slice
  static constexpr int kWaitNone = -2;  // after the first slice, no one

  Control* control(int r) const;
  const Header* header() const;
  char* slot(int r, uint64_t slice) const;

  // Slice bookkeeping and synchronisation ([Note: the slot protocol], shm_slots.h).
  template <typename Stage, typename Meanwhile, typename Consume>
  void run_slices(size_t count, size_t slice_elems, int wait_on, Stage stage, Meanwhile meanwhile,
                  Consume consume);
  uint64_t begin_slice();  // waits until every rank finished slice k-2; returns k
  void end_slice(uint64_t k);
  void signal();  // this rank finished one more phase
  void wait_for(const std::vector<int>& ranks, uint64_t phase);
  void wait_all(uint64_t phase);
  void wait_one(int r, uint64_t phase);
  WaitWord wait_word(int q, std::atomic<uint32_t>& word) const;
  void check_peer(int q, double t);  // a wait's periodic check when it waits on local rank q alone
  // Whether `peer` runs on another last-level cache than this rank: a few cache-line round trips on
  // the probe lines, which both ranks must run at the same point; the verdict moves only when two probes
  // in a row agree. See [Note: where the host runs ...].
  bool peer_on_other_cache(int peer);
  void start_op(CollectiveKind kind, DType dtype, ReduceOp op, int root, uint64_t count);
  void finish_op(OpRecord::Status status = OpRecord::Ok);
  // Starts an op and, when the scope ends without an exception, records it as this rank's last
  // completed op (peers print it when they time out waiting for us); the history records both ends.
  struct OpGuard {
    ShmComm* comm;
    int uncaught;
    OpGuard(ShmComm* c, CollectiveKind kind, DType dtype, ReduceOp op, int root, uint64_t count)
        : comm(c), uncaught(std::uncaught_exceptions()) {
      comm->start_op(kind, dtype, op, root, count);
    }
    ~OpGuard() { comm->finish_op(std::uncaught_exceptions() == uncaught ? OpRecord::Ok : OpRecord::Failed); }
  };
  std::string last_completed_table() const;
  void publish_fingerprint(uint64_t k);
  void check_fingerprints(uint64_t k);
  [[noreturn]] void fail_wait(const std::vector<int>& missing, uint64_t phase, const char* why);
  void check_abort() const;
  void abort_all(const std::string& reason);

  // Staging with streaming stores while the two ranks sit on two last-level caches ([Note: where the host
  // runs the ranks' cores], shm_placement.cpp): whether this call of `bytes` starts streaming (the last
  // verdict, as the selector's stage_copy reads it), and the re-probe at its first slice's consume step,
  // which updates `stream`.
  bool stage_streaming(size_t bytes) const;
  void reprobe_staging(const Slice& sl, size_t bytes, bool& stream);
  // The facts of a call the selector plans from (select.h), this communicator's part filled in.
  CpuCall call_facts(CpuOp op, size_t bytes) const;
  // The selector's plan for `call` whose input is `in`: looks for its window where the selector says to
  // (`w`: the window found, the registered path's), then plans.
  CpuPlan plan_call(CpuCall call, const void* in, CollectiveKind kind, std::shared_ptr<ShmWindow>& w) const;
  // The single-copy all-gather; false when the first probe found it refused, or, where the plan says
  // `huge_pages_only` (a large block), an input is not on huge pages on every rank (then nothing but, for a
  // smaller block, this rank's own block of `out` is written, and the caller runs the staged all-gather).
  bool all_gather_single_copy(const char* in, char* out, size_t count, size_t es, bool huge_pages_only);
  // The window of this communicator whose own region holds [p, p + bytes), else nullptr (and on one rank);
  // InvalidArgument for another group's window (`kind` names the collective). Whether to look is the
  // selector's (window_wanted).
  std::shared_ptr<ShmWindow> registered(const void* p, size_t bytes, CollectiveKind kind) const;
  // The registered collectives' first synchronisation (fingerprints and offsets compared) and last.
  void start_registered(const ShmWindow& w, const char* in);
  void finish_registered();
  // Single copy's vote, at the first call that could use it, on every rank together: this rank reads a few
  // bytes at peer_addr[q] of every peer q (unless set_single_copy(false)), publishes the verdict, and all
  // read all; sets single_copy_ (On only if every rank could) and returns whether it is on. One phase.
  bool vote_single_copy(const std::vector<uint64_t>& peer_addr, size_t probe_bytes);
  // Copies `bytes` from address `src` of local rank q's process into `dst` (process_vm_readv).
  void read_peer(int q, void* dst, uint64_t src, size_t bytes);
  using SingleCopy = SingleCopyVote;  // select.h

  ShmSegment seg_;
  int rank_;
  int nranks_;
  size_t slot_bytes_;
  double timeout_s_;
  std::vector<int> group_ranks_;
  std::vector<int> all_ranks_;  // 0..nranks-1
  uint64_t phase_ = 0;  // phases this rank has signalled
  uint64_t slice_ = 0;  // slices this rank has started
  uint64_t seq_ = 0;    // collectives this rank has started
  Fingerprint current_{};
  uint64_t current_hash_ = 0;      // of current_, as published in line 0
  std::vector<uint64_t> seen_done_;  // per local rank: a value of its `done` seen earlier (a lower bound)
  std::vector<const void*> srcs_;    // the reductions' source pointers (one collective runs at a time)
  double op_start_ = 0;     // steady-clock seconds
  double op_deadline_ = 0;  // steady-clock seconds
  double busy_s_ = 0;
  OpRecord history_[kHistory] = {};
  bool spin_allowed_ = true;  // false when more ranks than cores
  bool spin_ = true;          // waits spin before they sleep (see set_spin)
  uint64_t probes_ = 0;       // peer_on_other_cache calls so far (the same on every rank)
  double probe_ns_ = 0;       // and the fastest round trip of the last one
  bool probe_split_ = false;      // the last probe's own reading: the peer on another last-level cache
  bool placement_split_ = false;  // the verdict: changed only when two probes in a row agree on it
  uint64_t staged_calls_ = 0;        // since the last staging probe: calls that may stream (the same on
  uint64_t staged_bytes_ = 0;        // every rank) and their bytes; the first such call probes
  bool staged_probed_ = false;
  bool stage_other_cache_ = false;   // the last re-probe's verdict (reprobe_staging)
  int stage_stream_mode_ = 2;        // set_stage_streaming
  SingleCopy single_copy_ = SingleCopy::Untested;  // the same on every rank (decided together)
  bool single_copy_allowed_ = true;                // this rank's vote (set_single_copy)
  uint64_t single_copy_calls_ = 0;
  uint64_t windows_made_ = 0;   // create_window calls: the windows' ids, the same on every rank
  uint64_t current_slice_ = 0;  // the registered collective's slice (start_registered to finish_registered)
};

}  // namespace ringzero
