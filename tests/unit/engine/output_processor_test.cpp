// OutputProcessor without a model: tokens handed to it as if sampled, over a
// synthetic vocabulary whose tokens 3 + b are the single bytes b.
#include "engine/output_processor.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "model/dummy.h"
#include "format/gguf.h"
#include "scheduler/scheduler.h"

namespace pagellm {
namespace {

constexpr int32_t kEos = 2;
int32_t byte_token(char c) { return 3 + static_cast<unsigned char>(c); }

std::unique_ptr<Tokenizer> synthetic_tokenizer() {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("pagellm-output-processor-" + std::to_string(::getpid()) + ".gguf"))
          .string();
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  add_synthetic_vocab(w, 300);
  w.write(path);
  auto tokenizer = Tokenizer::from_gguf(*GGUFFile::open(path));
  std::filesystem::remove(path);
  return tokenizer;
}

SchedulerConfig scheduler_config() {
  SchedulerConfig c;
  c.max_model_len = 64;
  return c;
}

class EngineOutputProcessor : public ::testing::Test {
 protected:
  EngineOutputProcessor() : scheduler_(scheduler_config(), KVCacheConfig{8, 16, true, AllocationPolicy::Any}) {}

  RequestState& request(const SamplingParams& p, int32_t prompt_len = 3) {
    r_.id = "r";
    r_.params = p;
    r_.prompt.assign(static_cast<size_t>(prompt_len), byte_token('p'));
    r_.arrival = EngineClock::now();
    r_.samples.resize(static_cast<size_t>(p.n));
    for (SampleState& s : r_.samples) {
      s.seq = std::make_unique<Sequence>();
      s.seq->token_ids = r_.prompt;
      s.seq->num_prompt_tokens = prompt_len;
    }
    outputs_.add(r_);
    return r_;
  }
  void append(int32_t token, int32_t sample = 0, float logprob = 0) {
    SampleResult res;
    res.token = token;
    res.logprob = logprob;
    outputs_.append(r_, r_.samples[static_cast<size_t>(sample)], token, res, scheduler_);
  }
  // Appends the bytes of `text` until the sample has a stop decision; returns how many it took.
  size_t feed(const std::string& text, int32_t sample = 0) {
    size_t n = 0;
    for (char c : text) {
      append(byte_token(c), sample);
      ++n;
      if (r_.samples[static_cast<size_t>(sample)].pending_finish != FinishReason::None) break;
    }
    return n;
  }
  // What a step does with a pending decision.
  void finish_pending(int32_t sample = 0) {
    SampleState& s = r_.samples[static_cast<size_t>(sample)];
    outputs_.finish(r_, s, s.pending_finish);
  }

  EngineMetrics metrics_;
  std::unique_ptr<Tokenizer> tokenizer_ = synthetic_tokenizer();
  OutputProcessor outputs_{*tokenizer_, metrics_};
  Scheduler scheduler_;
  RequestState r_;
};

SamplingParams params(int32_t max_tokens = 16) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  return p;
}

TEST_F(EngineOutputProcessor, AStopStringEndsTheTextBeforeIt) {
  SamplingParams p = params();
  p.stop = {"lo"};
  request(p);
  EXPECT_EQ(feed("hello world"), 5u);
  EXPECT_EQ(r_.samples[0].pending_finish, FinishReason::Stop);
  finish_pending();
  const RequestOutput out = outputs_.collect(r_);
  EXPECT_TRUE(out.finished);
  ASSERT_EQ(out.completions.size(), 1u);
  EXPECT_EQ(out.completions[0].text, "hel");
  EXPECT_EQ(out.completions[0].stop_string, "lo");
  EXPECT_EQ(out.completions[0].token_ids.size(), 5u);
  EXPECT_EQ(out.completions[0].finish_reason, FinishReason::Stop);
  EXPECT_EQ(out.num_prompt_tokens, 3);
  EXPECT_EQ(metrics_.generation_tokens, 5);
  EXPECT_EQ(metrics_.prompt_tokens, 3);
  EXPECT_EQ(metrics_.request_success["stop"], 1);
}

