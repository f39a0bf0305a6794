"""Block quantization on CUDA tensors (csrc/cuda/quantize.cu through ringzero.parallel.data_parallel.quantize),
when a GPU is present: the packed bytes and the values read back equal the CPU kernels' bit for bit (the CPU
kernels are held to a float64 bound and a torch formula in tests/parallel/test_zeropp.py), for 8 and 4 bits,
sizes 0, 1, primes and around the block, rows side by side, NaN and inf blocks; the result lands on the
tensor's device, ordered on the current stream. Skipped without CUDA (the kernels' logic runs on the CPU grid
in CI: tests/cpp/test_cuda_quantize.cu)."""
import pytest
import torch

from ringzero.parallel.data_parallel import quantize as qz

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SIZES = [0, 1, 7, 255, 256, 257, 4099, 65537]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("rows", [1, 3])
def test_cuda_quantize_is_the_cpu_kernels_bit_for_bit(bits, rows):
    g = torch.Generator().manual_seed(20261129)
    print(f"seed 20261129 bits {bits} rows {rows}")
    for n in SIZES:
        x = torch.randn(rows, n, generator=g) * torch.logspace(-20, 20, rows).unsqueeze(1)
        if n > 300:
            x[0, 3] = float("nan")
            x[-1, 260] = float("inf")
        packed = qz.quantize(x, bits, 256)
        packed_cuda = qz.quantize(x.cuda(), bits, 256)
        assert packed_cuda.is_cuda
        assert torch.equal(packed_cuda.cpu(), packed), f"n={n}: the packed bytes differ"
        back = qz.dequantize(packed, n, bits, 256)
        back_cuda = qz.dequantize(packed_cuda, n, bits, 256)
        assert back_cuda.is_cuda
        assert torch.equal(back_cuda.cpu().view(torch.int32), back.view(torch.int32)), f"n={n}: the values differ"


def test_cuda_quantize_runs_on_the_current_stream():
    x = torch.randn(1 << 20, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        packed = qz.quantize(x, 8, 256)
        back = qz.dequantize(packed, x.numel(), 8, 256)
    s.synchronize()
    bound = qz.error_bound(x.cpu(), 8, 256)
    assert ((back.cpu().double() - x.cpu().double()).abs() <= bound * (1 + 1e-6)).all()


def test_cuda_quantize_refuses_mixed_devices():
    x = torch.randn(512, device="cuda")
    with pytest.raises(RuntimeError, match="bytes on cuda"):
        qz.quantize(x, 8, 256, out=torch.empty(qz.packed_bytes(512, 8, 256), dtype=torch.uint8))
