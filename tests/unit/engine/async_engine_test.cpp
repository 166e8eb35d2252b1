#include "engine/async_engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

namespace pagellm {
namespace {

EngineConfig tiny() {
  EngineConfig c;
  c.load_format = "dummy";
  c.dummy_shape = "tiny-llama";
  c.dummy_type = DType::F32;
  c.threads = 1;
  c.scheduler.max_model_len = 512;
  return c;
}

EngineRequest req(const std::string& id, int max_tokens) {
  EngineRequest r;
  r.id = id;
  r.prompt_ids = {1, 5, 9, 13, 17};
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  return r;
}

// Polls `cond` until it holds or 30 s pass: the loop thread publishes stats
// after its current step, which takes longer on a slow (or sanitized) build.
bool eventually(const std::function<bool()>& cond) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Reads a stream to its end; returns the tokens and the final output.
std::pair<std::vector<int32_t>, RequestOutput> drain(RequestStream& s) {
  std::vector<int32_t> tokens;
  for (;;) {
    auto out = s.next(std::chrono::seconds(30));
    EXPECT_TRUE(out.has_value()) << "stream stalled";
    if (!out) return {tokens, {}};
    for (const auto& d : out->completions) tokens.insert(tokens.end(), d.token_ids.begin(), d.token_ids.end());
    if (out->finished) return {tokens, *out};
  }
}

TEST(AsyncEngine, ManyThreadsSubmitAndAllFinish) {
  AsyncEngine engine(std::make_unique<Engine>(tiny()));
  std::vector<std::thread> clients;
  std::atomic<int> done{0};
  std::vector<std::vector<int32_t>> outputs(16);
  for (int i = 0; i < 16; ++i)
    clients.emplace_back([&, i] {
      auto s = engine.submit(req("r" + std::to_string(i), 8 + i % 5));
      outputs[i] = drain(*s).first;
      EXPECT_EQ(outputs[i].size(), static_cast<size_t>(8 + i % 5));
      EXPECT_TRUE(s->finished());
      EXPECT_FALSE(s->next(std::chrono::milliseconds(1)).has_value());
      done++;
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(done.load(), 16);
  // Same prompt, greedy: every output is a prefix of the longest one.
  for (int i = 0; i < 16; ++i)
    EXPECT_TRUE(std::equal(outputs[i].begin(), outputs[i].end(), outputs[4].begin())) << i;
  // Stats are a snapshot published after each step, just after the outputs.
  EXPECT_TRUE(eventually([&] { return engine.stats().kv.used_blocks == 0; }));
}

TEST(AsyncEngine, AbortFromAnotherThreadFreesBlocks) {
  AsyncEngine engine(std::make_unique<Engine>(tiny()));
  auto s = engine.submit(req("long", 400));
  ASSERT_TRUE(s->next(std::chrono::seconds(30)).has_value());  // running
  std::thread([&] { engine.abort("long"); }).join();
  const auto [tokens, last] = drain(*s);
  ASSERT_FALSE(last.completions.empty());
  EXPECT_EQ(last.completions.back().finish_reason, FinishReason::Abort);
  EXPECT_LT(tokens.size(), 400u);
  EXPECT_TRUE(eventually([&] { return engine.stats().kv.used_blocks == 0; }));
  EXPECT_EQ(engine.num_in_flight(), 0u);
}

TEST(AsyncEngine, InvalidRequestsThrowOnSubmit) {
  AsyncEngine engine(std::make_unique<Engine>(tiny()));
  auto bad = req("bad", 4);
  bad.params.top_p = 0;
  EXPECT_THROW(engine.submit(bad), InvalidRequest);
  auto ok = engine.submit(req("dup", 50));
  EXPECT_THROW(engine.submit(req("dup", 4)), InvalidRequest);
  drain(*ok);
}

TEST(AsyncEngine, QueueLimitAndShutdown) {
  AsyncEngineOptions opts;
  opts.max_waiting_requests = 2;
  auto cfg = tiny();
  cfg.scheduler.max_num_seqs = 1;
  AsyncEngine engine(std::make_unique<Engine>(cfg), opts);
  std::vector<std::shared_ptr<RequestStream>> streams;
  bool refused = false;
  for (int i = 0; i < 20 && !refused; ++i) {
    try {
      streams.push_back(engine.submit(req("q" + std::to_string(i), 200)));
    } catch (const QueueFull&) {
      refused = true;
    }
  }
  EXPECT_TRUE(refused);
  // Shut down with no grace: everything in flight ends (aborted), nothing hangs.
  std::thread stopper([&] { engine.shutdown(std::chrono::milliseconds(0)); });
  for (auto& s : streams) {
    const auto [tokens, last] = drain(*s);
    EXPECT_TRUE(last.finished);
  }
  stopper.join();
  EXPECT_THROW(engine.submit(req("late", 4)), ShuttingDown);
}

TEST(AsyncEngine, ShutdownLetsInFlightRequestsFinishWithinGrace) {
  AsyncEngine engine(std::make_unique<Engine>(tiny()));
  auto s = engine.submit(req("finish", 20));
  engine.shutdown(std::chrono::seconds(30));
  const auto [tokens, last] = drain(*s);
  EXPECT_EQ(tokens.size(), 20u);
  EXPECT_EQ(last.completions.back().finish_reason, FinishReason::Length);
}

}  // namespace
}  // namespace pagellm
