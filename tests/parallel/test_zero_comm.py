"""A ZeRO flat group's communication is swappable (python/ringzero/parallel/data_parallel/zero_comm.py): a
ShardedGroup handed a gather and a reduce-scatter of the test's own (counting calls around the plain forms)
gathers and reduces exactly as one built with the plain forms, and calls each form as its contract says
(bind once, then start and finish in pairs; one reduction per backward). zeropp.communication() picks ZeRO++'s forms from the options
and the hosts alone. Reference: the plain group, bit for bit, and integer gradients whose average is exact."""
import types

import torch

from harness import run_ranks


def counting_forms():
    from ringzero.parallel.data_parallel.zero_comm import ParamGather, PlainGather, ReduceScatter

    class CountingGather(ParamGather):
        """The plain gather inside, every call counted."""

        def __init__(self):
            self.inner, self.calls = PlainGather(), []

        def bind(self, shape):
            self.calls.append("bind")
            self.inner.bind(shape)

        def start(self, master, full):
            self.calls.append("start")
            return "counted " + self.inner.start(master, full)

        def finish(self, full):
            self.calls.append("finish")
            self.inner.finish(full)

    class CountingReduceScatter(ReduceScatter):
        """The plain reduce-scatter, its starts counted (a subclass: the other way to make a form)."""

        def __init__(self):
            self.calls = []

        def start(self, grad_flat, arranged=False):
            self.calls.append("start")
            return super().start(grad_flat, arranged)

    return CountingGather(), CountingReduceScatter()


def swap_case(rank, world):
    from ringzero.parallel.data_parallel.sharded_group import GradReduction, ShardedGroup
    sizes = [5, 8, 3]  # 16 elements: padding at world 3
    out = {}
    for name in ("plain", "counting"):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(n)) for n in sizes]
        forms = counting_forms() if name == "counting" else (None, None)
        g = ShardedGroup([(f"p{i}", p) for i, p in enumerate(params)], None, world, rank,
                         GradReduction.REDUCE_SCATTER, torch.float32, torch.float32, torch.device("cpu"), *forms)
        g.free()
        with torch.no_grad():
            g.master.mul_(rank + 2)  # every rank's shard changes: the gather must bring each rank's
        gathered = []
        for _ in range(2):
            g.wait_gathered()
            gathered.append([p.detach().clone().tolist() for p in params])
            g.free()
        for i, p in enumerate(params):  # integers: the average over the ranks is exact
            g.copy_grad_in(p, torch.full((sizes[i],), float((i + 1) * (rank + 1))))
        g.reduce_async()
        g.finish_reduce()
        calls = (forms[0].calls, forms[1].calls) if forms[0] is not None else None
        out[name] = (gathered, g.master.grad.tolist(), dict(g.gathers), calls)
    return out


def test_a_group_handed_its_own_forms_communicates_as_the_plain_one():
    for world in (1, 3):
        for r in run_ranks(world, swap_case):
            plain, counting = r["plain"], r["counting"]
            assert counting[0] == plain[0] and counting[1] == plain[1]
            assert plain[2] == {"master": 2} and counting[2] == {"counted master": 2}
            gather_calls, reduce_calls = counting[3]
            assert gather_calls == ["bind", "start", "finish", "start", "finish"], gather_calls
            assert reduce_calls == ["start"], reduce_calls


def test_the_options_pick_the_forms_once():
    """On one host hpz and qg keep the plain forms (no link to save); qw quantizes wherever it is asked;
    across hosts hpz wraps the gather of units gathered more than once a step, never the root's."""
    from ringzero.parallel.data_parallel.zero_comm import PlainGather, ReduceScatter
    from ringzero.parallel.data_parallel.zeropp import QuantizedReduceScatter, communication, parse
    from ringzero.parallel.data_parallel.zeropp_gather import (QuantizedGather, QuantizedGatherAcrossHosts,
                                                               SecondaryGather)
    one, two = types.SimpleNamespace(several_hosts=False), types.SimpleNamespace(several_hosts=True)

    def kinds(opts, split, repeated=True):
        c = communication(parse(opts), split)
        return [type(p) for p in c.make_gather(repeated).parts()], type(c.reduce_scatter())

    assert kinds(None, None) == ([PlainGather], ReduceScatter)
    assert kinds("hpz,qg", one) == ([PlainGather], ReduceScatter)
    assert kinds("qw", one) == ([QuantizedGather], ReduceScatter)
    assert kinds("hpz,qw,qg", two) == ([SecondaryGather, QuantizedGatherAcrossHosts], QuantizedReduceScatter)
    assert kinds("hpz,qw,qg", two, repeated=False) == ([QuantizedGatherAcrossHosts], QuantizedReduceScatter)
    assert kinds("hpz", two) == ([SecondaryGather, PlainGather], ReduceScatter)
