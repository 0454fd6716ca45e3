// SPDX-License-Identifier: Apache-2.0
// PyTransport: what a kvxfer.Transport object holds on the C++ side.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <utility>

#include "arguments.h"
#include "kvxfer/transport.h"

namespace kvxfer::python {

// The pool's buffer export (none for a transport with no pool: view None)
// plus the transport that writes into it; the export outlives the transport.
class PyTransport {
 public:
  PyTransport(std::string agent_name, py::handle view, Options options) {
    if (!view.is_none()) view_ = std::make_unique<PoolView>(view);
    const Region region = view_ ? view_->region() : Region{};
    py::gil_scoped_release nogil;
    transport_ = std::make_unique<Transport>(std::move(agent_name), region, std::move(options));
  }

  ~PyTransport() {
    // Closing joins the registration worker, which may be logging.
    py::gil_scoped_release nogil;
    transport_.reset();
  }

  PyTransport(const PyTransport&) = delete;
  PyTransport& operator=(const PyTransport&) = delete;

  Transport& get() { return *transport_; }

 private:
  std::unique_ptr<PoolView> view_;
  std::unique_ptr<Transport> transport_;
};

// Adds write_blocks and poll to the bound class as METH_FASTCALL methods:
// pybind11's generic dispatch costs more than the calls themselves.
void add_hot_path(py::class_<PyTransport>& cls);

// Adds the region and descriptor-list calls (register_memory, prepare,
// transfer...) and the DescList class (regions.cc).
void add_regions(py::module_& m, py::class_<PyTransport>& cls);

// The PollResult class (a typing.NamedTuple defined in Python) and its one
// shared empty value, handed over at import.
void set_poll_result(py::handle type, py::handle empty);

}  // namespace kvxfer::python
