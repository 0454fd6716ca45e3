// SPDX-License-Identifier: Apache-2.0
// What a figure was measured on: the machine, and the UCX it ran with.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "timing.h"

namespace kvxfer::tools {

struct MachineInfo {
  std::string hostname;
  std::string cpu_model;
  unsigned cpus = 0;            // usable by this process
  std::uint64_t mem_total = 0;  // bytes
  std::string kernel;
  std::string transparent_hugepages;  // the selected mode, e.g. "madvise"
};
MachineInfo machine_info();

struct UcxDevice {
  std::string transport;
  std::string device;
};

struct UcxInfo {
  std::string version;             // of the libucp this tool runs with
  std::vector<UcxDevice> devices;  // from `ucx_info -d`
  std::string note;                // why devices is empty, when it is
};
UcxInfo ucx_info();

// CPU time spent on this machine, split into ours (this process and,
// when known, the target process) and everyone else's, so a figure from a
// shared machine says how much a neighbour took from it.
struct CpuSample {
  double busy_s = 0;  // all CPUs, every process (from /proc/stat)
  double ours_s = 0;  // this process + the target process
  std::chrono::steady_clock::time_point at;
};
CpuSample sample_cpu(pid_t target_pid);
// utime + stime of a process (all its threads), in seconds, from
// /proc/PID/stat (clock-tick resolution).
double process_cpu_s(pid_t pid);
// The time on a CPU of a process's live threads, in seconds, from each
// /proc/PID/task/TID/schedstat (nanoseconds; threads that already exited
// are not counted): for short intervals where clock ticks are too coarse.
double threads_cpu_s(pid_t pid);
// Cores' worth of CPU that other processes used between two samples.
double others_cores(const CpuSample& before, const CpuSample& after);
// The 1-minute load average, from /proc/loadavg.
double load_average();
// This process's malloc heap in use (glibc's mallinfo2). UCX's own mmap'd
// pools are outside it: a figure from it is the C++ side's growth plus
// whatever UCX takes from malloc.
std::int64_t heap_in_use();

// Time a running thread loses to its machine. A thread that does nothing
// but read the clock sees a gap between two reads whenever something else
// ran on its CPU: the hypervisor (on a VM, invisible to the guest's steal
// time), an interrupt, another thread. A call of d µs meets such a gap with
// a chance of about per_s * d / 1e6, and then takes its length on top: on a
// machine that loses its CPU often, the tail of every short call is its
// gaps, not its work.
struct CpuGaps {
  double seconds = 0;       // how long the thread read the clock
  double threshold_us = 0;  // the shortest gap counted
  std::uint64_t gaps = 0;   // gaps of threshold_us or more
  double per_s = 0;
  double lost_share = 0;  // of the time, spent in those gaps
  Timing gap;             // their lengths, µs
};
CpuGaps measure_cpu_gaps(std::chrono::milliseconds spin, std::chrono::microseconds threshold);

// `kvxfer info`.
int run_info();

}  // namespace kvxfer::tools
