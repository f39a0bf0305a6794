#!/usr/bin/env python3
"""The CPU-grid tests can fail: planted defects in a copy of the CUDA kernels, one at a time.

Copies the working tree to a temporary folder, checks that the unchanged kernels pass, then for each
planted defect (a dropped release store, an acquire turned into a plain load, a dropped __syncthreads,
an off-by-one in a block's last slice, an epoch not bumped, a ring credit one slot early, the issue-15
per-slice partition, a dropped two-shot barrier, an unclaimed timeout record, a 16-byte pack taken at
8-byte alignment in the collectives and at half its alignment in Adam, ring credits counted per
launch, a dropped Adam bias correction, the all-to-all's prefix sum off by one, its read barrier
dropped, its blocks placed by the receiver's own counts, its packs at 8-byte alignment, its output
not cut, each of the ring driver's three stream waits dropped, a host
read and a host write of device memory, a process opening its own IPC handle) rebuilds the CPU-grid
tests and runs them: first the plain build (wrong values, a timeout, a crash, the grid's device-memory
fault), then, if that passed, the ThreadSanitizer build (a data race). Prints a table: every defect
must be caught. Takes about 20 minutes on 2 cores; not part of CI (docs/status.md: the table of its
last run).

    python3 tools/cpu_grid_mutations.py [--only NAME[,NAME...]] [--keep]
"""
import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

