"""The "ringzero" torch.distributed backend with CUDA tensors, 2 and 3 (training: 2 and 4) processes
sharing one GPU through CUDA IPC ([Note: CUDA tensors in the backend], csrc/torch/backend_cuda.h).
References: each op against the result computed on the host from every rank's inputs (integer-valued,
so exact); stock DDP (with and without torch's allreduce comm hook) and stock FSDP2 against one process
training on the whole batch, within TRAIN_ATOL (stated with its reason in tests/helpers/run_cuda_backend.py);
a rank missing at the CUDA rendezvous must give ringzero.CommTimeout naming it. NCCL cannot run here
(several ranks on one GPU), so every routed op must have run on ringzero's kernels (backend_stats).
Each case runs tests/helpers/run_cuda_backend.py in a fresh interpreter. Skips without CUDA (a skip is not a
pass: benchmarks/gpu_check.sh runs it on a GPU).
"""
import pytest

from cuda_util import gpu, run_script


@gpu
@pytest.mark.parametrize("world", [2, 3])
def test_routed_ops_match_the_reference(world):
    out = run_script("run_cuda_backend.py", str(world), "ops", timeout_s=300)
    assert f"ok {world} ranks ops" in out, out


@gpu
@pytest.mark.parametrize("world", [2, 4])
def test_stock_ddp_and_fsdp2_match_one_process(world):
    out = run_script("run_cuda_backend.py", str(world), "train", timeout_s=400)
    assert f"ok {world} ranks train" in out, out


@gpu
@pytest.mark.parametrize("world", [2, 4])
def test_compiled_stock_ddp_matches_one_process(world):
    pytest.importorskip("triton", reason="torch.compile on CUDA needs triton (inductor's GPU code generator)")
    out = run_script("run_cuda_backend.py", str(world), "train_compiled", timeout_s=540)
    assert f"ok {world} ranks train_compiled" in out, out


@gpu
def test_rank_missing_at_the_cuda_rendezvous_raises_comm_timeout():
    out = run_script("run_cuda_backend.py", "3", "absent", timeout_s=120)
    assert "ok 3 ranks absent" in out, out


@gpu
def test_group_spanning_hosts_on_one_gpu_says_nccl_cannot_serve():
    """Two ranks on forced hosts of their own, one GPU: the CUDA lane across hosts (the NCCL rings of
    comm/cuda.py) cannot be set up for ranks sharing a GPU, so CUDA collectives raise a ValueError saying
    why, and the group's CPU collectives still run on ringzero's engine. The lane's collectives across hosts
    themselves need one GPU per rank, which no machine of ours has (docs/backend.md)."""
    out = run_script("run_cuda_backend.py", "2", "hosts", timeout_s=120)
    assert "ok 2 ranks hosts" in out, out
