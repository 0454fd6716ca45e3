// SPDX-License-Identifier: Apache-2.0
#include "arguments.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <string>

namespace kvxfer::python {
namespace {

const char* type_name(PyObject* obj) { return Py_TYPE(obj)->tp_name; }

std::string shape_text(const Py_buffer& b) {
  std::string out = "(";
  for (int i = 0; i < b.ndim; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(b.shape[i]);
  }
  if (b.ndim == 1) out += ",";
  return out + ")";
}

// 4 or 8 when `b` holds native signed integers of that width, else 0.
// numpy exports int32/int64 as "i"/"l"/"q", possibly with a byte-order
// prefix; the width is taken from itemsize, which is what the exporter
// actually stores.
int signed_int_width(const Py_buffer& b) {
  const char* f = b.format != nullptr ? b.format : "B";
  if (*f == '@' || *f == '=' || (*f == '<' && std::endian::native == std::endian::little)) ++f;
  if (f[0] == '\0' || f[1] != '\0' || std::strchr("bhilqn", f[0]) == nullptr) return 0;
  return b.itemsize == 4 || b.itemsize == 8 ? static_cast<int>(b.itemsize) : 0;
}

// Raises OverflowError (pybind11 has no exception type for it).
[[noreturn]] void throw_overflow(const std::string& message) {
  PyErr_SetString(PyExc_OverflowError, message.c_str());
  throw py::error_already_set();
}

}  // namespace

std::string given(py::handle obj) {
  constexpr std::size_t kMaxRepr = 40;
  std::string text;
  PyObject* repr = PyObject_Repr(obj.ptr());
  Py_ssize_t size = 0;
  const char* utf8 = repr != nullptr ? PyUnicode_AsUTF8AndSize(repr, &size) : nullptr;
  if (utf8 != nullptr) {
    text.assign(utf8, static_cast<std::size_t>(size));
  } else {
    PyErr_Clear();
    text = "<no repr>";
  }
  Py_XDECREF(repr);
  if (text.size() > kMaxRepr) {
    // Cut on a character boundary, not inside a UTF-8 sequence.
    std::size_t cut = kMaxRepr;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text.resize(cut);
    text += "...";
  }
  const Py_ssize_t length =
      PyObject_CheckBuffer(obj.ptr()) || PySequence_Check(obj.ptr()) || PyMapping_Check(obj.ptr())
          ? PyObject_Length(obj.ptr())
          : -1;
  if (length < 0) {
    PyErr_Clear();
    return fmt::format("{} ({})", text, type_name(obj.ptr()));
  }
  return fmt::format("{} ({} of length {})", text, type_name(obj.ptr()), length);
}

std::string_view text_arg(py::handle obj, const char* name) {
  if (!PyUnicode_Check(obj.ptr())) {
    throw py::type_error(fmt::format("{} must be a str; got {}", name, given(obj)));
  }
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(obj.ptr(), &size);
  if (data == nullptr) {
    PyErr_Clear();
    throw py::value_error(
        fmt::format("{} must be a str that UTF-8 can encode; got {}", name, given(obj)));
  }
  return {data, static_cast<std::size_t>(size)};
}

std::uint64_t uint_arg(py::handle obj, const char* name) {
  PyObject* o = obj.ptr();
  if (PyBool_Check(o) || !PyIndex_Check(o)) {
    throw py::type_error(fmt::format("{} must be an int; got {}", name, given(obj)));
  }
  const auto index = py::reinterpret_steal<py::object>(PyNumber_Index(o));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow == 0 && value == -1 && PyErr_Occurred() != nullptr) throw py::error_already_set();
  if (overflow < 0 || (overflow == 0 && value < 0)) {
    throw py::value_error(fmt::format("{} must be >= 0; got {}", name, given(index)));
  }
  if (overflow == 0) return static_cast<std::uint64_t>(value);
  const unsigned long long big = PyLong_AsUnsignedLongLong(index.ptr());
  if (big == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    throw_overflow(fmt::format("{} = {} does not fit in 64 bits", name, given(index)));
  }
  return big;
}

PoolView::PoolView(py::handle view) {
  PyObject* obj = view.ptr();
  if (!PyObject_CheckBuffer(obj)) {
    throw py::type_error(fmt::format(
        "view must be a 2-D writable buffer of bytes, e.g. a memoryview of a (num_blocks, "
        "block_len) uint8 numpy array; got {}",
        type_name(obj)));
  }
  if (PyObject_GetBuffer(obj, &buffer_, PyBUF_FULL_RO) != 0) {
    py::error_already_set error;
    throw py::value_error(fmt::format("view: cannot read its buffer: {}", error.what()));
  }
  std::string problem;
  if (buffer_.readonly) {
    problem = "view must be writable; got a read-only buffer";
  } else if (buffer_.ndim != 2) {
    problem = fmt::format("view must be 2-D (num_blocks, block_len); got {}-D, shape {}",
                          buffer_.ndim, shape_text(buffer_));
  } else if (buffer_.itemsize != 1) {
    problem =
        fmt::format("view must be a buffer of bytes (itemsize 1); got itemsize {} (format '{}')",
                    buffer_.itemsize, buffer_.format != nullptr ? buffer_.format : "B");
  } else if (buffer_.suboffsets != nullptr || !PyBuffer_IsContiguous(&buffer_, 'C')) {
    problem =
        "view must be C-contiguous; got a strided buffer (copy it, or take a contiguous slice)";
  } else if (buffer_.shape[0] == 0 || buffer_.shape[1] == 0) {
    problem = fmt::format("view must hold at least one block of at least one byte; got shape {}",
                          shape_text(buffer_));
  }
  if (!problem.empty()) {
    PyBuffer_Release(&buffer_);
    throw py::value_error(problem);
  }
}

