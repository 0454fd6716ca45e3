// SPDX-License-Identifier: Apache-2.0
// A program outside the project that finds kvxfer with find_package() after
// `cmake --install`, writes one block over the loopback engine and checks it,
// with the library's warnings sent through the public log sink.
#include <kvxfer/log.h>
#include <kvxfer/transport.h>

#include <algorithm>
#include <cstdio>
#include <string_view>
#include <vector>

int main() {
  kvxfer::set_log_level(kvxfer::LogLevel::kWarn);
  int warnings = 0;
  kvxfer::set_log_sink([&warnings](kvxfer::LogLevel level, std::string_view message) {
    if (level >= kvxfer::LogLevel::kWarn) {
      ++warnings;
      std::printf("consumer: kvxfer says: %.*s\n", static_cast<int>(message.size()),
                  message.data());
    }
  });
  std::vector<unsigned char> a(16 * 64), b(16 * 64, 0);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<unsigned char>(i % 251 + 1);
  kvxfer::Options options;
  options.backends = {"LOOPBACK"};
  kvxfer::Transport ta("a", {a.data(), 16, 64}, options);
  kvxfer::Transport tb("b", {b.data(), 16, 64}, options);
  ta.add_remote_peer("b", tb.agent_metadata(), tb.base_addr(), tb.num_blocks(), tb.block_len());
  const std::vector<std::int64_t> local{3}, remote{5};
  const auto id = ta.write_blocks("b", local, remote);
  const auto result = ta.poll("b");
  // A write to a peer nobody registered is refused with a warning, which
  // reaches the sink on the library's log thread: flush_log() waits for it.
  const bool refused =
      !ta.write_blocks("nobody", local, remote) && kvxfer::flush_log() && warnings == 1;
  kvxfer::set_log_sink(nullptr);
  const bool ok = id && result.done.size() == 1 && refused &&
                  std::equal(a.begin() + 3 * 64, a.begin() + 4 * 64, b.begin() + 5 * 64);
  std::printf("consumer: %s\n", ok ? "block landed" : "FAILED");
  return ok ? 0 : 1;
}
