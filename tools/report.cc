// SPDX-License-Identifier: Apache-2.0
#include "report.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kvxfer/metrics.h"
#include "kvxfer/transport.h"
#include "machine.h"
#include "pool.h"
#include "subprocess.h"

namespace kvxfer::tools {
namespace {

using nlohmann::json;

std::string size_name(std::uint64_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

std::string fixed(const std::optional<double>& v, int digits = 2) {
  return v ? fmt::format("{:.{}f}", *v, digits) : "-";
}

// p50/p99/max, to the µs (a tenth below 10 µs).
std::string us_triple(const Timing& t) {
  if (t.count == 0) return "-";
  auto f = [](double v) { return v < 10 ? fmt::format("{:.1f}", v) : fmt::format("{:.0f}", v); };
  return fmt::format("{}/{}/{}", f(t.p50_us), f(t.p99_us), f(t.max_us));
}

json timing_json(const Timing& t) {
  return {{"count", t.count},
          {"mean_us", t.mean_us},
          {"p50_us", t.p50_us},
          {"p99_us", t.p99_us},
          {"max_us", t.max_us}};
}

template <typename T>
json opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

}  // namespace

std::optional<double> ratio_of(const std::optional<double>& gbps,
                               const std::optional<double>& baseline) {
  if (!gbps || !baseline || *baseline <= 0) return std::nullopt;
  return *gbps / *baseline;
}

std::optional<double> CaseResult::memcpy_ratio() const { return ratio_of(gbps, memcpy_gbps); }

std::optional<double> CaseResult::memcpy_all_ratio() const {
  return ratio_of(gbps, memcpy_all_gbps);
}

std::optional<double> CaseResult::perftest_ratio() const { return ratio_of(gbps, perftest.gbps); }

std::optional<bool> BenchReport::raw_tcp_agrees() const {
  if (!raw_tcp_gbps || !iperf3.gbps || *iperf3.gbps <= 0) return std::nullopt;
  return std::abs(*raw_tcp_gbps - *iperf3.gbps) <= kRawTcpAgreement * *iperf3.gbps;
}

std::optional<double> BenchReport::vs_iperf3(const CaseResult& c) const {
  return ratio_of(c.gbps, iperf3.gbps);
}

std::optional<double> BenchReport::tcp_vs_ucx(const CaseResult& c) const {
  if (c.lane != "tcp" && c.lane != "ucx") return std::nullopt;
  const auto find = [&](const char* lane) -> const CaseResult* {
    for (const CaseResult& o : cases) {
      if (o.lane == lane && o.spec.name == c.spec.name && o.encrypted == c.encrypted) return &o;
    }
    return nullptr;
  };
  const CaseResult* tcp = find("tcp");
  const CaseResult* ucx = find("ucx");
  if (tcp == nullptr || ucx == nullptr) return std::nullopt;
  return ratio_of(tcp->gbps, ucx->gbps);
}

std::string BenchReport::lanes_carried() const {
  std::vector<std::string> seen;
  std::string joined;
  for (const CaseResult& c : cases) {
    if (c.lane_seen.empty() || std::find(seen.begin(), seen.end(), c.lane_seen) != seen.end()) {
      continue;
    }
    seen.push_back(c.lane_seen);
    joined += (joined.empty() ? "" : "+") + c.lane_seen;
  }
  return joined;
}

bool BenchReport::all_verified() const {
  return !cases.empty() &&
         std::all_of(cases.begin(), cases.end(), [](const CaseResult& c) { return c.verified; });
}

void print_table(const BenchReport& report, std::FILE* out) {
  // The all-cores memcpy column is named for its thread count, so a reader
  // sees which limit the "x all-cores" ratio is quoted against.
  const auto with_threads =
      std::find_if(report.cases.begin(), report.cases.end(),
                   [](const CaseResult& c) { return c.memcpy_all_threads > 0; });
  const std::string memcpy_all_name =
      with_threads != report.cases.end()
          ? fmt::format("memcpy {}-core GB/s", with_threads->memcpy_all_threads)
          : std::string("memcpy N-core GB/s");
  // After `verified`: the lane that carried each case and the target
  // process's CPU seconds per GB (the receiving side's cost); TCP runs (an
  // iperf3 figure or error) add its GB/s over iperf3's, and --lane both its
  // tcp lane GB/s over its ucx lane GB/s.
  // The lane column is always there: a case's bytes went over the lane the
  // initiator's counters name, whatever UCX_TLS said.
  const bool lanes = true;
  const bool iperf = report.iperf3.gbps.has_value() || !report.iperf3.error.empty();
  const bool both = report.lanes.size() > 1;
  const auto extra = [&](const std::string& lane, const std::string& vs_iperf,
                         const std::string& tcp_ucx, const std::string& target_cpu) {
    std::string e;
    if (lanes || iperf) e += fmt::format("  {:<7}", lane);
    if (iperf) e += fmt::format(" {:>8}", vs_iperf);
    if (both) e += fmt::format(" {:>7}", tcp_ucx);
    if (lanes || iperf) e += fmt::format(" {:>15}", target_cpu);
    return e;
  };
  const bool extras = lanes || iperf;
  const std::string verified_fmt = extras ? "{:<8}" : "{}";
  fmt::print(out,
             "{:<6} {:>9} {:>6} {:>9} {:>7} {:>10} {:>18} {:>18} {:>7} {:>6} {:>19} {:>11} {:>9} "
             "{:>6}  {}{}\n",
             "case", "block_len", "batch", "1st GB/s", "GB/s", "blocks/s",
             report.args.op == "read" ? "read µs p50/99/max" : "write µs p50/99/max",
             "poll µs p50/99/max", "memcpy", "ratio", memcpy_all_name, "x all-cores", "perftest",
             "ratio", fmt::format(fmt::runtime(verified_fmt), "verified"),
             extra("lane", "x iperf3", "tcp/ucx", "target CPU s/GB"));
  for (const CaseResult& c : report.cases) {
    const bool reg = c.spec.is_reg();
    // The lane that carried it; when it is not the one asked for, both.
    std::string lane = c.lane_seen.empty() ? "-" : c.lane_seen;
    if (!c.lane.empty() && !c.lane_seen.empty() && c.lane_seen != c.lane) {
      lane = fmt::format("{}!={}", lane, c.lane);
    }
    if (c.encrypted) lane += "+tls";
    fmt::print(out,
               "{:<6} {:>9} {:>6} {:>9} {:>7} {:>10} {:>18} {:>18} {:>7} {:>6} {:>19} {:>11} {:>9} "
               "{:>6}  {}{}\n",
               c.spec.name, size_name(c.spec.block_len),
               reg ? std::string("-") : std::to_string(c.spec.batch), fixed(c.first_pass_gbps),
               fixed(c.gbps), c.blocks_per_s ? fmt::format("{:.0f}", *c.blocks_per_s) : "-",
               reg ? us_triple(c.usable) : us_triple(c.write_call),
               reg ? std::string("-") : us_triple(c.poll_call), fixed(c.memcpy_gbps),
               fixed(c.memcpy_ratio()), fixed(c.memcpy_all_gbps), fixed(c.memcpy_all_ratio()),
               fixed(c.perftest.gbps), fixed(c.perftest_ratio()),
               fmt::format(fmt::runtime(verified_fmt), c.verified ? "yes" : "NO"),
               extra(lane, fixed(report.vs_iperf3(c)), fixed(report.tcp_vs_ucx(c)),
                     c.target_cpu_s_per_gb ? fmt::format("{:.3f}", *c.target_cpu_s_per_gb) : "-"));
  }
  for (const CaseResult& c : report.cases) {
    // With --lane both a case has a row per lane: its lines name the lane.
    std::string name =
        both && !c.lane.empty() ? fmt::format("{} ({} lane)", c.spec.name, c.lane) : c.spec.name;
    if (c.encrypted) name += " (encrypted)";
    if (c.spec.is_reg() && c.usable.count > 0) {
      fmt::print(out,
                 "{}: a {}-block peer is usable (add_remote_peer + first write landed) in "
                 "{:.0f} µs median, {:.0f} µs p99 over {} tries, {:.0f} µs the first time; "
                 "add_remote_peer alone {:.0f} µs median; this side's {} MiB pool registered in "
                 "{:.1f} ms\n",
                 name, c.num_blocks, c.usable.p50_us, c.usable.p99_us, c.usable.count,
                 c.usable_first_us, c.add_peer.p50_us, (c.num_blocks * c.spec.block_len) >> 20,
                 c.local_registration_ms);
      fmt::print(out,
                 "{}: malloc heap growth: {} bytes per add_remote_peer; per write held in "
                 "flight: {} bytes (1 block), {} bytes (16 blocks)\n",
                 name, c.add_peer_heap_bytes, fixed(c.inflight_bytes_1, 0),
                 fixed(c.inflight_bytes_16, 0));
    }
    if (!c.error.empty()) fmt::print(out, "{}: {}\n", name, c.error);
    // --encrypt both: the encrypted row against its cleartext twin.
    const auto clear = std::find_if(report.cases.begin(), report.cases.end(), [&](const auto& o) {
      return !o.encrypted && o.lane == c.lane && o.spec.name == c.spec.name;
    });
    if (c.encrypted && clear != report.cases.end() && c.gbps && clear->gbps) {
      fmt::print(out, "{}: {:.2f} GB/s encrypted, {:.2f}x the {:.2f} GB/s of cleartext\n", name,
                 *c.gbps, *c.gbps / *clear->gbps, *clear->gbps);
    }
    if (c.first_pass_measured_gbps > 0 && !c.first_pass_fresh) {
      fmt::print(out,
                 "{}: its first pass met a target pool that an earlier case or warm-up of this "
                 "run had written: only a target's first case meets a fresh pool\n",
                 name);
    }
    if (c.mapping_warm_gbps) {
      fmt::print(out,
                 "{}: before timing, one untimed write of every block through this case's new "
                 "mapping of the target's pool: {:.2f} GB/s (a first write through a new mapping "
                 "costs more per page on some VMs, once per peer)\n",
                 name, *c.mapping_warm_gbps);
    }
    if (c.others_cores >= 0.25) {
      fmt::print(out,
                 "{}: other processes used {:.1f} of {} cores while it ran (load average {:.1f}): "
                 "its ratios are less trustworthy\n",
                 name, c.others_cores, report.cpus, c.loadavg);
    }
    // ucx_perftest runs once per case, whatever the lanes: one line for it.
    const bool first_of_case = std::none_of(
        report.cases.data(), &c, [&](const CaseResult& o) { return o.spec.name == c.spec.name; });
    if (!c.spec.is_reg() && !c.perftest.gbps && !c.perftest.error.empty() && first_of_case) {
      fmt::print(out, "{}: no perftest figure: {}\n", c.spec.name, c.perftest.error);
    }
  }
  fmt::print(out, "lanes: {} (the initiator's counters; UCX_TLS={} is the ucx lane's transports)\n",
             report.lanes_carried().empty() ? std::string("none counted a transfer")
                                            : "the bytes went over " + report.lanes_carried(),
             report.ucx_tls.empty() ? "(UCX default)" : report.ucx_tls);
  if (std::any_of(report.cases.begin(), report.cases.end(),
                  [](const CaseResult& c) { return c.first_pass_measured_gbps > 0; })) {
    double settle_max = 0;
    for (const CaseResult& c : report.cases)
      settle_max = std::max(settle_max, c.first_pass_settle_s);
    fmt::print(out,
               "1st GB/s: the case's first pass, every block of the {} MiB pool {} once "
               "before the timed part (GB/s: the steady state after it), through fresh "
               "registrations, timed once both pools' pre-touch had finished (registration to "
               "touched: {:.2f} s at most; KVXFER_PRETOUCH=off times the untouched pass); "
               "verified on a sample of its own; --no-warm-pass skips it\n",
               report.args.region >> 20,
               report.args.op == "read" ? "read from the target's" : "written into the target's",
               settle_max);
  }
  if (const CpuGaps& g = report.cpu_gaps; g.seconds > 0) {
    fmt::print(
        out,
        "machine: a thread that only read the clock for {:.1f} s lost its CPU {:.0f} times a "
        "second for {:.0f} µs or more (p50 {:.0f}, p99 {:.0f}, max {:.0f} µs; {:.1f}% of its "
        "time): a call of 10 µs meets such a gap {:.1f}% of the time\n",
        g.seconds, g.per_s, g.threshold_us, g.gap.p50_us, g.gap.p99_us, g.gap.max_us,
        100 * g.lost_share, 100 * g.per_s * 10e-6);
  }
  if (pool_kind() == "huge") {
    fmt::print(out, "pool: huge, {} of the initiator's {} MiB on transparent huge pages\n",
               report.pool_huge_bytes >> 20, report.args.region >> 20);
  }
  if (report.warmed_targets > 0) {
    fmt::print(out,
               "warm-up: before its first case, {} took one untimed pass of the initiator's "
               "whole {} MiB pool through {} ({:.2f} GB/s; a first pass over pages never sent "
               "runs several times slower on some VMs; --no-warm-pass skips it)\n",
               report.warmed_targets == 1
                   ? std::string("the target's pool")
                   : fmt::format("each of the {} targets' pools", report.warmed_targets),
               report.warm_bytes >> 20, report.warm_kind, report.warm_gbps);
  }
  if (report.iperf3.gbps) {
    fmt::print(out, "iperf3 (one connection, 1 MiB writes, loopback, {} s): {:.2f} GB/s",
               report.args.iperf3_seconds, *report.iperf3.gbps);
    if (report.iperf3.retransmits) fmt::print(out, ", {} retransmits", *report.iperf3.retransmits);
    fmt::print(out, "; the baseline of the x iperf3 column\n");
    if (report.iperf3_spinner.gbps) {
      fmt::print(out,
                 "iperf3 beside one spinning thread (as the bench's caller spins in poll()): "
                 "{:.2f} GB/s ({:.2f}x iperf3 alone); with {} cores, what one stream moves when "
                 "a third thread wants a core\n",
                 *report.iperf3_spinner.gbps, *report.iperf3_spinner.gbps / *report.iperf3.gbps,
                 report.cpus);
    }
  } else if (!report.iperf3.error.empty()) {
    fmt::print(out, "iperf3: no figure: {}\n", report.iperf3.error);
  }
  if (report.raw_tcp_gbps) {
    const auto big = std::find_if(report.cases.begin(), report.cases.end(),
                                  [](const CaseResult& c) { return c.spec.name == "big"; });
    fmt::print(out, "raw TCP stream (one connection, pool to pool, {} MiB",
               report.raw_tcp_bytes >> 20);
    if (report.raw_tcp_warm_bytes > 0) {
      fmt::print(out, " after an untimed {} MiB pass", report.raw_tcp_warm_bytes >> 20);
    }
    fmt::print(out, "): {:.2f} GB/s", *report.raw_tcp_gbps);
    const std::optional<bool> agrees = report.raw_tcp_agrees();
    if (agrees.has_value()) {
      const double off = (*report.raw_tcp_gbps / *report.iperf3.gbps - 1) * 100;
      if (*agrees) {
        fmt::print(out, "; agrees with iperf3 ({:+.0f}%)", off);
      } else {
        fmt::print(out,
                   "; disagrees with iperf3 ({:+.0f}%, over {:.0f}%): not used as the baseline",
                   off, kRawTcpAgreement * 100);
      }
    }
    // Quoted against big only where nothing contradicts it.
    if (big != report.cases.end() && big->gbps && agrees.value_or(true)) {
      fmt::print(out, "; big {:.2f} GB/s = {:.2f}x of it", *big->gbps,
                 *big->gbps / *report.raw_tcp_gbps);
    }
    fmt::print(out, "\n");
    if (report.raw_tcp_spinner_gbps) {
      fmt::print(out,
                 "raw TCP stream beside one spinning thread (the same two copies between the "
                 "same pools while the caller spins): {:.2f} GB/s ({:.2f}x the stream alone)",
                 *report.raw_tcp_spinner_gbps, *report.raw_tcp_spinner_gbps / *report.raw_tcp_gbps);
      if (big != report.cases.end() && big->gbps) {
        fmt::print(out, "; big = {:.2f}x of it", *big->gbps / *report.raw_tcp_spinner_gbps);
      }
      fmt::print(out, "\n");
    }
  } else if (!report.raw_tcp_error.empty()) {
    fmt::print(out, "raw TCP stream: no figure: {}\n", report.raw_tcp_error);
  }
  std::fflush(out);
}

void write_json(const BenchReport& report, const std::string& path) {
  const MachineInfo m = machine_info();
  const UcxInfo ucx = ucx_info();
  json transports = json::array();
  for (const auto& d : ucx.devices)
    transports.push_back({{"transport", d.transport}, {"device", d.device}});
  const BenchArgs& a = report.args;
  json cases = json::array();
  for (const CaseResult& c : report.cases) {
    json lane_transfers = json::object();
    for (const auto& [lane, count] : c.lane_transfers) lane_transfers[lane] = count;
    json j = {
        {"case", c.spec.name},
        // The lane asked for (null: none) and the one the initiator's
        // counters say carried the transfers.
        {"lane", c.lane.empty() ? json(nullptr) : json(c.lane)},
        {"lane_seen", c.lane_seen.empty() ? json(nullptr) : json(c.lane_seen)},
        {"encrypted", c.encrypted},
        {"lane_transfers", lane_transfers},
        {"block_len", c.spec.block_len},
        {"num_blocks", c.num_blocks},
        {"verified", c.verified},
        {"error", c.error.empty() ? json(nullptr) : json(c.error)},
        {"local_registration_ms", c.local_registration_ms},
        {"verify",
         {{"sampled", c.verify_sampled},
          {"good", c.verify_good},
          {"bad", c.verify_bad},
          {"raced_left_out", c.verify_raced}}},
        {"handles_released_after_close", c.handles_released},
        {"telemetry_records", c.telemetry_records},
        {"others_cores", c.others_cores},
        {"target_cpu_s_per_gb", opt(c.target_cpu_s_per_gb)},
        {"mapping_warm_gbps", opt(c.mapping_warm_gbps)},
        // The case's first pass (null: none ran, or its bytes did not
        // verify), and whether it met a pool nothing of this run had written.
        {"first_pass_gbps", opt(c.first_pass_gbps)},
        {"first_pass_measured_gbps", c.first_pass_measured_gbps},
        {"first_pass_fresh_pool", c.first_pass_fresh},
        {"first_pass_settle_s", c.first_pass_settle_s},
        {"loadavg_1min", c.loadavg},
    };
    if (c.spec.is_reg()) {
      j["add_remote_peer"] = timing_json(c.add_peer);
      j["usable"] = timing_json(c.usable);
      j["usable_first_us"] = c.usable_first_us;
      j["add_remote_peer_heap_bytes"] = c.add_peer_heap_bytes;
      j["inflight_heap_bytes_per_write"] = {{"1_block", opt(c.inflight_bytes_1)},
                                            {"16_blocks", opt(c.inflight_bytes_16)}};
    } else {
      j.update({
          {"batch", c.spec.batch},
          {"depth", c.spec.depth},
          {"pattern", c.spec.pattern.name()},
          {"total_requested", c.spec.total},
          {"writes", c.writes},
          {"blocks", c.blocks},
          {"bytes", c.bytes},
          {"seconds", c.seconds},
          {"gbps", opt(c.gbps)},
          {"measured_gbps", c.measured_gbps},
          {"blocks_per_s", opt(c.blocks_per_s)},
          {"write_blocks", timing_json(c.write_call)},
          {"poll", timing_json(c.poll_call)},
          {"polls", c.polls},
          {"failed_transfers", c.failed_transfers},
          {"add_remote_peer_us", c.peer_registration_us},
          {"memcpy_gbps", opt(c.memcpy_gbps)},
          {"memcpy_runs_gbps", c.memcpy_runs_gbps},
          {"memcpy_ratio", opt(c.memcpy_ratio())},
          {"memcpy_all_gbps", opt(c.memcpy_all_gbps)},
          {"memcpy_all_runs_gbps", c.memcpy_all_runs_gbps},
          {"memcpy_all_ratio", opt(c.memcpy_all_ratio())},
          {"memcpy_all_threads", c.memcpy_all_threads},
          {"perftest",
           {{"ran", c.perftest.ran},
            {"gbps", opt(c.perftest.gbps)},
            {"iterations", c.perftest.iterations},
            {"seconds", c.perftest.seconds},
            {"error", c.perftest.error.empty() ? json(nullptr) : json(c.perftest.error)}}},
          {"perftest_ratio", opt(c.perftest_ratio())},
          {"vs_iperf3", opt(report.vs_iperf3(c))},
          {"tcp_lane_vs_ucx_lane", opt(report.tcp_vs_ucx(c))},
      });
    }
    cases.push_back(std::move(j));
  }
  json ucx_knobs = json::object();
  for (const auto& [k, v] : a.ucx) ucx_knobs[k] = v;
  const json doc = {
      {"tool", "kvxfer bench"},
      {"kvxfer_version", std::string(kvxfer::version())},
      {"target_kvxfer_version", report.target_version},
      {"target", report.target},
      {"all_verified", report.all_verified()},
      {"ucx",
       {{"version", ucx.version},
        {"tls", report.ucx_tls.empty() ? json(nullptr) : json(report.ucx_tls)},
        {"knobs", ucx_knobs},
        {"transports", transports},
        {"note", ucx.note.empty() ? json(nullptr) : json(ucx.note)}}},
      {"cpu_gaps",
       {{"seconds", report.cpu_gaps.seconds},
        {"threshold_us", report.cpu_gaps.threshold_us},
        {"gaps", report.cpu_gaps.gaps},
        {"per_s", report.cpu_gaps.per_s},
        {"lost_share", report.cpu_gaps.lost_share},
        {"gap_us", timing_json(report.cpu_gaps.gap)}}},
      {"machine",
       {{"hostname", m.hostname},
        {"cpu_model", m.cpu_model},
        {"cpus", m.cpus},
        {"mem_total_bytes", m.mem_total},
        {"kernel", m.kernel},
        {"transparent_hugepages", m.transparent_hugepages}}},
      {"config",
       {{"tls", a.tls},
        {"op", a.op},
        {"region_bytes", a.region},
        {"config_fingerprint", report.fingerprint},
        {"progress_thread", a.progress_thread},
        {"num_threads", a.num_threads},
        {"engine_config", a.engine},
        {"target_engine_config", a.target_engine},
        {"poll_wait", a.poll_wait},
        {"poll_sleep_us", a.poll_sleep_us},
        {"pool", pool_kind()},
        {"pool_huge_bytes", report.pool_huge_bytes},
        {"lane", a.lane.empty() ? json(nullptr) : json(a.lane)},
        {"encrypt", a.encrypt},
        {"warm_pass", a.warm_pass},
        {"lanes", report.lanes.front().empty() ? json::array() : json(report.lanes)},
        {"seed", a.seed},
        {"verify_blocks", a.verify_blocks},
        {"reg_reps", a.reg_reps}}},
      {"cases", cases},
      // Top-level for scripts that compare runs; raw_tcp below has the detail.
      {"raw_tcp_gbps", opt(report.raw_tcp_gbps)},
      {"raw_tcp",
       {{"gbps", opt(report.raw_tcp_gbps)},
        {"bytes", report.raw_tcp_bytes},
        {"warm_bytes", report.raw_tcp_warm_bytes},
        {"agrees_with_iperf3", opt(report.raw_tcp_agrees())},
        {"beside_spinner_gbps", opt(report.raw_tcp_spinner_gbps)},
        {"error", report.raw_tcp_error.empty() ? json(nullptr) : json(report.raw_tcp_error)}}},
      {"pool_warm_pass",
       {{"targets", report.warmed_targets},
        {"bytes", report.warm_bytes},
        {"via", report.warm_kind},
        {"first_gbps", report.warm_gbps}}},
      {"iperf3_gbps", opt(report.iperf3.gbps)},
      {"iperf3_beside_spinner_gbps", opt(report.iperf3_spinner.gbps)},
      {"iperf3",
       {{"gbps", opt(report.iperf3.gbps)},
        {"seconds", report.iperf3.seconds},
        {"bytes", report.iperf3.bytes},
        {"retransmits", opt(report.iperf3.retransmits)},
        {"command", "iperf3 -c 127.0.0.1 -t " + std::to_string(a.iperf3_seconds) + " -J"},
        {"error", report.iperf3.error.empty() ? json(nullptr) : json(report.iperf3.error)}}},
  };
  std::ofstream out(path);
  out << doc.dump(2) << '\n';
  if (!out) throw std::runtime_error("cannot write " + path);
}

void write_metrics(const std::vector<Metrics>& metrics, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << prometheus_text(metrics);
  out.flush();
  if (!out) throw std::runtime_error(fmt::format("cannot write the metrics to {}", path));
}

std::string write_plot(const BenchReport& report, const std::string& path) {
  if (!in_path("gnuplot")) return "gnuplot not installed (Debian package gnuplot-nox)";
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("kvxfer-plot-{}", ::getpid());
  fs::create_directories(dir);
  const fs::path data = dir / "cases.dat";
  const fs::path script = dir / "plot.gp";
  // ucx_perftest over shared memory writes one cache-resident buffer and
  // reaches tens of GB/s; drawn to scale it would flatten the bars that
  // matter, so its bars are clipped above the others (the label keeps the
  // real figure).
  double top = 0;
  bool clipped = false;
  for (const CaseResult& c : report.cases) {
    top = std::max({top, c.gbps.value_or(0), c.memcpy_gbps.value_or(0)});
  }
  top = top > 0 ? top * 1.4 : 1;
  {
    std::ofstream d(data);
    for (const CaseResult& c : report.cases) {
      if (c.spec.is_reg()) continue;
      auto v = [](const std::optional<double>& x) { return x ? fmt::format("{:.3f}", *x) : "?"; };
      std::optional<double> perftest_bar = c.perftest.gbps;
      if (perftest_bar && *perftest_bar > top) {
        perftest_bar = top;
        clipped = true;
      }
      const std::string size = c.spec.block_len >= (1u << 20)
                                   ? fmt::format("{}M", c.spec.block_len >> 20)
                                   : fmt::format("{}K", c.spec.block_len >> 10);
      const std::string name =
          (report.lanes.size() > 1 && !c.lane.empty() ? fmt::format("{} {}", c.spec.name, c.lane)
                                                      : c.spec.name) +
          (c.encrypted ? " tls" : "");
      d << fmt::format("\"{} ({} x{})\" {} {} {} {} {}\n", name, size, c.spec.batch, v(c.gbps),
                       v(c.memcpy_gbps), v(perftest_bar), v(c.perftest.gbps), v(c.first_pass_gbps));
    }
  }
  {
    std::ofstream s(script);
    s << "set terminal pngcairo size 1000,560 noenhanced font 'sans,10'\n"
      << "set output '" << path << "'\n"
      << "set datafile missing '?'\n"
      << "set title 'kvxfer bench, "
      << (report.lanes_carried().empty() ? std::string("no lane")
                                         : report.lanes_carried() + " lane")
      << ", " << std::string(kvxfer::version()) << (report.args.op == "read" ? ", READ" : "")
      << ": payload GB/s (1e9 B/s)" << (clipped ? ", ucx_perftest bars clipped" : "") << "'\n"
      << "set style data histograms\n"
      << "set style histogram clustered gap 1\n"
      << "set style fill solid 0.85 border -1\n"
      << "set boxwidth 0.9\n"
      << "set ylabel 'GB/s'\n"
      << fmt::format("set yrange [0:{:.3f}]\n", top * 1.08) << "set grid ytics\n"
      << "set key below horizontal\n"
      << "plot '" << data.string()
      << "' using 6:xtic(1) title 'kvxfer first pass' lc rgb '#aec7e8', \\\n"
      << "  '' using 2 title 'kvxfer steady state' lc rgb '#1f77b4', \\\n"
      << "  '' using 3 title 'memcpy (1 thread)' lc rgb '#7f7f7f', \\\n"
      << "  '' using 4 title 'ucx_perftest ucp_put_bw' lc rgb '#ff7f0e', \\\n"
      << "  '' using ($0-0.3):6:(sprintf('%.2f',$6)) with labels offset 0,0.6 notitle, \\\n"
      << "  '' using ($0-0.1):2:(sprintf('%.2f',$2)) with labels offset 0,0.6 notitle, \\\n"
      << "  '' using ($0+0.1):3:(sprintf('%.2f',$3)) with labels offset 0,0.6 notitle, \\\n"
      << "  '' using ($0+0.3):4:(sprintf('%.2f',$5)) with labels offset 0,0.6 notitle\n";
  }
  SpawnOptions options;
  options.argv = {"gnuplot", script.string()};
  const Captured run = run_captured(options, std::chrono::seconds(60));
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  if (run.timed_out) return "gnuplot timed out";
  if (run.status != 0) return "gnuplot failed: " + run.output.substr(0, 500);
  return "";
}

}  // namespace kvxfer::tools
