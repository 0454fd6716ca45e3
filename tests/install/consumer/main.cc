// A program outside the project that finds kvxfer with find_package() after
// `cmake --install`, writes one block over the loopback engine and checks it.
#include <kvxfer/transport.h>

#include <algorithm>
#include <cstdio>
#include <vector>

int main() {
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
  const bool ok = id && result.done.size() == 1 &&
                  std::equal(a.begin() + 3 * 64, a.begin() + 4 * 64, b.begin() + 5 * 64);
  std::printf("consumer: %s\n", ok ? "block landed" : "FAILED");
  return ok ? 0 : 1;
}
