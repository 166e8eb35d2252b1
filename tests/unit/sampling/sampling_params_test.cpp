#include "sampling/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "core/request_limits.h"
#include "core/error.h"

namespace pagellm {
namespace {

constexpr int32_t kVocab = 1000;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

struct BadCase {
  const char* name;
  std::function<void(SamplingParams&)> set;
  const char* param;
};

TEST(SamplingParamsValidate, DefaultsAndGoodValuesPass) {
  SamplingParams p;
  EXPECT_NO_THROW(p.validate(kVocab));
  EXPECT_NO_THROW(p.validate());

  p.temperature = 0.0f;
  p.top_p = 1.0f;
  p.top_k = -1;
  p.min_p = 1.0f;
  p.repetition_penalty = 0.01f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.logit_bias = {{0, -100.0f}, {kVocab - 1, 100.0f}, {5, 0.5f}};
  p.seed = 0;
  p.logprobs = 20;
  p.prompt_logprobs = 0;
  p.max_tokens = 1;
  p.min_tokens = 1;
  p.stop = {"\n", "User:"};
  p.stop_token_ids = {0, kVocab - 1};
  p.n = 128;
  EXPECT_NO_THROW(p.validate(kVocab));

  p.top_k = 0;
  p.top_p = 1e-6f;
  p.min_p = 0.0f;
  p.temperature = 2.0f;
  p.logprobs = 0;
  p.min_tokens = 0;
  EXPECT_NO_THROW(p.validate(kVocab));

  // Without a vocabulary size token ids are only checked for sign.
  p.logit_bias = {{1 << 30, 1.0f}};
  p.stop_token_ids = {1 << 30};
  EXPECT_NO_THROW(p.validate());
}

TEST(SamplingParamsValidate, EachBadValueNamesItsParameter) {
  const BadCase cases[] = {
      {"negative temperature", [](SamplingParams& p) { p.temperature = -1.0f; }, "temperature"},
      {"NaN temperature", [](SamplingParams& p) { p.temperature = kNaN; }, "temperature"},
      {"infinite temperature", [](SamplingParams& p) { p.temperature = kInf; }, "temperature"},
      {"top_p zero", [](SamplingParams& p) { p.top_p = 0.0f; }, "top_p"},
      {"top_p above one", [](SamplingParams& p) { p.top_p = 1.01f; }, "top_p"},
      {"top_p negative", [](SamplingParams& p) { p.top_p = -0.5f; }, "top_p"},
      {"top_p NaN", [](SamplingParams& p) { p.top_p = kNaN; }, "top_p"},
      {"top_k -2", [](SamplingParams& p) { p.top_k = -2; }, "top_k"},
      {"min_p negative", [](SamplingParams& p) { p.min_p = -0.1f; }, "min_p"},
      {"min_p above one", [](SamplingParams& p) { p.min_p = 1.5f; }, "min_p"},
      {"min_p NaN", [](SamplingParams& p) { p.min_p = kNaN; }, "min_p"},
      {"repetition_penalty zero", [](SamplingParams& p) { p.repetition_penalty = 0.0f; },
       "repetition_penalty"},
      {"repetition_penalty negative", [](SamplingParams& p) { p.repetition_penalty = -1.0f; },
       "repetition_penalty"},
      {"repetition_penalty inf", [](SamplingParams& p) { p.repetition_penalty = kInf; },
       "repetition_penalty"},
      {"presence_penalty high", [](SamplingParams& p) { p.presence_penalty = 2.5f; },
       "presence_penalty"},
      {"presence_penalty low", [](SamplingParams& p) { p.presence_penalty = -2.01f; },
       "presence_penalty"},
      {"frequency_penalty high", [](SamplingParams& p) { p.frequency_penalty = 3.0f; },
       "frequency_penalty"},
      {"frequency_penalty NaN", [](SamplingParams& p) { p.frequency_penalty = kNaN; },
       "frequency_penalty"},
      {"logit_bias value high", [](SamplingParams& p) { p.logit_bias = {{3, 100.5f}}; }, "logit_bias"},
      {"logit_bias value low", [](SamplingParams& p) { p.logit_bias = {{3, -101.0f}}; }, "logit_bias"},
      {"logit_bias value NaN", [](SamplingParams& p) { p.logit_bias = {{3, kNaN}}; }, "logit_bias"},
      {"logit_bias id negative", [](SamplingParams& p) { p.logit_bias = {{-1, 1.0f}}; }, "logit_bias"},
      {"logit_bias id = vocab", [](SamplingParams& p) { p.logit_bias = {{kVocab, 1.0f}}; },
       "logit_bias"},
      {"max_tokens zero", [](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens"},
      {"min_tokens negative", [](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens"},
      {"min_tokens above max", [](SamplingParams& p) { p.max_tokens = 5; p.min_tokens = 6; },
       "min_tokens"},
      {"n zero", [](SamplingParams& p) { p.n = 0; }, "n"},
      {"n too large", [](SamplingParams& p) { p.n = 129; }, "n"},
      {"logprobs -2", [](SamplingParams& p) { p.logprobs = -2; }, "logprobs"},
      {"logprobs 21", [](SamplingParams& p) { p.logprobs = 21; }, "logprobs"},
      {"prompt_logprobs 21", [](SamplingParams& p) { p.prompt_logprobs = 21; }, "prompt_logprobs"},
      {"empty stop string", [](SamplingParams& p) { p.stop = {"ok", ""}; }, "stop"},
      {"stop_token_ids negative", [](SamplingParams& p) { p.stop_token_ids = {2, -3}; },
       "stop_token_ids"},
      {"stop_token_ids = vocab", [](SamplingParams& p) { p.stop_token_ids = {kVocab}; },
       "stop_token_ids"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    SamplingParams p;
    c.set(p);
    try {
      p.validate(kVocab);
      ADD_FAILURE() << "no exception";
    } catch (const InvalidRequest& e) {
      EXPECT_EQ(e.param(), c.param);
      EXPECT_NE(std::string(e.what()).find(c.param), std::string::npos) << e.what();
    }
  }
}

TEST(SamplingParamsValidate, MessagesReadLikeOpenAIs) {
  SamplingParams p;
  p.temperature = -1.0f;
  try {
    p.validate(kVocab);
    FAIL();
  } catch (const InvalidRequest& e) {
    EXPECT_STREQ(e.what(), "temperature must be a finite number >= 0, got -1");
  }
  p = SamplingParams{};
  p.top_p = 1.5f;
  try {
    p.validate(kVocab);
    FAIL();
  } catch (const InvalidRequest& e) {
    EXPECT_STREQ(e.what(), "top_p must be in (0, 1], got 1.5");
  }
}

TEST(SamplingParamsValidate, EngineBoundsAreTheRequestLimits) {
  const RequestLimits limits;
  SamplingParams p;
  p.n = limits.max_n;
  p.logprobs = limits.max_logprobs;
  EXPECT_NO_THROW(p.validate(kVocab));
  p.n = limits.max_n + 1;
  EXPECT_THROW(p.validate(kVocab), InvalidRequest);
  p.n = 1;
  p.logprobs = limits.max_logprobs + 1;
  EXPECT_THROW(p.validate(kVocab), InvalidRequest);
}

}  // namespace
}  // namespace pagellm
