// SPDX-License-Identifier: Apache-2.0
#include "machine.h"

#include <fmt/format.h>
#include <malloc.h>
#include <sched.h>
#include <sys/utsname.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "kvxfer/transport.h"
#include "subprocess.h"

namespace kvxfer::tools {
namespace {

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// The value after "key:" on the first matching line of a /proc file.
std::string proc_field(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return trim(line.substr(colon + 1));
    }
  }
  return "";
}

double clock_ticks() {
  static const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
  return hz;
}

}  // namespace

double threads_cpu_s(pid_t pid) {
  std::error_code ec;
  double ns = 0;
  for (const auto& task :
       std::filesystem::directory_iterator(fmt::format("/proc/{}/task", pid), ec)) {
    std::ifstream in(task.path() / "schedstat");
    double on_cpu_ns = 0;
    if (in >> on_cpu_ns) ns += on_cpu_ns;
  }
  return ns / 1e9;
}

double process_cpu_s(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  std::getline(in, stat);
  const auto paren = stat.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return 0;
  std::istringstream fields(stat.substr(paren + 2));
  std::string skip;
  for (int i = 3; i < 14; ++i) fields >> skip;  // state .. cmajflt
  double utime = 0;
  double stime = 0;
  fields >> utime >> stime;
  return (utime + stime) / clock_ticks();
}


CpuSample sample_cpu(pid_t target_pid) {
  CpuSample s;
  s.at = std::chrono::steady_clock::now();
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;  // "cpu": the sum over all CPUs
  double v[8] = {};
  for (double& x : v) in >> x;
  // user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
  s.busy_s = (v[0] + v[1] + v[2] + v[5] + v[6]) / clock_ticks();
  s.ours_s = process_cpu_s(::getpid()) + (target_pid > 0 ? process_cpu_s(target_pid) : 0);
  return s;
}

CpuGaps measure_cpu_gaps(std::chrono::milliseconds spin, std::chrono::microseconds threshold) {
  using Clock = std::chrono::steady_clock;
  std::vector<double> gaps;
  gaps.reserve(1 << 16);  // no allocation while the clock is read
  const auto start = Clock::now();
  const auto end = start + spin;
  auto last = start;
  for (auto now = start; now < end; now = Clock::now()) {
    if (now - last >= threshold && gaps.size() < gaps.capacity()) {
      gaps.push_back(std::chrono::duration<double, std::micro>(now - last).count());
    }
    last = now;
  }
  CpuGaps out;
  out.seconds = std::chrono::duration<double>(last - start).count();
  out.threshold_us = std::chrono::duration<double, std::micro>(threshold).count();
  out.gaps = gaps.size();
  double lost_us = 0;
  for (const double g : gaps) lost_us += g;
  if (out.seconds > 0) {
    out.per_s = static_cast<double>(out.gaps) / out.seconds;
    out.lost_share = lost_us / (out.seconds * 1e6);
  }
  out.gap = Timing::of(std::move(gaps));
  return out;
}

double others_cores(const CpuSample& before, const CpuSample& after) {
  const double wall = std::chrono::duration<double>(after.at - before.at).count();
  if (wall <= 0) return 0;
  const double others = (after.busy_s - before.busy_s) - (after.ours_s - before.ours_s);
  return std::max(0.0, others / wall);
}

double load_average() {
  double one = 0;
  std::ifstream("/proc/loadavg") >> one;
  return one;
}

std::int64_t heap_in_use() {
  const struct mallinfo2 m = ::mallinfo2();
  return static_cast<std::int64_t>(m.uordblks + m.hblkhd);
}

MachineInfo machine_info() {
  MachineInfo m;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) m.hostname = host;
  m.cpu_model = proc_field("/proc/cpuinfo", "model name");
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0)
    m.cpus = static_cast<unsigned>(CPU_COUNT(&set));
  const std::string mem = proc_field("/proc/meminfo", "MemTotal");  // "24576000 kB"
  m.mem_total = std::strtoull(mem.c_str(), nullptr, 10) * 1024;
  utsname u{};
  if (::uname(&u) == 0) m.kernel = fmt::format("{} {} {}", u.sysname, u.release, u.machine);
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(thp, modes);
  if (const auto b = modes.find('['), e = modes.find(']'); b != std::string::npos && e > b) {
    m.transparent_hugepages = modes.substr(b + 1, e - b - 1);
  }
  return m;
}

UcxInfo ucx_info() {
  UcxInfo info;
  info.version = ucp_get_version_string();
  if (!in_path("ucx_info")) {
    info.note = "ucx_info not installed (Debian package ucx-utils): transports not listed";
    return info;
  }
  SpawnOptions options;
  options.argv = {"ucx_info", "-d"};
  const Captured out = run_captured(options, std::chrono::seconds(20));
  if (out.timed_out || out.status != 0) {
    info.note = out.timed_out ? "ucx_info -d timed out" : "ucx_info -d failed";
    return info;
  }
  // "#      Transport: tcp" then "#         Device: lo".
  std::istringstream in(out.output);
  std::string line;
  std::string transport;
  while (std::getline(in, line)) {
    if (const auto p = line.find("Transport:"); p != std::string::npos) {
      transport = trim(line.substr(p + 10));
    } else if (const auto d = line.find("Device:"); d != std::string::npos && !transport.empty()) {
      info.devices.push_back({transport, trim(line.substr(d + 7))});
    }
  }
  if (info.devices.empty()) info.note = "ucx_info -d listed no transports";
  return info;
}

int run_info() {
  const UcxInfo ucx = ucx_info();
  const MachineInfo m = machine_info();
  fmt::print("{}\n", kvxfer::version());
  // Which libkvxfer this process runs: with a system package, a pip venv and
  // a build tree on one machine, the loader's choice is not obvious.
  const std::string library = kvxfer::library_path();
  fmt::print("library: {}\n", library.empty() ? "(unknown: the loader does not say)" : library);
  fmt::print("UCX {} (libucp this tool runs with)\n", ucx.version);
  if (const char* tls = std::getenv("UCX_TLS"))
    fmt::print("UCX_TLS={} (from the environment)\n", tls);
  if (ucx.devices.empty()) {
    fmt::print("transports: {}\n", ucx.note);
  } else {
    fmt::print("transports and devices (ucx_info -d):\n");
    for (const auto& d : ucx.devices) fmt::print("  {:<10} {}\n", d.transport, d.device);
  }
  fmt::print("bench baseline: ucx_perftest {}\n",
             in_path("ucx_perftest") ? "found" : "not installed (Debian package ucx-utils)");
  fmt::print("machine: {}, {} CPUs ({}), {:.1f} GiB, {}, THP {}\n", m.hostname, m.cpus, m.cpu_model,
             static_cast<double>(m.mem_total) / (1 << 30), m.kernel, m.transparent_hugepages);
  return 0;
}

}  // namespace kvxfer::tools
