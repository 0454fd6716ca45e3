// SPDX-License-Identifier: Apache-2.0
// _kvxfer: the C++ half of the Python package `kvxfer` (the public names are
// put together in python/kvxfer/). Uses only the public API, include/kvxfer/:
// never src/, never spdlog.
//
// The GIL is released around every call into the transport that takes its
// lock: the registration worker and engine threads log while holding that
// lock, and the log bridge needs the GIL, so a caller holding the GIL while
// waiting for the lock would deadlock. Only the immutable properties
// (agent_name, geometry, fingerprint, backend) are read with the GIL held.
#include <Python.h>
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "arguments.h"
#include "kvxfer/log.h"
#include "kvxfer/loopback.h"
#include "kvxfer/metrics.h"
#include "kvxfer/shared_pool.h"
#include "kvxfer/status.h"
#include "kvxfer/telemetry.h"
#include "kvxfer/transport.h"
#include "log_bridge.h"
#include "py_transport.h"

namespace kvxfer::python {
namespace {

// An add_remote_peer_async in progress. The package resolves a
// concurrent.futures.Future from it on a helper thread.
class PendingRegistration {
 public:
  explicit PendingRegistration(std::future<void> future) : future_(std::move(future)) {}

  // Called with the GIL released; rethrows what the registration threw.
  void result() {
    if (!future_.valid()) throw std::logic_error("the registration's result was already taken");
    future_.get();
  }

 private:
  std::future<void> future_;
};

// add_remote_peer's arguments, converted (each error names its argument)
// before the GIL is released.
struct PeerArgs {
  PeerArgs(py::handle peer_id, py::handle agent_metadata, py::handle base, py::handle blocks,
           py::handle len)
      : id(text_arg(peer_id, "peer_id")),
        metadata(agent_metadata, "agent_metadata"),
        base_addr(uint_arg(base, "base_addr")),
        num_blocks(uint_arg(blocks, "num_blocks")),
        block_len(uint_arg(len, "block_len")) {}

