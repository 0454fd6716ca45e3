// SPDX-License-Identifier: Apache-2.0
#include "startup.h"

#include <fmt/format.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench.h"
#include "bench_config.h"
#include "kvxfer/transport.h"
#include "pool.h"

namespace kvxfer::tools {
namespace {

using Clock = std::chrono::steady_clock;

double millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

void check(ucs_status_t st, const char* what) {
  if (st != UCS_OK) {
    throw std::runtime_error(fmt::format("startup: {} failed: {}", what, ucs_status_string(st)));
  }
}

// The UCX steps of UcxWorker's and UcxLane's constructors, as the engine
// makes them (features AM|WAKEUP|RMA, a MULTI worker), timed one by one.
std::map<std::string, double> ucx_phases(const std::map<std::string, std::string>& overrides,
                                         void* base, std::uint64_t bytes) {
  std::map<std::string, double> ms;
  auto t = Clock::now();
  const auto lap = [&](const char* name) {
    const auto now = Clock::now();
    ms[name] = millis(now - t);
    t = now;
  };
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  for (const auto& [k, v] : overrides) check(ucp_config_modify(config, k.c_str(), v.c_str()), k.c_str());
  lap("config_read");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | UCP_FEATURE_RMA;
  ucp_context_h context = nullptr;
  check(ucp_init(&params, config, &context), "ucp_init");
  ucp_config_release(config);
  lap("ucp_init");
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_MULTI;
  ucp_worker_h worker = nullptr;
  check(ucp_worker_create(context, &wparams, &worker), "ucp_worker_create");
  lap("worker_create");
  ucp_worker_attr_t wattr{};
  wattr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  check(ucp_worker_query(worker, &wattr), "ucp_worker_query");
  ucp_worker_release_address(worker, wattr.address);
  int efd = -1;
  check(ucp_worker_get_efd(worker, &efd), "ucp_worker_get_efd");
  lap("worker_address_efd");
  ucp_mem_map_params_t mparams{};
  mparams.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mparams.address = base;
  mparams.length = bytes;
  ucp_mem_h memh = nullptr;
  check(ucp_mem_map(context, &mparams, &memh), "ucp_mem_map");
  lap("mem_map");
  void* rkey = nullptr;
  std::size_t rkey_len = 0;
  check(ucp_rkey_pack(context, memh, &rkey, &rkey_len), "ucp_rkey_pack");
  ucp_rkey_buffer_release(rkey);
  lap("rkey_pack");
  ucp_mem_unmap(context, memh);
  ucp_worker_destroy(worker);
  ucp_cleanup(context);
  lap("teardown");
  return ms;
}

double transport_ms(const std::string& name, Pool& pool, std::uint64_t block_len,
                    const Options& options) {
  const auto start = Clock::now();
  Transport t(name, Region{pool.data(), pool.size() / block_len, block_len}, options);
  const double ms = millis(Clock::now() - start);
  t.close();
  return ms;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int run_startup(const StartupArgs& a) {
  constexpr std::uint64_t kBlockLen = 64 << 10;
  Pool pool(a.region);
  const auto overrides = engine_config_for(a.tls);
  Options ucx;
  ucx.config_fields = bench_config_fields(a.tls);
  ucx.engine_config = overrides;
  Options no_thread = ucx;
  no_thread.progress_thread = false;
  Options loop;
  loop.backends = {"LOOPBACK"};

  // Each row: the first run in this process (one-time UCX set-up, module
  // loading), then the median of the next reps.
  nlohmann::json j;
  j["tls"] = a.tls;
  j["region"] = a.region;
  j["reps"] = a.reps;
  std::map<std::string, std::vector<double>> rows;
  std::map<std::string, double> first;
  const auto add = [&](const std::string& k, double v, int rep) {
    if (rep == 0) {
      first[k] = v;
    } else {
      rows[k].push_back(v);
    }
  };
  for (int rep = 0; rep <= a.reps; ++rep) {
    for (const auto& [k, v] : ucx_phases(overrides, pool.data(), pool.size())) add("ucx." + k, v, rep);
    add("transport", transport_ms(fmt::format("startup-{}-{}", ::getpid(), rep), pool, kBlockLen, ucx), rep);
    add("transport_no_progress_thread",
        transport_ms(fmt::format("startup-nt-{}-{}", ::getpid(), rep), pool, kBlockLen, no_thread), rep);
    add("transport_loopback",
        transport_ms(fmt::format("startup-lb-{}-{}", ::getpid(), rep), pool, kBlockLen, loop), rep);
  }
  double ucx_sum_first = 0;
  double ucx_sum = 0;
  fmt::print("kvxfer startup: {} MiB pool, UCX_TLS={}, first run then median of {}\n",
             a.region >> 20, ucx_tls_for(a.tls).empty() ? "(default)" : ucx_tls_for(a.tls), a.reps);
  fmt::print("{:<32} {:>10} {:>10}\n", "phase", "first ms", "median ms");
  for (const auto& [k, v] : rows) {
    const double m = median(v);
    fmt::print("{:<32} {:>10.3f} {:>10.3f}\n", k, first[k], m);
    j["first_ms"][k] = first[k];
    j["median_ms"][k] = m;
    if (k.rfind("ucx.", 0) == 0 && k != "ucx.teardown") {
      ucx_sum_first += first[k];
      ucx_sum += m;
    }
  }
  fmt::print("{:<32} {:>10.3f} {:>10.3f}\n", "ucx steps (sum, no teardown)", ucx_sum_first, ucx_sum);
  fmt::print("{:<32} {:>10.3f} {:>10.3f}\n", "transport - ucx steps",
             first["transport"] - ucx_sum_first, median(rows["transport"]) - ucx_sum);
  j["ucx_steps_ms"] = {{"first", ucx_sum_first}, {"median", ucx_sum}};
  if (!a.json_path.empty()) std::ofstream(a.json_path) << j.dump(2) << '\n';
  return 0;
}

}  // namespace kvxfer::tools
