// Request fields are read exactly: each integer field takes a value only when
// its range holds it (no wrapping of 2^64-1 or 4294967298), floats must be
// finite and in range, token ids must be in the vocabulary.
#include "api/request_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "api/json_fields.h"
#include "core/error.h"

namespace pagellm {
namespace {

using nlohmann::json;

constexpr int32_t kVocab = 1000;
const json kU64Max = std::numeric_limits<uint64_t>::max();  // 18446744073709551615, number_unsigned
const json kI64Min = std::numeric_limits<int64_t>::min();   // -9223372036854775808, number_integer
const json kWraps32 = uint64_t{4294967298};                  // 2^32 + 2: token 2 if cast to int32_t

// "" when `body` parses, else "<param>: <message>".
std::string error_of(const json& body, bool chat = false) {
  try {
    parse_request_params(body, chat, kVocab, 16);
  } catch (const InvalidRequest& e) {
    return e.param() + ": " + e.what();
  }
  return "";
}

std::string error_with(const char* key, const json& value, bool chat = false) {
  json body = {{key, value}};
  if (chat && std::string(key) == "top_logprobs") body["logprobs"] = true;
  return error_of(body, chat);
}

struct Case {
  const char* key;
  json value;
  const char* error;  // nullptr: accepted; else a part of the message (the param must be `key`)
  bool chat = false;
};

TEST(RequestParams, IntegerFieldsAreExact) {
  const Case cases[] = {
      // max_tokens: [1, 2^31-1]; -1 is no longer "absent".
      {"max_tokens", 1, nullptr},
      {"max_tokens", 2147483647, nullptr},
      {"max_tokens", 5.0, nullptr},
      {"max_tokens", 0, "[1, 2147483647], got 0"},
      {"max_tokens", -1, "[1, 2147483647], got -1"},
      {"max_tokens", int64_t{2147483648}, "got 2147483648"},
      {"max_tokens", kU64Max, "got 18446744073709551615"},
      {"max_tokens", kI64Min, "got -9223372036854775808"},
      {"max_tokens", kWraps32, "got 4294967298"},
      {"max_tokens", 5.5, "must be an integer, got 5.5"},
      {"max_tokens", 1e30, "[1, 2147483647]"},
      {"max_tokens", "5", "must be an integer, got a string"},
      {"max_tokens", true, "must be an integer, got a boolean"},
      {"max_completion_tokens", kU64Max, "got 18446744073709551615", true},
      {"max_completion_tokens", 0, "[1, 2147483647]", true},
      // n: [1, 128]
      {"n", 1, nullptr},
      {"n", 128, nullptr},
      {"n", 0, "[1, 128], got 0"},
      {"n", 129, "[1, 128], got 129"},
      {"n", kU64Max, "[1, 128]"},
      {"n", kWraps32, "[1, 128]"},
      // min_tokens: [0, 2^31-1] (and <= max_tokens, checked by validate)
      {"min_tokens", 0, nullptr},
      {"min_tokens", 16, nullptr},
      {"min_tokens", -1, "[0, 2147483647], got -1"},
      {"min_tokens", kU64Max, "[0, 2147483647]"},
      {"min_tokens", 17, "must be <= max_tokens"},
      // top_k: -1 or 0 (off) or >= 1, as vLLM
      {"top_k", -1, nullptr},
      {"top_k", 0, nullptr},
      {"top_k", 2147483647, nullptr},
      {"top_k", -2, "[-1, 2147483647], got -2"},
      {"top_k", kU64Max, "got 18446744073709551615"},
      {"top_k", kI64Min, "got -9223372036854775808"},
      {"top_k", int64_t{2147483648}, "got 2147483648"},
      // priority: int32
      {"priority", -2147483648LL, nullptr},
      {"priority", 2147483647, nullptr},
      {"priority", -2147483649LL, "[-2147483648, 2147483647]"},
      {"priority", kU64Max, "got 18446744073709551615"},
      {"priority", kWraps32, "got 4294967298"},
      // seed: a signed 64-bit integer (vLLM's range)
      {"seed", kI64Min, nullptr},
      {"seed", std::numeric_limits<int64_t>::max(), nullptr},
      {"seed", 7.0, nullptr},
      {"seed", uint64_t{1} << 63, "got 9223372036854775808"},
      {"seed", kU64Max, "got 18446744073709551615"},
      {"seed", 1.5, "must be an integer"},
      {"seed", "1", "must be an integer"},
      // logprobs (completions): [0, 20]
      {"logprobs", 0, nullptr},
      {"logprobs", 20, nullptr},
      {"logprobs", -1, "[0, 20], got -1"},
      {"logprobs", 21, "[0, 20], got 21"},
      {"logprobs", kU64Max, "[0, 20]"},
      {"logprobs", true, "must be an integer"},
      // top_logprobs (chat, with logprobs: true): [0, 20]
      {"top_logprobs", 0, nullptr, true},
      {"top_logprobs", 20, nullptr, true},
      {"top_logprobs", -1, "[0, 20], got -1", true},
      {"top_logprobs", 21, "[0, 20], got 21", true},
      {"top_logprobs", kU64Max, "[0, 20]", true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = " + c.value.dump() + (c.chat ? " (chat)" : ""));
    const std::string err = error_with(c.key, c.value, c.chat);
    if (!c.error) {
      EXPECT_EQ(err, "");
      continue;
    }
    EXPECT_EQ(err.substr(0, err.find(':')), c.key) << err;
    EXPECT_NE(err.find(c.error), std::string::npos) << err;
  }
}

TEST(RequestParams, IntegerValuesLandExactly) {
  ParsedParams pp = parse_request_params(
      {{"max_tokens", 5.0}, {"top_k", -1}, {"priority", -2147483648LL}, {"seed", kI64Min}, {"n", 2}}, false, kVocab,
      16);
  EXPECT_EQ(pp.sampling.max_tokens, 5);
  EXPECT_EQ(pp.sampling.top_k, -1);
  EXPECT_EQ(pp.priority, std::numeric_limits<int32_t>::min());
  EXPECT_EQ(pp.sampling.seed, uint64_t{1} << 63);  // the bits of -2^63
  EXPECT_EQ(pp.sampling.n, 2);
  // Absent or null: the defaults.
  pp = parse_request_params({{"max_tokens", nullptr}, {"top_k", nullptr}}, false, kVocab, 16);
  EXPECT_EQ(pp.sampling.max_tokens, 16);
  EXPECT_EQ(pp.sampling.top_k, 0);
  // Numbers as the HTTP body carries them; 2^64 no longer fits an integer and parses as a float.
  EXPECT_NE(error_of(json::parse(R"({"max_tokens": 18446744073709551615})")).find("18446744073709551615"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"max_tokens": 18446744073709551616})")).find("max_tokens: "), std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"top_k": -9223372036854775809})")).find("top_k: "), std::string::npos);
  // Chat: max_completion_tokens wins over max_tokens.
  pp = parse_request_params({{"max_tokens", 3}, {"max_completion_tokens", 4}}, true, kVocab, 100);
  EXPECT_EQ(pp.sampling.max_tokens, 4);
  // Chat top_logprobs needs logprobs: true.
  EXPECT_EQ(error_of({{"top_logprobs", 2}}, true).substr(0, 13), "top_logprobs:");
}

