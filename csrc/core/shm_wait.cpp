// ShmComm's waits for its peers and how a failed wait ends: the culprit's diagnosis (which rank is
// missing, whether it exited or is itself waiting on the network, each rank's last completed op) and the
// abort that every local rank then raises. The wait loop itself is wait_until (shm_wait.h).
#include "shm_wait.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "errors.h"
#include "shm_slots.h"

namespace ringzero {

int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

bool process_gone(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close_paren = std::strrchr(buf, ')');  // the command name may contain spaces
  return close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

namespace {

constexpr const char* kTimedOut = "Timed out";  // fail_wait adds the timeout to this reason

std::string join(const std::vector<int>& v) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << "]";
  return s.str();
}

}  // namespace

void ShmComm::wait_one(int r, uint64_t phase) { wait_for(std::vector<int>{r}, phase); }

void ShmComm::wait_all(uint64_t phase) { wait_for(all_ranks_, phase); }

void ShmComm::wait_for(const std::vector<int>& ranks, uint64_t phase) {
  size_t ready = 0;  // counters only grow, so ranks[0..ready) stay ready
  const Header* h = header();
  wait_until(
      spin_,
      [&] {
        while (ready < ranks.size() && control(ranks[ready])->arrive.load(std::memory_order_acquire) >= phase) {
          // `done` shares the line just fetched, and the acquire above makes every earlier store of
          // that rank visible: keep it as the lower bound begin_slice checks first.
          seen_done_[ranks[ready]] = control(ranks[ready])->done.load(std::memory_order_relaxed);
          ++ready;
        }
        return ready == ranks.size();
      },
      [&] { return wait_word(ranks[ready], control(ranks[ready])->arrive_word); },
      [&](double t) {
        check_abort();
        for (size_t i = ready; i < ranks.size(); ++i) {
          const int q = ranks[i];
          if (control(q)->arrive.load(std::memory_order_acquire) < phase && process_gone(h->pids[q].load()))
            fail_wait(ranks, phase, "a peer exited");
        }
        if (t > op_deadline_) fail_wait(ranks, phase, kTimedOut);
      });
}

// The periodic check of a wait on the one local rank q (a slot to free, a probe to answer).
void ShmComm::check_peer(int q, double t) {
  check_abort();
  const bool gone = process_gone(header()->pids[q].load());
  if (gone || t > op_deadline_) fail_wait({q}, 0, gone ? "a peer exited" : kTimedOut);
}

std::string ShmComm::last_completed_table() const {
  std::ostringstream s;
  s << "last completed op per group rank:";
  for (int q = 0; q < nranks_; ++q) {
    const uint64_t seq = control(q)->last_seq.load(std::memory_order_acquire);
    s << (q ? ", " : " ") << group_ranks_[q] << ": ";
    if (seq == 0) s << "none";
    else s << collective_name(static_cast<CollectiveKind>(control(q)->last_kind.load())) << " #" << seq;
  }
  return s.str();
}

void ShmComm::fail_wait(const std::vector<int>& ranks, uint64_t phase, const char* why) {
  const Header* h = header();
  std::vector<int> missing, exited;
  std::ostringstream away;  // missing ranks that are alive but waiting on the network (set_away)
  for (int q : ranks) {
    const bool behind = phase == 0 || control(q)->arrive.load(std::memory_order_acquire) < phase;
    if (!behind) continue;
    missing.push_back(group_ranks_[q]);
    if (process_gone(h->pids[q].load())) {
      exited.push_back(group_ranks_[q]);
      continue;
    }
    // Alive, and maybe itself waiting in the cross-host step of the hierarchical all-reduce: the fault
    // is there, and this rank's clock can run out before that rank's does.
    std::vector<int> far;
    for (const auto& a : control(q)->away)
      if (const int v = a.load(std::memory_order_relaxed); v > 0 && std::find(far.begin(), far.end(), v - 1) == far.end())
        far.push_back(v - 1);
    if (far.empty()) continue;
    away << "; group rank " << group_ranks_[q]
         << " is alive and in its cross-host step, waiting on the network with group rank" << (far.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < far.size(); ++i) away << (i ? " and " : "") << far[i];
    away << " (look there first: that rank, its host, the link)";
  }
  std::ostringstream s;
  s << "ringzero " << collective_name(static_cast<CollectiveKind>(current_.kind)) << " (sequence number "
    << current_.seq << ") on group rank " << group_ranks_[rank_] << ": " << why;
  // "Timed out waiting <n>ms" is gloo's wording, which torch's tests and callers match.
  if (std::strcmp(why, kTimedOut) == 0) s << " waiting " << std::llround(timeout_s_ * 1000) << "ms (the op's timeout)";
  s << "; still waiting for group ranks " << join(missing);
  if (!exited.empty()) s << "; ranks " << join(exited) << " have exited";
  s << away.str() << ". " << last_completed_table()
    << ". Every rank must call the same collectives in the same order; raise RINGZERO_TIMEOUT_S if "
       "a rank is legitimately slow.";
  abort_all(s.str());
  throw CommTimeoutError(s.str());
}

void ShmComm::set_away(const std::vector<int>& peers) {
  if (peers.size() > 2) throw InvalidArgument("set_away takes at most 2 peers (a ring's two neighbours)");
  for (size_t i = 0; i < 2; ++i) {
    const int v = i < peers.size() ? peers[i] : -1;
    if (v < -1) throw InvalidArgument("set_away: peers are group ranks (>= 0), got " + std::to_string(v));
    control(rank_)->away[i].store(v + 1, std::memory_order_relaxed);
  }
}

void ShmComm::abort_all(const std::string& reason) {
  Header* h = static_cast<Header*>(seg_.data());
  int32_t expected = -1;
  // Claimed first (one writer of the text), published with the rank after the text: a reader that sees a
  // rank sees its whole reason. Before, the rank came first and a waiter could quote an empty reason.
  if (h->abort_rank.compare_exchange_strong(expected, kAbortClaimed)) {
    std::snprintf(h->abort_reason, sizeof(h->abort_reason), "%s", reason.c_str());
    h->abort_rank.store(rank_, std::memory_order_release);
  }
}

void ShmComm::check_abort() const {
  const Header* h = header();
  const int32_t who = h->abort_rank.load(std::memory_order_acquire);
  if (who < 0 || who == rank_) {  // -1 healthy; kAbortClaimed: the text is being written, seen at the next check
    if (who == rank_)
      throw CommTimeoutError("ringzero communicator on group rank " + std::to_string(group_ranks_[rank_]) +
                             " was aborted by an earlier error; create a new process group");
    return;
  }
  throw CommTimeoutError("ringzero " + std::string(collective_name(static_cast<CollectiveKind>(current_.kind))) +
                         " (sequence number " + std::to_string(current_.seq) + ") on group rank " +
                         std::to_string(group_ranks_[rank_]) + ": the communicator was aborted by group rank " +
                         std::to_string(group_ranks_[who]) + ": " + std::string(h->abort_reason));
}

}  // namespace ringzero
