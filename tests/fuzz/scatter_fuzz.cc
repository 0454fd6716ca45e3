// libFuzzer target for the UCX lane's scatter-write wire format: any input
// either decodes to a write header that re-encodes to the same bytes, or is
// refused; scatter_runs_fit agrees with a slow reference that cannot
// overflow; and the same holds for acks. Anything else (a crash, an
// over-read under ASan, a disagreement) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "wire/scatter.h"

namespace {

using namespace kvxfer::internal::ucx;

__extension__ typedef unsigned __int128 u128;  // __extension__: no -Wpedantic warning

// The definition of "fits", computed in 128 bits so nothing wraps.
bool reference_fit(const ScatterHeader& h, std::uint64_t region_len, std::uint64_t payload_len) {
  u128 total = 0;
  for (std::size_t i = 0; i < h.run_count(); ++i) {
    const ScatterRun r = h.run(i);
    if (r.length == 0) return false;
    if (static_cast<u128>(r.offset) + r.length > region_len) return false;
    total += r.length;
  }
  return total == payload_len;
}

std::uint64_t load_u64(const std::uint8_t* at) {
  std::uint64_t v;
  std::memcpy(&v, at, 8);
  return v;
}

void check_fit(const ScatterHeader& h, std::uint64_t region_len, std::uint64_t payload_len) {
  if (scatter_runs_fit(h, region_len, payload_len) != reference_fit(h, region_len, payload_len))
    std::abort();
}

void check_header(std::span<const std::uint8_t> bytes, std::span<const std::uint8_t> whole) {
  ScatterHeader h;
  if (!decode_scatter_header(bytes, &h)) return;
  const std::size_t count = h.run_count();
  if (count == 0 || count > kMaxScatterRuns || h.runs.size() != count * kScatterRunLen)
    std::abort();
  if (bytes.size() != scatter_header_len(count)) std::abort();

  std::vector<std::uint8_t> again(scatter_header_len(count));
  put_scatter_fixed(again.data(), static_cast<std::uint16_t>(count), h.token, h.sequence, h.slot,
                    h.lineage, h.epoch);
  std::uint64_t sum = 0;  // wraps on purpose: one of the payloads tried below
  std::uint64_t region = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const ScatterRun r = h.run(i);
    put_scatter_run(again.data(), i, r.offset, r.length);
    sum += r.length;
    if (r.offset + r.length > region) region = r.offset + r.length;
  }
  if (std::memcmp(again.data(), bytes.data(), bytes.size()) != 0) std::abort();

  // Region and payload lengths from the input's first 16 bytes when the
  // header is preceded by them, else fixed; plus values near the edges.
  std::uint64_t region_len = 1ull << 30;
  std::uint64_t payload_len = 1ull << 20;
  if (whole.size() >= 16 + bytes.size()) {
    region_len = load_u64(whole.data());
    payload_len = load_u64(whole.data() + 8);
  }
  check_fit(h, region_len, payload_len);
  for (const std::uint64_t r : {region_len, region, region - 1, ~std::uint64_t{0}}) {
    for (const std::uint64_t p : {payload_len, sum, sum - 1, sum + 1}) check_fit(h, r, p);
  }
}

void check_ack(std::span<const std::uint8_t> bytes) {
  ScatterAck a;
  if (!decode_ack(bytes, &a)) return;
  std::uint8_t again[kAckLen];
  encode_ack(again, a);
  if (bytes.size() != kAckLen || std::memcmp(again, bytes.data(), kAckLen) != 0) std::abort();
  ScatterAck b;
  if (!decode_ack(std::span<const std::uint8_t>(again, kAckLen), &b)) std::abort();
  if (b.slot != a.slot || b.sequence != a.sequence || b.status != a.status) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  // The whole input as a header or an ack, and the input past its first 16
  // bytes (which then give the region and payload lengths) as a header.
  check_header(bytes, bytes);
  check_ack(bytes);
  if (size >= 16) check_header(bytes.subspan(16), bytes);
  return 0;
}
