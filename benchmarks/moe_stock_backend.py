"""A stock mixture-of-experts layer written on plain torch.distributed, on the "ringzero" backend against the
same on gloo, in the same run.

    python benchmarks/moe_stock_backend.py --nproc 2 --steps 20

Each rank holds E/P experts of one MoE feed-forward (a router, top-2 routing, GELU experts) written the way
a user writes it without any library: tokens sorted by expert, the counts exchanged with one
`dist.all_to_all_single`, the tokens dispatched with another (uneven splits), the experts applied, the
results combined back with a third, and the same in backward (an autograd Function whose backward is the
reverse exchange). Two replicas with the same seed train side by side, one on a group made with
backend="ringzero", one on a gloo group, one step of each in turn; the table gives the median time per
step of the all-to-alls (every call timed, forward and backward), of the whole step, and the ratio gloo /
ringzero. An all-to-all's time as called includes waiting for the slowest rank (whose experts got more
tokens); --sync puts an untimed barrier before each, so that the time is the exchange's alone. At the end
every parameter of the two replicas must be equal, bit for bit (an all-to-all only moves bytes, so the
two runs compute the same floats).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ringzero.cli.launch import launch


class Exchange(torch.autograd.Function):
    """All-to-all-v along dim 0 on `group`; backward is the reverse exchange. `clock` collects seconds."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, clock):
        ctx.args = (in_splits, out_splits, group, clock)
        return timed_all_to_all(x, out_splits, in_splits, group, clock)

    @staticmethod
    def backward(ctx, grad):
        in_splits, out_splits, group, clock = ctx.args
        return timed_all_to_all(grad.contiguous(), in_splits, out_splits, group, clock), None, None, None, None


SYNC = [False]  # --sync: a barrier (not timed) before every all-to-all


def timed_all_to_all(x, out_splits, in_splits, group, clock):
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    if SYNC[0]:
        dist.barrier(group=group)
    t0 = time.perf_counter()
    dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
    clock.append(time.perf_counter() - t0)
    return out


class StockMoE(torch.nn.Module):
    def __init__(self, d: int, hidden: int, experts: int, group):
        super().__init__()
        self.group, self.world, self.rank = group, dist.get_world_size(group), dist.get_rank(group)
        self.local = experts // self.world
        self.experts = experts
        self.router = torch.nn.Linear(d, experts, bias=False)
        self.w1 = torch.nn.Parameter(torch.randn(self.local, d, hidden) * d ** -0.5)
        self.w2 = torch.nn.Parameter(torch.randn(self.local, hidden, d) * hidden ** -0.5)
        self.clock = []

    def forward(self, x):  # x [tokens, d]
        probs = self.router(x).softmax(-1)
        weight, expert = probs.topk(2, dim=-1)
        weight = weight / weight.sum(-1, keepdim=True)
        flat = expert.reshape(-1)
        order = flat.argsort(stable=True)
        rows = x.repeat_interleave(2, dim=0)[order]
        per_expert = torch.bincount(flat, minlength=self.experts)
        got = torch.empty_like(per_expert)
        if SYNC[0]:
            dist.barrier(group=self.group)
        t0 = time.perf_counter()
        dist.all_to_all_single(got, per_expert, group=self.group)
        self.clock.append(time.perf_counter() - t0)
        send = per_expert.view(self.world, self.local).sum(1).tolist()
        recv_by = got.view(self.world, self.local)
        recv = recv_by.sum(1).tolist()
        arrived = Exchange.apply(rows, recv, send, self.group, self.clock)
        # Rows arrive grouped by source rank, each group sorted by expert: regroup by local expert.
        local_expert = torch.repeat_interleave(torch.arange(self.local).repeat(self.world), recv_by.reshape(-1))
        by_expert = local_expert.argsort(stable=True)
        h = arrived[by_expert]
        counts = torch.bincount(local_expert, minlength=self.local).tolist()
        outs = [F.gelu(part @ self.w1[e]) @ self.w2[e] for e, part in enumerate(h.split(counts))]
        y = torch.empty_like(h)
        y[by_expert] = torch.cat(outs) if outs else h
        back = Exchange.apply(y, send, recv, self.group, self.clock)
        combined = torch.empty_like(back)
        combined[order] = back
        return (combined.view(-1, 2, x.shape[1]) * weight.unsqueeze(-1)).sum(1)


def run(args):
    SYNC[0] = args.sync
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"ringzero": dist.new_group(list(range(world)), backend="ringzero"),
              "gloo": dist.new_group(list(range(world)), backend="gloo")}
    layers, opts = {}, {}
    for name, g in groups.items():
        torch.manual_seed(1234 + rank)  # each rank its own experts; both replicas the same
        layers[name] = StockMoE(args.d, args.hidden, args.experts, g)
        torch.manual_seed(0)
        layers[name].router.weight.data = torch.randn(args.experts, args.d) * args.d ** -0.5  # the same router everywhere
        opts[name] = torch.optim.SGD(layers[name].parameters(), lr=1e-2)
    steps = {name: [] for name in groups}
    comm = {name: [] for name in groups}
    for step in range(args.steps):
        x = torch.randn(args.tokens, args.d, generator=torch.Generator().manual_seed(step * world + rank))
        for name in (list(groups) if step % 2 else list(groups)[::-1]):
            layer = layers[name]
            layer.clock.clear()
            dist.barrier()
            t0 = time.perf_counter()
            loss = layer(x).square().mean()
            loss.backward()
            grads = [p.grad for p in layer.router.parameters()]
            for gr in grads:  # the router is replicated: its gradient averaged as DDP would
                dist.all_reduce(gr, group=groups[name])
                gr /= world
            opts[name].step()
            opts[name].zero_grad()
            steps[name].append(time.perf_counter() - t0)
            comm[name].append(sum(layer.clock))
    for (n1, p1), (_, p2) in zip(layers["ringzero"].named_parameters(), layers["gloo"].named_parameters()):
        if not torch.equal(p1, p2):
            raise SystemExit(f"rank {rank}: parameter {n1} differs between the ringzero and gloo runs")
    skip = min(2, args.steps - 1)  # warm-up steps
    med = lambda xs: statistics.median(xs[skip:])  # noqa: E731
    t = torch.tensor([med(comm["ringzero"]), med(comm["gloo"]), med(steps["ringzero"]), med(steps["gloo"])],
                     dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        a_rz, a_gl, s_rz, s_gl = (v * 1e3 for v in t.tolist())
        print(f"# stock MoE layer on plain torch.distributed | {world} ranks | tokens {args.tokens} x d {args.d}, "
              f"{args.experts} experts top-2, hidden {args.hidden} | medians of steps {skip}-{args.steps - 1}, "
              "slowest rank, ms per step" + (" | a barrier (not timed) before every all-to-all" if args.sync else
                                             " | all-to-all time as called (waits for the slowest rank included)"))
        print(f"{'':>10} | {'all-to-all':>10} | {'step':>8}")
        print(f"{'ringzero':>10} | {a_rz:>10.2f} | {s_rz:>8.2f}")
        print(f"{'gloo':>10} | {a_gl:>10.2f} | {s_gl:>8.2f}")
        print(f"{'gloo/rz':>10} | {a_gl / a_rz:>9.2f}x | {s_gl / s_rz:>7.2f}x")
        print("# parameters of the two runs equal bit for bit on every rank", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--sync", action="store_true", help="a barrier before every all-to-all, outside its time: the "
                   "exchange alone, without the wait for a rank whose experts got more tokens")
    args = p.parse_args(argv)
    launch(run, args.nproc, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
