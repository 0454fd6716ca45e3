// SPDX-License-Identifier: Apache-2.0
// The tcp lane's frames (wire/tcp_frame.h): the header's exact bytes (its
// fields, then its tag), round trips of every frame type, each type's bounds
// on count, length, flags, status and tag, the challenge, the hello's body,
// the runs' exact bytes, and runs_fit's check of a write's or read request's
// runs against the receiver's regions.
#include "wire/tcp_frame.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace kvxfer::internal::tcp {
namespace {

using Bytes = std::vector<std::uint8_t>;
constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint64_t kRegion = 1 << 20;

wire::FrameHeader header(wire::FrameType type, std::uint32_t count, std::uint64_t length, std::uint16_t flags = 0,
              std::uint32_t status = 0, std::uint64_t seq = 7) {
  wire::FrameHeader h;
  h.type = type;
  h.flags = flags;
  h.count = count;
  h.status = status;
  h.seq = seq;
  h.length = length;
  return h;
}

Bytes bytes_of(const wire::FrameHeader& h) {
  Bytes out(wire::kHeaderLen);
  wire::encode_header(out.data(), h);
  return out;
}

bool same(const wire::FrameHeader& a, const wire::FrameHeader& b) {
  return a.type == b.type && a.flags == b.flags && a.count == b.count && a.status == b.status &&
         a.seq == b.seq && a.length == b.length;
}

// True when `bytes` is refused and the output, filled beforehand, is left
// as it was.
bool refused(const Bytes& bytes) {
  const wire::FrameHeader sentinel = header(wire::FrameType::kReadData, 9, 9, 9, 9, 9);
  wire::FrameHeader out = sentinel;
  return !wire::decode_header(bytes, &out) && same(out, sentinel);
}

bool refused(const wire::FrameHeader& h) { return refused(bytes_of(h)); }

// True when `h` encodes to a header that decodes to `h` again.
bool accepted(const wire::FrameHeader& h) {
  wire::FrameHeader out;
  return wire::decode_header(bytes_of(h), &out) && same(out, h);
}

// -------------------------------------------------------------- the header

TEST(TcpFrameHeader, LayoutIsLittleEndianWithMagicKVXT) {
  const Bytes expected = {
      'K',  'V',  'X',  'T',  4,    3,    0x01, 0x00,  // magic, version 4, kWrite, wire::kMore
      0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // count (3 runs), status
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // seq
      0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,  // length
      0,    0,    0,    0,    0,    0,    0,    0,     // tag (the sender writes it)
      0,    0,    0,    0,    0,    0,    0,    0,
  };
  EXPECT_EQ(bytes_of(header(wire::FrameType::kWrite, 3, 0x1112131415161718ull, wire::kMore, 0,
                            0x0102030405060708ull)),
            expected);
  EXPECT_EQ(wire::kHeaderLen, expected.size());
  EXPECT_EQ(wire::kFieldsLen, 32u);
}

TEST(TcpFrameHeader, TheTagIsTheLast16BytesAndAnyTagDecodes) {
  // Whether a tag is right is the lane's question (it holds the keys); the
  // decoder only splits the header.
  Bytes bytes = bytes_of(header(wire::FrameType::kAck, 0, 0));
  for (std::size_t i = 0; i < wire::kTagLen; ++i) bytes[wire::kFieldsLen + i] = static_cast<std::uint8_t>(0xe0 + i);
  wire::FrameHeader h;
  ASSERT_TRUE(wire::decode_header(bytes, &h));
  const std::span<const std::uint8_t, wire::kHeaderLen> view(bytes.data(), wire::kHeaderLen);
  EXPECT_EQ(wire::header_tag(view).data(), bytes.data() + wire::kFieldsLen);
  EXPECT_EQ(wire::header_tag(view)[0], 0xe0);
  EXPECT_EQ(wire::header_fields(view).data(), bytes.data());
  // encode_header clears the tag a reused buffer held.
  wire::encode_header(bytes.data(), header(wire::FrameType::kAck, 0, 0));
  EXPECT_EQ(bytes, bytes_of(header(wire::FrameType::kAck, 0, 0)));
}

TEST(TcpFrameHeader, TypesFlagsAndStatusesKeepTheirValues) {
  EXPECT_EQ(static_cast<int>(wire::FrameType::kHello), 1);
  EXPECT_EQ(static_cast<int>(wire::FrameType::kWelcome), 2);
  EXPECT_EQ(static_cast<int>(wire::FrameType::kWrite), 3);
  EXPECT_EQ(static_cast<int>(wire::FrameType::kNotify), 4);
  EXPECT_EQ(static_cast<int>(wire::FrameType::kReadReq), 5);
  EXPECT_EQ(static_cast<int>(wire::FrameType::kAck), 6);
  EXPECT_EQ(static_cast<int>(wire::FrameType::kReadData), 7);
  EXPECT_EQ(static_cast<int>(wire::FrameType::kChallenge), 8);
  EXPECT_EQ(wire::kMore, 1);
  EXPECT_EQ(wire::kNotifyFollows, 2);
  EXPECT_EQ(wire::kEncrypt, 4);
  EXPECT_EQ(wire::kStatusEncryption, 7u);
  EXPECT_EQ(wire::kStatusOk, 0u);
  EXPECT_EQ(wire::kStatusRefused, 1u);
  EXPECT_EQ(wire::kStatusQueueFull, 2u);
}

TEST(TcpFrameHeader, RoundTripsEveryFrameType) {
  const std::vector<wire::FrameHeader> frames = {
      header(wire::FrameType::kChallenge, 0, 0, 0, 0, 0),
      header(wire::FrameType::kHello, 5, 0, 0, 0, 0),
      header(wire::FrameType::kWelcome, 0, 0),
      header(wire::FrameType::kWrite, 3, 12288),
      header(wire::FrameType::kWrite, 1, 4096, wire::kMore),
      header(wire::FrameType::kWrite, 1, 4096, wire::kNotifyFollows),
      header(wire::FrameType::kNotify, 0, 11),
      header(wire::FrameType::kReadReq, 2, 8192),
      header(wire::FrameType::kReadReq, 2, 8192, wire::kMore),
      header(wire::FrameType::kAck, 0, 0),
      header(wire::FrameType::kAck, 0, 0, 0, wire::kStatusRefused),
      header(wire::FrameType::kReadData, 0, 8192),
      header(wire::FrameType::kReadData, 0, 0, 0, wire::kStatusRefused),
  };
  for (const wire::FrameHeader& h : frames) {
    EXPECT_TRUE(accepted(h)) << "type " << static_cast<int>(h.type) << " flags " << h.flags;
  }
  // The sequence number is the sender's: any value.
  EXPECT_TRUE(accepted(header(wire::FrameType::kAck, 0, 0, 0, 0, 0)));
  EXPECT_TRUE(accepted(header(wire::FrameType::kAck, 0, 0, 0, 0, kMax)));
}

TEST(TcpFrameHeader, BodyLengthFollowsTheType) {
  EXPECT_EQ(body_len(header(wire::FrameType::kChallenge, 0, 0)), wire::kNonceLen);
  EXPECT_EQ(body_len(header(wire::FrameType::kHello, 5, 0)), wire::kHelloFixedLen + 5 + wire::kHelloProofLen);
  EXPECT_EQ(body_len(header(wire::FrameType::kWelcome, 0, 0)), 0u);
  EXPECT_EQ(body_len(header(wire::FrameType::kWrite, 3, 12288)), 3 * wire::kRunLen);
  EXPECT_EQ(body_len(header(wire::FrameType::kReadReq, wire::kMaxRuns, 1)), wire::kMaxRuns * wire::kRunLen);
  EXPECT_EQ(body_len(header(wire::FrameType::kNotify, 0, 11)), 11u);
  EXPECT_EQ(body_len(header(wire::FrameType::kAck, 0, 0)), 0u);
  // A read's payload is not body: it goes straight into the reader's pool.
  EXPECT_EQ(body_len(header(wire::FrameType::kReadData, 0, 8192)), 0u);
}

TEST(TcpFrameHeader, RefusesEveryOtherSize) {
  const Bytes good = bytes_of(header(wire::FrameType::kAck, 0, 0));
  for (std::size_t len = 0; len < good.size(); ++len) {
    EXPECT_TRUE(refused(Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len))))
        << len;
  }
  Bytes longer = good;
  longer.push_back(0);
  EXPECT_TRUE(refused(longer));
}