TEST_F(EngineOutputProcessor, MaxTokensFinishReleasesHeldBackText) {
  SamplingParams p = params(3);
  p.stop = {"xyz"};
  request(p);
  EXPECT_EQ(feed("abxyz"), 3u);
  EXPECT_EQ(r_.samples[0].pending_finish, FinishReason::Length);
  EXPECT_EQ(r_.samples[0].delta.text, "ab");  // "x" may start the stop string
  finish_pending();
  const RequestOutput out = outputs_.collect(r_);
  EXPECT_EQ(out.completions[0].text, "abx");
  EXPECT_EQ(out.completions[0].finish_reason, FinishReason::Length);
  EXPECT_EQ(metrics_.request_success["length"], 1);
}

TEST_F(EngineOutputProcessor, StopTokensAndEosWaitForMinTokens) {
  SamplingParams p = params();
  p.stop_token_ids = {byte_token('a')};
  p.min_tokens = 3;  // the end-of-generation token counts as one
  request(p);
  append(kEos);
  append(byte_token('a'));
  EXPECT_EQ(r_.samples[0].pending_finish, FinishReason::None);
  append(byte_token('a'));
  EXPECT_EQ(r_.samples[0].pending_finish, FinishReason::Stop);
  EXPECT_EQ(r_.samples[0].delta.stop_token, byte_token('a'));
}

TEST_F(EngineOutputProcessor, EosStopsUnlessIgnored) {
  SamplingParams p = params();
  request(p);
  append(kEos);
  EXPECT_EQ(r_.samples[0].pending_finish, FinishReason::Stop);

  p.ignore_eos = true;
  r_ = RequestState{};
  request(p);
  append(kEos);
  EXPECT_EQ(r_.samples[0].pending_finish, FinishReason::None);
}

TEST_F(EngineOutputProcessor, TheContextsEndIsALengthFinish) {
  request(params(), 62);  // max_model_len 64
  append(byte_token('a'));
  EXPECT_EQ(r_.samples[0].pending_finish, FinishReason::None);
  append(byte_token('b'));
  EXPECT_EQ(r_.samples[0].pending_finish, FinishReason::Length);
}

TEST_F(EngineOutputProcessor, EachSampleHasItsDeltaAndTheRequestFinishesWithTheLast) {
  SamplingParams p = params(2);
  p.n = 2;
  p.logprobs = 0;
  request(p);
  append(byte_token('a'), 0, -0.5f);
  append(byte_token('b'), 1, -1.5f);
  RequestOutput out = outputs_.collect(r_);
  EXPECT_FALSE(out.finished);
  ASSERT_EQ(out.completions.size(), 2u);
  EXPECT_EQ(out.completions[1].index, 1);
  EXPECT_EQ(out.completions[1].text, "b");
  ASSERT_EQ(out.completions[1].logprobs.size(), 1u);
  EXPECT_EQ(out.completions[1].logprobs[0].logprob, -1.5f);
  EXPECT_TRUE(outputs_.collect(r_).completions.empty());  // no news

  append(byte_token('c'), 0);
  finish_pending(0);
  out = outputs_.collect(r_);
  EXPECT_FALSE(out.finished);
  ASSERT_EQ(out.completions.size(), 1u);
  EXPECT_EQ(out.completions[0].index, 0);
  EXPECT_EQ(out.completions[0].num_output_tokens, 2);

  outputs_.abort(r_);
  out = outputs_.collect(r_);
  EXPECT_TRUE(out.finished);
  ASSERT_EQ(out.completions.size(), 1u);
  EXPECT_EQ(out.completions[0].index, 1);
  EXPECT_EQ(out.completions[0].finish_reason, FinishReason::Abort);
  EXPECT_EQ(out.completions[0].num_output_tokens, 1);  // kept from the last delta
  EXPECT_EQ(metrics_.request_success["abort"], 1);
}

}  // namespace
}  // namespace pagellm
