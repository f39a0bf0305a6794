"""ringzero.patch(): ringzero's collectives under torch.distributed's names, for code that cannot
change its backend string.

    ringzero.patch()                 # from now on
    with ringzero.patch():           # or only inside the block
        dist.all_reduce(t)           # on a gloo group: runs ringzero.all_reduce

While patched, torch.distributed.all_reduce, reduce_scatter_tensor, all_gather_into_tensor,
broadcast and all_to_all_single (and the *_single names of torch >= 2.13) take ringzero's path when ringzero can run the call (CPU, contiguous, a dtype and reduce op
ringzero supports, a group whose backend is not already ringzero); any other call goes to torch's
function unchanged. Only the module attributes are replaced: code that imported the functions by
name before patching, and C++ callers such as DDP's reducer, keep torch's path (use the "ringzero"
backend for those).
"""
from __future__ import annotations

import functools
import inspect
import threading

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from . import api
from .types import SUPPORTED_DTYPES, to_reduce_op

# torch name -> (ringzero function, names of its tensor arguments). torch 2.13 renamed the tensor
# forms to *_single (FSDP2 calls those); both names are routed where torch has them.
_ROUTES = {
    "all_reduce": (api.all_reduce, ("tensor",)),
    "reduce_scatter_tensor": (api.reduce_scatter_tensor, ("output", "input")),
    "reduce_scatter_single": (api.reduce_scatter_single, ("output", "input")),
    "all_gather_into_tensor": (api.all_gather_into_tensor, ("output_tensor", "input_tensor")),
    "all_gather_single": (api.all_gather_single, ("output_tensor", "input_tensor")),
    "broadcast": (api.broadcast, ("tensor",)),
    "all_to_all_single": (api.all_to_all_single, ("output", "input")),
}
_ROUTES = {name: route for name, route in _ROUTES.items() if hasattr(c10d, name)}
_MODULES = (dist, c10d)
_originals: dict[str, object] = {}
_lock = threading.Lock()


def _eligible(args: dict, tensor_names, ours) -> bool:
    """True when ringzero can run this call exactly as torch would."""
    if not dist.is_initialized() or set(args) - set(inspect.signature(ours).parameters):
        return False
    tensors = [args.get(n) for n in tensor_names]
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.layout == torch.strided
               and t.is_contiguous() and t.dtype in SUPPORTED_DTYPES for t in tensors):
        return False
    if "op" in args:
        try:
            to_reduce_op(args["op"])
        except ValueError:  # PREMUL_SUM, bitwise ops: torch's path
            return False
    group = args.get("group")
    group = dist.group.WORLD if group is None else group
    if not isinstance(group, dist.ProcessGroup):
        return False
    try:
        backend = group._get_backend(torch.device("cpu"))
    except RuntimeError:  # a group without a CPU backend
        return False
    from .. import _C

    return not isinstance(backend, _C.RingzeroBackend)  # already ours: nothing to reroute


def _wrapper(name: str, original):
    ours, tensor_names = _ROUTES[name]
    signature = inspect.signature(original)

    @functools.wraps(original)
    def routed(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # let torch report the bad call
        if _eligible(bound.arguments, tensor_names, ours):
            return ours(**bound.arguments)
        return original(*args, **kwargs)

    routed.__ringzero_original__ = original
    return routed


class _Patch:
    """Returned by patch(): already applied; as a context manager it undoes itself on exit (unless
    it found the functions already patched, in which case the outer patch keeps them)."""

    def __init__(self, applied: bool):
        self._applied = applied

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._applied:
            unpatch()
        return False


def patch() -> _Patch:
    """Routes torch.distributed.all_reduce, reduce_scatter_tensor, all_gather_into_tensor, broadcast and
    all_to_all_single to ringzero where it can run them (see the module docstring). Call it on every rank,
    or none: a rank that takes torch's path would not meet the others on ringzero's. Usable as a
    plain call or as `with ringzero.patch(): ...`."""
    with _lock:
        if _originals:
            return _Patch(applied=False)
        for name in _ROUTES:
            original = getattr(c10d, name)
            _originals[name] = original
            routed = _wrapper(name, original)
            for module in _MODULES:
                setattr(module, name, routed)
    return _Patch(applied=True)


def unpatch() -> None:
    """Puts torch's functions back (does nothing when not patched)."""
    with _lock:
        for name, original in _originals.items():
            for module in _MODULES:
                setattr(module, name, original)
        _originals.clear()


def is_patched() -> bool:
    return bool(_originals)


__all__ = ["patch", "unpatch", "is_patched"]
