// SPDX-License-Identifier: Apache-2.0
// The bench's outputs: the table, the JSON record and the plot.
#pragma once

#include <cstdio>
#include <string>

#include "bench.h"

namespace kvxfer::tools {

void print_table(const BenchReport& report, std::FILE* out);
// Every figure, the machine and the UCX version and transports. Throws
// std::runtime_error when the file cannot be written.
void write_json(const BenchReport& report, const std::string& path);
// GB/s per case, kvxfer beside memcpy and ucx_perftest, through gnuplot.
// Returns "" or why there is no plot.
std::string write_plot(const BenchReport& report, const std::string& path);

}  // namespace kvxfer::tools
