"""A CUDA build of ringzero on a machine without a GPU (run by tools/cuda_torch_build.sh in its own
environment, with a CUDA torch): the build loads and says it has CUDA and NCCL, and every way into
the CUDA path without a GPU raises a Python error that says there is no GPU, instead of crashing or
hanging. Prints 'ok' and what it checked; exits 1 on the first failure."""
import subprocess
import sys

import torch

import ringzero
from ringzero import _C
from ringzero.comm import cuda as rz_cuda


def expect_error(what, fn, kind, says):
    try:
        fn()
    except kind as e:
        if says not in str(e):
            sys.exit(f"{what}: raised {type(e).__name__} without saying {says!r}: {e}")
        print(f"  {what}: {type(e).__name__}: {str(e)[:140]}")
        return
    sys.exit(f"{what}: returned instead of raising {kind.__name__}")


def main():
    print(f"ringzero {ringzero.__version__} from {ringzero.__file__}; torch {torch.__version__} (CUDA "
          f"{torch.version.cuda}); _C.has_cuda {_C.has_cuda}, has_nccl {_C.has_nccl}")
    if not torch.version.cuda:
        sys.exit("this check is for a CUDA build of torch")
    if not (_C.has_cuda and _C.has_nccl):
        sys.exit("the build did not take the CUDA path with NCCL (see the build's 'ringzero: ...' lines)")
    if torch.cuda.is_available():
        print("a GPU is visible: the no-GPU errors are not checked here (benchmarks/gpu_check.sh is for this machine)")
        return
    expect_error("simulated ranks", lambda: rz_cuda.simulated_world(2), RuntimeError, "sees none")
    expect_error("a peer communicator", lambda: _C.CudaPeerComm(0, 2, **rz_cuda.peer_config()), ringzero.CommError,
                 "no usable CUDA GPU")
    expect_error("a CUDA tensor", lambda: torch.ones(2, device="cuda"), RuntimeError, "NVIDIA driver")
    bench = subprocess.run([sys.executable, "-m", "ringzero", "bench", "--device", "cuda"], capture_output=True,
                           text=True, timeout=120)
    if bench.returncode != 2 or "no CUDA device is visible" not in bench.stderr:
        sys.exit(f"ringzero bench --device cuda: exit {bench.returncode}, stderr {bench.stderr[-500:]!r}")
    print("  ringzero bench --device cuda: exit 2, 'no CUDA device is visible'")
    print("ok")


if __name__ == "__main__":
    main()