  std::string id;
  ByteArg metadata;
  std::uintptr_t base_addr;
  std::uint64_t num_blocks;
  std::uint64_t block_len;
};

using Notifications = std::map<std::string, std::vector<std::vector<std::uint8_t>>>;

// get_notifications() hands out what the core already took off its queues,
// so nothing here may fail on a peer's bytes: a sender name that is not
// UTF-8 (the tcp lane's hello carries any bytes) is decoded with
// surrogateescape, which cannot fail and maps distinct names to distinct
// keys, so no sender's messages can land under another's name.
py::dict notifications_to_python(const Notifications& notes) {
  py::dict out;
  for (const auto& [agent, messages] : notes) {
    py::list list(messages.size());
    for (std::size_t i = 0; i < messages.size(); ++i) {
      list[i] = py::bytes(reinterpret_cast<const char*>(messages[i].data()), messages[i].size());
    }
    const auto name = py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(
        agent.data(), static_cast<Py_ssize_t>(agent.size()), "surrogateescape"));
    if (!name) throw py::error_already_set();
    out[name] = list;
  }
  return out;
}

py::list cancel(PyTransport& self, py::handle transfer_ids, py::handle mode) {
  follow_log_level();
  CancelMode cancel_mode = CancelMode::kImmediate;
  if (PyUnicode_Check(mode.ptr()) && PyUnicode_CompareWithASCIIString(mode.ptr(), "wait") == 0) {
    cancel_mode = CancelMode::kWait;
  } else if (!PyUnicode_Check(mode.ptr()) ||
             PyUnicode_CompareWithASCIIString(mode.ptr(), "immediate") != 0) {
    throw py::value_error(fmt::format("mode must be \"immediate\" or \"wait\"; got {}",
                                      py::repr(mode).cast<std::string>()));
  }
  std::vector<std::int64_t> values;
  copy_ints(transfer_ids, "transfer_ids", values);
  // Negative ids are never issued: like any unknown id, they are skipped.
  std::vector<TransferId> ids;
  ids.reserve(values.size());
  for (const std::int64_t v : values) {
    if (v >= 0) ids.push_back(static_cast<TransferId>(v));
  }
  std::vector<TransferId> still;
  {
    py::gil_scoped_release nogil;
    still = self.get().cancel(ids, cancel_mode);
  }
  py::list out(still.size());
  for (std::size_t i = 0; i < still.size(); ++i) out[i] = py::int_(still[i]);
  return out;
}

py::dict stats_to_python(const Stats& s) {
  py::dict live;
  live["memory_registrations"] = s.live.memory_registrations;
  live["peers"] = s.live.peers;
  live["remote_keys"] = s.live.remote_keys;
  live["transfers"] = s.live.transfers;
  live["requests"] = s.live.requests;
  py::dict peers;
  for (const PeerStats& p : s.peers) {
    py::dict d;
    d["num_blocks"] = p.num_blocks;
    d["bytes_done"] = p.bytes_done;
    d["transfers_done"] = p.transfers_done;
    d["transfers_failed"] = p.transfers_failed;
    d["reads_done"] = p.reads_done;
    d["read_bytes_done"] = p.read_bytes_done;
    d["post_failures"] = p.post_failures;
    d["posts_refused"] = p.posts_refused;
    d["inflight"] = p.inflight;
    d["strikes"] = p.strikes;
    d["fault"] = p.fault ? py::object(py::str(*p.fault)) : py::none();
    peers[py::str(p.peer_id)] = d;
  }
  py::dict out;
  out["live"] = live;
  out["inflight"] = s.inflight;
  out["registrations_pending"] = s.registrations_pending;
  out["peers"] = peers;
  py::dict counters;
  for (const auto& [name, value] : s.engine_counters) counters[py::str(name)] = value;
  out["engine_counters"] = counters;
  return out;
}

py::dict histogram_to_python(const LatencyHistogram& h) {
  py::list bounds;
  for (std::size_t i = 0; i < LatencyHistogram::kBuckets; ++i) {
    bounds.append(LatencyHistogram::upper_bound_seconds(i));
  }
  py::list counts;
  for (const std::uint64_t c : h.counts) counts.append(c);
  py::dict d;
  d["bounds"] = bounds;
  d["counts"] = counts;  // per bucket, the last one above the largest bound
  d["count"] = h.count;
  d["sum"] = h.sum_seconds;
  return d;
}

py::dict ops_to_python(const std::array<OpCounters, kNumTransferOps>& ops) {
  py::dict out;
  for (std::size_t i = 0; i < kNumTransferOps; ++i) {
    py::dict d;
    d["bytes_done"] = ops[i].bytes_done;
    d["transfers_done"] = ops[i].transfers_done;
    d["transfers_failed"] = ops[i].transfers_failed;
    out[py::str(std::string(op_name(static_cast<TransferOp>(i))))] = d;
  }
  return out;
}

py::dict faults_to_python(const std::array<std::uint64_t, kNumFaultCauses>& faults) {
  py::dict out;
  for (std::size_t i = 0; i < kNumFaultCauses; ++i) {
    out[py::str(std::string(fault_cause_name(static_cast<FaultCause>(i))))] = faults[i];
  }
  return out;
}

// The snapshot as plain dicts (kvxfer.metrics builds its families from it).
py::dict metrics_to_python(const Metrics& m) {
  py::dict out;
  out["agent"] = m.agent;
  out["ops"] = ops_to_python(m.ops);
  out["post_failures"] = m.post_failures;
  out["posts_refused"] = m.posts_refused;
  out["strikes_total"] = m.strikes_total;
  out["faults"] = faults_to_python(m.faults);
  out["inflight"] = m.inflight;
  out["peers_registered"] = m.peers_registered;
  out["registrations_pending"] = m.registrations_pending;
  py::dict counters;
  for (const auto& [name, value] : m.engine_counters) counters[py::str(name)] = value;
  out["engine_counters"] = counters;
  py::dict latency;
  for (std::size_t i = 0; i < kNumTransferOps; ++i) {
    latency[py::str(std::string(op_name(static_cast<TransferOp>(i))))] =
        histogram_to_python(m.transfer_latency[i]);
  }
  out["transfer_latency"] = latency;
  out["write_blocks_duration"] = histogram_to_python(m.write_blocks_duration);
  out["poll_duration"] = histogram_to_python(m.poll_duration);
  py::dict peers;
  for (const PeerMetrics& p : m.peers) {
    py::dict d;
    d["ops"] = ops_to_python(p.ops);
    d["post_failures"] = p.post_failures;
    d["posts_refused"] = p.posts_refused;
    d["strikes_total"] = p.strikes_total;
    d["faults"] = faults_to_python(p.faults);
    d["inflight"] = p.inflight;
    d["strikes"] = p.strikes;
    d["faulted"] = p.faulted;
    peers[py::str(p.peer_id)] = d;
  }
  out["peers"] = peers;
  return out;
}

// Seconds (a Python float) to the core's milliseconds. The value is checked
// before the conversion, which is undefined for inf, nan and out-of-range
// values; a positive timeout shorter than 1 ms rounds up, not to 0 (off).
std::chrono::milliseconds stall_timeout_ms(double seconds) {
  constexpr double kMaxSeconds = static_cast<double>(kMaxStallTimeout.count()) / 1000.0;
  if (!std::isfinite(seconds) || seconds < 0.0 || seconds > kMaxSeconds) {
    throw py::value_error(fmt::format(
        "stall_timeout must be a number of seconds from 0 (off) to {:.0f} (a year); got {}",
        kMaxSeconds, seconds));
  }
  // Nearest, not up: 0.07 * 1000.0 is 70.00000000000001.
  const auto ms = static_cast<std::int64_t>(std::llround(seconds * 1000.0));
  return std::chrono::milliseconds(seconds > 0.0 && ms == 0 ? 1 : ms);
}

constexpr std::array kStatuses{
    Status::kInProgress,   Status::kSuccess,  Status::kNotPosted,    Status::kInvalidParam,
    Status::kBackend,      Status::kNotFound, Status::kMismatch,     Status::kNotAllowed,
    Status::kRepostActive, Status::kUnknown,  Status::kNotSupported, Status::kRemoteDisconnect,
    Status::kCanceled,     Status::kStalled,
};

// A uint8 array of shape (num_blocks, block_len) over a new SharedPool,
// which lives as long as the array (and every view of it).
py::array shared_pool(std::int64_t num_blocks, std::int64_t block_len) {
  if (num_blocks < 1 || block_len < 1) {
    throw py::value_error(fmt::format("shared_pool: num_blocks ({}) and block_len ({}) must be >= 1",
                                      num_blocks, block_len));
  }
  const auto blocks = static_cast<std::uint64_t>(num_blocks);
  const auto len = static_cast<std::uint64_t>(block_len);
  if (blocks > static_cast<std::uint64_t>(PTRDIFF_MAX) / len) {
    throw py::value_error(fmt::format("shared_pool: {} blocks of {} bytes is too large",
                                      num_blocks, block_len));
  }
  std::unique_ptr<SharedPool> pool;
  int err = 0;
  {
    py::gil_scoped_release release;
    try {
      pool = std::make_unique<SharedPool>(blocks * len);
    } catch (const std::system_error& e) {
      err = e.code().value();
    }
  }
  if (!pool) {
    errno = err;
    PyErr_SetFromErrno(PyExc_OSError);
    throw py::error_already_set();
  }
  void* data = pool->data();
  py::capsule owner(pool.release(), [](void* p) { delete static_cast<SharedPool*>(p); });
  return py::array_t<std::uint8_t>({num_blocks, block_len}, {block_len, std::int64_t{1}},
                                   static_cast<std::uint8_t*>(data), owner);
}

}  // namespace
}  // namespace kvxfer::python

