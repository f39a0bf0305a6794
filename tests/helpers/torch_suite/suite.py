"""torch's own backend conformance suite (DistributedTest._DistTestBase from
torch.testing._internal.distributed.distributed_test, shipped in every torch wheel) as one unittest
class, on CPU, with the backend named by BACKEND ("ringzero", the default, or "gloo" to compare) at
WORLD_SIZE ranks (default 2). run.py drives it (pytest does not collect it by itself: not test_*.py).

The suite reads BACKEND, WORLD_SIZE and TEMP_DIR when it is imported, so they are set before the
import; the ranks are forked from the process that imported this module and inherit all of it.
"ringzero" joins the suite as a plugin backend (DistTestCases.backend_feature, the way the suite lets
out-of-tree backends in) with the features it shares with gloo: DDP, subgroups, and CUDA tensors
("gpu", "cuda": ours or NCCL's; with no GPU here those tests take their CPU paths, as on gloo).
RINGZERO_SUITE_HOSTS="a,a,b,b" puts rank r on host "a" or "b" (RINGZERO_HOST_ID): groups spanning them run
on ringzero's engine across hosts. The harness's two polls (its file barrier, its wait for the ranks) look
every 5 ms instead of every 100 ms: the same tests and outcomes, a run at world size 2 in 30 s, not 59.
"""
import os
import tempfile

BACKEND = os.environ.setdefault("BACKEND", "ringzero")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:  # the suite's barrier and lock files, shared by the ranks
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="ringzero_torch_suite_")
os.environ["CUDA_VISIBLE_DEVICES"] = ""  # CPU only, on GPU machines too: the suite's GPU tests skip themselves

import torch  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if BACKEND == "ringzero":
    import ringzero  # noqa: F401,E402  registers the backend (autoload does too, where installed)

    for feature in ("plugin", "ddp", "subgroup", "gpu", "cuda"):
        DistTestCases.backend_feature[feature].add("ringzero")

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

STAND_IN = os.environ.get("RINGZERO_STAND_IN") == "1"
if STAND_IN:
    # The second mode: the suite believes it runs gloo (BACKEND=gloo, so its gloo-only tests run) while
    # every group it asks gloo for is a ringzero group, whose inner gloo serves what ringzero hands on.
    import functools

    import ringzero  # noqa: F401,E402
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    assert BACKEND == "gloo", "RINGZERO_STAND_IN=1 stands in for gloo: run it with BACKEND=gloo"

    def _ringzero_for_gloo(make_group):
        @functools.wraps(make_group)
        def wrapper(*args, **kwargs):
            swapped = str(kwargs.get("backend", "")).lower() == "gloo"
            if swapped:
                kwargs["backend"] = "ringzero"
            group = make_group(*args, **kwargs)
            made = dist.group.WORLD if group is None else group  # init_process_group returns None
            if swapped and not distributed_c10d._rank_not_in_group(made):
                backend = made._get_backend(torch.device("cpu"))
                assert isinstance(backend, ringzero._C.RingzeroBackend), f"stand-in made {type(backend)}"
            return group
        return wrapper

    for module in (dist, distributed_c10d):
        module.init_process_group = _ringzero_for_gloo(distributed_c10d.init_process_group)
        module.new_group = _ringzero_for_gloo(distributed_c10d.new_group)

HOSTS = os.environ.get("RINGZERO_SUITE_HOSTS", "")
if HOSTS:
    # Ranks on forced hosts ("a,a,b,b": rank r's RINGZERO_HOST_ID), so that every group of the suite that
    # spans them runs on ringzero's engine across hosts (shared memory in each host, rings between).
    import functools

    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    def _on_forced_host(init):
        @functools.wraps(init)
        def wrapper(*args, **kwargs):
            rank = kwargs.get("rank", args[4] if len(args) > 4 else -1)
            os.environ["RINGZERO_HOST_ID"] = HOSTS.split(",")[rank]
            return init(*args, **kwargs)
        return wrapper

    for module in (dist, distributed_c10d):
        module.init_process_group = _on_forced_host(module.init_process_group)

torch.set_num_threads(1)  # several ranks share 2 cores


class TorchSuite(TestDistBackend, DistributedTest._DistTestBase):
    """Each test forks WORLD_SIZE ranks (as torch's test_distributed_fork.py does: much faster than spawning
    fresh interpreters on 2 cores) that init_process_group(BACKEND) through a FileStore."""

    def setUp(self):
        super().setUp()
        self._start_processes(torch.multiprocessing.get_context("fork").Process)


def _polling_every(fn, seconds):
    """fn (a function of torch's harness) with the `time` it sees replaced by one whose sleep lasts at most
    `seconds`: torch polls its file barrier and its ranks' exit every 0.1 s, a fixed cost per test."""
    import time
    import types

    clock = types.SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
    clock.sleep = lambda s: time.sleep(min(s, seconds))
    patched = types.FunctionType(fn.__code__, {**fn.__globals__, "time": clock}, fn.__name__, fn.__defaults__,
                                 fn.__closure__)
    patched.__kwdefaults__, patched.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    return patched


from torch.testing._internal.distributed import distributed_test  # noqa: E402

distributed_test.Barrier.sync = classmethod(_polling_every(distributed_test.Barrier.sync.__func__, 0.005))
TestDistBackend._join_processes = _polling_every(TestDistBackend._join_processes, 0.005)