# name, file, text to find, replacement, occurrence to replace (1-based; 0: every one), test to run.
# Text and replacement may be tuples of the same length: each pair is applied in turn (one defect that
# needs edits in several places).
MUTANTS = [
    ("release-dropped", "csrc/cuda/ring.cu",
     "if (send) store_release_sys(&peers->signal[right]->ready[c], sent);",
     "if (send) peers->signal[right]->ready[c] = sent;", 1, "fuzz",
     "ring: the 'slice is ready' flag written with a plain store (release dropped)"),
    ("acquire-plain", "csrc/cuda/device.cuh",
     "if (load_acquire_sys(flag) >= target) return true;",
     "if (*flag >= target) return true;", 0, "fuzz",
     "every wait reads its flag with a plain load (acquire dropped)"),
    ("syncthreads-dropped", "csrc/cuda/device.cuh",
     "  __syncthreads();  // the block's writes happen before thread q's release",
     "  // (dropped) the block's writes happen before thread q's release", 1, "fuzz",
     "block_barrier: the __syncthreads before the release dropped"),
    ("last-slice-off-by-one", "csrc/cuda/oneshot.cu",
     "hi = end < len ? end : len;",
     "hi = end < len ? end : len - 1;", 1, "fuzz",
     "one-shot: a block's part of the last slice ends one element early"),
    ("epoch-not-bumped", "csrc/cuda/device.cuh",
     "if (threadIdx.x == 0) self->epoch[b] = target;",
     "(void)target;", 1, "fuzz",
     "block_barrier: the epoch flag reused without being bumped"),
    ("ring-credit-early", "csrc/cuda/ring.cu",
     "sent + 1 - kRingSteps, WaitKind::RingCredit",
     "sent - kRingSteps, WaitKind::RingCredit", 1, "fuzz",
     "ring: a FIFO slot rewritten one credit early"),
    ("issue-15-partition", "csrc/cuda/oneshot.cu",
     "const size_t lo = begin < len ? begin : len, hi = end < len ? end : len;",
     "size_t lo, hi;\n    block_part<T>(len, blockIdx.x, gridDim.x, &lo, &hi);", 1, "fuzz",
     "one-shot: each slice partitioned by its own length (the issue-15 race)"),
    ("twoshot-barrier-dropped", "csrc/cuda/twoshot.cu",
     "    if (!block_barrier(w)) return;\n    for (int k = 0; k < n; ++k)\n      copy_block(out",
     "    for (int k = 0; k < n; ++k)\n      copy_block(out", 1, "fuzz",
     "two-shot: the barrier between the reduce and the gather dropped"),
    ("timeout-record-unclaimed", "csrc/cuda/device.cuh",
     "if (atomicCAS(w.claim, 0u, 1u) != 0u) return;",
     "atomicCAS(w.claim, 0u, 1u);", 1, "timeout",
     "a wait that runs out writes the timeout record without claiming it first"),
    ("pack-alignment-8", "csrc/cuda/device.cuh",
     "size_t vec_len = (misalign % kPackBytes == 0) ? len / N * N : 0;",
     "size_t vec_len = (misalign % 8 == 0) ? len / N * N : 0;", 1, "fuzz",
     "the 16-byte packs taken wherever the buffers are 8-byte aligned (a view 8 bytes into its storage)"),
    ("adam-alignment-half", "csrc/cuda/adam.cu",
     "return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;",
     "return p == nullptr || reinterpret_cast<uintptr_t>(p) % (bytes / 2) == 0;", 1, "adam",
     "Adam: an operand taken as pack-aligned at half its pack's alignment"),
    ("ring-credits-per-launch", "csrc/cuda/ring.cu",
     ("  uint64_t sent, recvd;",
      "  ch.sent = ch.recvd = a.peers.signal[r]->steps[c];",
      "if (ok && send && sent + 1 > kRingSteps)"),
     ("  uint64_t sent, recvd, launch_base;",
      "  ch.sent = ch.recvd = ch.launch_base = a.peers.signal[r]->steps[c];",
      "if (ok && send && sent + 1 - launch_base > kRingSteps)"), 1, "fuzz",
     "ring: slot credits counted from each launch, so its first sends overwrite slots the right neighbour "
     "may still be reading from the previous launch (caught only when ranks drift)"),
    ("adam-bias-correction", "csrc/cuda/adam.cu",
     "c.step_size = lr / (1.0f - powf(h.beta1, step));",
     "c.step_size = lr;", 1, "adam",
     "Adam: the first moment's bias correction dropped"),
    ("driver-recv-wait-dropped", "csrc/nccl/ring_driver.cpp",
     '  check(cudaStreamWaitEvent(reduce_, recv_done_, 0), "wait for the received slice");\n',
     "", 1, "loopback",
     "ring driver: the reduction stream no longer waits for the received slice (only asynchronous streams "
     "can see it)"),
    ("driver-reduced-wait-dropped", "csrc/nccl/ring_driver.cpp",
     '    check(cudaStreamWaitEvent(comm_, reduced_[st.slice], 0), "wait for the reduced slice");\n',
     "    ;\n", 1, "loopback",
     "ring driver: the transfer stream sends a slice without waiting for its reduction"),
    ("driver-tmp-free-wait-dropped", "csrc/nccl/ring_driver.cpp",
     '    check(cudaStreamWaitEvent(comm_, tmp_free_[st.tmp], 0), "wait for a free receive buffer");\n',
     "    ;\n", 1, "loopback",
     "ring driver: a receive lands in a staging buffer the previous reduction may still read"),
    ("a2a-prefix-off-by-one", "csrc/cuda/alltoall.cu",
     "if (p < r) before += c;",
     "if (p <= r) before += c;", 1, "alltoall",
     "all-to-all: a peer's block for this rank looked up one block too far (prefix sum off by one)"),
    ("a2a-slot-reused-early", "csrc/cuda/alltoall.cu",
     "    if (!block_barrier(w)) return;\n    if (off + slot >= longest) break;",
     "    if (off + slot >= longest) break;", 1, "alltoall",
     "all-to-all: the barrier after the reads dropped, so the next slice (or launch) rewrites a staging "
     "chunk one epoch early, while peers may still read it"),
    ("a2a-landing-own-counts", "csrc/cuda/alltoall.cu",
     "for (int p = 0; p < q; ++p) at += static_cast<size_t>(load_cg(counts_of(p) + r));",
     "for (int p = 0; p < q; ++p) at += static_cast<size_t>(load_cg(counts_of(r) + p));", 1, "alltoall",
     "all-to-all: a block placed by the receiver's own send counts (right only when the splits are "
     "symmetric)"),
    ("a2a-pack-alignment-8", "csrc/cuda/alltoall.cu",
     "if ((d - s) % kPackBytes == 0) {",
     "if ((d - s) % 8 == 0) {", 1, "alltoall",
     "all-to-all: 16-byte copies taken where source and destination agree only mod 8"),
    ("a2a-output-cut-dropped", "csrc/cuda/alltoall.cu",
     "got = at >= room ? 0 : (got < room - at ? got : room - at);",
     "(void)room;", 1, "alltoall",
     "all-to-all: blocks past the receiver's output not cut (writes past the buffer)"),
    ("host-reads-device-memory", "tests/cpp/test_cuda_fuzz.cu",
     "CUDA_OK(cudaMemcpy(got.data(), b.op[q], out_n * es, cudaMemcpyDeviceToHost));",
     "std::memcpy(got.data(), b.op[q], out_n * es);", 1, "fuzz",
     "the fuzz reads each rank's output with a host memcpy from device memory (a fault on a GPU; on the "
     "grid only a guard that faults can see it)"),
    ("host-writes-signal-block", "csrc/cuda/peer_comm.cpp",
     'cuda_ok(cudaMemset(base, 0, kSignalBytes), "zeroing the signal block");',
     "std::memset(base, 0, kSignalBytes);", 1, "fuzz",
     "PeerComm zeroes its signal block with a host memset of device memory"),
    ("ipc-opens-own-handle", "csrc/cuda/peer_comm.cpp",
     "    if (q == rank_) continue;\n    if (handles[q].size()",
     "    if (handles[q].size()", 1, "fuzz",
     "PeerComm opens every rank's IPC handle, its own too (CUDA refuses a process its own handle)"),
]

