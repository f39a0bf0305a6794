// ringzero._C: the pybind11 module (layer 4). Hard checks on tensors (Python validates first and gives
// the friendlier message), dtype mapping, GIL release around every blocking call, and the mapping of
// core errors to Python exceptions.
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/utils/pybind.h>

#include "core/errors.h"
#include "dtype_map.h"
#include "core/reduce.h"
#include "core/shm_comm.h"
#include "core/shm_quantized.h"
#include "core/shm_single_copy.h"
#include "core/shm_placement.h"
#include "core/shm_window.h"
#include "core/topology.h"

namespace py = pybind11;
using namespace ringzero;

void bind_adam(py::module& m);  // adam_bindings.cpp
void bind_cuda(py::module_& m);  // cuda_bindings.cpp
void bind_enums(py::module_& m);  // enum_bindings.cpp
void bind_shm_direct(py::module_& m, PyObject* comm_error, PyObject* comm_timeout, PyObject* mismatch);  // shm_direct.cpp
// Block quantization of CUDA tensors on the current stream (cuda_bindings.cpp; a CPU build raises).
void quantize_blocks_cuda(const at::Tensor& x, const at::Tensor& out, int64_t rows, int64_t n, int64_t bits,
                          int64_t block);
void dequantize_blocks_cuda(const at::Tensor& packed, const at::Tensor& out, int64_t rows, int64_t n, int64_t bits,
                            int64_t block);

namespace {

DType to_dtype(const at::Tensor& t, const char* arg) {
  const std::optional<DType> d = core_dtype(t.scalar_type());
  TORCH_CHECK_TYPE(d.has_value(), arg, " has dtype ", t.scalar_type(),
                   ", which ringzero does not reduce; use float32, float64, bfloat16, float16, int8, uint8, "
                   "int32 or int64");
  return *d;
}

void check_cpu(const at::Tensor& t, const char* arg) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), arg, " must be a CPU tensor for the shared-memory path, got ", t.device());
  TORCH_CHECK_VALUE(t.is_contiguous(), arg, " must be contiguous; call .contiguous() first");
}

DType check_pair(const at::Tensor& in, const at::Tensor& out) {
  check_cpu(in, "input");
  check_cpu(out, "output");
  const DType d = to_dtype(in, "input");
  TORCH_CHECK_TYPE(in.scalar_type() == out.scalar_type(), "output dtype ", out.scalar_type(),
                   " differs from input dtype ", in.scalar_type());
  return d;
}

