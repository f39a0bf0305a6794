"""The single-copy all-gather ([Note: single copy between a host's ranks], csrc/core/shm_single_copy.cpp):
ranks that are processes read each other's blocks with process_vm_readv. Reference: the blocks each rank
built, concatenated in rank order (integers: exact).

- Blocks just under 64 KiB (staged), at 64 KiB, a prime count past it, just under 8 MiB (the largest
  read directly on 4 KiB pages) and 8 MiB (staged again: torch's tensors here are on 4 KiB pages); in place and not; blocking (the api's native entry) and
  async (the worker thread); world sizes 2, 3 and 4.
- No rank may return while a peer still reads its input: each rank changes its input right after every
  call, and the next call's result must show only the new values.
- The kernel's refusal, as a container's seccomp profile gives it: one rank's process_vm_readv is made to
  fail with EPERM. Every rank then stages (single_copy == 2 everywhere) and the results are the same.
- RINGZERO_SINGLE_COPY=0: staged throughout.
- Blocks of 8 MiB and more are read directly only when every rank's input lies on huge pages (each rank's
  input an mmap advised for transparent huge pages, or against them on one rank): `single_copy_calls` tells
  which path ran, the same on every rank, and the results are exact either way.
"""
import ctypes
import errno
import mmap
import os
import platform

import pytest
import torch
import torch.distributed as dist

import ringzero
from harness import run_ranks
from ringzero import _C
from ringzero.comm.communicator import get_communicator

MIN, END = _C.CPU_THRESHOLDS["single_copy_min_bytes"], _C.CPU_THRESHOLDS["single_copy_end_bytes"]  # csrc/core/select.h


def refuse_process_vm_readv():
    """Makes process_vm_readv fail with EPERM in every thread of this process (a seccomp filter, synced
    to all threads), as a container's profile does; checks that it now does."""
    nr = {"x86_64": (310, 317)}[platform.machine()]  # process_vm_readv, seccomp
    libc = ctypes.CDLL(None, use_errno=True)

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    ld_nr, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS (seccomp_data.nr), BPF_JMP|BPF_JEQ|BPF_K, BPF_RET
    code = (Filter * 4)(Filter(ld_nr, 0, 0, 0), Filter(jeq, 0, 1, nr[0]),
                        Filter(ret, 0, 0, 0x00050000 | errno.EPERM), Filter(ret, 0, 0, 0x7FFF0000))
    program = Program(4, code)
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    assert libc.syscall(nr[1], 1, 1, ctypes.byref(program)) == 0, ctypes.get_errno()  # SET_MODE_FILTER, TSYNC

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    buf = ctypes.create_string_buffer(8)
    io = IoVec(ctypes.cast(buf, ctypes.c_void_p), 8)
    assert libc.process_vm_readv(os.getpid(), ctypes.byref(io), 1, ctypes.byref(io), 1, 0) == -1
    assert ctypes.get_errno() == errno.EPERM


def block(rank: int, count: int, dtype, generation: int) -> torch.Tensor:
    """Rank `rank`'s block: distinct in every element, rank and generation."""
    return (torch.arange(count, dtype=torch.int64) * 7 + rank * 1_000_003 + generation * 17).to(dtype)


def _cases(rank, world, refuse, want_state):
    if refuse == rank:
        refuse_process_vm_readv()
    comm = get_communicator(dist.group.WORLD)
    checked = 0
    for nbytes, dtype in [(MIN - 4, torch.int32), (MIN, torch.int32), (MIN + 8 * 2003, torch.int64),
                          (END - 8, torch.int64), (END, torch.int32)]:
        count = nbytes // torch.tensor([], dtype=dtype).element_size()
        want = torch.cat([block(q, count, dtype, 0) for q in range(world)])
        for in_place in (False, True):
            for async_op in (False, True):
                out = torch.full((world * count + 1,), -1, dtype=dtype)
                mine = out[rank * count:(rank + 1) * count] if in_place else block(rank, count, dtype, 0)
                if in_place:
                    mine.copy_(block(rank, count, dtype, 0))
                work = ringzero.all_gather_single(out[:-1], mine, async_op=async_op)
                if async_op:
                    work.wait()
                assert torch.equal(out[:-1], want), (nbytes, dtype, in_place, async_op)
                assert out[-1].item() == -1, "wrote past the output"
                checked += 1
    # Inputs changed right after each call: every call sees only its own generation.
    count = (256 << 10) // 4 + 1
    mine, out = block(rank, count, torch.int32, 0), torch.empty(world * count, dtype=torch.int32)
    for generation in range(40):
        ringzero.all_gather_single(out, mine)
        want = torch.cat([block(q, count, torch.int32, generation) for q in range(world)])
        assert torch.equal(out, want), f"generation {generation}: a peer read an input that had changed"
        mine.copy_(block(rank, count, torch.int32, generation + 1))
    assert comm.shm.single_copy == want_state, (comm.shm.single_copy, want_state)
    return checked