TESTS = {
    # plain: the fuzz at a fixed seed with short kernel timeouts; TSan: small blocks (TSan's thread limit)
    "fuzz": ("cpu_grid_test_cuda_fuzz", {"RINGZERO_FUZZ_SEED": "1", "RINGZERO_FUZZ_CASES": "120",
                                         "RINGZERO_FUZZ_TIMEOUT_S": "5"},
             {"RINGZERO_FUZZ_CASES": "40", "RINGZERO_CPU_GRID_THREADS": "64"}),
    "adam": ("cpu_grid_test_cuda_adam", {}, {"RINGZERO_CPU_GRID_THREADS": "64"}),
    "alltoall": ("cpu_grid_test_cuda_alltoall", {"RINGZERO_FUZZ_SEED": "1", "RINGZERO_FUZZ_CASES": "120",
                                                 "RINGZERO_FUZZ_TIMEOUT_S": "5"},
                 {"RINGZERO_FUZZ_CASES": "40", "RINGZERO_CPU_GRID_THREADS": "64"}),
    "timeout": ("cpu_grid_test_cuda_timeout", {}, {"RINGZERO_CPU_GRID_THREADS": "64"}),
    # the ring driver over the loopback transport alone (test_cuda's part; its stream workers pause at
    # random); plain only: under ThreadSanitizer it ran over 6 minutes
    "loopback": ("cpu_grid_test_cuda loopback", {}, None),
}


def run(cmd, env=None, timeout=900, cwd=None):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr, time.time() - t0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out, time.time() - t0


def configure(src, build, tsan):
    flags = ["-DCMAKE_BUILD_TYPE=" + ("RelWithDebInfo" if tsan else "Release"), "-DRINGZERO_CUDA=OFF"]
    if tsan:
        flags += ["-DCMAKE_CXX_FLAGS=-fsanitize=thread", "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread"]
    rc, out, _ = run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", *flags])
    if rc:
        sys.exit(f"cmake failed:\n{out}")


def build_and_test(build, test, tsan):
    command, plain_env, tsan_env = TESTS[test]
    exe, *args = command.split()
    rc, out, _ = run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target", exe], timeout=1800)
    if rc:
        return "build failed", out
    env = dict(os.environ, RINGZERO_CPU_GRID_KERNEL_LOG="")
    env.update(plain_env)
    if tsan:
        env.update(tsan_env)
        env["TSAN_OPTIONS"] = "halt_on_error=1 exitcode=66"
    rc, out, secs = run([str(build / exe), *args], env=env, timeout=900)
    if rc == 0:
        return None, out
    if rc == 66 or "ThreadSanitizer" in out:
        what = "data race"
    elif rc == 124:
        what = "hang (killed)"
    elif rc == 86:
        what = "device-memory fault"
    elif "raised" in out or "timed out" in out:
        what = "CommTimeout"
    elif "CUDA error" in out or "ringzero CUDA" in out:
        what = "CUDA error"
    elif "failures" in out:
        what = "wrong values"
    else:
        what = f"exit {rc}"
    return f"{what} ({secs:.0f} s)", out


def replace_nth(text, old, new, nth, name, path):
    count = text.count(old)
    if count == 0 or (nth > count):
        sys.exit(f"{name}: the text to change is not in {path} (the kernel changed: update this mutant)")
    if nth == 0:
        return text.replace(old, new)
    at = -1
    for _ in range(nth):
        at = text.index(old, at + 1)
    return text[:at] + new + text[at + len(old):]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run only these planted defects (names, comma-separated)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copy")
    args = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="ringzero_mutations_"))
    src = tmp / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    builds = {False: tmp / "plain", True: tmp / "tsan"}
    for tsan, b in builds.items():
        configure(src, b, tsan)
    print("baseline (no defect):", flush=True)
    only = set(args.only.split(",")) if args.only else None
    unknown = (only or set()) - {m[0] for m in MUTANTS}
    if unknown:
        sys.exit(f"--only: no planted defect named {', '.join(sorted(unknown))}")
    for test in sorted({m[5] for m in MUTANTS if not only or m[0] in only}):
        for tsan in (False, True) if TESTS[test][2] is not None else (False,):
            caught, out = build_and_test(builds[tsan], test, tsan)
            print(f"  {test} {'TSan' if tsan else 'plain'}: {'FAILS: ' + caught if caught else 'passes'}", flush=True)
            if caught:
                print(out[-3000:])
                sys.exit("the unchanged kernels must pass before defects are planted")
    rows = []
    for name, path, old, new, nth, test, what in MUTANTS:
        if only and name not in only:
            continue
        target = src / path
        original = mutated = target.read_text()
        for o, n in (zip(old, new) if isinstance(old, tuple) else [(old, new)]):
            mutated = replace_nth(mutated, o, n, nth, name, path)
        target.write_text(mutated)
        try:
            caught, out = build_and_test(builds[False], test, False)
            how = f"plain: {caught}" if caught else None
            if not caught and TESTS[test][2] is not None:
                caught, out = build_and_test(builds[True], test, True)
                how = f"TSan: {caught}" if caught else None
            how = how or "NOT CAUGHT"
        finally:
            target.write_text(original)
        rows.append((name, what, how))
        print(f"{name:26} {how}", flush=True)
    print("\n| planted defect | what it breaks | caught by |\n|---|---|---|")
    for name, what, how in rows:
        print(f"| `{name}` | {what} | {how} |")
    missed = [r for r in rows if r[2] == "NOT CAUGHT"]
    print(f"\n{len(rows) - len(missed)} of {len(rows)} planted defects caught")
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
