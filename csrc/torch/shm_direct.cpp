// The api's fast path into the shared-memory collectives (layer 4): methods written against the CPython
// API (METH_FASTCALL) instead of pybind11, for the calls whose cost is mostly the call itself.
//
// A 4 KiB all-gather at 2 ranks took 1.03 us through ringzero.all_gather_single and 0.55 us through the
// pybind11 binding alone (2-core VM, one L3: benchmarks/RESULTS.md): the api's checks in Python (tensor types,
// is_cpu), pybind11's overload dispatch and its tensor casters came to 0.1-0.2 us of it. These methods
// do the same checks in C on the PyObjects themselves and return False, with nothing done and no
// exception, for arguments they do not take (a tensor subclass other than Parameter, a non-CPU,
// non-strided or non-contiguous tensor, an unsupported or mismatched dtype, a size that does not fit):
// the api then takes its slow path, which explains the problem or handles the case. True: the
// collective ran.
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/autograd/python_variable.h>

#include "core/errors.h"
#include "core/shm_comm.h"
#include "dtype_map.h"

namespace py = pybind11;
using namespace ringzero;

namespace {

PyObject* g_comm_error = nullptr;
PyObject* g_comm_timeout = nullptr;
PyObject* g_mismatch = nullptr;
PyObject* g_reduce_op = nullptr;  // ringzero.ReduceOp (an IntEnum over the core's codes): the op argument's type

struct ShmDirect {
  PyObject_HEAD
  ShmComm* comm;
  PyObject* owner;  // the pybind11 ShmComm object: keeps `comm` alive
};

// The tensor behind `obj` when the fast path takes it (plain Tensor or Parameter, CPU, strided,
// contiguous, a core dtype), else nullptr.
const at::Tensor* plain_cpu_tensor(PyObject* obj, DType* dtype) {
  if (!THPVariable_CheckExact(obj)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.defined() || t.layout() != at::kStrided || !t.device().is_cpu() || !t.is_contiguous()) return nullptr;
  const std::optional<DType> d = core_dtype(t.scalar_type());
  if (!d) return nullptr;
  *dtype = *d;
  return &t;
}

// A plain int (or, with `type`, an instance of exactly that int subclass) in [lo, hi).
bool small_int(PyObject* obj, int lo, int hi, int* out, PyObject* type = nullptr) {
  if (type ? Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(type) : !PyLong_CheckExact(obj)) return false;
  const long v = PyLong_AsLong(obj);
  if (v < lo || v >= hi) {
    PyErr_Clear();
    return false;
  }
  *out = static_cast<int>(v);
  return true;
}

bool reduce_op(PyObject* obj, int* out) { return g_reduce_op && small_int(obj, 0, kNumReduceOps, out, g_reduce_op); }

// Runs fn without the GIL and maps the core's errors as module.cpp's translator does.
template <typename Fn>
PyObject* run(Fn fn) {
  PyObject* type = nullptr;
  std::string what;
  Py_BEGIN_ALLOW_THREADS
  try {
    fn();
  } catch (const CollectiveMismatchError& e) {
    type = g_mismatch, what = e.what();
  } catch (const CommTimeoutError& e) {
    type = g_comm_timeout, what = e.what();
  } catch (const CommError& e) {
    type = g_comm_error, what = e.what();
  } catch (const InvalidArgument& e) {
    type = PyExc_ValueError, what = e.what();
  } catch (const std::exception& e) {
    type = PyExc_RuntimeError, what = e.what();
  }
  Py_END_ALLOW_THREADS
  if (type) {
    PyErr_SetString(type, what.c_str());
    return nullptr;
  }
  Py_RETURN_TRUE;
}

bool check_nargs(Py_ssize_t nargs, Py_ssize_t want, const char* name) {
  if (nargs == want) return true;
  PyErr_Format(PyExc_TypeError, "ShmDirect.%s takes %zd arguments, got %zd", name, want, nargs);
  return false;
}

// all_reduce_(tensor, op, algo): in place; op a ringzero.ReduceOp, algo an int (AllReduceAlgo).
PyObject* all_reduce_(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!check_nargs(nargs, 3, "all_reduce_")) return nullptr;
  ShmComm* c = reinterpret_cast<ShmDirect*>(self)->comm;
  DType d;
  int op, algo;
  const at::Tensor* t = plain_cpu_tensor(args[0], &d);
  if (!t || !reduce_op(args[1], &op) || !small_int(args[2], 0, 256, &algo)) Py_RETURN_FALSE;
  void* p = t->data_ptr();
  const size_t n = t->numel();
  return run([&] { c->all_reduce(p, p, n, d, static_cast<ReduceOp>(op), static_cast<AllReduceAlgo>(algo)); });
}