TEST(TcpFrameHeader, RefusesWrongMagicOrVersion) {
  const Bytes good = bytes_of(header(wire::FrameType::kAck, 0, 0));
  for (std::size_t at = 0; at < 4; ++at) {
    Bytes bytes = good;
    bytes[at] ^= 0x01;
    EXPECT_TRUE(refused(bytes)) << "byte " << at;
  }
  for (const std::uint8_t version : {0, 1, 2, 3, 5, 0xff}) {
    Bytes bytes = good;
    bytes[4] = version;
    EXPECT_TRUE(refused(bytes)) << "version " << int{version};
  }
}

TEST(TcpFrameHeader, RefusesUnknownTypes) {
  for (const int type : {0, 9, 0x80, 0xff}) {
    Bytes bytes = bytes_of(header(wire::FrameType::kAck, 0, 0));
    bytes[5] = static_cast<std::uint8_t>(type);
    EXPECT_TRUE(refused(bytes)) << "type " << type;
  }
}

// A header of `h` with its tag's last byte set.
Bytes tagged(const wire::FrameHeader& h) {
  Bytes bytes = bytes_of(h);
  bytes.back() = 1;
  return bytes;
}

TEST(TcpFrameHeader, AChallengeIsItsTypeAndNothingElse) {
  EXPECT_TRUE(accepted(header(wire::FrameType::kChallenge, 0, 0, 0, 0, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kChallenge, 1, 0, 0, 0, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kChallenge, 0, 1, 0, 0, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kChallenge, 0, 0, wire::kMore, 0, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kChallenge, 0, 0, 0, 1, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kChallenge, 0, 0, 0, 0, 1)));
  // It comes before any key: a tag would be no one's.
  EXPECT_TRUE(refused(tagged(header(wire::FrameType::kChallenge, 0, 0, 0, 0, 0))));
}

