// ZeRO++'s dequantizing all-gather over registered rows: shm_quantized.h.
#include "shm_quantized.h"

#include "reduce.h"
#include "slice_context.h"

namespace ringzero {

// Per rank: dequantizes every local rank's rows straight from its region into their places in `out`; two
// synchronisations, as the registered all-gather (the fingerprint is that of an all-gather of the bytes).
// It has no staged form, so any size of rows is read from the window.
bool all_gather_dequantize(ShmComm& comm, const void* in, size_t rows, size_t row_bytes, size_t n, int bits,
                           size_t block, const int64_t* order, float* out) {
  SliceContext ctx(comm);
  const int nranks = ctx.nranks(), rank = ctx.rank();
  const size_t bytes = rows * row_bytes;
  std::shared_ptr<ShmWindow> w = nranks > 1 ? ctx.window(in, bytes, CollectiveKind::AllGather) : nullptr;
  if (!w) return false;
  SliceContext::OpGuard guard(&comm, CollectiveKind::AllGatherRegistered, DType::U8, ReduceOp::Sum,
                              static_cast<int>(w->id()), bytes);
  const char* mine = static_cast<const char*>(in);
  ctx.start_registered(*w, mine);
  const size_t offset = static_cast<size_t>(mine - w->region(rank));
  const size_t nblk = (n + block - 1) / block, qbytes = nblk * block * static_cast<size_t>(bits) / 8;
  for (int i = 0; i < nranks; ++i) {  // from its own rows up, so that the ranks start on different peers
    const int q = (rank + i) % nranks;
    for (size_t j = 0; j < rows; ++j) {
      const uint8_t* row = reinterpret_cast<const uint8_t*>(w->region(q) + offset + j * row_bytes);
      dequantize_blocks(row, reinterpret_cast<const float*>(row + qbytes), n, bits, block,
                        out + static_cast<size_t>(order[static_cast<size_t>(q) * rows + j]) * n);
    }
  }
  ctx.finish_registered();
  return true;
}

}  // namespace ringzero