TEST(RequestParams, FloatFieldsAreFiniteAndInRange) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const Case cases[] = {
      {"temperature", 0, nullptr},
      {"temperature", 2, nullptr},
      {"temperature", 1e30, nullptr},
      {"temperature", -0.01, ">= 0, got -0.01"},
      {"temperature", 1e300, "got 1e+300"},  // finite, but no float holds it
      {"temperature", nan, "a finite number"},
      {"temperature", inf, "a finite number"},
      {"temperature", "1", "got a string"},
      {"temperature", true, "got a boolean"},
      {"top_p", 1, nullptr},
      {"top_p", 1e-6, nullptr},
      {"top_p", 0, "(0, 1], got 0"},
      {"top_p", 1.0000001, "(0, 1]"},
      {"top_p", nan, "(0, 1]"},
      {"min_p", 0, nullptr},
      {"min_p", 1, nullptr},
      {"min_p", -0.1, "[0, 1]"},
      {"min_p", 1.5, "[0, 1]"},
      {"presence_penalty", -2, nullptr},
      {"presence_penalty", 2, nullptr},
      {"presence_penalty", 2.01, "[-2, 2], got 2.01"},
      {"frequency_penalty", -2.5, "[-2, 2]"},
      {"frequency_penalty", inf, "[-2, 2]"},
      {"repetition_penalty", 0.01, nullptr},
      {"repetition_penalty", 0, "> 0, got 0"},
      {"repetition_penalty", -inf, "> 0"},
      {"repetition_penalty", kU64Max, nullptr},  // an integer is a number too
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = " + c.value.dump());
    const std::string err = error_with(c.key, c.value);
    if (!c.error) {
      EXPECT_EQ(err, "");
      continue;
    }
    EXPECT_EQ(err.substr(0, err.find(':')), c.key) << err;
    EXPECT_NE(err.find(c.error), std::string::npos) << err;
  }
}

