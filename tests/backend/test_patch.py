"""ringzero.patch(): torch.distributed.all_reduce, reduce_scatter_tensor / reduce_scatter_single,
all_gather_into_tensor / all_gather_single and broadcast on an existing gloo group run ringzero's
collectives while patched, and torch's afterwards.

Reference: gloo's own results for the same calls, computed with torch's functions (saved before
patching). That ringzero ran is seen from its Communicator's sequence number for the group, which
only ringzero's collectives advance; calls ringzero cannot take (bitwise ops, non-contiguous
tensors) must still give gloo's answer through torch's path.
"""
import pytest
import torch
import torch.distributed as dist

import ringzero
from harness import run_ranks
from ringzero.comm import torch_compat
from reference import check_equal, make

# ringzero's name -> this torch's name for the same op (the *_single names exist from torch 2.13 on).
TORCH_NAMES = {"all_reduce": "all_reduce", "reduce_scatter_single": torch_compat.REDUCE_SCATTER_SINGLE,
               "all_gather_single": torch_compat.ALL_GATHER_SINGLE, "broadcast": "broadcast"}
TORCH_FNS = {name: getattr(dist, torch_name) for name, torch_name in TORCH_NAMES.items()}


def calls(rank, world, group, fns):
    """The routed ops on `group` through the functions in `fns`; returns their outputs."""
    x = make(rank, 1031, torch.float32)
    out = {}
    y = x.clone()
    fns["all_reduce"](y, op=dist.ReduceOp.MAX, group=group)
    out["all_reduce"] = y
    big = make(rank, 7 * world, torch.int32, salt=1)
    o = torch.empty(7, dtype=torch.int32)
    fns["reduce_scatter_single"](o, big, group=group)
    out["reduce_scatter"] = o
    o = torch.empty(13 * world, dtype=torch.bfloat16)
    work = fns["all_gather_single"](o, make(rank, 13, torch.bfloat16), group=group, async_op=True)
    work.wait()
    out["all_gather"] = o
    b = make(rank, 100, torch.int64, salt=3)
    fns["broadcast"](b, src=world - 1, group=group)
    out["broadcast"] = b
    return out


def body(rank, world):
    group = dist.new_group(backend="gloo")
    want = calls(rank, world, group, TORCH_FNS)
    comm = ringzero.get_communicator(group)

    with ringzero.patch():
        assert ringzero.comm.is_patched() and dist.all_reduce is not TORCH_FNS["all_reduce"]
        before = comm.seq
        routed = {name: getattr(dist, torch_name) for name, torch_name in TORCH_NAMES.items()}
        got = calls(rank, world, group, routed)
        assert comm.seq - before == 4, "the four calls did not run on ringzero"
        # The deprecated names route too.
        o = torch.empty(5 * world)
        dist.all_gather_into_tensor(o, torch.full((5,), float(rank)), group=group)
        check_equal(o, torch.arange(world, dtype=torch.float32).repeat_interleave(5), "all_gather_into_tensor")
        assert comm.seq - before == 5
        # What ringzero cannot run goes to torch unchanged, with gloo's answer.
        bits = torch.tensor([0b1011, 0b0110], dtype=torch.int32) ^ rank
        ref = bits.clone()
        TORCH_FNS["all_reduce"](ref, op=dist.ReduceOp.BOR, group=group)
        dist.all_reduce(bits, op=dist.ReduceOp.BOR, group=group)
        check_equal(bits, ref, "BOR through torch's path")
        assert comm.seq - before == 5
    for name, t in got.items():
        check_equal(t, want[name], f"patched {name}")
    assert not ringzero.comm.is_patched() and dist.all_reduce is TORCH_FNS["all_reduce"]

    # Plain call, then unpatch().
    ringzero.patch()
    before = comm.seq
    t = make(rank, 10, torch.float64)
    ref = t.clone()
    TORCH_FNS["all_reduce"](ref, group=group)
    dist.all_reduce(t, group=group)
    check_equal(t, ref, "plain patch() all_reduce")
    assert comm.seq == before + 1
    ringzero.unpatch()
    dist.all_reduce(t, group=group)
    assert comm.seq == before + 1 and dist.all_reduce is TORCH_FNS["all_reduce"]
    return True


@pytest.mark.parametrize("world", [1, 3])
def test_patch_routes_to_ringzero(world):
    assert all(run_ranks(world, body))