// all_gather(input, output): output holds nranks * input.numel() elements.
PyObject* all_gather(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!check_nargs(nargs, 2, "all_gather")) return nullptr;
  ShmComm* c = reinterpret_cast<ShmDirect*>(self)->comm;
  DType di, dout;
  const at::Tensor* in = plain_cpu_tensor(args[0], &di);
  const at::Tensor* out = plain_cpu_tensor(args[1], &dout);
  if (!in || !out || di != dout || out->numel() != in->numel() * c->nranks()) Py_RETURN_FALSE;
  const void* pi = in->data_ptr();
  void* po = out->data_ptr();
  const size_t n = in->numel();
  return run([&] { c->all_gather(pi, po, n, di); });
}

// reduce_scatter(input, output, op): op a ringzero.ReduceOp; input holds nranks * output.numel() elements; they must not overlap.
PyObject* reduce_scatter(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!check_nargs(nargs, 3, "reduce_scatter")) return nullptr;
  ShmComm* c = reinterpret_cast<ShmDirect*>(self)->comm;
  DType di, dout;
  int op;
  const at::Tensor* in = plain_cpu_tensor(args[0], &di);
  const at::Tensor* out = plain_cpu_tensor(args[1], &dout);
  if (!in || !out || di != dout || in->numel() != out->numel() * c->nranks() || !reduce_op(args[2], &op))
    Py_RETURN_FALSE;
  const char* i0 = static_cast<const char*>(in->data_ptr());
  char* o0 = static_cast<char*>(out->data_ptr());
  const size_t n = out->numel();
  const bool overlap = n != 0 && c->nranks() > 1 && o0 < i0 + in->nbytes() && i0 < o0 + out->nbytes();
  if (overlap) Py_RETURN_FALSE;
  return run([&] { c->reduce_scatter(i0, o0, n, di, static_cast<ReduceOp>(op)); });
}

// Element counts of the nranks blocks of `t` along dim 0 for all_to_all: `splits` None (equal blocks) or
// a list or tuple of nranks non-negative ints (rows) summing to t.size(0). False for anything else.
bool block_counts(PyObject* splits, const at::Tensor& t, int n, std::vector<size_t>* counts) {
  if (t.dim() == 0) return false;
  const int64_t rows = t.size(0), row = rows ? t.numel() / rows : 0;
  counts->assign(n, 0);
  if (splits == Py_None) {
    if (rows % n) return false;
    for (auto& c : *counts) c = static_cast<size_t>(rows / n * row);
    return true;
  }
  if (!PyList_CheckExact(splits) && !PyTuple_CheckExact(splits)) return false;
  if (PySequence_Fast_GET_SIZE(splits) != n) return false;
  PyObject** items = PySequence_Fast_ITEMS(splits);
  int64_t sum = 0;
  for (int q = 0; q < n; ++q) {
    if (!PyLong_CheckExact(items[q])) return false;
    const long long v = PyLong_AsLongLong(items[q]);
    if (v < 0 || v > rows) {
      PyErr_Clear();
      return false;
    }
    sum += v;
    (*counts)[q] = static_cast<size_t>(v * row);
  }
  return sum == rows;
}