PoolView::~PoolView() { PyBuffer_Release(&buffer_); }

Region PoolView::region() const {
  return Region{buffer_.buf, static_cast<std::uint64_t>(buffer_.shape[0]),
                static_cast<std::uint64_t>(buffer_.shape[1])};
}

ByteArg::ByteArg(py::handle obj, const char* name) {
  if (!PyObject_CheckBuffer(obj.ptr()) ||
      PyObject_GetBuffer(obj.ptr(), &buffer_, PyBUF_SIMPLE) != 0) {
    PyErr_Clear();
    throw py::type_error(fmt::format("{} must be bytes (or a contiguous bytes-like object); got {}",
                                     name, given(obj)));
  }
}

ByteArg::~ByteArg() { PyBuffer_Release(&buffer_); }

IndexArg::IndexArg(py::handle obj, const char* name, std::vector<std::int64_t>& scratch)
    : scratch_(scratch) {
  PyObject* o = obj.ptr();
  const bool maybe_array = !PyList_CheckExact(o) && !PyTuple_CheckExact(o) && !PyBytes_Check(o) &&
                           !PyByteArray_Check(o) && PyObject_CheckBuffer(o);
  if (maybe_array) {
    // PyBUF_ND asks for a C-contiguous export; a strided array refuses it
    // and is copied below instead.
    if (PyObject_GetBuffer(o, &buffer_, PyBUF_ND | PyBUF_FORMAT) == 0) {
      const int ndim = buffer_.ndim;
      const int width = signed_int_width(buffer_);
      if (ndim == 1 && width != 0) {
        has_view_ = true;
        kind_ = width == 4 ? Kind::kInt32 : Kind::kInt64;
        return;
      }
      PyBuffer_Release(&buffer_);
      if (ndim != 1) {
        throw py::value_error(fmt::format("{} must be 1-D; got a {}-D array", name, ndim));
      }
    } else {
      PyErr_Clear();
    }
  }
  // A dict, set or generator would be iterated (a dict's keys taken as
  // indices): an index list is a sequence or an array, nothing else.
  if (!PyList_CheckExact(o) && !PyTuple_CheckExact(o) &&
      (!PySequence_Check(o) || PyDict_Check(o))) {
    throw py::type_error(
        fmt::format("{} must be a sequence of ints (list, tuple or 1-D integer array); got {}",
                    name, given(obj)));
  }
  copy_ints(obj, name, scratch_);
  kind_ = Kind::kInt64;
}

IndexArg::~IndexArg() {
  if (has_view_) PyBuffer_Release(&buffer_);
}

std::span<const std::int32_t> IndexArg::int32() const {
  return {static_cast<const std::int32_t*>(buffer_.buf),
          static_cast<std::size_t>(buffer_.len) / sizeof(std::int32_t)};
}

std::span<const std::int64_t> IndexArg::int64() const {
  if (!has_view_) return scratch_;
  return {static_cast<const std::int64_t*>(buffer_.buf),
          static_cast<std::size_t>(buffer_.len) / sizeof(std::int64_t)};
}

void IndexArg::widen() {
  if (kind_ != Kind::kInt32) return;
  const auto values = int32();
  scratch_.assign(values.begin(), values.end());
  PyBuffer_Release(&buffer_);
  has_view_ = false;
  kind_ = Kind::kInt64;
}

void copy_ints(py::handle obj, const char* name, std::vector<std::int64_t>& out) {
  PyObject* o = obj.ptr();
  py::object seq;
  if (!PyUnicode_Check(o) && !PyBytes_Check(o) && !PyByteArray_Check(o)) {
    seq = py::reinterpret_steal<py::object>(PySequence_Fast(o, ""));
  }
  if (!seq) {
    PyErr_Clear();
    throw py::type_error(
        fmt::format("{} must be a sequence of ints (list, tuple or 1-D integer array); got {}",
                    name, given(obj)));
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  out.resize(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = items[i];
    py::object index;
    if (!PyLong_Check(item)) {
      // numpy integer scalars and other __index__ types; floats are refused.
      index = py::reinterpret_steal<py::object>(PyNumber_Index(item));
      if (!index) {
        PyErr_Clear();
        throw py::type_error(
            fmt::format("{}[{}] must be an int; got {}", name, i, given(py::handle(item))));
      }
      item = index.ptr();
    }
    int overflow = 0;
    const long long value = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (overflow != 0) {
      // As numpy's conversion of the reference's lists answers it.
      throw_overflow(fmt::format("{}[{}] = {} does not fit in 64 bits", name, i,
                                 py::str(py::handle(item)).cast<std::string>()));
    }
    out[static_cast<std::size_t>(i)] = value;
  }
}

}  // namespace kvxfer::python
