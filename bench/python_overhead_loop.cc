// SPDX-License-Identifier: Apache-2.0
// _kvxfer_bench: the C++ side of bench/python_overhead.py, kept out of the
// kvxfer package. Built beside it when KVXFER_BUILD_BENCH is on, never
// installed; import kvxfer first (it registers the Transport type used here).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "arguments.h"
#include "kvxfer/transport.h"
#include "py_transport.h"

namespace kvxfer::python {
namespace {

// The same write_blocks + poll pairs the Python benchmark makes, timed in a
// C++ loop: the figure the Python call overhead is compared against.
// Returns the mean ns per pair of each of `repeats` batches of `pairs`.
std::vector<double> time_write_poll(PyTransport& self, const std::string& peer_id,
                                    py::handle local_idxs, py::handle remote_idxs, int pairs,
                                    int repeats) {
  std::vector<std::int64_t> local;
  std::vector<std::int64_t> remote;
  copy_ints(local_idxs, "local_idxs", local);
  copy_ints(remote_idxs, "remote_idxs", remote);
  std::vector<double> per_pair_ns;
  py::gil_scoped_release nogil;
  Transport& t = self.get();
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
}  // namespace kvxfer::python

PYBIND11_MODULE(_kvxfer_bench, m) {
  namespace py = pybind11;
  m.doc() = "Benchmark-only helpers for bench/python_overhead.py; not part of kvxfer.";
  m.def("time_write_poll", &kvxfer::python::time_write_poll, py::arg("transport"),
        py::arg("peer_id"), py::arg("local_idxs"), py::arg("remote_idxs"), py::arg("pairs"),
        py::arg("repeats"));
}
