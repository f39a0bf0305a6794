"""Tensor memory of one process, counted as the allocator sees it: the bytes of every tensor storage alive,
and their peak. On a GPU torch.cuda.max_memory_allocated() counts the same thing; the CPU allocator keeps
no such statistics, so TensorMemoryMeter counts storages through a dispatch mode.

Why not torch.distributed._tools.MemTracker: it attributes memory to modules and raises when a module runs
forward twice in one iteration (every pipeline micro-batch does); a process-wide total needs only the
allocation and release of storages, which is all this file does.

What it counts: storages created by tensor operations while the meter is active (parameters, gradients,
optimizer states, flat buffers, activations, temporaries), and storages resized with
UntypedStorage.resize_ (ZeRO-3 frees and regathers that way). What it does not: memory outside tensors
(the shared-memory staging segment, Python objects, the allocator's own slack), and tensors created
before the meter started (pass them to `add`).
"""
from __future__ import annotations

import threading
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary


class TensorMemoryMeter(TorchDispatchMode):
    """with TensorMemoryMeter() as meter: ...; then meter.peak_bytes(device_type) and meter.current_bytes().

    Every storage is counted once however many views share it, from its first appearance to its release
    (the weak reference to its Python object dies with the storage). Only one meter may be active per
    process at a time (it patches UntypedStorage.resize_ while active)."""

    _active: "TensorMemoryMeter | None" = None

    def __init__(self):
        super().__init__()
        self._sizes = WeakIdKeyDictionary()  # UntypedStorage -> [device type, bytes counted]
        self._current: dict[str, int] = {}
        self._peak: dict[str, int] = {}
        self._lock = threading.Lock()  # autograd may release storages on its own threads
        self._orig_resize = None

    # ---- counting ---------------------------------------------------------------------------------------
    def _change(self, device: str, delta: int):
        with self._lock:
            now = self._current.get(device, 0) + delta
            self._current[device] = now
            if now > self._peak.get(device, 0):
                self._peak[device] = now

    def _see(self, storage: torch.UntypedStorage):
        if storage in self._sizes:
            return
        device, nbytes = storage.device.type, storage.nbytes()
        entry = [device, nbytes]
        self._sizes[storage] = entry
        weakref.finalize(storage, self._released, entry)
        self._change(device, nbytes)

    def _released(self, entry):
        self._change(entry[0], -entry[1])

    def add(self, *objs):
        """Counts tensors that already existed when the meter started: tensors, modules (parameters,
        buffers, gradients) or optimizers (states), in any nesting of lists, tuples and dicts."""
        flat, _ = tree_flatten(objs)
        for obj in flat:
            if isinstance(obj, torch.nn.Module):
                self.add(list(obj.parameters()), list(obj.buffers()),
                         [p.grad for p in obj.parameters() if p.grad is not None])
            elif isinstance(obj, torch.optim.Optimizer):
                self.add([dict(s) for s in obj.state.values()])
            elif isinstance(obj, torch.Tensor):
                self._see(obj.untyped_storage())
            elif obj is not None and not isinstance(obj, (int, float, bool, str)):
                raise TypeError(f"TensorMemoryMeter.add: cannot count an object of type {type(obj).__name__}; pass tensors, "
                                "modules or optimizers")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        subclasses = [t for t in types if t is not torch.Tensor and t is not torch.nn.Parameter]
        if any(getattr(t, "__name__", "") == "DTensor" for t in subclasses):
            # FSDP2's DTensor holds no storage of its own: it runs its local ops on plain tensors, which
            # come back through this mode and are counted.
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        if subclasses:
            return out  # other subclasses (fake tensors of DTensor's sharding propagation): no memory
        flat, _ = tree_flatten(out)
        for t in flat:
            if type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type != "meta":
                self._see(t.untyped_storage())
        return out

    # ---- UntypedStorage.resize_ ------------------------------------------------------------------------
    def _resize(self, storage, nbytes):
        orig = self._orig_resize
        entry = self._sizes.get(storage)
        result = orig(storage, nbytes)
        if entry is None:
            self._see(storage)
        else:
            new = storage.nbytes()
            self._change(entry[0], new - entry[1])
            entry[1] = new
        return result

    def __enter__(self):
        if TensorMemoryMeter._active is not None:
            raise RuntimeError("a TensorMemoryMeter is already active in this process; use one at a time")
        TensorMemoryMeter._active = self
        self._orig_resize = torch.UntypedStorage.resize_
        meter = self

        def resize_(storage, nbytes):
            return meter._resize(storage, nbytes)

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            torch.UntypedStorage.resize_ = self._orig_resize
            TensorMemoryMeter._active = None

    # ---- results ----------------------------------------------------------------------------------------
    def peak_bytes(self, device: str = "cpu") -> int:
        """Highest sum of live storage bytes on `device` ('cpu' or 'cuda') since the meter started."""
        return self._peak.get(device, 0)

    def current_bytes(self, device: str = "cpu") -> int:
        return self._current.get(device, 0)

    def reset_peak(self):
        """Makes the peak the current value (like torch.cuda.reset_peak_memory_stats)."""
        with self._lock:
            self._peak = dict(self._current)
