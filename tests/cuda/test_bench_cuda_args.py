"""`ringzero bench --device cuda` on a machine without a GPU: its arguments, its refusals (each naming the
argument and the fix, before any rank starts), and the pieces its #wrong column stands on (the row
shapes, the integer inputs and the host-side reference), checked against torch on the CPU. The timed
runs need a GPU: benchmarks/gpu_check.sh runs them."""
import argparse

import pytest
import torch

from ringzero import _C
from ringzero.cli import bench, cuda_bench


def args_of(**kw):
    base = dict(dtype="float32", algos=["auto", "oneshot", "twoshot", "ring"], no_gloo=False, sim_ranks=None)
    base.update(kw)
    return argparse.Namespace(**base)


def test_a_runnable_command_line_has_no_errors():
    assert cuda_bench.argument_errors(args_of(), True, 8, False) == []
    assert cuda_bench.argument_errors(args_of(sim_ranks=8, dtype="bfloat16"), True, 1, False) == []


@pytest.mark.parametrize("kw, has_cuda, gpus, torchrun, says", [
    ({}, False, 0, False, "no CUDA path"),
    ({}, True, 0, False, "no CUDA device is visible"),
    ({"dtype": "float64"}, True, 1, False, "--dtype float64"),
    ({"algos": ["auto", "fastest"]}, True, 1, False, "--algos fastest"),
    ({"no_gloo": True}, True, 1, False, "--no-nccl"),
    ({"sim_ranks": 1}, True, 1, False, "--sim-ranks 1"),
    ({"sim_ranks": 9}, True, 1, False, "--sim-ranks 9"),
    ({"sim_ranks": 4}, True, 1, True, "without torchrun"),
])
def test_each_refusal_names_the_argument(kw, has_cuda, gpus, torchrun, says):
    errors = cuda_bench.argument_errors(args_of(**kw), has_cuda, gpus, torchrun)
    assert len(errors) == 1 and says in errors[0], errors


def test_the_command_refuses_before_starting_ranks(capsys):
    """On this machine (no GPU) `--device cuda` exits with argparse's status 2 and the reason; the CPU
    form refuses the CUDA-only flags."""
    for argv, says in ([["--device", "cuda"], "--device cuda"],
                       [["--device", "cuda", "--sim-ranks", "3", "--algos", "ring,nope"], "--algos nope"],
                       [["--sim-ranks", "2"], "are for --device cuda"],
                       [["--no-nccl"], "are for --device cuda"]):
        with pytest.raises(SystemExit) as e:
            bench.main(argv)
        assert e.value.code == 2
        assert says in capsys.readouterr().err, argv
    if not getattr(_C, "has_cuda", False):
        assert "no CUDA path" in cuda_bench.argument_errors(args_of(), False, 0, False)[0]


def test_rows_of_a_size():
    assert cuda_bench.impls("all_reduce", ["auto", "ring"], True) == ["auto", "ring", "nccl"]
    assert cuda_bench.impls("reduce_scatter", ["auto", "ring"], True) == ["auto", "nccl"]
    assert cuda_bench.impls("all_gather", ["oneshot"], False) == ["auto"]


@pytest.mark.parametrize("op, size, es, world, want", [
    ("all_reduce", 8, 4, 3, (2, 2, 2)),
    ("all_reduce", 3, 4, 2, (1, 1, 1)),           # below one element: one element
    ("reduce_scatter", 1 << 20, 4, 3, (262143, 262143, 87381)),
    ("all_gather", 1 << 20, 2, 5, (524285, 104857, 524285)),
    ("reduce_scatter", 4, 4, 7, (7, 7, 1)),       # at least one element per rank
    ("all_to_all", 1 << 20, 4, 3, (262143, 262143, 262143)),  # input and output: size, even blocks
])
def test_shape_follows_nccl_tests(op, size, es, world, want):
    assert cuda_bench.shape(op, size, es, world) == want


@pytest.mark.parametrize("op", cuda_bench.OPS)
@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64])
def test_reference_equals_torch_on_the_cpu(op, world, dtype):
    """The #wrong column's reference against the collective's definition in float64, exactly: the
    inputs are integers in [-3, 3] with no zeros, and every sum over 8 ranks is exact in every dtype."""
    per = 13
    n_in = per * world if op in ("reduce_scatter", "all_to_all") else per
    inputs = [cuda_bench.pattern(r, n_in, dtype, "cpu") for r in range(world)]
    for x in inputs:
        assert x.dtype == dtype and bool(((x.abs() >= 1) & (x.abs() <= 3)).all())
    assert world == 1 or not torch.equal(inputs[0], inputs[1])
    total = torch.stack([x.double() for x in inputs]).sum(0)
    for rank in range(world):
        want = cuda_bench.expected(op, rank, world, n_in, dtype, "cpu")
        if op == "all_reduce":
            ref = total
        elif op == "reduce_scatter":
            ref = total[rank * per:(rank + 1) * per]
        elif op == "all_to_all":  # block `rank` of every rank's input, by the definition
            ref = torch.cat([x.double()[rank * per:(rank + 1) * per] for x in inputs])
        else:
            ref = torch.cat([x.double() for x in inputs])
        assert want.dtype == dtype and torch.equal(want.double(), ref), (op, world, dtype, rank)


def test_row_line_columns():
    line = cuda_bench.row_line(1 << 20, 262144, "float32", "oneshot", 10e-6, 4, "all_reduce", 0, 20e-6)
    cols = line.split()
    assert cols[:5] == ["1048576", "262144", "float32", "sum", "oneshot"]
    assert float(cols[5]) == pytest.approx(10.0)
    assert float(cols[6]) == pytest.approx(104.86, abs=0.01)         # algbw: size / time
    assert float(cols[7]) == pytest.approx(104.86 * 1.5, abs=0.01)   # busbw: x 2(n-1)/n
    assert cols[8] == "0" and cols[9] == "2.00x"
    assert len(cuda_bench.row_line(8, 2, "int32", "nccl", 1e-6, 2, "all_gather", 3, 1e-6).split()) == 9
