"""ringzero.memory.TensorMemoryMeter: exact byte counts for allocations whose sizes we know (views,
clones, releases, storage resizes, tensors added from before the meter), and the same peak as torch's
own tracker (torch.distributed._tools.mem_tracker.MemTracker) over a training step of ringzero's GPT.
"""
import gc

import pytest
import torch

from ringzero.memory import TensorMemoryMeter
from ringzero.models import GPT, GPTConfig, lm_loss


def test_counts_each_storage_once_from_allocation_to_release():
    with TensorMemoryMeter() as m:
        a = torch.zeros(1009, dtype=torch.float32)  # 4036 bytes
        assert m.current_bytes() == 4036
        view = a[7:500].view(-1, 17)
        assert m.current_bytes() == 4036  # a view shares the storage
        b = a.to(torch.float64)  # 8072 bytes
        assert m.current_bytes() == 4036 + 8072
        del b
        gc.collect()
        assert m.current_bytes() == 4036
        c = torch.ones(13, dtype=torch.int16)
        assert m.current_bytes() == 4036 + 26
        del a, view, c
        gc.collect()
        assert m.current_bytes() == 0
    assert m.peak_bytes() == 4036 + 8072
    assert m.peak_bytes("cuda") == 0


def test_storage_resize_and_reset_peak():
    with TensorMemoryMeter() as m:
        flat = torch.empty(1000, dtype=torch.bfloat16)
        flat.untyped_storage().resize_(0)  # how ZeRO-3 frees gathered weights
        assert m.current_bytes() == 0
        m.reset_peak()
        flat.untyped_storage().resize_(2000)
        assert m.current_bytes() == 2000 and m.peak_bytes() == 2000
    flat.untyped_storage().resize_(0)  # after the meter: resize_ is torch's own again, nothing counted
    assert m.current_bytes() == 2000 and flat.untyped_storage().nbytes() == 0


def test_add_counts_tensors_modules_and_optimizers_made_before():
    model = torch.nn.Linear(31, 7)  # 31*7 + 7 floats
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 31)).sum().backward()
    opt.step()  # exp_avg and exp_avg_sq, plus a 0-dim step per parameter
    extra = torch.zeros(5, dtype=torch.float64)
    with TensorMemoryMeter() as m:
        m.add(model, opt, [extra])
    params = (31 * 7 + 7) * 4
    steps = sum(s["step"].untyped_storage().nbytes() for s in opt.state.values())
    assert m.current_bytes() == params + params + 2 * params + steps + 40  # weights, grads, moments, steps, extra
    with pytest.raises(TypeError, match="cannot count an object of type object"):
        m.add(object())


def test_one_meter_at_a_time():
    with TensorMemoryMeter():
        with pytest.raises(RuntimeError, match="already active"):
            with TensorMemoryMeter():
                pass


def train_steps(model, opt, x, steps=3):
    for _ in range(steps):
        lm_loss(model(x), x).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)


def test_peak_of_a_training_step_equals_torch_mem_tracker():
    from torch.distributed._tools.mem_tracker import MemTracker

    cfg = GPTConfig(seq_len=64, n_layer=2, n_head=2, d_model=96)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))
    peaks = []
    for which in ("ours", "torch"):
        torch.manual_seed(0)
        model = GPT(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if which == "ours":
            with TensorMemoryMeter() as meter:
                meter.add(model, opt)
                train_steps(model, opt, x)
            peaks.append(meter.peak_bytes())
        else:
            tracker = MemTracker()
            tracker.track_external(model, opt)
            with tracker:
                for _ in range(3):
                    tracker.reset_mod_stats()  # MemTracker refuses a second forward otherwise
                    train_steps(model, opt, x, steps=1)
            peaks.append(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
    print(f"peak bytes: ringzero.memory {peaks[0]}, MemTracker {peaks[1]}")
    assert peaks[0] > 0 and abs(peaks[0] - peaks[1]) <= 0.01 * peaks[1]