TEST(TcpFrameHeader, AChallengeFrameCarriesItsNonce) {
  std::array<std::uint8_t, wire::kNonceLen> nonce{};
  for (std::size_t i = 0; i < nonce.size(); ++i) nonce[i] = static_cast<std::uint8_t>(i + 1);
  Bytes frame(wire::kHeaderLen + wire::kNonceLen);
  wire::encode_challenge(frame.data(), nonce);
  std::array<std::uint8_t, wire::kNonceLen> out{};
  ASSERT_TRUE(wire::decode_challenge(frame, &out));
  EXPECT_EQ(out, nonce);
  // Anything but exactly a challenge frame is refused, *out untouched.
  out.fill(9);
  EXPECT_FALSE(wire::decode_challenge(std::span(frame).first(frame.size() - 1), &out));
  Bytes longer = frame;
  longer.push_back(0);
  EXPECT_FALSE(wire::decode_challenge(longer, &out));
  Bytes other = frame;
  other[5] = static_cast<std::uint8_t>(wire::FrameType::kWelcome);
  EXPECT_FALSE(wire::decode_challenge(other, &out));
  Bytes old = frame;
  old[4] = 2;
  EXPECT_FALSE(wire::decode_challenge(old, &out));
  EXPECT_EQ(out[0], 9);
}

