// SPDX-License-Identifier: Apache-2.0
// write_blocks, read_blocks and poll, called once per transfer from the serving loop. They
// are plain METH_FASTCALL methods: no argument tuple, no overload resolution,
// no type-caster lookups. Exceptions go through pybind11's registered
// translators, so they map exactly as for every other method.
#include <Python.h>
#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "arguments.h"
#include "log_bridge.h"
#include "py_transport.h"

namespace kvxfer::python {
namespace {

PyTypeObject* g_transport_type = nullptr;
PyTypeObject* g_poll_result_type = nullptr;
PyObject* g_empty_poll_result = nullptr;

// Sets the Python error for the exception being handled, as pybind11's own
// dispatcher does.
void translate_current_exception() {
  if (py::detail::apply_exception_translators(
          py::detail::get_local_internals().registered_exception_translators)) {
    return;
  }
  if (py::detail::apply_exception_translators(
          py::detail::get_internals().registered_exception_translators)) {
    return;
  }
  PyErr_SetString(PyExc_SystemError, "kvxfer: an exception escaped translation");
}

PyTransport& unwrap(PyObject* self) {
  if (!PyObject_TypeCheck(self, g_transport_type)) {
    throw py::type_error(
        fmt::format("expected a kvxfer.Transport; got {}", Py_TYPE(self)->tp_name));
  }
  // PyTransport is the only C++ type in the instance, so it is the first
  // value (the pybind11 fast path: no type lookup).
  void* value = reinterpret_cast<py::detail::instance*>(self)->get_value_and_holder().value_ptr();
  if (value == nullptr) throw py::type_error("kvxfer.Transport.__init__() was not called");
  return *static_cast<PyTransport*>(value);
}

// Binds fastcall arguments to `names`, positionally then by keyword.
template <std::size_t N>
std::array<PyObject*, N> bind_args(const char* function, const std::array<const char*, N>& names,
                                   std::size_t required, PyObject* const* args, Py_ssize_t nargs,
                                   PyObject* kwnames) {
  std::array<PyObject*, N> out{};
  if (static_cast<std::size_t>(nargs) > N) {
    throw py::type_error(
        fmt::format("{}() takes at most {} arguments ({} given)", function, N, nargs));
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) out[static_cast<std::size_t>(i)] = args[i];
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    std::size_t j = 0;
    while (j < N && PyUnicode_CompareWithASCIIString(key, names[j]) != 0) ++j;
    if (j == N) {
      throw py::type_error(fmt::format("{}() got an unexpected keyword argument '{}'", function,
                                       py::str(key).cast<std::string>()));
    }
    if (out[j] != nullptr) {
      throw py::type_error(
          fmt::format("{}() got multiple values for argument '{}'", function, names[j]));
    }
    out[j] = args[nargs + k];
  }
  for (std::size_t j = 0; j < required; ++j) {
    if (out[j] == nullptr) {
      throw py::type_error(fmt::format("{}() missing required argument '{}'", function, names[j]));
    }
  }
  return out;
}

PyObject* id_tuple(const std::vector<TransferId>& ids) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(ids.size()));
  if (tuple == nullptr) throw py::error_already_set();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    PyObject* id = PyLong_FromUnsignedLongLong(ids[i]);
    if (id == nullptr) {
      Py_DECREF(tuple);
      throw py::error_already_set();
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), id);
  }
  return tuple;
}

PyObject* to_python(const PollResult& result) {
  if (g_poll_result_type == nullptr) throw std::logic_error("kvxfer: import kvxfer, not _kvxfer");
  if (result.empty()) {
    Py_INCREF(g_empty_poll_result);
    return g_empty_poll_result;
  }
  // What tuple.__new__(PollResult, ...) does, without building the
  // argument tuples (PollResult adds no fields of its own).
  py::object out =
      py::reinterpret_steal<py::object>(g_poll_result_type->tp_alloc(g_poll_result_type, 3));
  if (!out) throw py::error_already_set();
  PyTuple_SET_ITEM(out.ptr(), 0, id_tuple(result.done));
  PyTuple_SET_ITEM(out.ptr(), 1, id_tuple(result.failed));
  PyObject* fault = Py_None;
  if (result.peer_fault) {
    fault = PyUnicode_DecodeUTF8(result.peer_fault->data(),
                                 static_cast<Py_ssize_t>(result.peer_fault->size()), "replace");
    if (fault == nullptr) throw py::error_already_set();
  } else {
    Py_INCREF(fault);
  }
  PyTuple_SET_ITEM(out.ptr(), 2, fault);
  return out.release().ptr();
}

