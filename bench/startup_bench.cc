// Where a Transport's start-up goes (issue 11, target 6): a Transport over a
// 1 GiB pool constructed and closed REPS times per configuration, and the
// same UCX steps the engine takes (config read, ucp_init, worker create and
// query, mapping the pool) timed one by one, with UCX_TLS as given (the
// engine itself drops the shared-memory transports: ucx_config.h). Prints medians in ms; a
// benchmark, not a test: run it on a quiet machine.
//   kvxfer_startup_bench [REPS]
#include <fmt/format.h>
#include <sys/mman.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvxfer/transport.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kPool = std::size_t{1} << 30;
constexpr std::size_t kBlock = std::size_t{64} << 10;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void check(ucs_status_t st, const char* what) {
  if (st != UCS_OK) throw std::runtime_error(fmt::format("{}: {}", what, ucs_status_string(st)));
}

// The engine's UCX steps, timed (ms): config, init, worker, query, mem_map.
std::vector<double> raw_ucx_steps(void* pool) {
  std::vector<double> out;
  auto t = Clock::now();
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  out.push_back(ms_since(t));
  t = Clock::now();
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucp_context_h context = nullptr;
  check(ucp_init(&params, config, &context), "ucp_init");
  ucp_config_release(config);
  out.push_back(ms_since(t));
  t = Clock::now();
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_MULTI;
  ucp_worker_h worker = nullptr;
  check(ucp_worker_create(context, &wparams, &worker), "ucp_worker_create");
  out.push_back(ms_since(t));
  t = Clock::now();
  ucp_worker_attr_t wattr{};
  wattr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  check(ucp_worker_query(worker, &wattr), "ucp_worker_query");
  ucp_worker_release_address(worker, wattr.address);
  int efd = -1;
  check(ucp_worker_get_efd(worker, &efd), "ucp_worker_get_efd");
  out.push_back(ms_since(t));
  t = Clock::now();
  ucp_mem_map_params_t mparams{};
  mparams.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mparams.address = pool;
  mparams.length = kPool;
  ucp_mem_h memh = nullptr;
  check(ucp_mem_map(context, &mparams, &memh), "ucp_mem_map");
  out.push_back(ms_since(t));
  t = Clock::now();
  check(ucp_mem_unmap(context, memh), "ucp_mem_unmap");
  ucp_worker_destroy(worker);
  ucp_cleanup(context);
  out.push_back(ms_since(t));
  return out;
}

struct Config {
  std::string name;
  std::vector<std::pair<std::string, std::string>> env;
  bool progress_thread = true;
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 15;
  void* pool = ::mmap(nullptr, kPool, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (pool == MAP_FAILED) return 1;
  const std::vector<Config> configs = {
      {"UCX_TLS unset (all)", {}, true},
      {"UCX_TLS=sm,self", {{"UCX_TLS", "sm,self"}}, true},
      {"UCX_TLS=tcp", {{"UCX_TLS", "tcp"}}, true},
      {"UCX_TLS=tcp, no progress thread", {{"UCX_TLS", "tcp"}}, false},
      {"UCX_TLS=tcp, UCX_MEM_EVENTS=no", {{"UCX_TLS", "tcp"}, {"UCX_MEM_EVENTS", "no"}}, true},
      {"UCX_TLS=self", {{"UCX_TLS", "self"}}, true},
      {"UCX_TLS=^sm (all but shared memory)", {{"UCX_TLS", "^sm"}}, true},
      {"UCX_TLS=^posix,sysv,cma", {{"UCX_TLS", "^posix,sysv,cma"}}, true},
      {"UCX_TLS=sm,self,tcp, UCX_NET_DEVICES=lo",
       {{"UCX_TLS", "sm,self,tcp"}, {"UCX_NET_DEVICES", "lo"}},
       true},
  };
  fmt::print(
      "Transport start-up over a {} MiB pool, median of {} (ms). 'raw' columns: the engine's "
      "UCX steps alone.\n",
      kPool >> 20, reps);
  fmt::print("{:<42} {:>9} {:>7} | {:>6} {:>8} {:>7} {:>6} {:>7} {:>8}\n", "configuration",
             "Transport", "close", "config", "ucp_init", "worker", "query", "mem_map", "teardown");
  for (const Config& c : configs) {
    for (const auto& [k, v] : c.env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<double> make;
    std::vector<double> close;
    std::vector<std::vector<double>> raw(6);
    for (int i = 0; i < reps + 1; ++i) {
      kvxfer::Options options;
      options.progress_thread = c.progress_thread;
      auto t0 = Clock::now();
      auto transport = std::make_unique<kvxfer::Transport>(
          fmt::format("startup-{}", i), kvxfer::Region{pool, kPool / kBlock, kBlock}, options);
      const double m = ms_since(t0);
      t0 = Clock::now();
      transport->close();
      transport.reset();
      const double cl = ms_since(t0);
      const auto steps = raw_ucx_steps(pool);
      if (i == 0) continue;  // the first of each: libraries and pages warm up
      make.push_back(m);
      close.push_back(cl);
      for (std::size_t s = 0; s < steps.size(); ++s) raw[s].push_back(steps[s]);
    }
    fmt::print("{:<42} {:>9.2f} {:>7.2f} | {:>6.2f} {:>8.2f} {:>7.2f} {:>6.2f} {:>7.2f} {:>8.2f}\n",
               c.name, median(make), median(close), median(raw[0]), median(raw[1]),
               median(raw[2]), median(raw[3]), median(raw[4]), median(raw[5]));
    for (const auto& [k, v] : c.env) ::unsetenv(k.c_str());
  }
  ::munmap(pool, kPool);
  return 0;
}