TEST(TcpFrameHeader, AHelloCarriesANameOf1ToKMaxNameBytesAndNothingElse) {
  EXPECT_TRUE(accepted(header(wire::FrameType::kHello, 1, 0, 0, 0, 0)));
  EXPECT_TRUE(accepted(header(wire::FrameType::kHello, wire::kMaxName, 0, 0, 0, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kHello, 5, 0, 0, 0, 1)));
  EXPECT_TRUE(refused(tagged(header(wire::FrameType::kHello, 5, 0, 0, 0, 0))));
  EXPECT_TRUE(refused(header(wire::FrameType::kHello, 0, 0, 0, 0, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kHello, wire::kMaxName + 1, 0, 0, 0, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kHello, 0xffffffff, 0, 0, 0, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kHello, 5, 1, 0, 0, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kHello, 5, 0, wire::kMore, 0, 0)));
  // Its one flag: the initiator encrypts (KVXFER_TCP_ENCRYPT=on).
  EXPECT_TRUE(accepted(header(wire::FrameType::kHello, 5, 0, wire::kEncrypt, 0, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kHello, 5, 0, wire::kEncrypt | wire::kMore, 0, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kWrite, 1, 4096, wire::kEncrypt, 0, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kHello, 5, 0, 0, 1, 0)));
}

TEST(TcpFrameHeader, AWelcomeCarriesOnlyItsStatus) {
  EXPECT_TRUE(refused(header(wire::FrameType::kWelcome, 1, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kWelcome, 0, 1)));
  EXPECT_TRUE(refused(header(wire::FrameType::kWelcome, 0, 0, wire::kMore)));
  // A refused hello's answer: the status says why, and comes through.
  for (const std::uint32_t status :
       {std::uint32_t{wire::kStatusOk}, std::uint32_t{wire::kStatusNotYours}, std::uint32_t{wire::kStatusStaleFence},
        std::uint32_t{wire::kStatusTableFull}, std::uint32_t{wire::kStatusUnproven}}) {
    wire::FrameHeader h;
    ASSERT_TRUE(wire::decode_header(bytes_of(header(wire::FrameType::kWelcome, 0, 0, 0, status)), &h));
    EXPECT_EQ(h.status, status);
  }
}

TEST(TcpFrameHeader, AWriteCarries1ToKMaxRunsAndANonzeroLength) {
  EXPECT_TRUE(accepted(header(wire::FrameType::kWrite, 1, 1)));
  EXPECT_TRUE(accepted(header(wire::FrameType::kWrite, wire::kMaxRuns, kMax)));
  EXPECT_TRUE(refused(header(wire::FrameType::kWrite, 0, 4096)));
  EXPECT_TRUE(refused(header(wire::FrameType::kWrite, wire::kMaxRuns + 1, 4096)));
  EXPECT_TRUE(refused(header(wire::FrameType::kWrite, 0xffffffff, 4096)));
  EXPECT_TRUE(refused(header(wire::FrameType::kWrite, 1, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kWrite, 1, 4096, 0, wire::kStatusRefused)));
}

TEST(TcpFrameHeader, AWriteCarriesKMoreOrKNotifyFollowsButNotBoth) {
  EXPECT_TRUE(refused(header(wire::FrameType::kWrite, 1, 4096, wire::kMore | wire::kNotifyFollows)));
  // The other bits are no flag of any frame.
  for (int bit = 2; bit < 16; ++bit) {
    EXPECT_TRUE(refused(header(wire::FrameType::kWrite, 1, 4096, static_cast<std::uint16_t>(1u << bit))))
        << "bit " << bit;
  }
}

TEST(TcpFrameHeader, AReadRequestCarries1ToKMaxRunsAndOnlyKMore) {
  EXPECT_TRUE(accepted(header(wire::FrameType::kReadReq, 1, 1)));
  EXPECT_TRUE(accepted(header(wire::FrameType::kReadReq, wire::kMaxRuns, kMax, wire::kMore)));
  EXPECT_TRUE(refused(header(wire::FrameType::kReadReq, 0, 4096)));
  EXPECT_TRUE(refused(header(wire::FrameType::kReadReq, wire::kMaxRuns + 1, 4096)));
  EXPECT_TRUE(refused(header(wire::FrameType::kReadReq, 1, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kReadReq, 1, 4096, 0, wire::kStatusRefused)));
  // A read delivers no notification.
  EXPECT_TRUE(refused(header(wire::FrameType::kReadReq, 1, 4096, wire::kNotifyFollows)));
  EXPECT_TRUE(refused(header(wire::FrameType::kReadReq, 1, 4096, wire::kMore | wire::kNotifyFollows)));
  EXPECT_TRUE(refused(header(wire::FrameType::kReadReq, 1, 4096, 1u << 15)));
}

