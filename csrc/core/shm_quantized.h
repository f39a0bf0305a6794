// ZeRO++'s quantized collectives on a host's shared memory (layer 1), beside the other collectives and
// over ShmComm's slice context, not in its core.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ringzero {

class ShmComm;

// ZeRO++'s int8 weight gather in the host with the dequantization fused into it (zeropp.py, qw): `in` is
// this rank's `rows` packed rows (quantize_blocks' layout: row_bytes each, n values of `bits` bits in
// blocks of `block`), lying in a window of `comm` (any size; false, nothing done, where it does not);
// every local rank's rows are read where they lie and dequantized straight into `out`: local rank q's row
// j into out row order[q * rows + j] (n float32 each). No staging copy of the int8 bytes. Every local rank
// calls it together with the same rows, n, bits and block.
bool all_gather_dequantize(ShmComm& comm, const void* in, size_t rows, size_t row_bytes, size_t n, int bits,
                           size_t block, const int64_t* order, float* out);

}  // namespace ringzero
