// SPDX-License-Identifier: Apache-2.0
// Conversions of the Python arguments of the kvxfer module: the pool view,
// metadata bytes and index lists. Each error names the argument it is about.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvxfer/transport.h"

namespace kvxfer::python {

namespace py = pybind11;

// The local pool: a 2-D, C-contiguous, writable buffer of bytes. Holding the
// buffer export keeps the exporter from freeing or moving the memory (a
// bytearray cannot be resized, a numpy array cannot be resized in place)
// for as long as this lives. Construct and destroy with the GIL held.
class PoolView {
 public:
  explicit PoolView(py::handle view);
  ~PoolView();
  PoolView(const PoolView&) = delete;
  PoolView& operator=(const PoolView&) = delete;

  [[nodiscard]] Region region() const;

 private:
  Py_buffer buffer_{};
};

// Read-only bytes (bytes, bytearray, memoryview...), pinned while this lives.
class ByteArg {
 public:
  ByteArg(py::handle obj, const char* name);
  ~ByteArg();
  ByteArg(const ByteArg&) = delete;
  ByteArg& operator=(const ByteArg&) = delete;

  [[nodiscard]] std::span<const std::uint8_t> span() const {
    return {static_cast<const std::uint8_t*>(buffer_.buf), static_cast<std::size_t>(buffer_.len)};
  }

 private:
  Py_buffer buffer_{};
};

// One index list of write_blocks. A 1-D C-contiguous int32 or int64 buffer
// (a numpy array) is handed on as a view, which the core reads exactly once
// (into the copy it checks and posts: another thread may be writing to the
// array); anything else (list, tuple, other dtypes, strided arrays) is
// copied into `scratch` as int64.
class IndexArg {
 public:
  enum class Kind { kInt32, kInt64 };

  IndexArg(py::handle obj, const char* name, std::vector<std::int64_t>& scratch);
  ~IndexArg();
  IndexArg(const IndexArg&) = delete;
  IndexArg& operator=(const IndexArg&) = delete;

  [[nodiscard]] Kind kind() const { return kind_; }
  [[nodiscard]] std::span<const std::int32_t> int32() const;
  [[nodiscard]] std::span<const std::int64_t> int64() const;
  // Makes the values available as int64 (copies an int32 view into scratch).
  void widen();

 private:
  Kind kind_ = Kind::kInt64;
  bool has_view_ = false;
  Py_buffer buffer_{};
  std::vector<std::int64_t>& scratch_;
};

// Copies any iterable of Python ints into `out` (TypeError naming `name` and
// the position of an element that is not an int, OverflowError for one that
// does not fit in 64 bits).
void copy_ints(py::handle obj, const char* name, std::vector<std::int64_t>& out);

// What a caller passed, for an error message: its repr, shortened (metadata
// can be kilobytes), its type and, when it has one, its length.
[[nodiscard]] std::string given(py::handle obj);

// A str argument as UTF-8, valid while `obj` lives. TypeError naming `name`
// for anything else, ValueError for a str that is not valid UTF-8 (lone
// surrogates).
[[nodiscard]] std::string_view text_arg(py::handle obj, const char* name);

// A non-negative integer argument that fits in 64 bits (an int or anything
// with __index__, e.g. a numpy integer; not a bool). TypeError naming `name`
// for another type, ValueError for a negative value, OverflowError for one
// of 2**64 or more.
[[nodiscard]] std::uint64_t uint_arg(py::handle obj, const char* name);

}  // namespace kvxfer::python