TEST(TcpFrameHeader, ANotificationCarries1ToKMaxNotificationBytes) {
  EXPECT_TRUE(accepted(header(wire::FrameType::kNotify, 0, 1)));
  EXPECT_TRUE(accepted(header(wire::FrameType::kNotify, 0, wire::kMaxMessage)));
  EXPECT_TRUE(refused(header(wire::FrameType::kNotify, 0, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kNotify, 0, wire::kMaxMessage + 1)));
  EXPECT_TRUE(refused(header(wire::FrameType::kNotify, 0, kMax)));
  EXPECT_TRUE(refused(header(wire::FrameType::kNotify, 1, 11)));
  EXPECT_TRUE(refused(header(wire::FrameType::kNotify, 0, 11, wire::kMore)));
  EXPECT_TRUE(refused(header(wire::FrameType::kNotify, 0, 11, 0, 1)));
}

TEST(TcpFrameHeader, AnAckCarriesAStatusAndNothingElse) {
  EXPECT_TRUE(accepted(header(wire::FrameType::kAck, 0, 0, 0, wire::kStatusQueueFull)));
  EXPECT_TRUE(refused(header(wire::FrameType::kAck, 1, 0)));
  EXPECT_TRUE(refused(header(wire::FrameType::kAck, 0, 1)));
  EXPECT_TRUE(refused(header(wire::FrameType::kAck, 0, 0, wire::kMore)));
}

TEST(TcpFrameHeader, ReadDataCarriesBytesOnlyWithStatusOk) {
  EXPECT_TRUE(accepted(header(wire::FrameType::kReadData, 0, kMax)));
  EXPECT_TRUE(accepted(header(wire::FrameType::kReadData, 0, 0, 0, wire::kStatusRefused)));
  EXPECT_TRUE(refused(header(wire::FrameType::kReadData, 0, 1, 0, wire::kStatusRefused)));
  EXPECT_TRUE(refused(header(wire::FrameType::kReadData, 1, 4096)));
  EXPECT_TRUE(refused(header(wire::FrameType::kReadData, 0, 4096, wire::kMore)));
}

// -------------------------------------------------------------- the hello

wire::Hello make_hello() {
  wire::Hello h{0x0102030405060708ull, 0x1112131415161718ull, 3, 0x2122232425262728ull, "ab"};
  for (std::size_t i = 0; i < h.key.size(); ++i) h.key[i] = static_cast<std::uint8_t>(0x40 + i);
  for (std::size_t i = 0; i < h.nonce.size(); ++i) h.nonce[i] = static_cast<std::uint8_t>(0x60 + i);
  return h;
}
const wire::Hello kHello = make_hello();

// The body with a proof of 0xa0, 0xa1, ... (the lane computes the real one).
Bytes hello_body(const wire::Hello& hello) {
  Bytes out(wire::kHelloFixedLen + hello.name.size() + wire::kHelloProofLen);
  wire::encode_hello_body(out.data(), hello);
  for (std::size_t i = 0; i < wire::kHelloProofLen; ++i) {
    out[wire::kHelloFixedLen + hello.name.size() + i] = static_cast<std::uint8_t>(0xa0 + i);
  }
  return out;
}

// True when `body` is refused and the output, filled beforehand, is left
// as it was.
bool hello_refused(const Bytes& body, std::size_t name_len) {
  wire::Hello out{9, 9, 9, 9, "untouched"};
  return !wire::decode_hello_body(body, name_len, &out) && out.token == 9 && out.lineage == 9 &&
         out.gen == 9 && out.epoch == 9 && out.name == "untouched";
}

