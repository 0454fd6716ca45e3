// SPDX-License-Identifier: Apache-2.0
// _kvxfer_bench: the C++ side of bench/python_overhead.py, kept out of the
// kvxfer package. Built beside it when KVXFER_BUILD_BENCH is on, never
// installed. It depends on the public C++ API only (kvxfer/transport.h):
// the kvxfer::Transport comes from the Python object as a capsule
// (Transport._transport_capsule), the indices through pybind11's own casts.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kvxfer/transport.h"

namespace kvxfer::bench {
namespace {

namespace py = pybind11;

// The C++ transport behind a kvxfer.Transport.
Transport& transport_of(py::handle transport) {
  const py::object capsule = transport.attr("_transport_capsule")();
  void* p = PyCapsule_GetPointer(capsule.ptr(), "kvxfer.Transport");
  if (p == nullptr) throw py::error_already_set();
  return *static_cast<Transport*>(p);
}

// The same write_blocks + poll pairs the Python benchmark makes, timed in a
// C++ loop: the figure the Python call overhead is compared against.
// Returns the mean ns per pair of each of `repeats` batches of `pairs`.
std::vector<double> time_write_poll(py::handle transport, const std::string& peer_id,
                                    py::handle local_idxs, py::handle remote_idxs, int pairs,
                                    int repeats) {
  Transport& t = transport_of(transport);
  const auto local = py::cast<std::vector<std::int64_t>>(local_idxs);
  const auto remote = py::cast<std::vector<std::int64_t>>(remote_idxs);
  std::vector<double> per_pair_ns;
  py::gil_scoped_release nogil;
  const std::optional<std::string_view> scope = peer_id;
  for (int r = 0; r < repeats; ++r) {
    std::size_t completed = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < pairs; ++i) {
      if (!t.write_blocks(peer_id, local, remote)) throw std::runtime_error("write_blocks failed");
      completed += t.poll(scope).done.size();
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    if (completed != static_cast<std::size_t>(pairs)) {
      throw std::runtime_error("time_write_poll: a write did not complete at its poll");
    }
    per_pair_ns.push_back(std::chrono::duration<double, std::nano>(elapsed).count() / pairs);
  }
  return per_pair_ns;
}

}  // namespace
}  // namespace kvxfer::bench

PYBIND11_MODULE(_kvxfer_bench, m) {
  namespace py = pybind11;
  m.doc() = "Benchmark-only helpers for bench/python_overhead.py; not part of kvxfer.";
  m.def("time_write_poll", &kvxfer::bench::time_write_poll, py::arg("transport"),
        py::arg("peer_id"), py::arg("local_idxs"), py::arg("remote_idxs"), py::arg("pairs"),
        py::arg("repeats"));
}