// all_to_all(input, output, splits): torch's all_to_all_single along dim 0; splits None (equal blocks) or
// the tuple (output_split_sizes, input_split_sizes), each None or nranks ints. Rows of one shape; the
// tensors must not overlap.
PyObject* all_to_all(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!check_nargs(nargs, 3, "all_to_all")) return nullptr;
  ShmComm* c = reinterpret_cast<ShmDirect*>(self)->comm;
  DType di, dout;
  const at::Tensor* in = plain_cpu_tensor(args[0], &di);
  const at::Tensor* out = plain_cpu_tensor(args[1], &dout);
  if (!in || !out || di != dout || in->dim() == 0 || in->dim() != out->dim() ||
      in->sizes().slice(1) != out->sizes().slice(1))
    Py_RETURN_FALSE;
  PyObject* out_splits = Py_None;
  PyObject* in_splits = Py_None;
  if (args[2] != Py_None) {
    if (!PyTuple_CheckExact(args[2]) || PyTuple_GET_SIZE(args[2]) != 2) Py_RETURN_FALSE;
    out_splits = PyTuple_GET_ITEM(args[2], 0), in_splits = PyTuple_GET_ITEM(args[2], 1);
  }
  std::vector<size_t> send, recv;
  if (!block_counts(in_splits, *in, c->nranks(), &send) || !block_counts(out_splits, *out, c->nranks(), &recv))
    Py_RETURN_FALSE;
  const char* i0 = static_cast<const char*>(in->data_ptr());
  char* o0 = static_cast<char*>(out->data_ptr());
  if (in->numel() && out->numel() && o0 < i0 + in->nbytes() && i0 < o0 + out->nbytes()) Py_RETURN_FALSE;
  return run([&] { c->all_to_all_v(i0, o0, send, recv, di); });
}

void dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);  // a heap type: each instance holds a reference to it
  Py_XDECREF(reinterpret_cast<ShmDirect*>(self)->owner);
  type->tp_free(self);
  Py_DECREF(type);
}

PyMethodDef kMethods[] = {
    {"all_reduce_", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&all_reduce_)), METH_FASTCALL,
     "all_reduce_(tensor, op, algo) -> bool: in place; False (nothing done) for arguments the fast path does not take"},
    {"all_gather", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&all_gather)), METH_FASTCALL,
     "all_gather(input, output) -> bool; False (nothing done) for arguments the fast path does not take"},
    {"reduce_scatter", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&reduce_scatter)), METH_FASTCALL,
     "reduce_scatter(input, output, op) -> bool; False (nothing done) for arguments the fast path does not take"},
    {"all_to_all", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&all_to_all)), METH_FASTCALL,
     "all_to_all(input, output, splits) -> bool; splits None or (output_split_sizes, input_split_sizes); False "
     "(nothing done) for arguments the fast path does not take"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject* g_type = nullptr;

}  // namespace

void bind_shm_direct(py::module_& m, PyObject* comm_error, PyObject* comm_timeout, PyObject* mismatch) {
  g_comm_error = comm_error, g_comm_timeout = comm_timeout, g_mismatch = mismatch;
  static PyType_Slot slots[] = {{Py_tp_dealloc, reinterpret_cast<void*>(&dealloc)},
                                {Py_tp_methods, kMethods},
                                {Py_tp_doc, const_cast<char*>("The api's fast path into a ShmComm (see shm_direct.cpp)")},
                                {0, nullptr}};
  static PyType_Spec spec = {"ringzero._C.ShmDirect", sizeof(ShmDirect), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, slots};
  g_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&spec));
  if (!g_type) throw py::error_already_set();
  m.add_object("ShmDirect", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(g_type)));
  m.def(
      "set_reduce_op_type",
      [](py::object type) {
        Py_XDECREF(g_reduce_op);
        g_reduce_op = type.release().ptr();
      },
      "The class ShmDirect takes as `op` (ringzero.ReduceOp, made in Python from _C.REDUCE_OPS)");
  m.def(
      "shm_direct",
      [](py::object shm) {
        ShmComm* c = shm.cast<ShmComm*>();
        PyObject* obj = PyType_GenericAlloc(g_type, 0);
        if (!obj) throw py::error_already_set();
        auto* d = reinterpret_cast<ShmDirect*>(obj);
        d->comm = c;
        d->owner = shm.release().ptr();
        return py::reinterpret_steal<py::object>(obj);
      },
      py::arg("shm"), "The api's fast path into `shm` (a ShmComm): all_reduce_, all_gather, reduce_scatter, all_to_all");
}
