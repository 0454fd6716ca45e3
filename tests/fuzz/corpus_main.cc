// SPDX-License-Identifier: Apache-2.0
// Replays a target's seed corpus without libFuzzer (GCC builds): every seed
// in <corpus>/valid must be accepted and every seed in <corpus>/invalid
// refused (fuzz_target.h). A crash, an abort, a seed in the wrong directory
// or a directory without seeds fails the test.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_target.h"

namespace {

namespace fs = std::filesystem;

std::vector<fs::path> seeds_in(const fs::path& dir) {
  std::vector<fs::path> seeds;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file()) seeds.push_back(entry.path());
  }
  std::sort(seeds.begin(), seeds.end());
  return seeds;
}

// Returns the number of seeds whose verdict was wrong; -1 when a seed cannot
// be read.
int replay(const std::vector<fs::path>& seeds, bool want_accepted) {
  int wrong = 0;
  for (const auto& seed : seeds) {
    std::ifstream in(seed, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "cannot read %s\n", seed.c_str());
      return -1;
    }
    const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                          std::istreambuf_iterator<char>());
    const bool accepted = kvxfer::fuzz::accepts(bytes);
    if (accepted != want_accepted) {
      std::fprintf(stderr, "FAIL %s (%zu bytes): %s, expected %s\n", seed.c_str(), bytes.size(),
                   accepted ? "accepted" : "refused", want_accepted ? "accepted" : "refused");
      ++wrong;
    }
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir with valid/ and invalid/>\n", argv[0]);
    return 2;
  }
  const fs::path corpus(argv[1]);
  const auto valid = seeds_in(corpus / "valid");
  const auto invalid = seeds_in(corpus / "invalid");
  if (valid.empty() || invalid.empty()) {
    std::fprintf(stderr, "%s needs seeds in both valid/ (%zu) and invalid/ (%zu)\n", corpus.c_str(),
                 valid.size(), invalid.size());
    return 1;
  }
  const int wrong_valid = replay(valid, true);
  const int wrong_invalid = replay(invalid, false);
  if (wrong_valid < 0 || wrong_invalid < 0) return 2;
  std::printf("%zu valid seeds accepted, %zu invalid seeds refused, %d wrong\n",
              valid.size() - static_cast<std::size_t>(wrong_valid),
              invalid.size() - static_cast<std::size_t>(wrong_invalid),
              wrong_valid + wrong_invalid);
  return wrong_valid + wrong_invalid == 0 ? 0 : 1;
}
