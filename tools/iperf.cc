// SPDX-License-Identifier: Apache-2.0
#include "iperf.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "channel.h"
#include "perftest.h"
#include "spinner.h"
#include "subprocess.h"

namespace kvxfer::tools {
namespace {

using Clock = std::chrono::steady_clock;

std::string tail(const std::string& text, std::size_t n) {
  return text.size() > n ? "..." + text.substr(text.size() - n) : text;
}

}  // namespace

bool iperf3_available() { return in_path("iperf3"); }

IperfResult run_iperf3(const IperfRequest& request) {
  IperfResult result;
  if (!iperf3_available()) {
    result.error = "iperf3 not installed (Debian package iperf3)";
    return result;
  }
  const std::uint16_t port = request.port != 0 ? request.port : pick_free_port();
  SpawnOptions server_options;
  // -1: one client, then exit.
  server_options.argv = {"iperf3", "-s", "-1", "-p", std::to_string(port), "-B", request.host};
  server_options.quiet_stdout = true;
  server_options.quiet_stderr = true;
  const auto deadline = Clock::now() + request.timeout;
  try {
    Subprocess server(server_options);
    // Connecting to find out would be taken as the one client: watch the
    // kernel's socket table instead.
    if (result.error = wait_listening(server, port, deadline, "iperf3"); !result.error.empty()) {
      return result;
    }
    SpawnOptions client_options;
    client_options.argv = {"iperf3",
                           "-c",
                           request.host,
                           "-p",
                           std::to_string(port),
                           "-t",
                           std::to_string(request.seconds),
                           "-l",
                           std::to_string(request.write_len),
                           "-P",
                           std::to_string(std::max(1, request.streams)),
                           "-J"};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const Captured client =
        run_captured(client_options, std::max(left, std::chrono::milliseconds(1)));
    result.ran = true;
    if (!server.wait_for(std::chrono::milliseconds(5000))) server.kill();
    if (client.timed_out) {
      result.error = fmt::format("iperf3 timed out after {} s", request.timeout.count());
      return result;
    }
    // -J prints one JSON document (an error too, as its "error" key); any
    // other output around it is left out.
    const auto open = client.output.find('{');
    const auto close = client.output.rfind('}');
    if (open == std::string::npos || close == std::string::npos || close < open) {
      result.error = fmt::format("iperf3 exited with {} and no JSON: {}", client.status,
                                 tail(client.output, 300));
      return result;
    }
    const nlohmann::json doc =
        nlohmann::json::parse(client.output.substr(open, close - open + 1), nullptr, false);
    if (doc.is_discarded()) {
      result.error = "cannot parse iperf3's JSON: " + tail(client.output, 300);
      return result;
    }
    if (doc.contains("error") && doc["error"].is_string()) {
      result.error = "iperf3: " + doc["error"].get<std::string>();
      return result;
    }
    const nlohmann::json* received = nullptr;
    if (doc.contains("end") && doc["end"].contains("sum_received")) {
      received = &doc["end"]["sum_received"];
    }
    if (received == nullptr || !received->contains("bits_per_second") ||
        !(*received)["bits_per_second"].is_number()) {
      result.error = "iperf3's JSON has no end.sum_received.bits_per_second";
      return result;
    }
    result.gbps = (*received)["bits_per_second"].get<double>() / 8e9;
    if (received->contains("seconds") && (*received)["seconds"].is_number()) {
      result.seconds = (*received)["seconds"].get<double>();
    }
    if (received->contains("bytes") && (*received)["bytes"].is_number()) {
      result.bytes = (*received)["bytes"].get<std::uint64_t>();
    }
    const auto& end = doc["end"];
    if (end.contains("sum_sent") && end["sum_sent"].contains("retransmits") &&
        end["sum_sent"]["retransmits"].is_number()) {
      result.retransmits = end["sum_sent"]["retransmits"].get<std::uint64_t>();
    }
    if (client.status != 0 && result.error.empty()) {
      result.error = fmt::format("iperf3 exited with {}", client.status);
      result.gbps.reset();
    }
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  return result;
}

IperfResult run_iperf3_pairs(const IperfRequest& request, int pairs) {
  if (pairs <= 1) return run_iperf3(request);
  std::vector<IperfResult> results(static_cast<std::size_t>(pairs));
  // Every pair's port picked before any server starts, distinct: pairs that
  // picked theirs at the same time could draw the same one.
  std::vector<IperfRequest> requests(results.size(), request);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    for (;;) {
      requests[i].port = pick_free_port();
      const auto same = [&](const IperfRequest& r) { return r.port == requests[i].port; };
      if (std::none_of(requests.begin(), requests.begin() + static_cast<std::ptrdiff_t>(i), same)) {
        break;
      }
    }
  }
  {
    std::vector<std::jthread> threads;
    threads.reserve(results.size());
    for (std::size_t i = 0; i < results.size(); ++i) {
      threads.emplace_back([&results, &requests, i] { results[i] = run_iperf3(requests[i]); });
    }
  }
  IperfResult sum;
  sum.ran = true;
  double gbps = 0;
  for (const IperfResult& r : results) {
    if (!r.gbps) {
      sum.error = r.error.empty() ? std::string("an iperf3 pair had no figure") : r.error;
      return sum;
    }
    gbps += *r.gbps;
    sum.bytes += r.bytes;
    sum.seconds = std::max(sum.seconds, r.seconds);
    if (r.retransmits) sum.retransmits = sum.retransmits.value_or(0) + *r.retransmits;
  }
  sum.gbps = gbps;
  return sum;
}

IperfResult run_iperf3_beside_spinner(const IperfRequest& request) {
  const Spinner spinner;
  return run_iperf3(request);
}

}  // namespace kvxfer::tools
