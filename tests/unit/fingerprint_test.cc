// SPDX-License-Identifier: Apache-2.0
// config_fingerprint: the first 16 hex chars of the SHA-256 of the fields as
// Python's json.dumps(fields, sort_keys=True, separators=(",", ":")) writes
// them, "" without fields. Expected values were computed with CPython 3.
#include <gtest/gtest.h>

#include <string>

#include "agents.h"
#include "wire/metadata.h"

namespace kvxfer::unit {
namespace {

TEST(FingerprintTest, NoFieldsGiveAnEmptyFingerprint) { EXPECT_EQ(config_fingerprint({}), ""); }

TEST(FingerprintTest, MatchesPythonForModelAndDtype) {
  // json: {"dtype":"bf16","model":"llama"}
  EXPECT_EQ(config_fingerprint({{"model", "llama"}, {"dtype", "bf16"}}), "fd0be5262a67984b");
}

TEST(FingerprintTest, MatchesPythonForOneField) {
  EXPECT_EQ(config_fingerprint({{"model", "llama"}}), "787e74b170526553");
}

TEST(FingerprintTest, SortsKeysByCodePoint) {
  // json: {"B":"3","_":"4","a":"1","b":"2"}
  EXPECT_EQ(config_fingerprint({{"b", "2"}, {"a", "1"}, {"B", "3"}, {"_", "4"}}),
            "8b19f5eb5d952524");
}

TEST(FingerprintTest, EscapesNonAsciiLikePython) {
  // json: {"model":"ll\u00e4ma-\u00fc\ud83d\ude00"} (ensure_ascii, surrogate pair)
  EXPECT_EQ(config_fingerprint({{"model", "ll\xc3\xa4ma-\xc3\xbc\xf0\x9f\x98\x80"}}),
            "e26a4af01a49e086");
}

TEST(FingerprintTest, SortsNonAsciiKeysAfterAscii) {
  // json: {"z":"y","\u00e9":"x"}
  EXPECT_EQ(config_fingerprint({{"\xc3\xa9", "x"}, {"z", "y"}}), "e829284b1d98a962");
}

TEST(FingerprintTest, EscapesQuotesBackslashesAndControlCharactersLikePython) {
  // json: {"q":"say \"hi\"\\ \n\t\r\b\f\u0001 \u007f </>&"}
  EXPECT_EQ(config_fingerprint({{"q", "say \"hi\"\\ \n\t\r\b\f\x01 \x7f </>&"}}),
            "4449e0c3020b634f");
}

TEST(FingerprintTest, AnEmptyKeyIsStillAField) {
  // json: {"":""}
  EXPECT_EQ(config_fingerprint({{"", ""}}), "86cfeee6df382a20");
}

TEST(FingerprintTest, TransportReportsTheFingerprintOfItsFields) {
  Options options = loopback_options();
  options.config_fields = {{"model", "llama"}, {"dtype", "bf16"}};
  Agent a{"agent-a", options};
  EXPECT_EQ(a.transport.config_fingerprint(), "fd0be5262a67984b");
  Agent plain{"agent-plain"};
  EXPECT_EQ(plain.transport.config_fingerprint(), "");
}

// Fields of any JSON value arrive as the canonical text json.dumps writes;
// the fingerprint is the SHA-256 of exactly those bytes.
TEST(FingerprintJsonTest, MatchesPythonForAnIntegerValue) {
  EXPECT_EQ(config_fingerprint_json(R"({"block_size":16})"), "addf234ab11ac58f");
}

TEST(FingerprintJsonTest, MatchesPythonForMixedValues) {
  EXPECT_EQ(config_fingerprint_json(R"({"block_size":16,"dtype":"bfloat16","model":"llama"})"),
            "a87a54d3ddb14c7c");
}

TEST(FingerprintJsonTest, MatchesPythonForNullBoolsFloatsAndNesting) {
  EXPECT_EQ(config_fingerprint_json(R"({"a":null,"b":true,"c":false,"d":1.5,"e":-0.0,"f":1e+100,)"
                                    R"("g":[1,[2,{"h":"i"}]],"j":{"k":{"l":[]}}})"),
            "2e4b320023b6f721");
}

TEST(FingerprintJsonTest, MatchesPythonForNanAndInfinity) {
  // json.dumps writes them (allow_nan), so the reference hashes them.
  EXPECT_EQ(config_fingerprint_json(R"({"x":NaN,"y":Infinity})"), "4dbb8537fad28c11");
}

TEST(FingerprintJsonTest, StringFieldsGiveTheSameFingerprintEitherWay) {
  EXPECT_EQ(config_fingerprint_json(R"({"dtype":"bf16","model":"llama"})"),
            config_fingerprint({{"model", "llama"}, {"dtype", "bf16"}}));
}

TEST(FingerprintJsonTest, NoFieldsGiveAnEmptyFingerprint) {
  EXPECT_EQ(config_fingerprint_json(""), "");
  EXPECT_EQ(config_fingerprint_json("{}"), "");
}

TEST(FingerprintJsonTest, TextThatCannotBeCanonicalIsRefused) {
  const std::vector<std::string> bad_texts{"[1]",
                                           "16",
                                           "{",
                                           " {}",
                                           "{\"a\":1} ",
                                           "{\"a\":\"\xc3\xa9\"}",
                                           "{\"a\":\"\n\"}",
                                           std::string("{\"a\":\"\0\"}", 9)};
  for (const std::string& bad : bad_texts) {
    EXPECT_THROW((void)config_fingerprint_json(bad), std::invalid_argument) << bad;
  }
}

TEST(FingerprintJsonTest, TransportReportsTheFingerprintOfItsJson) {
  Options options = loopback_options();
  options.config_json = R"({"block_size":16})";
  Agent a{"agent-a", options};
  EXPECT_EQ(a.transport.config_fingerprint(), "addf234ab11ac58f");
  EXPECT_EQ(wire::decode(a.transport.agent_metadata()).config_fingerprint, "addf234ab11ac58f");
}

TEST(FingerprintJsonTest, PeersAgreeAcrossBothForms) {
  Options strings = loopback_options();
  strings.config_fields = {{"model", "llama"}, {"dtype", "bf16"}};
  Options json = loopback_options();
  json.config_json = R"({"dtype":"bf16","model":"llama"})";
  Agent b{"agent-b", strings};
  Agent a{"agent-a", json};
  EXPECT_NO_THROW(add_peer(a.transport, "b", b.transport));
}

TEST(FingerprintJsonTest, PeerWithOtherJsonFieldsIsRefused) {
  Options sixteen = loopback_options();
  sixteen.config_json = R"({"block_size":16})";
  Options thirty_two = loopback_options();
  thirty_two.config_json = R"({"block_size":32})";
  Agent b{"agent-b", sixteen};
  Agent a{"agent-a", thirty_two};
  EXPECT_THROW(add_peer(a.transport, "b", b.transport), std::invalid_argument);
}

// Either side declaring fields the other does not is a mismatch, and the
// message says which side declared what.
TEST(FingerprintTest, APeerWithoutFieldsIsRefusedByOneWithThemAndTheReverse) {
  Options fields = loopback_options();
  fields.config_fields = {{"model", "llama"}};
  Agent with{"agent-with", fields};
  Agent without{"agent-without"};
  try {
    add_peer(with.transport, "w", without.transport);
    ADD_FAILURE() << "a peer without config fields was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("declares no config fields while we declare fingerprint " +
                                         with.transport.config_fingerprint()),
              std::string::npos)
        << e.what();
  }
  try {
    add_peer(without.transport, "w", with.transport);
    ADD_FAILURE() << "a peer with config fields was accepted by one without";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("declares config fingerprint " +
                                         with.transport.config_fingerprint() +
                                         " while we declare no config fields"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(with.transport.peers().empty());
  EXPECT_TRUE(without.transport.peers().empty());
}

TEST(FingerprintJsonTest, SettingBothFormsIsRefused) {
  Options options = loopback_options();
  options.config_fields = {{"model", "llama"}};
  options.config_json = R"({"model":"llama"})";
  Pool pool(kNumBlocks, kBlockLen);
  EXPECT_THROW(Transport("agent-a", pool.region(), options), std::invalid_argument);
}

}  // namespace
}  // namespace kvxfer::unit
