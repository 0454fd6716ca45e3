// SPDX-License-Identifier: Apache-2.0
// The tcp lane's handshake keys and frame tags (engines/tcp/tcp_handshake.h):
// both ends of one handshake derive the same proof and keys; another
// challenge, hello or key derives others (so a recorded hello proves nothing
// on a new connection); and a frame's tag holds only for its bytes, its
// direction and its place in the connection.
#include "engines/tcp/tcp_handshake.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

namespace kvxfer::internal::tcp {
namespace {

using Bytes = std::vector<std::uint8_t>;
using Tag = std::array<std::uint8_t, kTagLen>;

const Bytes kChallenge(80, 0x11);
const Bytes kHelloHeader(48, 0x21);
const Bytes kHello(150, 0x22);

struct Pair {
  Identity initiator;
  Identity target;
  HandshakeKeys at_initiator;
  HandshakeKeys at_target;
};

// Derives both ends' keys from the same transcript.
void handshake(Pair& p, const Bytes& challenge = kChallenge, const Bytes& hello = kHello) {
  ASSERT_TRUE(handshake_keys(p.initiator, p.target.public_key(), true, challenge, kHelloHeader,
                             hello, &p.at_initiator));
  ASSERT_TRUE(handshake_keys(p.target, p.initiator.public_key(), false, challenge, kHelloHeader,
                             hello, &p.at_target));
}

Tag sign(FrameAuth& auth, const Bytes& fields, const Bytes& body) {
  Tag tag{};
  EXPECT_TRUE(auth.sign(fields, body, tag));
  return tag;
}

TEST(TcpHandshake, BothEndsDeriveTheSameProofAndKeys) {
  Pair p;
  handshake(p);
  EXPECT_TRUE(same_proof(p.at_target.proof, p.at_initiator.proof));
  EXPECT_EQ(p.at_initiator.to_target, p.at_target.to_target);
  EXPECT_EQ(p.at_initiator.to_initiator, p.at_target.to_initiator);
  EXPECT_NE(p.at_target.to_target, p.at_target.to_initiator);
  EXPECT_NE(p.at_target.proof, p.at_target.to_target);
}

TEST(TcpHandshake, AnotherChallengeMakesAHellosProofWorthless) {
  // A hello recorded on one connection, replayed on another: the target's
  // challenge there differs, and so does the proof it expects.
  Pair p;
  handshake(p);
  Bytes other = kChallenge;
  other[40] ^= 1;
  HandshakeKeys replayed;
  ASSERT_TRUE(handshake_keys(p.target, p.initiator.public_key(), false, other, kHelloHeader, kHello,
                             &replayed));
  EXPECT_FALSE(same_proof(replayed.proof, p.at_initiator.proof));
  EXPECT_NE(replayed.to_target, p.at_initiator.to_target);
}

TEST(TcpHandshake, EveryByteOfTheHelloIsBound) {
  Pair p;
  handshake(p);
  for (std::size_t at : {std::size_t{0}, kHello.size() / 2, kHello.size() - 1}) {
    Bytes changed = kHello;
    changed[at] ^= 0x80;
    HandshakeKeys keys;
    ASSERT_TRUE(handshake_keys(p.target, p.initiator.public_key(), false, kChallenge, kHelloHeader,
                               changed, &keys));
    EXPECT_FALSE(same_proof(keys.proof, p.at_initiator.proof)) << at;
  }
  // Bytes moved from one message to the next are another transcript.
  Bytes longer_challenge = kChallenge;
  longer_challenge.push_back(kHelloHeader[0]);
  const Bytes shorter_header(kHelloHeader.begin() + 1, kHelloHeader.end());
  HandshakeKeys moved;
  ASSERT_TRUE(handshake_keys(p.target, p.initiator.public_key(), false, longer_challenge,
                             shorter_header, kHello, &moved));
  EXPECT_FALSE(same_proof(moved.proof, p.at_initiator.proof));
}

TEST(TcpHandshake, AnInitiatorWithoutThePrivateKeyCannotProveIt) {
  // Mallory presents the initiator's public key (it is in the metadata) but
  // holds only her own private key.
  Pair p;
  handshake(p);
  Identity mallory;
  HandshakeKeys hers;
  ASSERT_TRUE(handshake_keys(mallory, p.target.public_key(), true, kChallenge, kHelloHeader, kHello,
                             &hers));
  EXPECT_FALSE(same_proof(p.at_target.proof, hers.proof));
}

TEST(TcpHandshake, ALowOrderPeerKeyGivesNoKeys) {
  Identity self;
  const IdentityKey zero{};  // the identity point: no shared secret
  HandshakeKeys keys;
  EXPECT_FALSE(handshake_keys(self, zero, true, kChallenge, kHelloHeader, kHello, &keys));
}

TEST(TcpHandshake, ProofsCompareByEveryByte) {
  Proof a{};
  a[31] = 1;
  EXPECT_TRUE(same_proof(a, a));
  Proof b = a;
  b[31] = 0;
  EXPECT_FALSE(same_proof(a, b));
  EXPECT_FALSE(same_proof(a, std::span<const std::uint8_t>(a).first(31)));
}

class FrameTags : public ::testing::Test {
 protected:
  void SetUp() override {
    handshake(pair_);
    ASSERT_TRUE(sender_.start(pair_.at_initiator.to_target));
    ASSERT_TRUE(receiver_.start(pair_.at_target.to_target));
  }
  Pair pair_;
  FrameAuth sender_;
  FrameAuth receiver_;
  const Bytes fields_ = Bytes(32, 0x33);
  const Bytes body_ = Bytes(16 * 1000, 0x44);
};

TEST_F(FrameTags, FramesInOrderVerify) {
  for (int i = 0; i < 5; ++i) {
    const Tag tag = sign(sender_, fields_, i % 2 == 0 ? body_ : Bytes{});
    EXPECT_TRUE(receiver_.verify(fields_, i % 2 == 0 ? body_ : Bytes{}, tag)) << i;
  }
}

TEST_F(FrameTags, AChangedHeaderOrBodyFails) {
  Bytes fields = fields_;
  fields[9] ^= 1;
  EXPECT_FALSE(receiver_.verify(fields, body_, sign(sender_, fields_, body_)));
  FrameAuth fresh;
  ASSERT_TRUE(fresh.start(pair_.at_target.to_target));
  FrameAuth again;
  ASSERT_TRUE(again.start(pair_.at_initiator.to_target));
  Bytes body = body_;
  body.back() ^= 1;
  EXPECT_FALSE(fresh.verify(fields_, body, sign(again, fields_, body_)));
}

TEST_F(FrameTags, AReplayedFrameFails) {
  const Tag first = sign(sender_, fields_, body_);
  ASSERT_TRUE(receiver_.verify(fields_, body_, first));
  // The same bytes again, as an on-path attacker would resend them.
  EXPECT_FALSE(receiver_.verify(fields_, body_, first));
}

TEST_F(FrameTags, FramesOutOfOrderOrDroppedFail) {
  (void)sign(sender_, fields_, body_);  // frame 0, never delivered
  const Tag second = sign(sender_, fields_, body_);
  EXPECT_FALSE(receiver_.verify(fields_, body_, second));
}

TEST_F(FrameTags, AFrameOfTheOtherDirectionFails) {
  // A target's frame reflected back to it as if the initiator sent it.
  FrameAuth target_out;
  ASSERT_TRUE(target_out.start(pair_.at_target.to_initiator));
  EXPECT_FALSE(receiver_.verify(fields_, body_, sign(target_out, fields_, body_)));
}

TEST_F(FrameTags, AFrameOfAnotherConnectionFails) {
  // The same two peers, another handshake (another challenge): another key.
  Pair other;
  Bytes challenge = kChallenge;
  challenge[0] ^= 1;
  ASSERT_TRUE(handshake_keys(pair_.initiator, pair_.target.public_key(), true, challenge,
                             kHelloHeader, kHello, &other.at_initiator));
  FrameAuth old_conn;
  ASSERT_TRUE(old_conn.start(other.at_initiator.to_target));
  EXPECT_FALSE(receiver_.verify(fields_, body_, sign(old_conn, fields_, body_)));
}

TEST_F(FrameTags, AReceiverStartedPastTheFirstFramesExpectsTheNext) {
  // The initiator checks the welcome (frame 0) itself and hands the I/O
  // thread a receiver that starts at frame 1.
  FrameAuth welcome_sender;
  ASSERT_TRUE(welcome_sender.start(pair_.at_target.to_initiator));
  (void)sign(welcome_sender, fields_, {});
  const Tag second = sign(welcome_sender, fields_, {});
  FrameAuth io_thread;
  ASSERT_TRUE(io_thread.start(pair_.at_initiator.to_initiator, 1));
  EXPECT_TRUE(io_thread.verify(fields_, {}, second));
}

TEST(FrameAuthState, NotStartedSignsAndVerifiesNothing) {
  FrameAuth auth;
  Tag tag{};
  const Bytes fields(32, 1);
  EXPECT_FALSE(auth.started());
  EXPECT_FALSE(auth.sign(fields, {}, tag));
  EXPECT_FALSE(auth.verify(fields, {}, tag));
}

}  // namespace
}  // namespace kvxfer::internal::tcp