TEST(RequestParams, StopTokenIdsAreTokenIds) {
  EXPECT_EQ(error_with("stop_token_ids", {0, kVocab - 1, 2.0}), "");
  const ParsedParams pp = parse_request_params({{"stop_token_ids", {0, 999, 2.0}}}, false, kVocab, 16);
  EXPECT_EQ(pp.sampling.stop_token_ids, (std::vector<int32_t>{0, 999, 2}));
  for (const json& bad : {json::array({kWraps32}), json::array({kU64Max}), json::array({kVocab}), json::array({-1}),
                          json::array({kI64Min}), json::array({2.5}), json::array({"2"}), json::array({nullptr}),
                          json(5), json("2")}) {
    SCOPED_TRACE(bad.dump());
    const std::string err = error_with("stop_token_ids", bad);
    EXPECT_EQ(err.substr(0, 15), "stop_token_ids:") << err;
  }
  EXPECT_NE(error_with("stop_token_ids", {1, kWraps32}).find("stop_token_ids[1]"), std::string::npos);
  EXPECT_NE(error_with("stop_token_ids", json::array({kWraps32})).find("[0, 999], got 4294967298"),
            std::string::npos);
  EXPECT_EQ(error_with("stop_token_ids", json(std::vector<int>(1024, 1))), "");
  EXPECT_NE(error_with("stop_token_ids", json(std::vector<int>(1025, 1))).find("at most 1024"), std::string::npos);
}

TEST(RequestParams, LogitBiasKeysAreCanonicalTokenIds) {
  const ParsedParams pp =
      parse_request_params({{"logit_bias", {{"0", -100}, {"5", 1.5}, {"999", 100}}}}, false, kVocab, 16);
  ASSERT_EQ(pp.sampling.logit_bias.size(), 3u);
  for (const char* key : {" 5", "5 ", "+5", "-5", "05", "00", "5.0", "5e0", "0x5", "", "1000", "4294967298",
                          "18446744073709551615", "99999999999999999999999", "five", "\xef\xbc\x95"}) {
    SCOPED_TRACE(std::string("key '") + key + "'");
    const std::string err = error_with("logit_bias", {{key, 1}});
    EXPECT_EQ(err.substr(0, 11), "logit_bias:") << err;
    EXPECT_NE(err.find("is not a token id"), std::string::npos) << err;
  }
  for (const json& bad : {json(100.5), json(-101), json(std::numeric_limits<double>::quiet_NaN()), json("1"),
                          json(true), json(nullptr), json::array({1})}) {
    SCOPED_TRACE(bad.dump());
    const std::string err = error_with("logit_bias", {{"5", bad}});
    EXPECT_EQ(err.substr(0, 11), "logit_bias:") << err;
    EXPECT_NE(err.find("logit_bias[\"5\"]"), std::string::npos) << err;
  }
  EXPECT_EQ(error_with("logit_bias", json::array({1})).substr(0, 11), "logit_bias:");
  json many = json::object();
  for (int i = 0; i < 1025 && i < kVocab; ++i) many[std::to_string(i)] = 1;
  EXPECT_EQ(error_with("logit_bias", many), "");  // 1000 entries: under 1024
  RequestLimits small;
  small.max_logit_bias = 10;
  EXPECT_THROW(parse_request_params({{"logit_bias", many}}, false, kVocab, 16, small), InvalidRequest);
  EXPECT_EQ(parse_token_id_key("0"), 0);
  EXPECT_EQ(parse_token_id_key("2147483647"), 2147483647);
  EXPECT_EQ(parse_token_id_key("12345678901"), -1);
}

TEST(RequestParams, StopStringsAreBounded) {
  EXPECT_EQ(error_with("stop", "."), "");
  EXPECT_EQ(error_with("stop", json::array()), "");
  EXPECT_EQ(error_with("stop", json(std::vector<std::string>(16, "x"))), "");
  EXPECT_NE(error_with("stop", json(std::vector<std::string>(17, "x"))).find("at most 16"), std::string::npos);
  EXPECT_EQ(error_with("stop", std::string(1024, 'x')), "");
  EXPECT_NE(error_with("stop", std::string(1025, 'x')).find("at most 1024 bytes"), std::string::npos);
  EXPECT_NE(error_with("stop", {"ok", std::string(1025, 'x')}).find("entry 1"), std::string::npos);
  for (const json& bad : {json(""), json::array({""}), json(5), json::array({1}), json::object()}) {
    SCOPED_TRACE(bad.dump());
    EXPECT_EQ(error_with("stop", bad).substr(0, 5), "stop:");
  }
}

TEST(JsonFields, MessagesCutLongValuesOnCharacterBoundaries) {
  EXPECT_EQ(cut_for_message("short"), "short");
  const std::string euros(30, 'x');
  const std::string s = euros + "\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac";  // 30 + 4 x 3 bytes
  const std::string cut = cut_for_message(s, 40);
  EXPECT_EQ(cut, euros + "\xe2\x82\xac\xe2\x82\xac...");
  EXPECT_EQ(json_to_int(json(-0.0), "x", "x", 0, 1), 0);
  EXPECT_THROW(json_to_int(json(0x1p63), "x", "x", std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max()),
               InvalidRequest);
  EXPECT_EQ(json_to_int(json(-0x1p63), "x", "x", std::numeric_limits<int64_t>::min(), 0),
            std::numeric_limits<int64_t>::min());
}

}  // namespace
}  // namespace pagellm
