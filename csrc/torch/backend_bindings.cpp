// Python binding of the c10d backend: ringzero._C.RingzeroBackend, a subclass of torch's
// torch._C._distributed_c10d.Backend, built by the creator that python/ringzero/comm/backend.py
// registers with torch.distributed.Backend.register_backend.
#include <ATen/core/Tensor.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "backend.h"
#include "core/errors.h"

namespace py = pybind11;

namespace {

// Holder that lets go of the GIL while dropping the last reference: destruction drains the worker
// thread, whose future callbacks (DDP comm hooks written in Python) may need the GIL. torch holds its
// own c10d objects the same way.
template <typename T>
class NoGilPtr {
 public:
  NoGilPtr() = default;
  explicit NoGilPtr(T* p) : p_(c10::intrusive_ptr<T>::unsafe_reclaim_from_nonowning(p)) {}
  explicit NoGilPtr(c10::intrusive_ptr<T> p) : p_(std::move(p)) {}
  NoGilPtr(const NoGilPtr&) = default;
  NoGilPtr(NoGilPtr&&) noexcept = default;
  NoGilPtr& operator=(const NoGilPtr&) = default;
  NoGilPtr& operator=(NoGilPtr&&) noexcept = default;
  ~NoGilPtr() {
    if (p_ && PyGILState_Check()) {
      py::gil_scoped_release nogil;
      p_.reset();
    }
  }
  T* get() const { return p_.get(); }
  T& operator*() const { return *p_; }
  T* operator->() const { return p_.get(); }

 private:
  c10::intrusive_ptr<T> p_;
};

// torch's objects arrive as raw pointers (their pybind holder is torch's private type); taking our
// own reference keeps them alive as long as the backend.
template <typename T>
c10::intrusive_ptr<T> share(T* p) {
  return p ? c10::intrusive_ptr<T>::unsafe_reclaim_from_nonowning(p) : c10::intrusive_ptr<T>();
}

// A Python object that C++ threads may hold: dropped with the GIL taken, and leaked if Python is already
// finalising.
std::shared_ptr<py::object> held_with_gil(py::object obj) {
  return std::shared_ptr<py::object>(new py::object(std::move(obj)), [](py::object* p) {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    delete p;
  });
}

// The Python setup function of the CUDA lane as the backend's CudaSetup: called with the GIL taken
// (c10d ops arrive without it); its result is a ringzero._C.CudaBackendPeers (cuda_bindings.cpp). The
// function object is dropped with the GIL held, and leaked if Python is already finalising.
ringzero::CudaSetup cuda_setup_of(py::object fn) {
  if (fn.is_none()) return {};
  std::shared_ptr<py::object> held = held_with_gil(std::move(fn));
  return [held](int device_index) {
    py::gil_scoped_acquire gil;
    return (*held)(device_index).cast<ringzero::CudaPeers>();
  };
}

}  // namespace

// The Python HostsEngine (comm/backend.py) as the backend's HostsEngine, and the CUDA one as its CUDA
// lane's (cuda_bindings.cpp): called on the backend's worker thread or the caller's, which takes the GIL
// for the call (the engine's waits on gloo release it again). What the engine raises comes back as the
// core's error of the same kind (module.cpp maps those to ringzero.CommTimeout and
// ringzero.CollectiveMismatch), its message kept, so that Work.wait() says what the engine said. Dropped
// with the GIL held, and leaked if Python is already finalising.
namespace ringzero {
namespace {
// What the engine raised (the name of its Python exception class and its message) as the core's error.
std::exception_ptr engine_error(const std::string& op, const std::string& kind, const std::string& message) {
  if (kind == "CommTimeout") return std::make_exception_ptr(ringzero::CommTimeoutError(message));
  if (kind == "CollectiveMismatch") return std::make_exception_ptr(ringzero::CollectiveMismatchError(message));
  return std::make_exception_ptr(ringzero::CommError("ringzero " + op + " across hosts failed: " + kind + ": " + message));
}

// Calls the engine with the GIL taken; rethrows what it raised as engine_error.
void call_engine(const py::object& engine, const std::string& op, const std::vector<at::Tensor>& tensors,
                 const std::vector<int64_t>& args, const std::shared_ptr<DeferredCall>* deferred) {
  std::string kind, message;
  {
    py::gil_scoped_acquire gil;
    try {
      if (deferred && *deferred) {
        engine(op, tensors, args, *deferred);
      } else {
        engine(op, tensors, args);
      }
      return;
    } catch (py::error_already_set& e) {
      kind = py::str(e.type().attr("__name__")).cast<std::string>();
      message = py::str(e.value()).cast<std::string>();
    }
  }
  std::rethrow_exception(engine_error(op, kind, message));
}
}  // namespace

HostsEngine hosts_engine_of(py::object engine) {
  if (engine.is_none()) return {};
  std::shared_ptr<py::object> held = held_with_gil(std::move(engine));
  return [held](const std::string& op, const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& args) {
    call_engine(*held, op, tensors, args, nullptr);
  };
}

// The CPU engine (HostsEngine in comm/backend.py): an all-reduce that may defer its tail gets its
// DeferredCall as a fourth argument ([Note: the engine's deferred tail], backend_hosts.h).
HostsEngineCall hosts_engine_call_of(py::object engine) {
  if (engine.is_none()) return {};
  std::shared_ptr<py::object> held = held_with_gil(std::move(engine));
  return [held](const std::string& op, const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& args,
                const std::shared_ptr<DeferredCall>& deferred) { call_engine(*held, op, tensors, args, &deferred); };
}
}  // namespace ringzero