@pytest.mark.parametrize("world, refuse, env, want_state", [
    (2, None, {}, 1), (3, None, {}, 1), (4, None, {}, 1),
    (3, 1, {}, 2), (2, None, {"RINGZERO_SINGLE_COPY": "0"}, 2)],
    ids=["2-ranks", "3-ranks", "4-ranks", "3-ranks-rank1-refused", "2-ranks-turned-off"])
def test_single_copy_all_gather_matches_the_blocks(world, refuse, env, want_state):
    if refuse is not None and platform.machine() != "x86_64":
        pytest.skip("the refusal is planted with an x86-64 seccomp filter")
    checked = run_ranks(world, _cases, refuse, want_state, env=env, timeout_s=240)
    assert checked == [20] * world


def _anon_huge_kib(address: int) -> int:
    """AnonHugePages (KiB) of the mapping of this process that holds `address`, from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


def _pagemap_scan_works() -> bool:
    """Whether the kernel has PAGEMAP_SCAN (Linux 6.7+), which on_huge_pages asks."""
    release = tuple(int(p) for p in platform.release().split("-")[0].split(".")[:2])
    return release >= (6, 7)


def _huge_page_cases(rank, world, small_rank):
    comm = get_communicator(dist.group.WORLD)
    # Private: shared anonymous memory gets no transparent huge pages unless shmem_enabled says so.
    probe = mmap.mmap(-1, 3 * END, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    probe.madvise(mmap.MADV_HUGEPAGE)
    probe_t = torch.frombuffer(probe, dtype=torch.uint8)
    probe_t.fill_(1)
    tells = _C.ShmComm.on_huge_pages(probe_t.data_ptr(), probe_t.numel())  # False where the kernel cannot say
    # The independent reference: the kernel's own count of the mapping's huge pages, where it can say so.
    huge_kib = _anon_huge_kib(probe_t.data_ptr())
    if _pagemap_scan_works():
        assert tells == (huge_kib >= 2 * 3 * END // 3 // 1024), (tells, huge_kib)
    want_direct = int(tells and small_rank is None)
    inputs = []  # the mappings outlive the calls that read them
    for nbytes in (END, 2 * END + 4 * 1009):
        count = nbytes // 4
        want = torch.cat([block(q, count, torch.int32, 0) for q in range(world)])
        for async_op in (False, True):
            buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            buf.madvise(mmap.MADV_NOHUGEPAGE if rank == small_rank else mmap.MADV_HUGEPAGE)
            mine = torch.frombuffer(buf, dtype=torch.int32)
            mine.copy_(block(rank, count, torch.int32, 0))
            inputs.append((buf, mine))
            out = torch.full((world * count + 1,), -1, dtype=torch.int32)
            before = comm.shm.single_copy_calls
            work = ringzero.all_gather_single(out[:-1], mine, async_op=async_op)
            if async_op:
                work.wait()
            assert torch.equal(out[:-1], want), (nbytes, async_op)
            assert out[-1].item() == -1, "wrote past the output"
            assert comm.shm.single_copy_calls - before == want_direct, (nbytes, async_op, tells, small_rank)
    return tells


@pytest.mark.parametrize("world, small_rank", [(2, None), (3, None), (2, 1)],
                         ids=["2-ranks-huge", "3-ranks-huge", "2-ranks-rank1-small-pages"])
def test_single_copy_of_large_blocks_only_on_huge_pages(world, small_rank):
    tells = run_ranks(world, _huge_page_cases, small_rank, timeout_s=240)
    assert len(set(tells)) == 1, tells
    print(f"the kernel tells huge pages apart: {tells[0]} (if not, every case staged)")
