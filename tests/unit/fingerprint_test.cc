// config_fingerprint: the first 16 hex chars of the SHA-256 of the fields as
// Python's json.dumps(fields, sort_keys=True, separators=(",", ":")) writes
// them, "" without fields. Expected values were computed with CPython 3.
#include <gtest/gtest.h>

#include "agents.h"

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

}  // namespace
}  // namespace kvxfer::unit