PYBIND11_DECLARE_HOLDER_TYPE(T, NoGilPtr<T>, true)

void bind_backend(py::module_& m) {
  using ringzero::RingzeroBackend;
  py::module_::import("torch._C._distributed_c10d");  // registers c10d.Backend, our base
  py::class_<ringzero::BackendConfig>(m, "BackendConfig", "What the c10d backend is built with (see backend.h)")
      .def(py::init([](std::string host_id, double timeout_s, size_t slot_bytes, int all_reduce_algo,
                       bool spans_hosts, bool single_copy, int host_cpus) {
             TORCH_CHECK_VALUE(all_reduce_algo >= 0 && all_reduce_algo < ringzero::kNumAllReduceAlgos,
                               "all_reduce_algo must be one of ringzero._C.ALL_REDUCE_ALGOS, got ", all_reduce_algo);
             return ringzero::BackendConfig{std::move(host_id), timeout_s, slot_bytes,
                                            static_cast<ringzero::AllReduceAlgo>(all_reduce_algo), single_copy,
                                            spans_hosts, host_cpus};
           }),
           py::arg("host_id"), py::arg("timeout_s"), py::arg("slot_bytes"), py::arg("all_reduce_algo"),
           py::arg("spans_hosts") = false, py::arg("single_copy") = true, py::arg("host_cpus") = 0)
      .def_readonly("spans_hosts", &ringzero::BackendConfig::spans_hosts)
      .def_readonly("host_id", &ringzero::BackendConfig::host_id)
      .def_readonly("timeout_s", &ringzero::BackendConfig::timeout_s)
      .def_readonly("slot_bytes", &ringzero::BackendConfig::slot_bytes)
      .def_readonly("single_copy", &ringzero::BackendConfig::single_copy)
      .def_readonly("host_cpus", &ringzero::BackendConfig::host_cpus)
      .def_property_readonly("all_reduce_algo",
                             [](const ringzero::BackendConfig& c) { return static_cast<int>(c.all_reduce_algo); });
  py::class_<ringzero::DeferredCall, std::shared_ptr<ringzero::DeferredCall>>(
      m, "DeferredCall", "An all-reduce of the c10d backend's engine across hosts that may return before its last "
      "segment has run ([Note: the engine's deferred tail], csrc/torch/backend_hosts.h)")
      .def("next_queued", [](ringzero::DeferredCall& c) { return c.task.next_queued(); },
           "True when another op of the group is queued behind this one on the backend's worker")
      .def("defer", [](ringzero::DeferredCall& c) { c.deferred = true; },
           "The engine returns with the tail still to run: the Work completes at complete(), not at the return")
      .def("complete", [](ringzero::DeferredCall& c, const std::string& kind, const std::string& message) {
             TORCH_CHECK(c.deferred && !c.completed, "ringzero: DeferredCall.complete() on a call that was not "
                         "deferred or was completed already");
             c.completed = true;
             std::exception_ptr error = kind.empty() ? nullptr : ringzero::engine_error("all_reduce", kind, message);
             py::gil_scoped_release nogil;  // its future's callbacks (DDP's hooks) may take the GIL themselves
             c.task.complete(error);
           }, py::arg("kind") = "", py::arg("message") = "",
           "Completes the deferred call's Work; kind: the name of the exception its tail raised ('' if none)");
  py::class_<RingzeroBackend, c10d::Backend, NoGilPtr<RingzeroBackend>>(m, "RingzeroBackend",
                                                                         "ringzero's c10d backend (see backend.h)")
      .def(py::init([](c10d::Store* store, int rank, int size, const ringzero::BackendConfig& config,
                       c10d::Backend* cpu_fallback, c10d::Backend* cuda_fallback, py::object cuda_setup,
                       py::object hosts_engine) {
             TORCH_CHECK_VALUE(store, "store must not be None");
             TORCH_CHECK_VALUE(hosts_engine.is_none() || config.spans_hosts, "hosts_engine is for a group that spans "
                               "hosts; pass config.spans_hosts=True with it, or no engine");
             ringzero::CudaSetup setup = cuda_setup_of(std::move(cuda_setup));
             ringzero::HostsEngineCall engine = ringzero::hosts_engine_call_of(std::move(hosts_engine));
             py::gil_scoped_release nogil;  // the rendezvous waits for every rank
             return NoGilPtr<RingzeroBackend>(c10::make_intrusive<RingzeroBackend>(
                 share(store), rank, size, config, share(cpu_fallback), share(cuda_fallback), std::move(setup),
                 std::move(engine)));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("config"), py::arg("cpu_fallback"),
           py::arg("cuda_fallback") = nullptr, py::arg("cuda_setup") = py::none(), py::arg("hosts_engine") = py::none(),
           "Collective over the group: rendezvous of the shared-memory segment through `store`. cuda_setup(device_index) "
           "-> CudaBackendPeers is called once, at the first CUDA collective; hosts_engine(op, tensors, args) runs the "
           "CPU collectives of a group spanning hosts (comm/backend.py).")
      .def_property_readonly("uses_shared_memory", &RingzeroBackend::uses_shared_memory,
                             "False when the group spans hosts")
      .def_property_readonly("runs_across_hosts", &RingzeroBackend::runs_across_hosts,
                             "True when the group spans hosts and its CPU collectives run on ringzero's engine")
      .def("stats", [](const RingzeroBackend& b, const std::string& device) { return b.stats(c10::Device(device).type()); },
           py::arg("device") = "cpu",
           "{'native': {op: calls}, 'fallback': {op: calls}}: which ops on tensors of `device` ran on our kernels");
}