TEST(TcpHello, BodyLayoutIsLittleEndianWithTheKeyAndNonceThenTheNameThenTheProof) {
  Bytes expected = {
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // target token
      0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,  // lineage
      0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // gen
      0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21,  // epoch
  };
  for (std::uint8_t b = 0x40; b < 0x60; ++b) expected.push_back(b);  // initiator key
  for (std::uint8_t b = 0x60; b < 0x80; ++b) expected.push_back(b);  // initiator nonce
  expected.push_back('a');                                           // name
  expected.push_back('b');
  for (std::uint8_t b = 0xa0; b < 0xc0; ++b) expected.push_back(b);  // proof
  EXPECT_EQ(hello_body(kHello), expected);
  // The proof covers everything before it.
  EXPECT_EQ(wire::hello_proven_part(expected).size(), wire::kHelloFixedLen + 2);
}

TEST(TcpHello, RoundTripsIntoAViewOfTheBody) {
  const std::string name(wire::kMaxName, 'n');
  for (const wire::Hello& in : {kHello, wire::Hello{0, 1, 1, 1, "a"}, wire::Hello{kMax, kMax, kMax, kMax, name}}) {
    const Bytes body = hello_body(in);
    wire::Hello out;
    ASSERT_TRUE(wire::decode_hello_body(body, in.name.size(), &out)) << in.name;
    EXPECT_EQ(out.token, in.token);
    EXPECT_EQ(out.lineage, in.lineage);
    EXPECT_EQ(out.gen, in.gen);
    EXPECT_EQ(out.epoch, in.epoch);
    EXPECT_EQ(out.name, in.name);
    EXPECT_EQ(out.key, in.key);
    EXPECT_EQ(out.nonce, in.nonce);
    EXPECT_EQ(reinterpret_cast<const std::uint8_t*>(out.name.data()), body.data() + wire::kHelloFixedLen);
    EXPECT_EQ(out.proof.data(), body.data() + wire::kHelloFixedLen + in.name.size());
    EXPECT_EQ(out.proof.size(), wire::kHelloProofLen);
  }
}

TEST(TcpHello, RefusesZeroLineageGenOrEpoch) {
  EXPECT_TRUE(hello_refused(hello_body(wire::Hello{1, 0, 1, 1, "ab"}), 2));
  EXPECT_TRUE(hello_refused(hello_body(wire::Hello{1, 1, 0, 1, "ab"}), 2));
  EXPECT_TRUE(hello_refused(hello_body(wire::Hello{1, 1, 1, 0, "ab"}), 2));
}

TEST(TcpHello, RefusesABodyOfAnotherSizeThanTheNameLengthSays) {
  const Bytes good = hello_body(kHello);
  for (std::size_t len = 0; len < good.size(); ++len) {
    EXPECT_TRUE(hello_refused(Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)),
                              kHello.name.size()))
        << len;
  }
  Bytes longer = good;
  longer.push_back('c');
  EXPECT_TRUE(hello_refused(longer, kHello.name.size()));
  EXPECT_TRUE(hello_refused(good, kHello.name.size() - 1));
  EXPECT_TRUE(hello_refused(good, kHello.name.size() + 1));
}

TEST(TcpHello, RefusesANameLengthThatWrapsTheSize) {
  // wire::kHelloFixedLen + name_len + wire::kHelloProofLen wraps to one byte short of
  // the fixed part and the MAC.
  const Bytes good = hello_body(kHello);
  const Bytes short_body(good.begin(), good.begin() + wire::kHelloFixedLen + wire::kHelloProofLen - 1);
  EXPECT_TRUE(hello_refused(short_body, std::numeric_limits<std::size_t>::max()));
  // A name longer than any hello's, with a body to match, is refused too.
  EXPECT_TRUE(hello_refused(Bytes(wire::kHelloFixedLen + wire::kMaxName + 1 + wire::kHelloProofLen, 1), wire::kMaxName + 1));
}

// -------------------------------------------------------------- runs_fit

