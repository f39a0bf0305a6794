// The backend's communicator for a CPU group that spans hosts ([Note: one engine behind every door],
// docs/design.md): it speaks ShmComm's vocabulary (the op bodies of backend_ops.cpp are written once
// against it) and hands each collective to the engine its Python creator made (HostsEngine in
// python/ringzero/comm/backend.py): the transport ringzero.* runs for the same layout, from
// comm/transports.py's pick_transport. Runs on the backend's worker thread, in call order; the engine
// call takes the GIL itself (backend_bindings.cpp).
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/types.h"
#include "dtype_map.h"

namespace ringzero {

// engine(op, tensors, args): see HostsEngine's docstring for what each op takes. Raises (as a C++
// exception: CommTimeoutError, CollectiveMismatchError or CommError) what the engine raised.
using HostsEngine = std::function<void(const std::string& op, const std::vector<at::Tensor>& tensors,
                                       const std::vector<int64_t>& args)>;

class HostsComm {
 public:
  HostsComm(HostsEngine engine, int rank, int size) : engine_(std::move(engine)), rank_(rank), size_(size) {}
  int rank() const { return rank_; }
  explicit operator bool() const { return static_cast<bool>(engine_); }

  void all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, AllReduceAlgo) {
    at::Tensor x = view(out, count, dtype);
    if (in != out) x.copy_(view(const_cast<void*>(in), count, dtype));
    engine_("all_reduce", {x}, {static_cast<int64_t>(op)});
  }
  void reduce_scatter(const void* in, void* out, size_t count_per_rank, DType dtype, ReduceOp op) {
    engine_("reduce_scatter", {view(out, count_per_rank, dtype), view(const_cast<void*>(in), count_per_rank * size_, dtype)},
            {static_cast<int64_t>(op)});
  }
  void all_gather(const void* in, void* out, size_t count, DType dtype) {
    engine_("all_gather", {view(out, count * size_, dtype), view(const_cast<void*>(in), count, dtype)}, {});
  }
  void all_gather_v(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) {
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    engine_("all_gather", {view(out, total, dtype), view(const_cast<void*>(in), counts.at(rank_), dtype)},
            std::vector<int64_t>(counts.begin(), counts.end()));
  }
  void broadcast(void* buf, size_t count, DType dtype, int root) {
    engine_("broadcast", {view(buf, count, dtype)}, {root});
  }
  // Only root's output is defined (torch's reduce); the others reduce a copy, so that their input is
  // left as it was whatever the ring does with its buffer.
  void reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, int root) {
    at::Tensor src = view(const_cast<void*>(in), count, dtype);
    at::Tensor x = rank_ == root ? view(out, count, dtype) : src.clone();
    if (rank_ == root && in != out) x.copy_(src);
    engine_("reduce", {x}, {root, static_cast<int64_t>(op)});
  }
  void barrier() { engine_("barrier", {}, {}); }

 private:
  static at::Tensor view(void* p, size_t count, DType dtype) {
    return at::from_blob(p, {static_cast<int64_t>(count)}, at::TensorOptions().dtype(scalar_type_of(dtype)));
  }

  HostsEngine engine_;
  int rank_, size_;
};

}  // namespace ringzero
