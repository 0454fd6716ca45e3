// SPDX-License-Identifier: Apache-2.0
// The one little-endian reader and writer under every byte format a peer
// sends (wire/*.h). Loads and stores go through memcpy and std::endian, so
// the bytes are the same on any host and no access is ever unaligned.
//
// ByteWriter appends to a std::vector, or writes in place into a buffer of
// known size without allocating (the fence's, the notification's and the
// tcp frames' path). ByteReader walks peer bytes: a read past the end fails
// softly (std::nullopt, ok() turns false for good, the cursor stays), never
// UB and never an exception.
#pragma once

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kvxfer::wire {

static_assert(std::endian::native == std::endian::little || std::endian::native == std::endian::big,
              "wire formats need a little- or big-endian host");

// The integers a format may carry: fixed width, never bool.
template <typename T>
concept WireInt = std::integral<T> && !std::same_as<T, bool> &&
                  (sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8);

// Host order <-> little-endian (the same swap both ways). A no-op on
// little-endian hosts, so the stores and loads below are plain memcpy there.
template <WireInt T>
[[nodiscard]] constexpr T to_little_endian(T value) {
  if constexpr (std::endian::native == std::endian::little || sizeof(T) == 1) {
    return value;
  } else {
    using U = std::make_unsigned_t<T>;
    auto in = static_cast<U>(value);
    U out = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      out = static_cast<U>((out << 8) | (in & 0xffu));
      in = static_cast<U>(in >> 8);
    }
    return static_cast<T>(out);
  }
}

// Stores `value` little-endian at `at` (sizeof(T) bytes, any alignment).
template <WireInt T>
inline void store_le(std::uint8_t* at, T value) {
  value = to_little_endian(value);
  std::memcpy(at, &value, sizeof(T));
}

// Loads a little-endian T from `at` (sizeof(T) bytes, any alignment).
template <WireInt T>
[[nodiscard]] inline T load_le(const std::uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return to_little_endian(value);
}

// The bytes of a string, as a format writes them.
[[nodiscard]] inline std::span<const std::uint8_t> byte_view(std::string_view text) {
  return {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()};
}

class ByteWriter {
 public:
  // Appends to `out` (which may already hold bytes), growing it as needed.
  explicit ByteWriter(std::vector<std::uint8_t>& out) : grow_(&out) {}
  // Writes in place into `buffer` and never past its end: a write that does
  // not fit writes nothing, and neither does any write after it (ok() false).
  explicit ByteWriter(std::span<std::uint8_t> buffer) : fixed_(buffer) {}

  template <WireInt T>
  void put(T value) {
    std::uint8_t* at = nullptr;
    if (claim(sizeof(T), &at)) store_le(at, value);
  }
  void u8(std::uint8_t value) { put(value); }
  void u16(std::uint16_t value) { put(value); }
  void u32(std::uint32_t value) { put(value); }
  void u64(std::uint64_t value) { put(value); }
  void i32(std::int32_t value) { put(value); }

  void raw(std::span<const std::uint8_t> bytes) {
    // claim (resize) + memcpy rather than vector::insert: GCC 12 reports a
    // false -Wstringop-overflow for insert of a possibly empty range.
    std::uint8_t* at = nullptr;
    if (!bytes.empty() && claim(bytes.size(), &at)) std::memcpy(at, bytes.data(), bytes.size());
  }

  // A u32 length, then the bytes. The caller keeps them under 4 GiB (every
  // format caps its fields far below that).
  void prefixed(std::span<const std::uint8_t> bytes) {
    u32(static_cast<std::uint32_t>(bytes.size()));
    raw(bytes);
  }

  // Bytes this writer has written (for a vector: appended).
  [[nodiscard]] std::size_t written() const { return written_; }
  // False once a write did not fit a fixed buffer.
  [[nodiscard]] bool ok() const { return ok_; }

 private:
  // Makes room for `n` bytes at *at. Says whether it could by a bool, not a
  // null pointer: with a fixed buffer of constant size the answer is a
  // constant, and a fixed-size message's stores then carry no check at all.
  bool claim(std::size_t n, std::uint8_t** at) {
    if (grow_ != nullptr) {
      const std::size_t end = grow_->size();
      grow_->resize(end + n);
      *at = grow_->data() + end;
    } else if (ok_ && fixed_.size() - written_ >= n) {
      *at = fixed_.data() + written_;
    } else {
      ok_ = false;
      return false;
    }
    written_ += n;
    return true;
  }

  std::vector<std::uint8_t>* grow_ = nullptr;
  std::span<std::uint8_t> fixed_;
  std::size_t written_ = 0;
  bool ok_ = true;
};

// A bounds-checked cursor over bytes from a peer. Each read returns
// std::nullopt when the bytes are not there, consumes nothing then, and
// clears ok() for good: a decoder may read a whole fixed layout and check
// ok() once, knowing that ok() means every read before it succeeded.
class ByteReader {
 public:
  explicit ByteReader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}

  template <WireInt T>
  [[nodiscard]] std::optional<T> get() {
    if (remaining() < sizeof(T)) return fail<T>();
    const T value = load_le<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return value;
  }
  [[nodiscard]] std::optional<std::uint8_t> u8() { return get<std::uint8_t>(); }
  [[nodiscard]] std::optional<std::uint16_t> u16() { return get<std::uint16_t>(); }
  [[nodiscard]] std::optional<std::uint32_t> u32() { return get<std::uint32_t>(); }
  [[nodiscard]] std::optional<std::uint64_t> u64() { return get<std::uint64_t>(); }
  [[nodiscard]] std::optional<std::int32_t> i32() { return get<std::int32_t>(); }

  // The next `n` bytes, as a view into the reader's bytes.
  [[nodiscard]] std::optional<std::span<const std::uint8_t>> take(std::size_t n) {
    if (remaining() < n) return fail<std::span<const std::uint8_t>>();
    const auto out = bytes_.subspan(pos_, n);
    pos_ += n;
    return out;
  }

  // A u32 length, then that many bytes (a view into the reader's bytes).
  // Fails, consuming nothing, when the length is over `max_len` (whether or
  // not that many bytes follow) or the bytes are not all there.
  [[nodiscard]] std::optional<std::span<const std::uint8_t>> prefixed(std::size_t max_len) {
    const std::size_t start = pos_;
    const auto len = u32();
    if (!len) return std::nullopt;
    if (*len > max_len || remaining() < *len) {
      pos_ = start;
      return fail<std::span<const std::uint8_t>>();
    }
    return take(*len);
  }

  [[nodiscard]] std::size_t position() const { return pos_; }
  [[nodiscard]] std::size_t remaining() const { return bytes_.size() - pos_; }
  [[nodiscard]] bool at_end() const { return pos_ == bytes_.size(); }
  [[nodiscard]] bool ok() const { return ok_; }

 private:
  template <typename T>
  std::optional<T> fail() {
    ok_ = false;
    return std::nullopt;
  }

  std::span<const std::uint8_t> bytes_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace kvxfer::wire