// A run, in the pool (region 0) unless it names a region.
struct TestRun {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::uint64_t region = 0;
};

Bytes runs_of(const std::vector<TestRun>& runs) {
  Bytes out(runs.size() * wire::kRunLen);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    wire::put_run_at(out.data() + i * wire::kRunLen, runs[i].region, runs[i].offset,
                     runs[i].length);
  }
  return out;
}

// A receiver with a pool of `pool` bytes (id 0) and nothing else.
auto pool_of(std::uint64_t pool) {
  return [pool](std::uint64_t id) -> std::uint64_t { return id == 0 ? pool : 0; };
}

// Whether a write (or a frame of `type`) of `runs` whose header says `length`
// bytes fits a pool of `region` bytes.
bool fits(const std::vector<TestRun>& runs, std::uint64_t length, std::uint64_t region = kRegion,
          wire::FrameType type = wire::FrameType::kWrite) {
  const wire::FrameHeader h = header(type, static_cast<std::uint32_t>(runs.size()), length);
  return runs_fit(h, runs_of(runs), pool_of(region));
}

// A receiver with no pool and two regions: slot 1 generation 2 (64 KiB) and
// slot 3 generation 1 (4 KiB).
constexpr std::uint64_t kSixtyFour = (std::uint64_t{2} << 32) | 1;
constexpr std::uint64_t kFour = (std::uint64_t{1} << 32) | 3;
std::uint64_t two_regions(std::uint64_t id) {
  return id == kSixtyFour ? 65536 : id == kFour ? 4096 : 0;
}

bool fits_regions(const std::vector<TestRun>& runs, std::uint64_t length) {
  const wire::FrameHeader h =
      header(wire::FrameType::kWrite, static_cast<std::uint32_t>(runs.size()), length);
  return runs_fit(h, runs_of(runs), two_regions);
}

TEST(TcpRuns, LayoutIsRegionOffsetLengthLittleEndian) {
  Bytes run(wire::kRunLen);
  wire::put_run_at(run.data(), 0x0102030405060708ull, 0x1112131415161718ull,
                   0x2122232425262728ull);
  const Bytes expected = {
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // the target's region id
      0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,  // offset in it
      0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21,  // length
  };
  EXPECT_EQ(run, expected);
  const wire::Run back = wire::RunList{run}.run(0);
  EXPECT_EQ(back.region, 0x0102030405060708ull);
  EXPECT_EQ(back.offset, 0x1112131415161718ull);
  EXPECT_EQ(back.length, 0x2122232425262728ull);
}

TEST(TcpRunsFit, AcceptsRunsInsideTheRegionsTheyName) {
  EXPECT_TRUE(fits_regions({{0, 65536, kSixtyFour}}, 65536));
  EXPECT_TRUE(fits_regions({{0, 16, kSixtyFour}, {4080, 16, kFour}, {100, 1, kSixtyFour}}, 33));
}

TEST(TcpRunsFit, RefusesARunNamingARegionTheReceiverDoesNotHave) {
  // No pool, another slot, the right slot of another generation.
  EXPECT_FALSE(fits_regions({{0, 16, 0}}, 16));
  EXPECT_FALSE(fits_regions({{0, 16, (std::uint64_t{2} << 32) | 2}}, 16));
  EXPECT_FALSE(fits_regions({{0, 16, (std::uint64_t{1} << 32) | 1}}, 16));
  EXPECT_FALSE(fits_regions({{0, 16, kSixtyFour}, {0, 16, (std::uint64_t{3} << 32) | 1}}, 32));
}

TEST(TcpRunsFit, RefusesARunPastTheEndOfTheRegionItNames) {
  // Inside the larger region, but it names the smaller.
  EXPECT_FALSE(fits_regions({{4096, 16, kFour}}, 16));
  EXPECT_FALSE(fits_regions({{4090, 16, kFour}}, 16));
  EXPECT_FALSE(fits_regions({{0, 4097, kFour}}, 4097));
  EXPECT_TRUE(fits_regions({{4080, 16, kFour}}, 16));
}

