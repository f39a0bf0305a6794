// ringzero._C's CUDA part (layer 4): tensor checks and the current stream around layers 2-3. Compiled
// into _C always; without RINGZERO_WITH_CUDA (a CPU torch) it only sets _C.has_cuda = False, so the
// Python layer can say plainly that this build has no CUDA path.
#include <pybind11/pybind11.h>

namespace py = pybind11;

#ifndef RINGZERO_WITH_CUDA

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

void bind_cuda(py::module_& m) {
  m.attr("has_cuda") = false;
  m.attr("has_nccl") = false;
  m.attr("CUDA_COLLS") = py::dict();
}

void quantize_blocks_cuda(const at::Tensor& x, const at::Tensor&, int64_t, int64_t, int64_t, int64_t) {
  TORCH_CHECK_VALUE(false, "quantize_blocks: the values are on ", x.device(), " but ringzero was built without CUDA");
}
void dequantize_blocks_cuda(const at::Tensor&, const at::Tensor& out, int64_t, int64_t, int64_t, int64_t) {
  TORCH_CHECK_VALUE(false, "dequantize_blocks: out is on ", out.device(), " but ringzero was built without CUDA");
}

#else

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <vector>

#include "backend_cuda.h"
#include "core/errors.h"
#include "cuda_algo.h"

namespace ringzero {
HostsEngine hosts_engine_of(py::object engine);  // backend_bindings.cpp
}
#include "cuda/peer_comm.h"
#include "cuda/quantize.h"
#include "cuda/reduce.h"
#include "nccl/ring_driver.h"
#include "nccl/transport.h"

using namespace ringzero;

namespace {

DType cuda_dtype(const at::Tensor& t, const char* arg) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::F32;
    case at::kBFloat16: return DType::BF16;
    case at::kHalf: return DType::F16;
    case at::kInt: return DType::I32;
    case at::kLong: return DType::I64;
    default:
      TORCH_CHECK_TYPE(false, arg, " has dtype ", t.scalar_type(), "; the CUDA collectives take float32, bfloat16, ",
                       "float16, int32 or int64 (convert with .to(), or use torch.distributed for this dtype)");
  }
}

// A contiguous CUDA tensor on `device` (when given) with `dtype` (when given); returns its dtype.
DType check_cuda(const at::Tensor& t, const char* arg, const at::Tensor* like = nullptr) {
  TORCH_CHECK_VALUE(t.is_cuda(), arg, " must be a CUDA tensor, got one on ", t.device());
  TORCH_CHECK_VALUE(t.is_contiguous(), arg, " must be contiguous; call .contiguous() first");
  if (like) {
    TORCH_CHECK_VALUE(t.device() == like->device(), arg, " is on ", t.device(), " but the input is on ", like->device());
    TORCH_CHECK_TYPE(t.scalar_type() == like->scalar_type(), arg, " dtype ", t.scalar_type(), " differs from input dtype ",
                     like->scalar_type());
  }
  return cuda_dtype(t, arg);
}

// The all-to-all moves bytes, by element size: any dtype of 1, 2, 4 or 8 bytes goes as the DType of that size.
DType mover_dtype(const at::Tensor& t, const char* arg) {
  switch (t.element_size()) {
    case 1: return DType::U8;
    case 2: return DType::F16;
    case 4: return DType::I32;
    case 8: return DType::I64;
  }
  TORCH_CHECK_TYPE(false, arg, " has dtype ", t.scalar_type(), " (", t.element_size(), " bytes an element); the CUDA ",
                   "all-to-all moves elements of 1, 2, 4 or 8 bytes (view it as another dtype first)");
  return DType::U8;
}

