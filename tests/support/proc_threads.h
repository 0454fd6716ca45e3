// SPDX-License-Identifier: Apache-2.0
// What the tests ask of /proc about this process's own threads.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

namespace kvxfer::test {

// How many of this process's threads are named `name` (their comm, as
// pthread_setname_np set it, at most 15 characters).
inline int threads_named(const std::string& name) {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (std::getline(comm, line) && line == name) ++n;
  }
  return n;
}

}  // namespace kvxfer::test