TEST(TcpRunsFit, AcceptsRunsInsideTheRegionThatAddUpToTheLength) {
  EXPECT_TRUE(fits({{0, 4096}}, 4096));
  EXPECT_TRUE(fits({{0, 4096}, {65536, 8192}, {kRegion - 4096, 4096}}, 16384));
  EXPECT_TRUE(fits({{0, kRegion}}, kRegion));
  EXPECT_TRUE(fits({{0, 4096}, {65536, 8192}}, 12288, kRegion, wire::FrameType::kReadReq));
}

TEST(TcpRunsFit, RefusesRunsOutsideTheRegion) {
  EXPECT_FALSE(fits({{kRegion, 1}}, 1));
  EXPECT_FALSE(fits({{kRegion + 4096, 4096}}, 4096));
  EXPECT_FALSE(fits({{0, kRegion + 1}}, kRegion + 1));
  EXPECT_FALSE(fits({{0, 4096}}, 4096, 0));
  EXPECT_FALSE(fits({{0, 4096}, {kMax - 4095, 4096}}, 8192, kRegion, wire::FrameType::kReadReq));
}

TEST(TcpRunsFit, RefusesARunOverlappingTheRegionsEnd) {
  EXPECT_FALSE(fits({{kRegion - 4095, 4096}}, 4096));
  EXPECT_FALSE(fits({{0, 4096}, {kRegion - 1, 2}}, 4098));
}

TEST(TcpRunsFit, RefusesRunsThatDoNotAddUpToTheLength) {
  const std::vector<TestRun> runs = {{0, 4096}, {65536, 8192}};
  EXPECT_TRUE(fits(runs, 12288));
  EXPECT_FALSE(fits(runs, 12287));
  EXPECT_FALSE(fits(runs, 12289));
  EXPECT_FALSE(fits(runs, 4096));
  EXPECT_FALSE(fits(runs, kMax));
}

TEST(TcpRunsFit, RefusesAZeroLengthRun) {
  EXPECT_FALSE(fits({{0, 0}}, 1));
  EXPECT_FALSE(fits({{0, 4096}, {8192, 0}}, 4096));
}

TEST(TcpRunsFit, RefusesRunsWhoseEndOrSumOverflows) {
  // offset + length wraps to a small end.
  EXPECT_FALSE(fits({{kMax - 100, 4096}}, 4096, kMax));
  // Two runs whose lengths wrap to the header's length in 64 bits.
  EXPECT_FALSE(fits({{0, 1ull << 63}, {0, (1ull << 63) + 4096}}, 4096, kMax));
  // Two runs as long as the region add up to kMax - 1 in 64 bits.
  EXPECT_FALSE(fits({{0, kMax}, {0, kMax}}, kMax - 1, kMax));
  // Runs as large whose sum does not wrap fit a region that large.
  EXPECT_TRUE(fits({{0, 1ull << 62}, {0, 1ull << 62}}, 1ull << 63, kMax));
}

TEST(TcpRunsFit, RefusesRunsBytesOfAnotherSizeThanTheCount) {
  const wire::FrameHeader h = header(wire::FrameType::kWrite, 2, 8192);
  const Bytes runs = runs_of({{0, 4096}, {8192, 4096}});
  EXPECT_TRUE(runs_fit(h, runs, pool_of(kRegion)));
  EXPECT_FALSE(runs_fit(h, Bytes(runs.begin(), runs.end() - 1), pool_of(kRegion)));
  EXPECT_FALSE(runs_fit(h, Bytes(runs.begin(), runs.begin() + wire::kRunLen), pool_of(kRegion)));
  Bytes longer = runs_of({{0, 4096}, {8192, 4096}, {16384, 4096}});
  EXPECT_FALSE(runs_fit(h, longer, pool_of(kRegion)));
  EXPECT_FALSE(runs_fit(h, {}, pool_of(kRegion)));
}

}  // namespace
}  // namespace kvxfer::internal::tcp
