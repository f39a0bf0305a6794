"""The public collectives, mirroring torch.distributed: same arguments, shapes and semantics.

Eligibility and argument checks live here (clear ValueError/TypeError naming the argument); the
native code repeats the essential checks as hard errors.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import cuda
from .communicator import FAST, get_communicator
from .types import SUPPORTED_DTYPES, ReduceOp, to_reduce_op
from .work import Work

_SUPPORTED = frozenset(SUPPORTED_DTYPES)


def _resolve_group(group, op: str):
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            f"ringzero.{op}: group=None needs the default process group, but torch.distributed is not "
            "initialized; call torch.distributed.init_process_group('gloo') first"
        )
    if group is None or group is dist.GroupMember.WORLD:
        return dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"ringzero.{op}: group must be a ProcessGroup or None, got {type(group).__name__}")
    return group


def _comm(group, op: str):
    """The Communicator for `group` (None: the default group), or None on ranks outside the group
    (torch.distributed returns without doing anything there; so do we). A known group costs one dict
    lookup and two identity checks."""
    comm = FAST.get(id(group))
    if comm is not None and comm.serves(group):
        return comm
    if not dist.is_initialized():
        _resolve_group(group, op)  # raises the explanatory error
    g = _resolve_group(group, op)
    if dist.get_rank(g) < 0:
        return None
    comm = get_communicator(g, op)
    FAST[id(group)] = comm
    return comm


def _check_tensor(t, arg: str, op: str, cuda_kernel: bool = False) -> bool:
    """Raises for a tensor no collective takes; returns whether it is a CUDA tensor (the one device check
    of a call). cuda_kernel: the op has CUDA kernels (all_reduce, reduce-scatter, all-gather), which take
    fewer dtypes."""
    if type(t) is torch.Tensor and t.dtype in _SUPPORTED and t.is_cpu and t.is_contiguous():
        return False  # the common case, checked cheaply
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"ringzero.{op}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _SUPPORTED:
        names = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
        raise TypeError(f"ringzero.{op}: {arg} has dtype {t.dtype}, which ringzero does not support; use one of {names}")
    if t.device.type == "cuda":
        cuda.check_available(op, arg)
        if cuda_kernel and t.dtype not in cuda.CUDA_DTYPES:
            raise TypeError(f"ringzero.{op}: {arg} is a CUDA tensor of dtype {t.dtype}; the CUDA collectives take "
                            "float32, bfloat16, float16, int32 or int64 (convert it, or use torch.distributed)")
    elif t.device.type != "cpu":
        raise ValueError(
            f"ringzero.{op}: {arg} is on {t.device}; ringzero runs collectives on CPU and CUDA tensors only; "
            f"move it with {arg}.cpu()"
        )
    if not t.is_contiguous():
        raise ValueError(f"ringzero.{op}: {arg} must be contiguous; pass {arg}.contiguous()")
    return t.device.type == "cuda"


def _check_pair(out, out_arg: str, inp, inp_arg: str, op: str):
    """Both tensors valid, of one dtype and on one device."""
    moves_bytes = op in ("all_gather_v", "all_to_all_single", "all_to_all")  # any dtype: no reduction on CUDA
    _check_tensor(out, out_arg, op, cuda_kernel=not moves_bytes)
    _check_tensor(inp, inp_arg, op, cuda_kernel=not moves_bytes)
    if inp.dtype != out.dtype:
        raise TypeError(f"ringzero.{op}: {out_arg} dtype {out.dtype} differs from {inp_arg} dtype {inp.dtype}")
    if out.device != inp.device:
        raise ValueError(f"ringzero.{op}: {out_arg} is on {out.device} but {inp_arg} is on {inp.device}; put both on "
                         "one device")


def _group_rank_of(comm, global_rank, group_rank, arg: str, op: str) -> int:
    """Turns torch's (global `src`/`dst`, or `group_src`/`group_dst`) into a rank of the group."""
    if (global_rank is None) == (group_rank is None):
        raise ValueError(f"ringzero.{op}: pass exactly one of {arg} (a global rank) and group_{arg} (a rank in group)")
    world = comm.world
    if group_rank is not None:
        if not isinstance(group_rank, int) or not 0 <= group_rank < world:
            raise ValueError(f"ringzero.{op}: group_{arg}={group_rank!r} must be in [0, {world})")
        return group_rank
    ranks = comm.global_ranks
    if not isinstance(global_rank, int) or global_rank not in ranks:
        raise ValueError(f"ringzero.{op}: {arg}={global_rank!r} is not a rank of the group (its ranks are {ranks})")
    return ranks.index(global_rank)


