"""zeropp (ZeRO-3 with ZeRO++'s options) on one host's ranks, on CUDA tensors or, for a check of this script's
own logic where there is no GPU, on CPU ones: run by tests/cuda/test_zeropp_cuda.py in a fresh interpreter
(python tests/helpers/run_cuda_zeropp.py N cuda|cpu); on CUDA every rank shares GPU 0 through CUDA IPC.

  - qw: the weights a gather gives equal, bit for bit, every rank's master shard quantized and dequantized
    by the CPU kernels (csrc/core/quantize_kernels.inc; the CUDA kernels must write the same bytes), and every
    gather of the run was a qw gather;
  - on one host hpz and qg (with ef) change nothing: the masters after the steps equal plain ZeRO-3's bit for
    bit (hpz keeps no secondary and qg reduces in full precision where there is no link);
  - qw trains: its losses stay within 3% of the first loss of plain ZeRO-3's at every step.

Across hosts the same steps take NCCL between the hosts, which refuses ranks that share a GPU: that part
needs a GPU per rank. Prints 'ok N ranks DEVICE'."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from harness import run_ranks  # noqa: E402

STEPS, MICRO = 3, 2


def case(rank, world, device_type):
    import torch.distributed as dist
    from parallel_cases import batches, local, make_model
    from ringzero.models import Block, lm_loss
    from ringzero.parallel import ZeroDataParallel
    from ringzero.parallel.data_parallel import quantize as qz

    if device_type == "cuda":
        torch.cuda.set_device(0)
        torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device(device_type)
    data = batches(world, STEPS, MICRO)
    out = {}
    for name, opts in (("plain", None), ("qw", "qw"), ("hpz,qg,ef", "hpz,qg,ef")):
        torch.manual_seed(0)
        model = ZeroDataParallel(make_model().to(device), stage=3, unit=Block, zeropp=opts)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for step in data:
            for batch in step:
                x, y = local(batch, rank)
                loss = lm_loss(model(x.to(device)), y.to(device))
                loss.backward()
            opt.step()
            opt.zero_grad()
            t = loss.detach().float().cpu()
            dist.all_reduce(t)  # the default group is gloo: the loss goes through the host
            losses.append(float(t) / world)
        units = [g for g in model.groups if g is not model.sharding.root]
        counts = [dict(g.gathers) for g in units]
        exact = None
        if name == "qw":
            g = units[0]
            g.wait_gathered()
            shard = g.master.detach().float().cpu()
            shards = [torch.empty_like(shard) for _ in range(world)]
            dist.all_gather(shards, shard)
            want = torch.cat([qz.dequantize(qz.quantize(s, 8, 256), s.numel(), 8, 256) for s in shards])
            exact = bool(torch.equal(g.full.float().cpu(), want))
            g.free()
            assert all(set(c) == {"qw"} for c in counts), f"rank {rank}: qw ran other gathers: {counts}"
        masters = [g.master.detach().float().cpu() for g in model.groups]
        out[name] = (losses, masters, exact)
        if model.split is not None:
            assert not model.split.several_hosts
            model.split.close()
    assert out["qw"][2] is True, f"rank {rank}: the qw gather's weights are not the dequantized masters"
    for a, b in zip(out["hpz,qg,ef"][1], out["plain"][1]):
        assert torch.equal(a, b), f"rank {rank}: on one host hpz and qg changed the training"
    assert out["hpz,qg,ef"][0] == out["plain"][0]
    plain, qw = out["plain"][0], out["qw"][0]
    gap = max(abs(a - b) for a, b in zip(qw, plain)) / plain[0]
    assert gap <= 0.03, f"rank {rank}: qw's losses {qw} against plain {plain}"
    assert any(not torch.equal(a, b) for a, b in zip(out["qw"][1], out["plain"][1])), "qw quantized nothing"
    return f"qw loss gap {gap:.4f} of the first loss ({qw[-1]:.4f} against {plain[-1]:.4f})"


if __name__ == "__main__":
    world, device_type = int(sys.argv[1]), sys.argv[2]
    env = {"RINGZERO_TIMEOUT_S": "120"}
    if device_type == "cuda":  # small staging, as the other CUDA scripts: several slices per call
        env.update({"RINGZERO_CUDA_BUFFER_BYTES": str(256 << 10), "RINGZERO_CUDA_MAX_BLOCKS": "4"})
    results = run_ranks(world, case, device_type, env=env, timeout_s=540)
    print(f"ok {world} ranks {device_type}: {results[0]}")
