// SPDX-License-Identifier: Apache-2.0
#include "startup.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench_config.h"
#include "kvxfer/transport.h"
#include "pool.h"

namespace kvxfer::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kBlockLen = 64 << 10;

double millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One kind of Transport, constructed once per rep.
struct Row {
  Row(std::string k, std::string w, Options o)
      : key(std::move(k)), what(std::move(w)), options(std::move(o)) {}
  std::string key;   // in the JSON
  std::string what;  // in the table
  Options options;
  std::vector<std::string> lanes;  // built, as lanes_built() says
  std::optional<double> first_ms;
  std::vector<double> ms;  // the reps after the first
  std::string error;       // the construction threw: the row stops
};

// The lanes a Transport built: a lane that runs has counters of its own
// among the engine's (docs/metrics.md), one that does not has none.
std::vector<std::string> lanes_built(const Transport& transport) {
  const auto counters = transport.stats().engine_counters;
  std::vector<std::string> lanes;
  for (const std::string lane : {"cma", "ucx", "tcp"}) {
    if (counters.contains(lane + "_writes")) lanes.push_back(lane);
  }
  return lanes;
}

std::string lanes_text(const std::vector<std::string>& lanes) {
  return lanes.empty() ? "none" : fmt::format("{}", fmt::join(lanes, ","));
}

// Constructs the row's Transport over `pool` once, timed (the construction
// alone, not its close).
void construct(Row& row, int rep, Pool& pool) {
  if (!row.error.empty()) return;
  try {
    const auto start = Clock::now();
    Transport transport(fmt::format("startup-{}-{}-{}", row.key, ::getpid(), rep),
                        Region{pool.data(), pool.size() / kBlockLen, kBlockLen}, row.options);
    const double ms = millis(Clock::now() - start);
    row.lanes = lanes_built(transport);
    transport.close();
    if (rep == 0) {
      row.first_ms = ms;
    } else {
      row.ms.push_back(ms);
    }
  } catch (const std::exception& e) {
    row.error = e.what();
  }
}

std::string cell(const std::optional<double>& ms) {
  return ms ? fmt::format("{:.3f}", *ms) : std::string("-");
}

nlohmann::json json_of(const std::optional<double>& ms) {
  return ms ? nlohmann::json(*ms) : nlohmann::json(nullptr);
}

}  // namespace

int run_startup(const StartupArgs& a) {
  Pool pool(a.region);
  const Options bench = bench_options(a.tls);
  const auto with = [&](const char* key, const char* value) {
    Options o = bench;
    o.engine_config[key] = value;
    return o;
  };
  Options no_thread = bench;
  no_thread.progress_thread = false;
  Options loopback;
  loopback.backends = {"LOOPBACK"};
  const std::string tls = ucx_tls_for(a.tls).empty() ? "(UCX default)" : ucx_tls_for(a.tls);
  std::vector<Row> rows = {
      {"transport", fmt::format("as the bench makes it (--tls {})", a.tls.empty() ? "''" : a.tls),
       bench},
      {"transport_no_progress_thread", "the same without the progress thread", no_thread},
      {"transport_rma_on", fmt::format("the same with {}=on (the ucx lane forced)", kRmaKey),
       with(kRmaKey, "on")},
      {"transport_rma_off", fmt::format("the same with {}=off (no ucx lane)", kRmaKey),
       with(kRmaKey, "off")},
      {"transport_loopback", "the loopback engine: no lane, the core alone", loopback},
  };
  // Interleaved, so that a neighbour's load on a shared machine falls on
  // every row alike.
  for (int rep = 0; rep <= a.reps; ++rep) {
    for (Row& row : rows) construct(row, rep, pool);
  }
  Row& on = rows[2];
  Row& off = rows[3];
  // What the ucx lane adds: the same construction with it and without it,
  // paired run by run; only where those rows built the same lanes but it.
  std::optional<double> ucx_lane_ms;
  std::string ucx_lane_note;
  if (!on.error.empty() || !off.error.empty()) {
    ucx_lane_note = "a row failed";
  } else if (std::vector<std::string> without = on.lanes;
             std::erase(without, "ucx") == 1 && without == off.lanes && !on.ms.empty()) {
    std::vector<double> added;
    for (std::size_t i = 0; i < on.ms.size(); ++i) added.push_back(on.ms[i] - off.ms[i]);
    if (const double m = median(added); m > 0) {
      ucx_lane_ms = m;
    } else {
      ucx_lane_note = "none measurable: within the runs' noise";
    }
  } else {
    ucx_lane_note = fmt::format("not measured: {}=on built {}, {}=off built {}", kRmaKey,
                                lanes_text(on.lanes), kRmaKey, lanes_text(off.lanes));
  }

  fmt::print(
      "kvxfer startup: Transport construction over a {} MiB pool ({} blocks of {} KiB), "
      "UCX_TLS={}; the first run in this process, then the median of {} more\n",
      a.region >> 20, a.region / kBlockLen, kBlockLen >> 10, tls, a.reps);
  fmt::print("{:<52} {:<12} {:>9} {:>9}\n", "Transport", "lanes built", "first ms", "median ms");
  nlohmann::json j;
  j["tls"] = a.tls;
  j["ucx_tls"] = ucx_tls_for(a.tls);
  j["region"] = a.region;
  j["block_len"] = kBlockLen;
  j["reps"] = a.reps;
  for (const Row& row : rows) {
    std::optional<double> m;
    if (!row.ms.empty()) m = median(row.ms);
    fmt::print("{:<52} {:<12} {:>9} {:>9}\n", row.what,
               row.error.empty() ? lanes_text(row.lanes) : "-", cell(row.first_ms), cell(m));
    j["what"][row.key] = row.what;
    j["lanes"][row.key] = row.lanes;
    j["first_ms"][row.key] = json_of(row.first_ms);
    j["median_ms"][row.key] = json_of(m);
    j["error"][row.key] = row.error.empty() ? nullptr : nlohmann::json(row.error);
  }
  fmt::print("{:<52} {:<12} {:>9} {:>9}\n", "what the ucx lane adds (=on minus =off, run by run)",
             "", "-", cell(ucx_lane_ms));
  j["ucx_lane_ms"] = json_of(ucx_lane_ms);
  for (const Row& row : rows) {
    if (!row.error.empty()) fmt::print("{}: failed: {}\n", row.what, row.error);
  }
  if (!ucx_lane_note.empty()) fmt::print("what the ucx lane adds: {}\n", ucx_lane_note);
  fmt::print(
      "first: one-time set-up in this process (loading UCX's modules, say) falls to the first "
      "row that needs it\nthe ucx lane runs only where an RDMA device is, or with {}=on: a "
      "Transport without it creates no UCX context\n",
      kRmaKey);
  if (!a.json_path.empty()) {
    std::ofstream out(a.json_path);
    out << j.dump(2) << '\n';
    if (!out) throw std::runtime_error("cannot write " + a.json_path);
  }
  // Forcing the ucx lane may fail where UCX has no transport for it: said
  // above, not a failure of the command.
  const bool failed = std::any_of(rows.begin(), rows.end(),
                                  [&](const Row& r) { return !r.error.empty() && &r != &on; });
  return failed ? 1 : 0;
}

}  // namespace kvxfer::tools
