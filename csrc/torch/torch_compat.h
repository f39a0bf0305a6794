// The one place where csrc/torch meets a difference between torch releases (2.10 through 2.15 are
// supported). Keyed on torch's own version macros; every other file uses the names below and holds no
// version #if. tools/torch_compat.sh compiles csrc/torch against each release's headers to keep this true.
#pragma once
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#define RINGZERO_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace ringzero::torch_compat {

// The factor of a PREMUL_SUM reduce op: NCCLPreMulSumSupplement until 2.12, PreMulSumSupplement from 2.13
// (which keeps the old name as an alias).
#if RINGZERO_TORCH_AT_LEAST(2, 13)
using PreMulSumSupplement = c10d::PreMulSumSupplement;
#else
using PreMulSumSupplement = c10d::NCCLPreMulSumSupplement;
#endif

// The OpType a Work of reduce_scatter_tensor_coalesced reports: its own member from 2.12 (read off the
// headers), before that the generic COALESCED.
#if RINGZERO_TORCH_AT_LEAST(2, 12)
constexpr c10d::OpType kReduceScatterTensorCoalesced = c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#else
constexpr c10d::OpType kReduceScatterTensorCoalesced = c10d::OpType::COALESCED;
#endif

}  // namespace ringzero::torch_compat
