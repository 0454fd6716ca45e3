// SPDX-License-Identifier: Apache-2.0
// The bench's outputs: the table, the JSON record, the metrics and the plot,
// and the ratios they quote (bench.h's ratio methods). Reads a finished
// BenchReport; writes only stdout and the files asked for.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "bench.h"
#include "kvxfer/metrics.h"

namespace kvxfer::tools {

void print_table(const BenchReport& report, std::FILE* out);
// Every figure, the machine and the UCX version and transports. Throws
// std::runtime_error when the file cannot be written.
void write_json(const BenchReport& report, const std::string& path);
// The Prometheus text of every case's initiator transport (one `agent`
// label per case). Throws std::runtime_error when the file cannot be
// written.
void write_metrics(const std::vector<Metrics>& metrics, const std::string& path);
// GB/s per case, kvxfer beside memcpy and ucx_perftest, through gnuplot.
// Returns "" or why there is no plot.
std::string write_plot(const BenchReport& report, const std::string& path);

}  // namespace kvxfer::tools