def all_reduce(tensor: torch.Tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduces `tensor` in place across all ranks of `group` (every rank must call it with the same
    dtype and numel). CPU or CUDA tensors (CUDA: float32, bfloat16, float16, int32, int64; see
    comm/cuda.py for streams). Returns a Work handle when async_op=True, else None."""
    comm = FAST.get(id(group))  # the fast path: [Note: the api's fast path] (communicator.py)
    if comm is not None and not async_op and comm.run_direct(group, comm.shm_all_reduce_, tensor, op, comm.algo):
        return None
    op_ = op if type(op) is ReduceOp else to_reduce_op(op)
    on_cuda = _check_tensor(tensor, "tensor", "all_reduce", cuda_kernel=True)
    comm = _comm(group, "all_reduce")
    if comm is None:
        return None
    # The device is checked once, above; the call goes straight to that device's transport (DDP's path).
    if on_cuda:
        return comm.run_cuda(lambda transport: transport.all_reduce(tensor, op_), async_op, tensor, "all_reduce")
    return comm.run_cpu(lambda: comm.transport.all_reduce(tensor, op_), async_op, tensor, "all_reduce", tensor)


def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor, op=ReduceOp.SUM, group=None,
                          async_op: bool = False):
    """output (numel k) on group rank r receives block r (elements [r*k, (r+1)*k)) of `input`
    (numel world*k) reduced across ranks. `input` is not modified."""
    comm = FAST.get(id(group))  # the fast path: [Note: the api's fast path] (communicator.py)
    if comm is not None and not async_op and comm.run_direct(group, comm.shm_reduce_scatter, input, output, op):
        return None
    op_ = to_reduce_op(op)
    _check_pair(output, "output", input, "input", "reduce_scatter_single")
    comm = _comm(group, "reduce_scatter_single")
    if comm is None:
        return None
    world = comm.world
    if input.numel() != world * output.numel():
        raise ValueError(
            f"ringzero.reduce_scatter_single: input has {input.numel()} elements but must have "
            f"world_size * output.numel() = {world} * {output.numel()} = {world * output.numel()}"
        )
    if output.data_ptr() == input.data_ptr() and output.numel() and world > 1:
        raise ValueError("ringzero.reduce_scatter_single: output must not alias input; allocate a separate output")
    return comm.run(lambda: comm.reduce_scatter(output, input, op_), async_op, output, "reduce_scatter", input,
                    inputs=(input,))


def all_gather_single(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group=None, async_op: bool = False):
    """output_tensor (numel world*k) receives every rank's input_tensor (numel k) in rank order."""
    comm = FAST.get(id(group))  # the fast path: [Note: the api's fast path] (communicator.py)
    if comm is not None and not async_op and comm.run_direct(group, comm.shm_all_gather, input_tensor,
                                                                output_tensor):
        return None
    _check_pair(output_tensor, "output_tensor", input_tensor, "input_tensor", "all_gather_single")
    comm = _comm(group, "all_gather_single")
    if comm is None:
        return None
    if output_tensor.numel() != comm.world * input_tensor.numel():
        raise ValueError(
            f"ringzero.all_gather_single: output_tensor has {output_tensor.numel()} elements but must have "
            f"world_size * input_tensor.numel() = {comm.world * input_tensor.numel()}"
        )
    return comm.run(lambda: comm.all_gather(output_tensor, input_tensor), async_op, output_tensor, "all_gather",
                    output_tensor, inputs=(input_tensor,))


# torch.distributed's older names for the two tensor forms (torch 2.13 deprecates them; we keep both).
reduce_scatter_tensor = reduce_scatter_single
all_gather_into_tensor = all_gather_single


def all_gather_v(output: torch.Tensor, input: torch.Tensor, counts, group=None, async_op: bool = False):
    """Uneven all-gather: rank q contributes counts[q] elements (input.numel() == counts[rank]) and
    `output` (numel sum(counts)) receives them in rank order. Every rank must pass the same counts."""
    _check_pair(output, "output", input, "input", "all_gather_v")
    comm = _comm(group, "all_gather_v")
    if comm is None:
        return None
    world, rank = comm.world, comm.rank
    try:
        counts = [int(c) for c in counts]
    except (TypeError, ValueError):
        raise TypeError(f"ringzero.all_gather_v: counts must be a sequence of ints, got {counts!r}") from None
    if len(counts) != world or any(c < 0 for c in counts):
        raise ValueError(f"ringzero.all_gather_v: counts must hold {world} non-negative ints (one per rank), got {counts}")
    if input.numel() != counts[rank]:
        raise ValueError(f"ringzero.all_gather_v: input has {input.numel()} elements but counts[{rank}] = {counts[rank]}")
    if output.numel() != sum(counts):
        raise ValueError(f"ringzero.all_gather_v: output has {output.numel()} elements but sum(counts) = {sum(counts)}")
    return comm.run(lambda: comm.all_gather(output, input, counts), async_op, output, "all_gather_v", output,
                    inputs=(input,))


def broadcast(tensor: torch.Tensor, src: int | None = None, group=None, async_op: bool = False,
              group_src: int | None = None):
    """Copies `tensor` of rank `src` (a global rank; or group_src, a rank in `group`) to every rank."""
    _check_tensor(tensor, "tensor", "broadcast")
    comm = _comm(group, "broadcast")
    if comm is None:
        return None
    root = _group_rank_of(comm, src, group_src, "src", "broadcast")
    return comm.run(lambda: comm.broadcast(tensor, root), async_op, tensor, "broadcast", tensor)


def reduce(tensor: torch.Tensor, dst: int | None = None, op=ReduceOp.SUM, group=None, async_op: bool = False,
           group_dst: int | None = None):
    """Reduces `tensor` across ranks into `tensor` on rank `dst` (global; or group_dst in `group`).
    Other ranks' tensors are left unchanged."""
    op_ = to_reduce_op(op)
    _check_tensor(tensor, "tensor", "reduce")
    comm = _comm(group, "reduce")
    if comm is None:
        return None
    root = _group_rank_of(comm, dst, group_dst, "dst", "reduce")
    return comm.run(lambda: comm.reduce(tensor, root, op_), async_op, tensor, "reduce", tensor)


def _split_counts(t: torch.Tensor, splits, world: int, what: str, arg: str, rank: int, op: str) -> list[int]:
    """Element counts of the world blocks of `t` along dim 0: `splits` rows each (None: equal blocks)."""
    rows = t.shape[0] if t.dim() else 1
    row = t.numel() // rows if rows else 0
    if splits is None or len(splits) == 0:
        if rows % world:
            raise ValueError(f"ringzero.{op} on rank {rank}: {what}'s first dimension ({rows}) is not divisible by the "
                             f"world size {world}; pass {arg}")
        return [rows // world * row] * world
    try:
        splits = [int(x) for x in splits]
    except (TypeError, ValueError):
        raise TypeError(f"ringzero.{op} on rank {rank}: {arg} must be a sequence of ints, got {splits!r}") from None
    if len(splits) != world or any(x < 0 for x in splits):
        raise ValueError(f"ringzero.{op} on rank {rank}: {arg} must hold {world} non-negative sizes (one per rank), "
                         f"got {splits}")
    if sum(splits) != rows:
        raise ValueError(f"ringzero.{op} on rank {rank}: {arg} {splits} sums to {sum(splits)} but {what}'s first "
                         f"dimension is {rows}")
    return [x * row for x in splits]


def _check_cpu(t: torch.Tensor, arg: str, op: str):
    if t.device.type != "cpu":
        raise ValueError(f"ringzero.{op}: {arg} is on {t.device}; ringzero's {op} takes CPU tensors (CUDA: use "
                         f"torch.distributed.{op} on an NCCL group)")


def _disjoint(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return True
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 + a.numel() * a.element_size() <= b0 or b0 + b.numel() * b.element_size() <= a0


def all_to_all_single(output: torch.Tensor, input: torch.Tensor, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op: bool = False):
    """torch.distributed.all_to_all_single: input's first dimension splits into world blocks
    (input_split_sizes rows each, None: equal blocks), block p goes to group rank p; output receives, in rank
    order, every rank's block for this rank (output_split_sizes rows from each). Rank q's
    input_split_sizes[p] must equal rank p's output_split_sizes[q]: otherwise every rank raises
    CollectiveMismatch naming the pair. CPU or CUDA tensors of one dtype and device, rows of one shape; output
    must not overlap input. CUDA tensors: the all-to-all kernel over CUDA IPC on one host, a host copy
    across hosts (comm/cuda.py). Every rank of the group calls it."""
    comm = FAST.get(id(group))  # the fast path: [Note: the api's fast path] (communicator.py)
    if comm is not None and not async_op and comm.run_direct(
            group, comm.shm_all_to_all, input, output,
            None if output_split_sizes is None and input_split_sizes is None else (output_split_sizes, input_split_sizes)):
        return None
    op = "all_to_all_single"
    _check_pair(output, "output", input, "input", op)
    comm = _comm(group, op)
    if comm is None:
        return None
    world, rank = comm.world, comm.rank
    send = _split_counts(input, input_split_sizes, world, "input", "input_split_sizes", rank, op)
    recv = _split_counts(output, output_split_sizes, world, "output", "output_split_sizes", rank, op)
    if input.dim() and output.dim() and input.shape[1:] != output.shape[1:] and input.numel() and output.numel():
        raise ValueError(f"ringzero.{op}: input rows have shape {tuple(input.shape[1:])} but output rows "
                         f"{tuple(output.shape[1:])}; give both the same shape past dim 0")
    if not _disjoint(output, input):
        raise ValueError(f"ringzero.{op}: output must not overlap input; allocate a separate output")
    return comm.run(lambda: comm.all_to_all(output.view(-1), input.view(-1), send, recv), async_op, output,
                    "all_to_all", output, inputs=(input,))


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op: bool = False):
    """torch.distributed.all_to_all: input_tensor_list[p] goes to group rank p, output_tensor_list[q] receives
    rank q's tensor for this rank (sizes may differ per pair; rank q's input_tensor_list[p] must have as many
    elements as rank p's output_tensor_list[q]). CPU or CUDA tensors of one dtype and device, as
    all_to_all_single."""
    op = "all_to_all"
    comm = _comm(group, op)
    if comm is None:
        return None
    world = comm.world
    outs, ins = list(output_tensor_list), list(input_tensor_list)
    if len(outs) != world or len(ins) != world:
        raise ValueError(f"ringzero.{op}: output_tensor_list and input_tensor_list must hold world_size = {world} "
                         f"tensors each (got {len(outs)} and {len(ins)})")
    for i, (o, t) in enumerate(zip(outs, ins)):
        _check_pair(o, f"output_tensor_list[{i}]", t, f"input_tensor_list[{i}]", op)
        _check_pair(t, f"input_tensor_list[{i}]", ins[0], "input_tensor_list[0]", op)
    send, recv = [t.numel() for t in ins], [o.numel() for o in outs]

    def body():
        flat_in = torch.cat([t.reshape(-1) for t in ins])
        flat_out = torch.empty(sum(recv), dtype=ins[0].dtype, device=ins[0].device)
        comm.all_to_all(flat_out, flat_in, send, recv)
        for o, piece in zip(outs, flat_out.split(recv)):
            o.copy_(piece.view(o.shape))

    if ins[0].is_cuda:  # run() takes the CUDA path by its result tensor's device; every tensor is kept for the stream
        return comm.run(body, async_op, outs[0], "all_to_all", ins[0], inputs=(*ins, *outs[1:]))
    return comm.run(body, async_op, None, "all_to_all", ins[0])


def gather(tensor: torch.Tensor, gather_list=None, dst: int | None = None, group=None, async_op: bool = False,
           group_dst: int | None = None):
    """torch.distributed.gather: rank `dst` (global; or group_dst in `group`; neither: global rank 0) gets
    every rank's `tensor` in gather_list (world tensors of tensor's size, in rank order); the other ranks pass
    gather_list=None. CPU tensors."""
    op = "gather"
    comm, root, outs = _rooted(op, tensor, gather_list, "gather_list", group, dst, group_dst, "dst")
    if comm is None:
        return None

    def body():
        if outs and _takes_blocks(comm):  # straight into the caller's tensors
            comm.gather(outs, tensor.view(-1), root)
            return
        flat = torch.empty(tensor.numel() * comm.world if outs else 0, dtype=tensor.dtype)
        comm.gather(flat, tensor.view(-1), root)
        for o, piece in zip(outs, flat.split(tensor.numel()) if outs else ()):
            o.copy_(piece.view(o.shape))

    return comm.run(body, async_op, None, op, tensor)


def scatter(tensor: torch.Tensor, scatter_list=None, src: int | None = None, group=None, async_op: bool = False,
            group_src: int | None = None):
    """torch.distributed.scatter: every rank's `tensor` gets its tensor of rank `src`'s scatter_list (world
    tensors of tensor's size; global src, or group_src in `group`; neither: global rank 0); the other ranks
    pass scatter_list=None. CPU tensors."""
    op = "scatter"
    comm, root, ins = _rooted(op, tensor, scatter_list, "scatter_list", group, src, group_src, "src")
    if comm is None:
        return None

    def body():
        if ins and _takes_blocks(comm):  # straight from the caller's tensors
            comm.scatter(tensor.view(-1), ins, root)
            return
        flat = torch.cat([t.reshape(-1) for t in ins]) if ins else torch.empty(0, dtype=tensor.dtype)
        comm.scatter(tensor.view(-1), flat, root)

    return comm.run(body, async_op, tensor, op, tensor)


def _takes_blocks(comm) -> bool:
    """Whether the root's list (contiguous tensors: _root_list checks) goes to the transport as it is
    (transports.NetworkRing.TAKES_BLOCKS: each block sent or received in place) rather than through one flat
    copy of the whole buffer."""
    return getattr(comm.transport, "TAKES_BLOCKS", False)


def _rooted(op: str, tensor: torch.Tensor, tensors, arg: str, group, global_root, group_root, root_arg: str):
    """What gather and scatter open with: `tensor` checked (CPU), the group's communicator (None where this
    rank is not in the group), the root as a group rank (global_root, or group_root in `group`; neither:
    global rank 0) and the root's list of tensors (checked; [] on the other ranks): (comm, root, tensors)."""
    _check_tensor(tensor, "tensor", op)
    _check_cpu(tensor, "tensor", op)
    comm = _comm(group, op)
    if comm is None:
        return None, 0, []
    root = _group_rank_of(comm, 0 if global_root is None and group_root is None else global_root, group_root,
                          root_arg, op)
    return comm, root, _root_list(tensors, arg, tensor, comm, root, op)


def _root_list(tensors, arg: str, tensor: torch.Tensor, comm, root: int, op: str) -> list:
    """The root's list of world tensors like `tensor` (checked); [] on the other ranks, which pass None."""
    if comm.rank != root:
        if tensors:
            raise ValueError(f"ringzero.{op}: {arg} must be None on rank {comm.rank} of the group, which is not the "
                             f"root ({root})")
        return []
    tensors = list(tensors or [])
    if len(tensors) != comm.world:
        raise ValueError(f"ringzero.{op}: {arg} on the root must hold world_size = {comm.world} tensors, got "
                         f"{len(tensors)}")
    for i, t in enumerate(tensors):
        _check_pair(t, f"{arg}[{i}]", tensor, "tensor", op)
        if t.numel() != tensor.numel():
            raise ValueError(f"ringzero.{op}: {arg}[{i}] has {t.numel()} elements but tensor has {tensor.numel()}; "
                             f"{op} takes tensors of one size")
    return tensors


def barrier(group=None, async_op: bool = False):
    """Returns once every rank of `group` has entered the barrier."""
    comm = _comm(group, "barrier")
    if comm is None:
        return None
    return comm.run(comm.barrier, async_op, None, "barrier")


__all__ = [
    "all_reduce", "reduce_scatter_single", "reduce_scatter_tensor", "all_gather_single", "all_gather_into_tensor",
    "all_gather_v", "broadcast", "reduce", "barrier", "all_to_all_single", "all_to_all", "gather", "scatter", "Work",
]
