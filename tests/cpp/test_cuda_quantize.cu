// The block quantization kernels of layer 2 (csrc/cuda/quantize.cu), without torch, against the CPU loops
// of layer 1 (csrc/core/reduce.h quantize_blocks / dequantize_blocks, which tests/parallel/test_zeropp.py
// holds to a float64 bound and to a torch formula of the format): the packed bytes and the values read
// back must be equal bit for bit. Rows 1-3; sizes 0, 1, 7, primes, one block, one block +- 1, many blocks;
// blocks of 8, 256 and 1000 values (more than a CUDA block's threads); 8 and 4 bits; a block of zeros,
// blocks holding a NaN or an infinity (NaN scale, zero integers); magnitudes from 1e-30 to 1e30 and values
// exactly halfway between two levels (ties to even). Runs on a GPU (gpu_check.sh) and on the CPU grid (CI).
// Without a CUDA device it prints SKIP and exits 77 (the CPU grid is always one).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/reduce.h"
#include "cuda/quantize.h"
#include "cuda_test_util.h"

using namespace ringzero;
using namespace ringzero::test;

namespace {

uint32_t bits_of(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

// rows x n values: random magnitudes per block (so scales span decades), with the special blocks.
std::vector<float> make_values(size_t rows, size_t n, size_t block, std::mt19937& rng) {
  std::vector<float> x(rows * n);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp10(-30, 30);
  const size_t nblk = (n + block - 1) / block;
  for (size_t r = 0; r < rows; ++r)
    for (size_t b = 0; b < nblk; ++b) {
      const float mag = std::pow(10.0f, static_cast<float>(exp10(rng)));
      const size_t kind = (r * nblk + b) % 7;
      for (size_t i = b * block; i < std::min(n, (b + 1) * block); ++i) {
        float v = u(rng) * mag;
        if (kind == 1) v = 0.0f;                                          // a block of zeros: scale 0
        if (kind == 2 && i == b * block + 1) v = std::nanf("");          // a NaN block
        if (kind == 3 && i == b * block) v = -std::numeric_limits<float>::infinity();
        if (kind == 4) v = (static_cast<float>(static_cast<int>(i % 9)) - 4.0f) * 0.5f;  // halves: ties at 4 bits
        if (v == 0.0f) v = 0.0f;  // +0 only: the sign of a zero maximum is left to the reduction's order
        x[r * n + i] = v;
      }
      if (kind == 4 && b * block < n) x[r * n + b * block] = 2.0f;  // the block maximum: 2 -> L exactly
    }
  return x;
}

void one_case(size_t rows, size_t n, int bits, size_t block, std::mt19937& rng) {
  const std::vector<float> x = make_values(rows, n, block, rng);
  const size_t row = cuda::quantized_row_bytes(n, bits, block);
  const size_t nblk = (n + block - 1) / block, qbytes = nblk * block * bits / 8;
  // CPU reference, row by row as the binding calls it.
  std::vector<uint8_t> want(rows * row, 0xAB);
  std::vector<float> want_back(rows * n);
  for (size_t r = 0; r < rows; ++r) {
    quantize_blocks(x.data() + r * n, n, bits, block, want.data() + r * row,
                    reinterpret_cast<float*>(want.data() + r * row + qbytes));
    dequantize_blocks(want.data() + r * row, reinterpret_cast<const float*>(want.data() + r * row + qbytes), n, bits,
                      block, want_back.data() + r * n);
  }
  float *dx = nullptr, *dback = nullptr;
  uint8_t* dq = nullptr;
  const size_t xb = std::max<size_t>(1, x.size()) * 4, qb = std::max<size_t>(1, want.size());
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dx), xb));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dq), qb));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dback), xb));
  CUDA_OK(cudaMemset(dq, 0xCD, qb));  // every byte must be written
  if (!x.empty()) CUDA_OK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cuda::launch_quantize_blocks(dx, rows, n, bits, block, dq, nullptr));
  CUDA_OK(cuda::launch_dequantize_blocks(dq, rows, n, bits, block, dback, nullptr));
  std::vector<uint8_t> got(want.size());
  std::vector<float> back(want_back.size());
  if (!got.empty()) CUDA_OK(cudaMemcpy(got.data(), dq, got.size(), cudaMemcpyDeviceToHost));
  if (!back.empty()) CUDA_OK(cudaMemcpy(back.data(), dback, back.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(dx));
  CUDA_OK(cudaFree(dq));
  CUDA_OK(cudaFree(dback));
  size_t bad_bytes = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && bad_bytes++ == 0) first = i;
  CHECK(bad_bytes == 0, "quantize rows=%zu n=%zu bits=%d block=%zu: %zu bytes differ, first at %zu (row %zu, byte %zu): "
        "0x%02x against the CPU's 0x%02x", rows, n, bits, block, bad_bytes, first, first / row, first % row,
        got.empty() ? 0 : got[first], want.empty() ? 0 : want[first]);
  size_t bad_values = 0;
  for (size_t i = 0; i < back.size(); ++i)
    if (bits_of(back[i]) != bits_of(want_back[i]) && !(std::isnan(back[i]) && std::isnan(want_back[i]))) {
      if (bad_values++ == 0)
        CHECK(false, "dequantize rows=%zu n=%zu bits=%d block=%zu: value %zu is %.9g, the CPU's %.9g", rows, n, bits,
              block, i, back[i], want_back[i]);
    }
  CHECK(bad_values == 0, "dequantize rows=%zu n=%zu bits=%d block=%zu: %zu values differ", rows, n, bits, block,
        bad_values);
}

}  // namespace

int main() {
  skip_without_gpu("test_cuda_quantize");
  const unsigned seed = 20261129;
  std::printf("test_cuda_quantize: seed %u (case i: seed + i)\n", seed);
  // RINGZERO_QUANT_CASE_STRIDE=k runs every k-th case (tools/test.sh: 7 under ThreadSanitizer, where each launch
  // makes a TSan thread per CUDA thread: all 120 cases take about 5 minutes there, 1 s without it).
  const char* stride_env = std::getenv("RINGZERO_QUANT_CASE_STRIDE");
  const int stride = stride_env ? std::max(1, std::atoi(stride_env)) : 1;
  int cases = 0, index = 0;
  for (int bits : {8, 4})
    for (size_t block : {size_t{8}, size_t{256}, size_t{1000}})
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{255}, size_t{256}, size_t{257}, size_t{1000},
                       size_t{4099}, size_t{12289}})
        for (size_t rows : {size_t{1}, size_t{3}}) {
          std::mt19937 rng(seed + index);  // each case's values are its own, whatever the stride
          if (index++ % stride) continue;
          one_case(rows, n, bits, block, rng);
          ++cases;
        }
  // bad arguments come back as cudaErrorInvalidValue, not a launch
  CHECK(cuda::launch_quantize_blocks(nullptr, 1, 8, 6, 8, nullptr, nullptr) == cudaErrorInvalidValue, "bits 6 accepted");
  CHECK(cuda::launch_dequantize_blocks(nullptr, 1, 8, 8, 12, nullptr, nullptr) == cudaErrorInvalidValue,
        "block 12 accepted");
  std::printf("test_cuda_quantize: %d cases\n", cases);
  return finish();
}
