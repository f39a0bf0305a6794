"""The Python half of the backend's CUDA lane across hosts, without a GPU: cuda.cuda_transport picks the
CUDA transport of each layout (the same function the Communicator's CUDA path uses), and the backend's
CudaHostsEngine hands exactly the three collectives the C++ lane routes to it to that transport, with the
arguments HostsComm's table gives (comm/backend.py), and refuses anything else as a routing bug. The lane's
collectives themselves need a GPU per rank (tests/cuda/test_backend_cuda.py covers what one GPU can).
"""
import pytest
import torch

from ringzero.comm import backend, cuda
from ringzero.comm.transports import HIERARCHICAL, ONE_HOST, RING, SOLO, Solo
from ringzero.comm.types import ReduceOp


def test_cuda_transport_follows_the_layout():
    host, peer, flat, cross = object(), object(), object(), object()
    assert isinstance(cuda.cuda_transport(SOLO, host, peer, flat, cross, 0, 1, 1), Solo)
    one = cuda.cuda_transport(ONE_HOST, host, peer, flat, cross, 0, 2, 2)
    assert type(one) is cuda.CudaPeers and one.peer is peer and one.host is host
    hier = cuda.cuda_transport(HIERARCHICAL, None, peer, flat, cross, 0, 2, 4)
    assert type(hier) is cuda.CudaHierarchical and (hier.peer, hier.flat, hier.cross) == (peer, flat, cross)
    assert (hier.local_world, hier.world) == (2, 4)
    ring = cuda.cuda_transport(RING, None, peer, flat, cross, 0, 1, 3)
    assert type(ring) is cuda.CudaRing and ring.flat is flat


class Recorder:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, args))


def test_cuda_engine_runs_the_routed_collectives_and_refuses_the_rest():
    t = Recorder()
    engine = backend.CudaHostsEngine(t)
    out, inp = torch.zeros(8), torch.ones(4)
    engine("all_reduce", [out], [int(ReduceOp.MAX)])
    engine("reduce_scatter", [inp, out], [int(ReduceOp.SUM)])
    engine("all_gather", [out, inp], [])
    assert [(n, a[-1] if n != "all_gather" else a[2]) for n, a in t.calls] == \
        [("all_reduce", ReduceOp.MAX), ("reduce_scatter", ReduceOp.SUM), ("all_gather", None)]
    assert t.calls[1][1][0] is inp and t.calls[2][1][0] is out
    for op, args in [("broadcast", [0]), ("reduce", [0, 0]), ("barrier", []), ("all_gather", [4, 4])]:
        with pytest.raises(ValueError, match="not routed here"):
            engine(op, [out, inp], args)
    assert engine in backend.hosts_engines() and engine.kind == "Recorder"