PYBIND11_MODULE(_kvxfer, m) {
  using namespace kvxfer;
  using namespace kvxfer::python;
  using release_gil = py::call_guard<py::gil_scoped_release>;

  m.doc() = "C++ core of the kvxfer package; import kvxfer instead.";
  m.attr("__version__") = std::string(version().substr(version().find(' ') + 1));
  m.def("library_path", &library_path,
        "The file the C++ library was loaded from (see kvxfer.info()).");
  m.def("shared_pool", &shared_pool, py::arg("num_blocks"), py::arg("block_len"),
        "A zeroed uint8 array of shape (num_blocks, block_len) in shared memory (a\n"
        "kvxfer::SharedPool). Register it as a Transport's pool, and peers on this\n"
        "host map it and copy with memcpy instead of process_vm_writev/readv.\n"
        "Raises ValueError for a size below 1 or too large, OSError when the memory\n"
        "cannot be had.");

  py::enum_<Status> status(m, "Status", "kvxfer status codes (mirrors the NIXL status set).");
  for (const Status s : kStatuses) status.value(std::string(status_name(s)).c_str(), s);

  py::register_exception<SupersededError>(m, "SupersededError", PyExc_RuntimeError);

  py::class_<PendingRegistration>(m, "_PendingRegistration")
      .def("result", &PendingRegistration::result, release_gil());

  py::class_<loopback::FaultPlan>(m, "FaultPlan",
                                  "The loopback engine's fault plan (see kvxfer.loopback).")
      .def("fail_next_posts", &loopback::FaultPlan::fail_next_posts, py::arg("status"),
           py::arg("count") = 1, release_gil())
      .def("fail_checks", &loopback::FaultPlan::fail_checks, py::arg("transfer_id"),
           py::arg("status"), release_gil())
      .def("clear_check_error", &loopback::FaultPlan::clear_check_error, py::arg("transfer_id"),
           release_gil())
      .def("finish_with", &loopback::FaultPlan::finish_with, py::arg("transfer_id"),
           py::arg("status"), release_gil())
      .def("hold_next", &loopback::FaultPlan::hold_next, py::arg("count") = 1, release_gil())
      .def("land", &loopback::FaultPlan::land, py::arg("transfer_id"), release_gil())
      .def("fail_next_releases", &loopback::FaultPlan::fail_next_releases, py::arg("status"),
           py::arg("count") = 1, release_gil())
      .def("fail_next_connects", &loopback::FaultPlan::fail_next_connects, py::arg("status"),
           py::arg("count") = 1, release_gil())
      .def("fail_next_disconnects", &loopback::FaultPlan::fail_next_disconnects, py::arg("status"),
           py::arg("count") = 1, release_gil())
      .def("disconnect", &loopback::FaultPlan::disconnect, py::arg("agent_name"), release_gil())
      .def("reconnect", &loopback::FaultPlan::reconnect, py::arg("agent_name"), release_gil())
      .def("set_connect_delay_ms", &loopback::FaultPlan::set_connect_delay_ms, py::arg("delay_ms"),
           release_gil())
      .def_property_readonly("check_count", [](const loopback::FaultPlan& plan) {
        py::gil_scoped_release nogil;
        return plan.check_count();
      });

  py::class_<PyTransport> transport(m, "Transport");
  transport
      .def(py::init([](py::handle agent_name, py::handle view, std::string config_json,
                       std::vector<std::string> backends, int num_threads, bool progress_thread,
                       int strike_limit, double stall_timeout,
                       std::map<std::string, std::string> engine_config, int latency_sample_every,
                       bool telemetry, std::size_t telemetry_capacity) {
             sync_log_level();
             Options options;
             options.config_json = std::move(config_json);
             options.backends = std::move(backends);
             options.num_threads = num_threads;
             options.progress_thread = progress_thread;
             options.strike_limit = strike_limit;
             options.stall_timeout = stall_timeout_ms(stall_timeout);
             options.engine_config = std::move(engine_config);
             options.latency_sample_every = latency_sample_every;
             options.telemetry = telemetry;
             options.telemetry_capacity = telemetry_capacity;
             return std::make_unique<PyTransport>(std::string(text_arg(agent_name, "agent_name")),
                                                  view, std::move(options));
           }),
           py::arg("agent_name"), py::arg("view"), py::kw_only(), py::arg("config_json"),
           py::arg("backends"), py::arg("num_threads"), py::arg("progress_thread"),
           py::arg("strike_limit"), py::arg("stall_timeout"), py::arg("engine_config"),
           py::arg("latency_sample_every") = 16, py::arg("telemetry") = false,
           py::arg("telemetry_capacity") = 4096)
      .def_property_readonly("available",
                             [](PyTransport& self) {
                               py::gil_scoped_release nogil;
                               return self.get().available();
                             })
      .def_property_readonly("closed",
                             [](PyTransport& self) {
                               py::gil_scoped_release nogil;
                               return self.get().closed();
                             })
      .def_property_readonly("agent_name",
                             [](PyTransport& self) { return self.get().agent_name(); })
      .def_property_readonly("backend", [](PyTransport& self) { return self.get().backend(); })
      .def_property_readonly("base_addr", [](PyTransport& self) { return self.get().base_addr(); })
      .def_property_readonly("num_blocks",
                             [](PyTransport& self) { return self.get().num_blocks(); })
      .def_property_readonly("block_len", [](PyTransport& self) { return self.get().block_len(); })
      .def_property_readonly("config_fingerprint",
                             [](PyTransport& self) { return self.get().config_fingerprint(); })
      .def_property_readonly(
          "fault_plan", [](PyTransport& self) { return self.get().fault_plan(); },
          py::return_value_policy::reference_internal,
          "The loopback engine's FaultPlan, or None for other engines.")
      // For C++ extensions outside the package (bench/python_overhead_loop.cc):
      // the kvxfer::Transport behind this object, as a capsule named
      // "kvxfer.Transport", so that they need the public C++ API only, not
      // this module's headers. Valid while this object lives.
      .def("_transport_capsule",
           [](PyTransport& self) { return py::capsule(&self.get(), "kvxfer.Transport"); })
      .def("get_agent_metadata",
           [](PyTransport& self) {
             std::vector<std::uint8_t> bytes;
             {
               py::gil_scoped_release nogil;
               bytes = self.get().agent_metadata();
             }
             return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
           })
      .def(
          "add_remote_peer",
          [](PyTransport& self, py::handle peer_id, py::handle agent_metadata, py::handle base_addr,
             py::handle num_blocks, py::handle block_len) {
            follow_log_level();
            const PeerArgs peer(peer_id, agent_metadata, base_addr, num_blocks, block_len);
            py::gil_scoped_release nogil;
            self.get().add_remote_peer(peer.id, peer.metadata.span(), peer.base_addr,
                                       peer.num_blocks, peer.block_len);
          },
          py::arg("peer_id"), py::arg("agent_metadata"), py::arg("base_addr"),
          py::arg("num_blocks"), py::arg("block_len"))
      .def(
          "_add_remote_peer_async",
          [](PyTransport& self, py::handle peer_id, py::handle agent_metadata, py::handle base_addr,
             py::handle num_blocks, py::handle block_len) {
            follow_log_level();
            const PeerArgs peer(peer_id, agent_metadata, base_addr, num_blocks, block_len);
            py::gil_scoped_release nogil;
            return std::make_unique<PendingRegistration>(self.get().add_remote_peer_async(
                peer.id, peer.metadata.span(), peer.base_addr, peer.num_blocks, peer.block_len));
          },
          py::arg("peer_id"), py::arg("agent_metadata"), py::arg("base_addr"),
          py::arg("num_blocks"), py::arg("block_len"))
      .def(
          "remove_remote_peer",
          [](PyTransport& self, py::handle peer_id) {
            follow_log_level();
            const std::string id(text_arg(peer_id, "peer_id"));
            py::gil_scoped_release nogil;
            self.get().remove_remote_peer(id);
          },
          py::arg("peer_id"))
      .def(
          "peers", [](PyTransport& self) { return self.get().peers(); }, release_gil())
      .def(
          "_record_post_failure",
          [](PyTransport& self, py::handle peer_id, const std::string& cause) {
            follow_log_level();
            const std::string id(text_arg(peer_id, "peer_id"));
            py::gil_scoped_release nogil;
            return self.get().record_post_failure(id, cause);
          },
          py::arg("peer_id"), py::arg("cause"),
          "Counts a post the caller could not make against the peer, as a failed post.")
      .def("cancel", &cancel, py::arg("transfer_ids"), py::arg("mode") = "immediate")
      .def(
          "send_notification",
          [](PyTransport& self, py::handle peer_id, py::handle message) {
            follow_log_level();
            const std::string_view peer = text_arg(peer_id, "peer_id");
            ByteArg bytes(message, "message");
            std::optional<TransferId> id;
            {
              py::gil_scoped_release nogil;
              id = self.get().send_notification(peer, bytes.span());
            }
            return id ? py::object(py::int_(*id)) : py::object(py::none());
          },
          py::arg("peer_id"), py::arg("message"),
          "Sends message (bytes-like, 1..4096 bytes) to the peer with no blocks: a transfer id\n"
          "that poll() reports done once the peer took it, or None.")
      .def(
          "get_notifications",
          [](PyTransport& self) {
            follow_log_level();
            Notifications notes;
            {
              py::gil_scoped_release nogil;
              notes = self.get().get_notifications();
            }
            return notifications_to_python(notes);
          },
          "The notifications peers delivered since the last call: {agent_name: [bytes, ...]},\n"
          "each list in its sender's order; each message is returned once. A name that is\n"
          "not UTF-8 is decoded with errors=\"surrogateescape\" (name.encode(\"utf-8\",\n"
          "\"surrogateescape\") gives its bytes back).")
      .def("close",
           [](PyTransport& self) {
             follow_log_level();
             py::gil_scoped_release nogil;
             self.get().close();
           })
      .def("stats",
           [](PyTransport& self) {
             Stats s;
             {
               py::gil_scoped_release nogil;
               s = self.get().stats();
             }
             return stats_to_python(s);
           })
      .def(
          "metrics",
          [](PyTransport& self) {
            Metrics snapshot;
            {
              py::gil_scoped_release nogil;
              snapshot = self.get().metrics();
            }
            return metrics_to_python(snapshot);
          },
          "A snapshot of the transport's counters, gauges and latency histograms as dicts\n"
          "(see kvxfer.metrics for them on a prometheus_client registry).")
      .def(
          "_telemetry",
          [](PyTransport& self) {
            Telemetry taken;
            {
              py::gil_scoped_release nogil;
              taken = self.get().telemetry();
            }
            // Times as seconds on time.monotonic()'s clock (CLOCK_MONOTONIC,
            // steady_clock's on Linux).
            auto seconds = [](std::chrono::steady_clock::time_point t) {
              return std::chrono::duration<double>(t.time_since_epoch()).count();
            };
            py::list records(taken.records.size());
            for (std::size_t i = 0; i < taken.records.size(); ++i) {
              const TransferRecord& r = taken.records[i];
              records[i] = py::make_tuple(r.id, r.peer, std::string(op_name(r.op)), r.blocks,
                                          r.bytes, seconds(r.posted), seconds(r.completed),
                                          std::string(result_name(r.result)), r.lane);
            }
            return py::make_tuple(records, taken.dropped);
          },
          "(records as tuples, dropped): see kvxfer.Transport.telemetry().")
      .def(
          "prometheus_text",
          [](PyTransport& self) {
            py::gil_scoped_release nogil;
            return prometheus_text(self.get().metrics());
          },
          "The metrics in the Prometheus text exposition format.");

  add_hot_path(transport);
  add_regions(m, transport);

  m.def("_set_poll_result", &set_poll_result, py::arg("type"), py::arg("empty"),
        "Hands over the PollResult class and its shared empty value.");
  m.def(
      "_engine_counter_info",
      [](const std::string& name) {
        const EngineCounterInfo info = engine_counter_info(name);
        return py::make_tuple(info.kind == EngineCounterKind::kGauge ? "gauge" : "counter",
                              info.is_public);
      },
      py::arg("name"),
      "(kind, is_public) of an engine counter, as kvxfer::engine_counter_info declares it.");
  m.def("_config_fingerprint_json", &config_fingerprint_json, py::arg("canonical_json"),
        "First 16 hex chars of sha256 of canonical JSON text (kvxfer.config_fingerprint).");
  m.attr("_MAX_STALL_TIMEOUT_S") = static_cast<double>(kMaxStallTimeout.count()) / 1000.0;
  m.attr("_MAX_TELEMETRY_CAPACITY") = kMaxTelemetryCapacity;
  m.attr("_MAX_NOTIFICATION_BYTES") = kMaxNotificationBytes;
  m.def(
      "_notifications_to_python",
      [](const std::vector<std::pair<py::bytes, std::vector<py::bytes>>>& taken) {
        Notifications notes;
        for (const auto& [name, messages] : taken) {
          auto& list = notes[std::string(name)];
          for (const auto& message : messages) {
            const std::string bytes(message);
            list.emplace_back(bytes.begin(), bytes.end());
          }
        }
        return notifications_to_python(notes);
      },
      py::arg("taken"),
      "What get_notifications() makes of the notifications the core took, given as\n"
      "[(sender name bytes, [message bytes, ...]), ...] (for tests).");
  m.def("sync_log_level", &sync_log_level,
        "Sets the library's log level from logging.getLogger('kvxfer') now. Not needed:\n"
        "every call into kvxfer, and every record, notices a level change first.");
  m.def(
      "flush_log",
      [](double timeout) {
        // The log thread needs the GIL to hand records to logging.
        py::gil_scoped_release nogil;
        return kvxfer::flush_log(
            std::chrono::milliseconds(static_cast<std::int64_t>(timeout * 1000)));
      },
      py::arg("timeout") = 5.0,
      "Waits (at most `timeout` seconds) until every record the library logged so far has "
      "reached logging.getLogger('kvxfer'); True when it has. Records are handed to logging by "
      "the library's log thread, a little after the call that logged them returns.");

  install_log_bridge();
}