// write_blocks and read_blocks: the same arguments, one transfer each way.
template <bool kRead>
PyObject* transfer_blocks(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                          PyObject* kwnames) {
  try {
    follow_log_level();
    PyTransport& transport = unwrap(self);
    static constexpr std::array<const char*, 4> kNames{"peer_id", "local_idxs", "remote_idxs",
                                                       "notify"};
    const auto a =
        bind_args(kRead ? "read_blocks" : "write_blocks", kNames, 3, args, nargs, kwnames);
    const std::string_view peer_id = text_arg(a[0], "peer_id");
    std::vector<std::int64_t> local_copy;
    std::vector<std::int64_t> remote_copy;
    IndexArg local(a[1], "local_idxs", local_copy);
    IndexArg remote(a[2], "remote_idxs", remote_copy);
    // None (or absent): no notification. The core copies the bytes once.
    std::optional<ByteArg> notify;
    if (a[3] != nullptr && a[3] != Py_None) {
      notify.emplace(a[3], "notify");
      // The core's checks name no argument (and take no bytes as none).
      if (notify->span().empty()) {
        throw py::value_error("notify must hold at least one byte (None: no notification)");
      }
      if (notify->span().size() > kMaxNotificationBytes) {
        throw py::value_error(fmt::format("notify must hold at most {} bytes; got {}",
                                          kMaxNotificationBytes, notify->span().size()));
      }
    }
    const std::span<const std::uint8_t> message =
        notify ? notify->span() : std::span<const std::uint8_t>{};
    if (local.kind() != remote.kind()) {
      local.widen();
      remote.widen();
    }
    std::optional<TransferId> id;
    {
      py::gil_scoped_release nogil;
      Transport& t = transport.get();
      if (local.kind() == IndexArg::Kind::kInt32) {
        id = kRead ? t.read_blocks(peer_id, local.int32(), remote.int32(), message)
                   : t.write_blocks(peer_id, local.int32(), remote.int32(), message);
      } else {
        id = kRead ? t.read_blocks(peer_id, local.int64(), remote.int64(), message)
                   : t.write_blocks(peer_id, local.int64(), remote.int64(), message);
      }
    }
    if (!id) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(*id);
  } catch (...) {
    translate_current_exception();
    return nullptr;
  }
}

PyObject* poll(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  try {
    follow_log_level();
    PyTransport& transport = unwrap(self);
    static constexpr std::array<const char*, 1> kNames{"peer_id"};
    const auto a = bind_args("poll", kNames, 0, args, nargs, kwnames);
    std::optional<std::string_view> peer_id;
    if (a[0] != nullptr && a[0] != Py_None) peer_id = text_arg(a[0], "peer_id");
    PollResult result;
    {
      py::gil_scoped_release nogil;
      result = transport.get().poll(peer_id);
    }
    return to_python(result);
  } catch (...) {
    translate_current_exception();
    return nullptr;
  }
}

template <auto F>
PyCFunction as_cfunction() {
  // Through void(*)() so the compiler accepts the METH_FASTCALL signature.
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(F));
}

PyMethodDef g_write_blocks_def{
    "write_blocks", as_cfunction<&transfer_blocks<false>>(), METH_FASTCALL | METH_KEYWORDS,
    "write_blocks($self, peer_id, local_idxs, remote_idxs, notify=None)\n--\n\n"
    "Posts one WRITE of local block local_idxs[i] to remote block remote_idxs[i] for\n"
    "every i. The index lists are lists, tuples or 1-D integer arrays (int32/int64\n"
    "numpy arrays are not converted: their memory is read exactly once, into the\n"
    "copy that is then checked and posted). notify (bytes-like, 1..4096 bytes): the\n"
    "peer's get_notifications() shows it once every byte of this write is in its\n"
    "memory; the write is done once the peer took it. Returns the transfer id, or\n"
    "None when the peer is unknown or the post failed (counted against the peer)."};

PyMethodDef g_read_blocks_def{
    "read_blocks", as_cfunction<&transfer_blocks<true>>(), METH_FASTCALL | METH_KEYWORDS,
    "read_blocks($self, peer_id, local_idxs, remote_idxs, notify=None)\n--\n\n"
    "Posts one READ of the peer's block remote_idxs[i] into local block local_idxs[i]\n"
    "for every i: the mirror of write_blocks (same index types, same checks, and a\n"
    "local block may not appear twice). poll() reports it done once the bytes are in\n"
    "this transport's pool; notify as for write_blocks, delivered to the peer read\n"
    "from. Returns the transfer id, or None when the peer is unknown or the post\n"
    "failed (counted against the peer)."};

PyMethodDef g_poll_def{
    "poll", as_cfunction<&poll>(), METH_FASTCALL | METH_KEYWORDS,
    "poll($self, peer_id=None)\n--\n\n"
    "Reports transfers that finished since the last poll: PollResult(done, failed,\n"
    "peer_fault). Scoped to peer_id when given (its siblings' completions stay for\n"
    "their own polls); None checks every peer."};

void add_method(py::class_<PyTransport>& cls, PyMethodDef* def) {
  PyObject* descr = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), def);
  if (descr == nullptr) throw py::error_already_set();
  cls.attr(def->ml_name) = py::reinterpret_steal<py::object>(descr);
}

}  // namespace

void add_hot_path(py::class_<PyTransport>& cls) {
  g_transport_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  add_method(cls, &g_write_blocks_def);
  add_method(cls, &g_read_blocks_def);
  add_method(cls, &g_poll_def);
}

void set_poll_result(py::handle type, py::handle empty) {
  if (!PyType_Check(type.ptr()) ||
      !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(type.ptr()), &PyTuple_Type)) {
    throw py::type_error("PollResult must be a tuple subclass");
  }
  g_poll_result_type = reinterpret_cast<PyTypeObject*>(type.inc_ref().ptr());
  g_empty_poll_result = empty.inc_ref().ptr();
}

}  // namespace kvxfer::python