// One rank's all-to-all tensors, checked: a contiguous CUDA input and output of one dtype and device (the
// output not overlapping the input: the layer below checks that), and its send counts: `n` int64 on the same
// device, contiguous (they stay there: the kernel reads them, the host never does). Returns the mover dtype.
DType check_all_to_all(const at::Tensor& in, const at::Tensor& out, const at::Tensor& counts, int n,
                       const std::string& rank) {
  TORCH_CHECK_VALUE(in.is_cuda(), "input", rank, " must be a CUDA tensor, got one on ", in.device());
  TORCH_CHECK_VALUE(in.is_contiguous(), "input", rank, " must be contiguous; call .contiguous() first");
  TORCH_CHECK_VALUE(out.is_cuda() && out.device() == in.device(), "output", rank, " must be on ", in.device(),
                    ", the input's device; got ", out.device());
  TORCH_CHECK_VALUE(out.is_contiguous(), "output", rank, " must be contiguous; call .contiguous() first");
  TORCH_CHECK_TYPE(out.scalar_type() == in.scalar_type(), "output", rank, " dtype ", out.scalar_type(),
                   " differs from the input's, ", in.scalar_type());
  TORCH_CHECK_VALUE(counts.is_cuda() && counts.device() == in.device(), "send_counts", rank, " must be on ",
                    in.device(), ", the input's device (the kernel reads them there); got ", counts.device());
  TORCH_CHECK_TYPE(counts.scalar_type() == at::kLong, "send_counts", rank, " must be int64, got ",
                   counts.scalar_type());
  TORCH_CHECK_VALUE(counts.is_contiguous() && counts.numel() == n, "send_counts", rank,
                    " must be a contiguous tensor of ", n, " elements (one per rank), got ", counts.numel());
  return mover_dtype(in, "input");
}

ReduceOp op_of(int op) {
  TORCH_CHECK_VALUE(op >= 0 && op < kNumReduceOps, "unknown reduce op ", op);
  return static_cast<ReduceOp>(op);
}

cudaStream_t stream_of(const at::Tensor& t) { return at::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

cuda::PeerConfig config(size_t staging_bytes, double timeout_s, int ring_channels, int max_blocks, size_t one_shot_max,
                        size_t two_shot_max) {
  cuda::PeerConfig c;
  c.staging_bytes = staging_bytes;
  c.timeout_s = timeout_s;
  c.ring_channels = ring_channels;
  c.max_blocks = max_blocks;
  c.one_shot_max_bytes = one_shot_max;
  c.two_shot_max_bytes = two_shot_max;
  return c;
}

// Element counts of one collective, checked: all_reduce numel(out) == numel(in); reduce_scatter
// numel(in) == n * numel(out); all_gather numel(out) == n * numel(in). Returns `count` as layer 2 takes it.
size_t coll_count(cuda::Coll coll, const at::Tensor& in, const at::Tensor& out, int n) {
  const size_t i = in.numel(), o = out.numel();
  switch (coll) {
    case cuda::Coll::AllReduce:
      TORCH_CHECK_VALUE(i == o, "output has ", o, " elements, input ", i);
      return i;
    case cuda::Coll::ReduceScatter:
      TORCH_CHECK_VALUE(i == o * n, "input must have world_size * output.numel() = ", n * o, " elements, has ", i);
      return o;
    case cuda::Coll::AllGather:
      TORCH_CHECK_VALUE(o == i * n, "output must have world_size * input.numel() = ", n * i, " elements, has ", o);
      return i;
  }
  return 0;
}

// Runs f() and turns layer 2-3 exceptions into the Python ones (_C's translator covers CommError and
// InvalidArgument already; this only releases the GIL around the launch).
template <class F> void nogil(F&& f) {
  py::gil_scoped_release release;
  f();
}

// The timeout record of a communicator (cuda::RunStatus) as a dict, or None while no wait ran out.
py::object timeout_record(const cuda::RunStatus* s) {
  if (!s) return py::none();
  py::dict d;
  d["rank"] = s->rank;
  d["peer"] = s->peer;
  d["culprit"] = s->culprit;
  d["block"] = s->block;
  d["what"] = cuda::wait_name(s->what);
  d["flag"] = s->flag;
  d["target"] = s->target;
  return d;
}

struct SimRanks {
  std::unique_ptr<cuda::SimWorld> world;
  void all_to_all(const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs,
                  const std::vector<at::Tensor>& counts) {
    const int n = world->nranks();
    TORCH_CHECK_VALUE(static_cast<int>(ins.size()) == n && static_cast<int>(outs.size()) == n &&
                          static_cast<int>(counts.size()) == n,
                      "pass one input, one output and one send_counts tensor per simulated rank (", n, ")");
    std::vector<const void*> ip;
    std::vector<void*> op_;
    std::vector<size_t> in_elems, out_elems;
    std::vector<const int64_t*> cp;
    DType d = DType::U8;
    for (int q = 0; q < n; ++q) {
      const std::string rank = "[" + std::to_string(q) + "]";
      d = check_all_to_all(ins[q], outs[q], counts[q], n, rank);
      TORCH_CHECK_VALUE(ins[q].device() == ins[0].device() && ins[q].scalar_type() == ins[0].scalar_type(),
                        "every simulated rank's tensors must share the device and dtype of inputs[0]");
      ip.push_back(ins[q].data_ptr());
      op_.push_back(outs[q].data_ptr());
      in_elems.push_back(ins[q].numel());
      out_elems.push_back(outs[q].numel());
      cp.push_back(counts[q].data_ptr<int64_t>());
    }
    c10::cuda::CUDAGuard guard(ins[0].device());
    cudaStream_t s = stream_of(ins[0]);
    nogil([&] { world->all_to_all(ip, in_elems, op_, out_elems, cp, d, s); });
  }
  void run(cuda::Coll coll, const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs, int op, int algo) {
    const int n = world->nranks();
    TORCH_CHECK_VALUE(static_cast<int>(ins.size()) == n && static_cast<int>(outs.size()) == n,
                      "pass one input and one output tensor per simulated rank (", n, ")");
    const DType d = check_cuda(ins[0], "inputs[0]");
    const size_t count = coll_count(coll, ins[0], outs[0], n);
    std::vector<const void*> ip;
    std::vector<void*> op_;
    for (int q = 0; q < n; ++q) {
      check_cuda(ins[q], "inputs[q]", &ins[0]);
      check_cuda(outs[q], "outputs[q]", &ins[0]);
      TORCH_CHECK_VALUE(ins[q].numel() == ins[0].numel() && outs[q].numel() == outs[0].numel(),
                        "every simulated rank needs tensors of the same sizes");
      ip.push_back(ins[q].data_ptr());
      op_.push_back(outs[q].data_ptr());
    }
    c10::cuda::CUDAGuard guard(ins[0].device());
    cudaStream_t s = stream_of(ins[0]);
    nogil([&] { world->run(coll, ip, op_, count, d, op_of(op), cuda_algo_of(algo), s); });
  }
};

struct LoopbackRings {
  std::vector<std::unique_ptr<nccl::RingDriver>> drivers;
  nccl::LoopbackTransport transport;
  // Each simulated rank's work goes on its own side stream ordered after the current stream, so the
  // loopback copies between ranks really cross streams, as NCCL's would.
  std::vector<c10::cuda::CUDAStream> streams;

  template <class Plan> void run(const at::Tensor& first, Plan plan) {
    c10::cuda::CUDAGuard guard(first.device());
    auto cur = at::cuda::getCurrentCUDAStream(first.device().index());
    if (streams.empty())
      for (size_t q = 0; q < drivers.size(); ++q) streams.push_back(c10::cuda::getStreamFromPool(false, first.device().index()));
    nogil([&] {
      std::vector<nccl::RingDriver*> dp;
      for (size_t q = 0; q < drivers.size(); ++q) {
        nccl::stream_order(cur.stream(), streams[q].stream());
        plan(q, streams[q].stream());
        dp.push_back(drivers[q].get());
      }
      nccl::run_rings(dp, transport);
      for (auto& s : streams) nccl::stream_order(s.stream(), cur.stream());
    });
  }
};

}  // namespace