ReduceOp to_op(int op) {
  TORCH_CHECK_VALUE(op >= 0 && op < kNumReduceOps, "unknown reduce op ", op);
  return static_cast<ReduceOp>(op);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "ringzero native collectives (shared memory, reduction kernels)";

  static py::exception<CommError> comm_error(m, "CommError", PyExc_RuntimeError);
  static py::exception<CommTimeoutError> comm_timeout(m, "CommTimeout", comm_error.ptr());
  static py::exception<CollectiveMismatchError> mismatch(m, "CollectiveMismatch", comm_error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CollectiveMismatchError& e) {
      PyErr_SetString(mismatch.ptr(), e.what());
    } catch (const CommTimeoutError& e) {
      PyErr_SetString(comm_timeout.ptr(), e.what());
    } catch (const CommError& e) {
      PyErr_SetString(comm_error.ptr(), e.what());
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  bind_enums(m);
  bind_shm_direct(m, comm_error.ptr(), comm_timeout.ptr(), mismatch.ptr());
  bind_adam(m);
  bind_cuda(m);
  { void bind_backend(py::module_&); bind_backend(m); }  // c10d backend: csrc/torch/backend_bindings.cpp
  m.def("reduce_isa", &reduce_isa, "Instruction set of the CPU reduction kernels in use");
  m.def("core_round_trip_ns", &core_round_trip_ns, py::arg("cpu_a"), py::arg("cpu_b"), py::arg("round_trips") = 20000,
        py::call_guard<py::gil_scoped_release>(),
        "Nanoseconds per cache-line round trip between two cpus (best of three runs): tens when they share "
        "a last-level cache, hundreds when they do not");

  m.def(
      "reduce_",
      [](at::Tensor dst, std::vector<at::Tensor> srcs, int op, int divisor) {
        check_cpu(dst, "dst");
        const DType d = to_dtype(dst, "dst");
        TORCH_CHECK_VALUE(!srcs.empty(), "srcs must not be empty");
        std::vector<const void*> ptrs;
        for (const auto& s : srcs) {
          check_cpu(s, "srcs[i]");
          TORCH_CHECK_TYPE(s.scalar_type() == dst.scalar_type(), "srcs dtype differs from dst");
          TORCH_CHECK_VALUE(s.numel() == dst.numel(), "srcs[i] has ", s.numel(), " elements, dst ", dst.numel());
          ptrs.push_back(s.data_ptr());
        }
        ReduceOp o = to_op(op);
        if (o == ReduceOp::Avg) o = ReduceOp::Sum;
        py::gil_scoped_release nogil;
        reduce_n(dst.data_ptr(), ptrs.data(), static_cast<int>(ptrs.size()), dst.numel(), d, o, divisor);
        return dst;
      },
      py::arg("dst"), py::arg("srcs"), py::arg("op"), py::arg("divisor") = 1,
      "dst = op(srcs[0], srcs[1], ...) element-wise (Avg: pass op=SUM and divisor); dst may alias a source");

  // Block quantization (reduce.h): one row of n values, or rows side by side; the packed row layout of
  // python/ringzero/parallel/data_parallel/quantize.py (integers, then float32 scales).
  // (rows, n, bytes of the integers of one row, bytes of one row) of a float32 tensor of rows of n values;
  // checks `packed` (uint8, 4-byte aligned for the scales) holds that many rows.
  struct Rows {
    int64_t rows, n, qbytes, row;
  };
  auto packed_rows = [](const char* fn, const at::Tensor& values, const at::Tensor& packed, int64_t bits,
                        int64_t block) {
    TORCH_CHECK(bits == 8 || bits == 4, fn, ": bits must be 8 or 4, got ", bits);
    TORCH_CHECK(block > 0 && block % 8 == 0, fn, ": block must be a positive multiple of 8, got ", block);
    TORCH_CHECK((values.is_cpu() || values.is_cuda()) && values.scalar_type() == at::kFloat && values.is_contiguous() &&
                    values.dim() >= 1 && values.dim() <= 2,
                fn, ": the values must be a contiguous 1-D or 2-D float32 CPU or CUDA tensor");
    const int64_t rows = values.dim() == 2 ? values.size(0) : 1, n = values.size(-1);
    const int64_t nblk = (n + block - 1) / block, qbytes = nblk * block * bits / 8, row = qbytes + 4 * nblk;
    TORCH_CHECK(packed.device() == values.device() && packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                    packed.numel() == rows * row && reinterpret_cast<uintptr_t>(packed.data_ptr()) % 4 == 0,
                fn, ": the packed tensor must be a contiguous, 4-byte aligned uint8 tensor of ", rows * row,
                " bytes on ", values.device());
    return Rows{rows, n, qbytes, row};
  };
  m.def(
      "quantize_blocks",
      [packed_rows](const at::Tensor& x, const at::Tensor& out, int64_t bits, int64_t block) {
        const auto [rows, n, qbytes, row] = packed_rows("quantize_blocks", x, out, bits, block);
        if (x.is_cuda()) return quantize_blocks_cuda(x, out, rows, n, bits, block);
        const float* xp = x.data_ptr<float>();
        uint8_t* op = out.data_ptr<uint8_t>();
        py::gil_scoped_release nogil;
        for (int64_t r = 0; r < rows; ++r)
          quantize_blocks(xp + r * n, n, static_cast<int>(bits), block, op + r * row,
                          reinterpret_cast<float*>(op + r * row + qbytes));
      },
      py::arg("x"), py::arg("out"), py::arg("bits"), py::arg("block"),
      "Packs each row of x (float32) into out as block-quantized integers and float32 scales");
  m.def(
      "dequantize_blocks",
      [packed_rows](const at::Tensor& packed, const at::Tensor& out, int64_t bits, int64_t block) {
        const auto [rows, n, qbytes, row] = packed_rows("dequantize_blocks", out, packed, bits, block);
        if (out.is_cuda()) return dequantize_blocks_cuda(packed, out, rows, n, bits, block);
        const uint8_t* pp = packed.data_ptr<uint8_t>();
        float* op = out.data_ptr<float>();
        py::gil_scoped_release nogil;
        for (int64_t r = 0; r < rows; ++r)
          dequantize_blocks(pp + r * row, reinterpret_cast<const float*>(pp + r * row + qbytes), n,
                            static_cast<int>(bits), block, op + r * n);
      },
      py::arg("packed"), py::arg("out"), py::arg("bits"), py::arg("block"),
      "Unpacks quantize_blocks' rows into out (float32, one row of n values per packed row)");
  m.def(
      "copy_bytes",
      [](const at::Tensor& dst, const at::Tensor& src, bool streaming) {
        TORCH_CHECK(dst.is_cpu() && src.is_cpu() && dst.is_contiguous() && src.is_contiguous() &&
                        dst.nbytes() == src.nbytes(),
                    "copy_bytes: dst and src must be contiguous CPU tensors of the same number of bytes");
        py::gil_scoped_release nogil;
        (streaming ? copy_streaming : copy_cached)(dst.data_ptr(), src.data_ptr(), src.nbytes());
      },
      py::arg("dst"), py::arg("src"), py::arg("streaming"),
      "dst's bytes = src's, by the collectives' own copies: memcpy, or streaming stores (streaming=True); "
      "benchmarks time the floors with it");
  m.def(
      "window_id",
      [](uintptr_t ptr, size_t bytes) {
        std::shared_ptr<ShmWindow> w = ShmWindow::find(reinterpret_cast<const void*>(ptr), bytes);
        return w ? w->id() : uint64_t{0};
      },
      py::arg("ptr"), py::arg("bytes"),
      "The id (>= 1) of the live ringzero.empty allocation of this process holding [ptr, ptr + bytes), else 0");

  py::class_<ShmComm>(m, "ShmComm")
      .def(py::init([](const std::string& name, int rank, int nranks, size_t slot_bytes, double timeout_s,
                       std::vector<int> group_ranks) {
             return std::make_unique<ShmComm>(name, rank, nranks, slot_bytes, timeout_s, std::move(group_ranks));
           }),
           py::arg("name"), py::arg("rank"), py::arg("nranks"), py::arg("slot_bytes"), py::arg("timeout_s"),
           py::arg("group_ranks"))
      .def_property_readonly("name", &ShmComm::name)
      .def_property_readonly("seq", &ShmComm::seq)
      .def_property_readonly("probes", &ShmComm::probes,
                             "Cache-placement probes run so far (two-rank staged collectives; core/shm_placement.cpp)")
      .def_property_readonly("probe_ns", &ShmComm::probe_ns, "The fastest round trip of the last probe, ns")
      .def("set_stage_streaming", &ShmComm::set_stage_streaming, py::arg("mode"),
           "This rank's staged all-reduces, reduce-scatters and all-gathers of two ranks, 64 KiB and more: 0 never "
           "stream their staging, 1 always, 2 (default) while the placement probe finds two last-level caches "
           "(core/shm_placement.cpp); the probes run whatever it is")
      .def_property_readonly("stage_other_cache", &ShmComm::stage_other_cache,
                             "The last staging probe's verdict: the peer on another last-level cache")
      .def_property_readonly("rank", &ShmComm::rank)
      .def_property_readonly("nranks", &ShmComm::nranks)
      .def_property_readonly("slot_bytes", &ShmComm::slot_bytes)
      .def("unlink", &ShmComm::unlink)
      .def(
          "create_window",
          [](ShmComm& c, size_t bytes) {
            std::shared_ptr<ShmWindow> w;
            {
              py::gil_scoped_release nogil;  // waits for the host's other ranks
              w = c.create_window(bytes);
            }
            // The tensor's storage holds the window: the mapping lives while any view of it does.
            return at::from_blob(w->region(w->rank()), {static_cast<int64_t>(bytes)}, [w](void*) {},
                                    at::TensorOptions().dtype(at::kByte));
          },
          py::arg("bytes"),
          "Collective over the host's ranks (the same bytes on each): a uint8 tensor of `bytes` in memory every "
          "local rank has mapped, which all_reduce, reduce_scatter and all_gather read from the peers directly; "
          "[Note: registered tensors] (core/shm_window.cpp)")
      .def("set_timeout", &ShmComm::set_timeout)
      .def("set_spin", &ShmComm::set_spin, py::arg("spin"),
           "Whether waits may spin before sleeping (never when ranks outnumber cores); see core/shm_wait.h")
      .def("set_single_copy", &ShmComm::set_single_copy, py::arg("allowed"),
           "This rank's vote on whether large all-gathers read peers' memory directly (decided at the first one); "
           "[Note: single copy between a host's ranks]")
      .def_property_readonly("single_copy", &ShmComm::single_copy,
                             "0: not yet decided, 1: in use, 2: off (a rank did not allow it, or the kernel refused)")
      .def_property_readonly("single_copy_calls", &ShmComm::single_copy_calls,
                             "All-gathers so far that read the peers' inputs directly (the others staged)")
      .def_static("on_huge_pages", [](uint64_t address, size_t bytes) {
            return ringzero::on_huge_pages(reinterpret_cast<const void*>(address), bytes); },
          py::arg("address"), py::arg("bytes"),
          "Whether this process's memory at [address, address + bytes) lies on huge pages, as the single-copy "
          "all-gather of a large block asks (false where the kernel cannot say: PAGEMAP_SCAN, Linux 6.7+)")
      .def("set_host_cpus", &ShmComm::set_host_cpus, py::arg("cpus"),
           "Distinct cpus the host's ranks may run on together; waits spin only if every rank can have one")
      .def_property_readonly("spin", static_cast<bool (ShmComm::*)() const>(&ShmComm::spin))
      .def("set_away", &ShmComm::set_away, py::arg("peers"),
           "This rank now waits on `peers` (group ranks, <= 2) over the network; [] when back. Peers that time "
           "out waiting for it name them")
      .def("abort", &ShmComm::abort, py::arg("reason"),
           "A step outside shared memory failed: every local rank's wait raises CommTimeout quoting `reason`")
      .def("history",
           [](const ShmComm& c) {
             // [seq, op, dtype name, numel, start perf_counter, seconds or None, status]: comm/flight.py's entries
             static const char* kStatus[] = {"running", "ok", "failed"};
             py::list out;
             for (const ShmComm::OpRecord& r : c.history()) {
               py::object seconds = r.seconds < 0 ? py::object(py::none()) : py::object(py::float_(r.seconds));
               out.append(py::make_tuple(r.seq, collective_name(r.kind), dtype_name(r.dtype), r.count, r.start_s, seconds,
                                         kStatus[r.status]));
             }
             return out;
           },
           "This rank's last 64 collectives on the segment, oldest first (for the flight recorder)")
      .def_property_readonly("busy_s", &ShmComm::busy_s)
      .def("choose_all_reduce", [](const ShmComm& c, size_t bytes) { return static_cast<int>(c.choose_all_reduce(bytes)); })
      .def("all_reduce",
           [](ShmComm& c, at::Tensor in, at::Tensor out, int op, int algo) {
             const DType d = check_pair(in, out);
             TORCH_CHECK_VALUE(in.numel() == out.numel(), "output has ", out.numel(), " elements, input ", in.numel());
             py::gil_scoped_release nogil;
             c.all_reduce(in.data_ptr(), out.data_ptr(), in.numel(), d, to_op(op), static_cast<AllReduceAlgo>(algo));
           })
      .def("all_reduce_",
           [](ShmComm& c, const at::Tensor& t, int op, int algo) {
             // In place, one tensor: the api's fast path (each tensor argument costs its conversion).
             check_cpu(t, "tensor");
             const DType d = to_dtype(t, "tensor");
             py::gil_scoped_release nogil;
             c.all_reduce(t.data_ptr(), t.data_ptr(), t.numel(), d, to_op(op), static_cast<AllReduceAlgo>(algo));
           })
      .def("reduce_scatter",
           [](ShmComm& c, at::Tensor in, at::Tensor out, int op) {
             const DType d = check_pair(in, out);
             TORCH_CHECK_VALUE(in.numel() == out.numel() * c.nranks(), "input must have world_size * output.numel() elements");
             const char* i0 = static_cast<const char*>(in.data_ptr());
             const char* o0 = static_cast<const char*>(out.data_ptr());
             TORCH_CHECK_VALUE(out.numel() == 0 || c.nranks() == 1 || o0 + out.nbytes() <= i0 || i0 + in.nbytes() <= o0,
                               "output must not overlap input");
             py::gil_scoped_release nogil;
             c.reduce_scatter(in.data_ptr(), out.data_ptr(), out.numel(), d, to_op(op));
           })
      .def("all_gather",
           [](ShmComm& c, at::Tensor in, at::Tensor out) {
             const DType d = check_pair(in, out);
             TORCH_CHECK_VALUE(out.numel() == in.numel() * c.nranks(), "output must have world_size * input.numel() elements");
             py::gil_scoped_release nogil;
             c.all_gather(in.data_ptr(), out.data_ptr(), in.numel(), d);
           })
      .def("all_gather_dequantize",
           [](ShmComm& c, at::Tensor in, at::Tensor out, int64_t n, int64_t bits, int64_t block, at::Tensor order) {
             // in: (rows, row_bytes) uint8 packed rows (quantize_blocks' layout); out: (nranks * rows, n)
             // float32; order: nranks * rows int64, a permutation. False where `in` is not in this group's window.
             TORCH_CHECK_VALUE(bits == 8 || bits == 4, "all_gather_dequantize: bits must be 8 or 4, got ", bits);
             TORCH_CHECK_VALUE(block > 0 && block % 8 == 0, "all_gather_dequantize: block must be a positive multiple of 8");
             TORCH_CHECK_VALUE(in.is_cpu() && in.scalar_type() == at::kByte && in.is_contiguous() && in.dim() == 2,
                               "all_gather_dequantize: in must be a contiguous 2-D uint8 CPU tensor");
             const int64_t rows = in.size(0), nblk = (n + block - 1) / block;
             const int64_t row_bytes = nblk * block * bits / 8 + 4 * nblk;
             TORCH_CHECK_VALUE(n >= 0 && in.size(1) == row_bytes && row_bytes % 4 == 0 &&
                                   reinterpret_cast<uintptr_t>(in.data_ptr()) % 4 == 0,
                               "all_gather_dequantize: rows of ", n, " values hold ", row_bytes, " bytes, got ", in.size(1));
             const int64_t total = rows * c.nranks();
             TORCH_CHECK_VALUE(out.is_cpu() && out.scalar_type() == at::kFloat && out.is_contiguous() &&
                                   out.numel() == total * n,
                               "all_gather_dequantize: out must be a contiguous float32 CPU tensor of ", total * n, " values");
             TORCH_CHECK_VALUE(order.is_cpu() && order.scalar_type() == at::kLong && order.is_contiguous() &&
                                   order.numel() == total,
                               "all_gather_dequantize: order must hold ", total, " int64 row indices");
             const int64_t* o = order.data_ptr<int64_t>();
             std::vector<bool> seen(static_cast<size_t>(total), false);
             for (int64_t k = 0; k < total; ++k) {
               TORCH_CHECK_VALUE(o[k] >= 0 && o[k] < total && !seen[static_cast<size_t>(o[k])],
                                 "all_gather_dequantize: order must be a permutation of 0..", total - 1);
               seen[static_cast<size_t>(o[k])] = true;
             }
             py::gil_scoped_release nogil;
             return all_gather_dequantize(c, in.data_ptr(), rows, row_bytes, n, bits, block, o, out.data_ptr<float>());
           })
      .def("all_gather_v",
           [](ShmComm& c, at::Tensor in, at::Tensor out, std::vector<size_t> counts) {
             const DType d = check_pair(in, out);
             TORCH_CHECK_VALUE(static_cast<int>(counts.size()) == c.nranks(), "counts needs one entry per rank");
             size_t total = 0;
             for (size_t x : counts) total += x;
             TORCH_CHECK_VALUE(static_cast<size_t>(out.numel()) == total, "output must have sum(counts) elements");
             TORCH_CHECK_VALUE(static_cast<size_t>(in.numel()) == counts[c.rank()], "input must have counts[rank] elements");
             py::gil_scoped_release nogil;
             c.all_gather_v(in.data_ptr(), out.data_ptr(), counts, d);
           })
      .def("all_to_all_v",
           [](ShmComm& c, at::Tensor in, at::Tensor out, std::vector<size_t> send_counts, std::vector<size_t> recv_counts) {
             // Counts in elements of the flat tensors; [Note: the all-to-all's count table] (shm_alltoall.cpp).
             const DType d = check_pair(in, out);
             TORCH_CHECK_VALUE(static_cast<int>(send_counts.size()) == c.nranks() &&
                                   static_cast<int>(recv_counts.size()) == c.nranks(),
                               "send_counts and recv_counts need one entry per rank");
             size_t sent = 0, received = 0;
             for (size_t x : send_counts) sent += x;
             for (size_t x : recv_counts) received += x;
             TORCH_CHECK_VALUE(static_cast<size_t>(in.numel()) == sent, "input has ", in.numel(),
                               " elements but sum(send_counts) = ", sent);
             TORCH_CHECK_VALUE(static_cast<size_t>(out.numel()) == received, "output has ", out.numel(),
                               " elements but sum(recv_counts) = ", received);
             const char* i0 = static_cast<const char*>(in.data_ptr());
             const char* o0 = static_cast<const char*>(out.data_ptr());
             TORCH_CHECK_VALUE(in.numel() == 0 || out.numel() == 0 || o0 + out.nbytes() <= i0 || i0 + in.nbytes() <= o0,
                               "output must not overlap input");
             py::gil_scoped_release nogil;
             c.all_to_all_v(in.data_ptr(), out.data_ptr(), send_counts, recv_counts, d);
           })
      .def("gather",
           [](ShmComm& c, at::Tensor in, at::Tensor out, int root) {
             // out: root's nranks * in.numel() elements; the others may pass any tensor of in's dtype.
             const DType d = check_pair(in, out);
             TORCH_CHECK_VALUE(root >= 0 && root < c.nranks(), "root ", root, " is outside the ", c.nranks(), " local ranks");
             TORCH_CHECK_VALUE(c.rank() != root || out.numel() == in.numel() * c.nranks(),
                               "the root's output must have world_size * input.numel() elements");
             py::gil_scoped_release nogil;
             c.gather(in.data_ptr(), out.data_ptr(), in.numel(), d, root);
           })
      .def("scatter",
           [](ShmComm& c, at::Tensor in, at::Tensor out, int root) {
             // in: root's nranks * out.numel() elements; the others may pass any tensor of out's dtype.
             const DType d = check_pair(in, out);
             TORCH_CHECK_VALUE(root >= 0 && root < c.nranks(), "root ", root, " is outside the ", c.nranks(), " local ranks");
             TORCH_CHECK_VALUE(c.rank() != root || in.numel() == out.numel() * c.nranks(),
                               "the root's input must have world_size * output.numel() elements");
             py::gil_scoped_release nogil;
             c.scatter(in.data_ptr(), out.data_ptr(), out.numel(), d, root);
           })
      .def("broadcast",
           [](ShmComm& c, at::Tensor t, int root) {
             check_cpu(t, "tensor");
             const DType d = to_dtype(t, "tensor");
             py::gil_scoped_release nogil;
             c.broadcast(t.data_ptr(), t.numel(), d, root);
           })
      .def("reduce",
           [](ShmComm& c, at::Tensor in, at::Tensor out, int op, int root) {
             const DType d = check_pair(in, out);
             TORCH_CHECK_VALUE(in.numel() == out.numel(), "output has ", out.numel(), " elements, input ", in.numel());
             py::gil_scoped_release nogil;
             c.reduce(in.data_ptr(), out.data_ptr(), in.numel(), d, to_op(op), root);
           })
      .def("barrier", [](ShmComm& c) {
        py::gil_scoped_release nogil;
        c.barrier();
      });
}