// Block quantization of CUDA tensors (module.cpp checked the shapes): on the tensors' device and current stream.
void quantize_blocks_cuda(const at::Tensor& x, const at::Tensor& out, int64_t rows, int64_t n, int64_t bits,
                          int64_t block) {
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err = cuda::launch_quantize_blocks(x.data_ptr<float>(), rows, n, static_cast<int>(bits), block,
                                                       out.data_ptr<uint8_t>(), c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "quantize_blocks: ", cudaGetErrorString(err));
}

void dequantize_blocks_cuda(const at::Tensor& packed, const at::Tensor& out, int64_t rows, int64_t n, int64_t bits,
                            int64_t block) {
  const c10::cuda::CUDAGuard guard(out.device());
  const cudaError_t err = cuda::launch_dequantize_blocks(packed.data_ptr<uint8_t>(), rows, n, static_cast<int>(bits),
                                                         block, out.data_ptr<float>(),
                                                         c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "dequantize_blocks: ", cudaGetErrorString(err));
}

void bind_cuda(py::module_& m) {
  m.attr("has_cuda") = true;
#ifdef RINGZERO_WITH_NCCL
  m.attr("has_nccl") = true;
#else
  m.attr("has_nccl") = false;
#endif
  // The `coll` codes of CudaPeerComm.run and CudaSimWorld.run (cuda::Coll, csrc/cuda/peer_comm.h) by
  // name: python/ringzero/comm/cuda.py reads them here rather than keeping its own integers.
  py::dict colls;
  colls["all_reduce"] = static_cast<int>(cuda::Coll::AllReduce);
  colls["reduce_scatter"] = static_cast<int>(cuda::Coll::ReduceScatter);
  colls["all_gather"] = static_cast<int>(cuda::Coll::AllGather);
  m.attr("CUDA_COLLS") = colls;

  m.def(
      "cuda_reduce_",
      [](at::Tensor dst, std::vector<at::Tensor> srcs, int op, int divisor) {
        const DType d = check_cuda(dst, "dst");
        TORCH_CHECK_VALUE(!srcs.empty() && srcs.size() <= cuda::kMaxRanks, "srcs must hold 1 to 8 tensors");
        std::vector<const void*> ptrs;
        for (const auto& s : srcs) {
          check_cuda(s, "srcs[i]", &dst);
          TORCH_CHECK_VALUE(s.numel() == dst.numel(), "srcs[i] has ", s.numel(), " elements, dst ", dst.numel());
          ptrs.push_back(s.data_ptr());
        }
        c10::cuda::CUDAGuard guard(dst.device());
        cudaError_t e = cuda::launch_reduce(dst.data_ptr(), ptrs.data(), static_cast<int>(ptrs.size()), dst.numel(), d,
                                            op_of(op), divisor, stream_of(dst));
        TORCH_CHECK(e == cudaSuccess, "ringzero cuda_reduce_: ", cudaGetErrorString(e));
        return dst;
      },
      py::arg("dst"), py::arg("srcs"), py::arg("op"), py::arg("divisor") = 1,
      "dst = op(srcs...) on the current stream (CUDA tensors); Avg: op=SUM with divisor");

  // Shared: the c10d backend's CUDA lane keeps the communicator its Python setup made (backend_cuda.h).
  py::class_<cuda::PeerComm, std::shared_ptr<cuda::PeerComm>>(m, "CudaPeerComm")
      .def(py::init([](int rank, int nranks, size_t staging_bytes, double timeout_s, int ring_channels, int max_blocks,
                       size_t one_shot_max, size_t two_shot_max) {
             return std::make_shared<cuda::PeerComm>(
                 rank, nranks, config(staging_bytes, timeout_s, ring_channels, max_blocks, one_shot_max, two_shot_max));
           }),
           py::arg("rank"), py::arg("nranks"), py::arg("staging_bytes"), py::arg("timeout_s"), py::arg("ring_channels"),
           py::arg("max_blocks"), py::arg("one_shot_max_bytes"), py::arg("two_shot_max_bytes"),
           "This rank's staging buffer and flags on the current device")
      .def("ipc_handle", [](const cuda::PeerComm& c) { return py::bytes(c.ipc_handle()); })
      .def("open_peers", [](cuda::PeerComm& c, std::vector<std::string> handles) { c.open_peers(handles); })
      .def("choose_algo", [](const cuda::PeerComm& c, size_t bytes) {
        return static_cast<int>(cuda::choose_algo(c.config(), bytes));
      })
      .def("run", [](cuda::PeerComm& c, int coll, at::Tensor in, at::Tensor out, int op, int algo) {
        const DType d = check_cuda(in, "input");
        check_cuda(out, "output", &in);
        const auto k = static_cast<cuda::Coll>(coll);
        const size_t count = coll_count(k, in, out, c.nranks());
        c10::cuda::CUDAGuard guard(in.device());
        cudaStream_t s = stream_of(in);
        nogil([&] { c.run(k, in.data_ptr(), out.data_ptr(), count, d, op_of(op), cuda_algo_of(algo), s); });
      }, py::arg("coll"), py::arg("input"), py::arg("output"), py::arg("op"), py::arg("algo"),
      "coll 0 all-reduce, 1 reduce-scatter, 2 all-gather, on the current stream")
      .def("all_to_all", [](cuda::PeerComm& c, at::Tensor in, at::Tensor out, at::Tensor send_counts) {
        const DType d = check_all_to_all(in, out, send_counts, c.nranks(), "");
        c10::cuda::CUDAGuard guard(in.device());
        cudaStream_t s = stream_of(in);
        nogil([&] {
          c.all_to_all(in.data_ptr(), in.numel(), out.data_ptr(), out.numel(), send_counts.data_ptr<int64_t>(), d, s);
        });
      }, py::arg("input"), py::arg("output"), py::arg("send_counts"),
      "All-to-all(v) along dim 0 on the current stream: block q of the input (send_counts[q] elements; "
      "send_counts an int64 CUDA tensor, read by the kernel) goes to rank q; the output receives block rank() "
      "of every rank in rank order, placed by the senders' counts. Every rank calls it")
      .def("timeout_record", [](const cuda::PeerComm& c) { return timeout_record(c.timed_out()); },
           "None, or what a kernel of this communicator waited for when its wait ran out (read it after the "
           "collective's stream finished); ranks are the communicator's")
      .def("check", &cuda::PeerComm::check, "Raises CommTimeout if a kernel of this communicator timed out");

  py::class_<CudaPeers>(m, "CudaBackendPeers",
                        "What the c10d backend's CUDA setup hands over (backend_cuda.h, comm/backend.py)")
      .def(py::init([](py::object peer, bool spans_hosts, bool shares_gpu, bool blocking_wait, py::object engine,
                       int rank, int size) {
             TORCH_CHECK_VALUE(engine.is_none() || spans_hosts, "engine is for a group that spans hosts; pass "
                               "spans_hosts=True with it, or no engine");
             auto shared = peer.is_none() ? nullptr : peer.cast<std::shared_ptr<cuda::PeerComm>>();
             return CudaPeers{std::move(shared), spans_hosts, shares_gpu, blocking_wait,
                              ringzero::hosts_engine_of(std::move(engine)), rank, size};
           }),
           py::arg("peer"), py::arg("spans_hosts"), py::arg("shares_gpu"), py::arg("blocking_wait"),
           py::arg("engine") = py::none(), py::arg("rank") = 0, py::arg("size") = 1,
           "engine(op, tensors, args): the CUDA collectives of a group spanning hosts (comm/backend.py "
           "CudaHostsEngine); rank and size: this rank's and the group's")
      .def_readonly("spans_hosts", &CudaPeers::spans_hosts)
      .def_readonly("shares_gpu", &CudaPeers::shares_gpu);

  py::class_<SimRanks>(m, "CudaSimWorld")
      .def(py::init([](int nranks, size_t staging_bytes, double timeout_s, int ring_channels, int max_blocks,
                       size_t one_shot_max, size_t two_shot_max) {
             auto s = std::make_unique<SimRanks>();
             s->world = std::make_unique<cuda::SimWorld>(
                 nranks, config(staging_bytes, timeout_s, ring_channels, max_blocks, one_shot_max, two_shot_max));
             return s;
           }),
           py::arg("nranks"), py::arg("staging_bytes"), py::arg("timeout_s"), py::arg("ring_channels"),
           py::arg("max_blocks"), py::arg("one_shot_max_bytes"), py::arg("two_shot_max_bytes"))
      .def_property_readonly("nranks", [](const SimRanks& s) { return s.world->nranks(); })
      .def("timeout_record", [](const SimRanks& s) { return timeout_record(s.world->timed_out()); })
      .def("check", [](const SimRanks& s) { s.world->check(); }, "Raises CommTimeout if a kernel timed out")
      .def("run", [](SimRanks& s, int coll, std::vector<at::Tensor> ins, std::vector<at::Tensor> outs, int op,
                     int algo) { s.run(static_cast<cuda::Coll>(coll), ins, outs, op, algo); },
           py::arg("coll"), py::arg("inputs"), py::arg("outputs"), py::arg("op"), py::arg("algo"))
      .def("all_to_all", [](SimRanks& s, std::vector<at::Tensor> ins, std::vector<at::Tensor> outs,
                            std::vector<at::Tensor> send_counts) { s.all_to_all(ins, outs, send_counts); },
           py::arg("inputs"), py::arg("outputs"), py::arg("send_counts"),
           "CudaPeerComm.all_to_all of every simulated rank in one launch");

  py::class_<LoopbackRings>(m, "LoopbackRing")
      .def(py::init([](int nranks, size_t slice_bytes) {
             auto r = std::make_unique<LoopbackRings>();
             for (int q = 0; q < nranks; ++q) r->drivers.push_back(std::make_unique<nccl::RingDriver>(q, nranks, slice_bytes));
             return r;
           }),
           py::arg("nranks"), py::arg("slice_bytes"), "The NCCL ring driver over the loopback transport")
      .def("all_reduce", [](LoopbackRings& r, std::vector<at::Tensor> bufs, int op) {
        TORCH_CHECK_VALUE(bufs.size() == r.drivers.size(), "one tensor per simulated rank");
        const DType d = check_cuda(bufs[0], "tensors[0]");
        for (auto& b : bufs) check_cuda(b, "tensors[q]", &bufs[0]);
        r.run(bufs[0], [&](size_t q, cudaStream_t s) {
          r.drivers[q]->plan_all_reduce(bufs[q].data_ptr(), bufs[q].numel(), d, op_of(op), s);
        });
      })
      .def("reduce_scatter", [](LoopbackRings& r, std::vector<at::Tensor> ins, std::vector<at::Tensor> works,
                                std::vector<at::Tensor> outs, int op) {
        const size_t n = r.drivers.size();
        TORCH_CHECK_VALUE(ins.size() == n && works.size() == n && outs.size() == n, "one tensor per simulated rank");
        const DType d = check_cuda(ins[0], "inputs[0]");
        for (size_t q = 0; q < n; ++q) {
          check_cuda(works[q], "works[q]", &ins[0]);
          TORCH_CHECK_VALUE(works[q].numel() == ins[q].numel(), "works[q] must have input's size");
          coll_count(cuda::Coll::ReduceScatter, ins[q], outs[q], static_cast<int>(n));
        }
        r.run(ins[0], [&](size_t q, cudaStream_t s) {
          r.drivers[q]->plan_reduce_scatter(ins[q].data_ptr(), works[q].data_ptr(), outs[q].data_ptr(), outs[q].numel(),
                                            d, op_of(op), s);
        });
      })
      .def("all_gather", [](LoopbackRings& r, std::vector<at::Tensor> ins, std::vector<at::Tensor> outs) {
        const size_t n = r.drivers.size();
        TORCH_CHECK_VALUE(ins.size() == n && outs.size() == n, "one tensor per simulated rank");
        const DType d = check_cuda(ins[0], "inputs[0]");
        for (size_t q = 0; q < n; ++q) coll_count(cuda::Coll::AllGather, ins[q], outs[q], static_cast<int>(n));
        r.run(ins[0], [&](size_t q, cudaStream_t s) {
          r.drivers[q]->plan_all_gather(ins[q].data_ptr(), outs[q].data_ptr(), ins[q].numel(), d, s);
        });
      });

#ifdef RINGZERO_WITH_NCCL
  struct NcclRing {
    std::unique_ptr<nccl::NcclTransport> transport;
    std::unique_ptr<nccl::RingDriver> driver;
  };
  m.def("nccl_unique_id", [] { return py::bytes(nccl::NcclTransport::make_unique_id()); });
  py::class_<NcclRing>(m, "NcclRing")
      .def(py::init([](std::string unique_id, int rank, int nranks, size_t slice_bytes) {
             auto r = std::make_unique<NcclRing>();
             {
               py::gil_scoped_release release;  // ncclCommInitRank waits for every rank
               r->transport = std::make_unique<nccl::NcclTransport>(unique_id, rank, nranks);
             }
             r->driver = std::make_unique<nccl::RingDriver>(rank, nranks, slice_bytes);
             return r;
           }),
           py::arg("unique_id"), py::arg("rank"), py::arg("nranks"), py::arg("slice_bytes"))
      .def("all_reduce", [](NcclRing& r, at::Tensor t, int op) {
        const DType d = check_cuda(t, "tensor");
        c10::cuda::CUDAGuard guard(t.device());
        cudaStream_t s = stream_of(t);
        nogil([&] {
          r.driver->plan_all_reduce(t.data_ptr(), t.numel(), d, op_of(op), s);
          nccl::run_ring(*r.driver, *r.transport);
        });
      })
      .def("reduce_scatter", [](NcclRing& r, at::Tensor in, at::Tensor work, at::Tensor out, int op) {
        const DType d = check_cuda(in, "input");
        check_cuda(work, "work", &in);
        check_cuda(out, "output", &in);
        TORCH_CHECK_VALUE(work.numel() == in.numel(), "work must have input's size");
        c10::cuda::CUDAGuard guard(in.device());
        cudaStream_t s = stream_of(in);
        nogil([&] {
          r.driver->plan_reduce_scatter(in.data_ptr(), work.data_ptr(), out.data_ptr(), out.numel(), d, op_of(op), s);
          nccl::run_ring(*r.driver, *r.transport);
        });
      })
      .def("all_gather", [](NcclRing& r, at::Tensor in, at::Tensor out) {
        const DType d = check_cuda(in, "input");
        check_cuda(out, "output", &in);
        c10::cuda::CUDAGuard guard(in.device());
        cudaStream_t s = stream_of(in);
        nogil([&] {
          r.driver->plan_all_gather(in.data_ptr(), out.data_ptr(), in.numel(), d, s);
          nccl::run_ring(*r.driver, *r.transport);
        });
      });
#endif
}

#endif  // RINGZERO_WITH_CUDA
