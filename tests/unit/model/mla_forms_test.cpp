// Multi-head latent attention's two forms in one step: a sequence with keys
// in the cache (the absorbed form) beside a whole prompt of 512 tokens (the
// expanded form, attention_kv), and a 512-token chunk after cached keys
// (expanded from the cache, gather_kv) alone and beside a decode: each row's
// logits are those its sequence gets alone. (Each form alone is checked
// against transformers by the HF fixtures.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include "backend/registry.h"
#include "core/thread_pool.h"
#include "core/trace.h"
#include "model/dummy.h"
#include "model/model.h"
#include "test_paths.h"

namespace pagellm {
namespace {

constexpr int kBlock = 16;

// One sequence's slice of a batch: tokens at positions [ctx, ctx + n) in
// blocks first_block, first_block + 1, ...
void add_seq(BatchInfo& b, const std::vector<int32_t>& tokens, int ctx, int first_block) {
  SeqInfo s;
  s.q_start = static_cast<int32_t>(b.token_ids.size());
  s.q_len = static_cast<int32_t>(tokens.size());
  s.ctx_len = ctx + s.q_len;
  for (int blk = 0; blk * kBlock < s.ctx_len; ++blk) s.block_table.push_back(first_block + blk);
  for (int i = 0; i < s.q_len; ++i) {
    const int pos = ctx + i;
    b.token_ids.push_back(tokens[static_cast<size_t>(i)]);
    b.positions.push_back(pos);
    b.slot_mapping.push_back(int64_t{s.block_table[static_cast<size_t>(pos / kBlock)]} * kBlock + pos % kBlock);
  }
  b.seqs.push_back(s);
}

// The ops traced since `since` (trace::now_us(); the trace keeps every event written).
std::set<std::string> traced_ops(const std::string& name, int64_t since = 0) {
  trace::enable(false);
  const std::string path = test::temp_dir() + "/" + name + ".json";
  trace::write(path);
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::set<std::string> ops;
  for (const auto& e : j["traceEvents"])
    if (e["ts"].get<double>() >= static_cast<double>(since)) ops.insert(e["name"].get<std::string>());
  return ops;
}

std::vector<float> logits_of(Model& m, const BatchInfo& b, const std::vector<int32_t>& rows) {
  std::vector<float> out(rows.size() * static_cast<size_t>(m.config().n_vocab));
  m.forward(b, rows, out.data());
  return out;
}

double max_rel_gap(const std::vector<float>& a, const std::vector<float>& b) {
  double gap = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return gap / scale;
}

// A tiny DeepSeek-V3 with random F32 weights, its cache in blocks of 16;
// a (40 tokens in blocks 1..3) and its next token, the reference decode.
struct TinyMla {
  std::unique_ptr<Backend> backend = create_backend("cpu", {{"threads", "2"}});
  ThreadPool pool{2};
  ModelConfig cfg;
  std::unique_ptr<TensorSource> src;
  std::unique_ptr<Model> model;
  std::mt19937 rng;
  std::vector<int32_t> a;
  int32_t a_next = 0;
  std::vector<float> a_alone;  // a_next's logits after a's prompt

  TinyMla(int n_vocab, int context, int blocks, uint32_t seed)
      : cfg(dummy_config("tiny-deepseek3", n_vocab)), rng(seed) {
    src = make_dummy_source(cfg, DummySpec{"tiny-deepseek3", DType::F32, 1}, pool);
    model = Model::from_source(cfg, *src, *backend);
    model->set_context_length(context);
    backend->allocate_kv_cache(model->kv_cache_spec(kBlock, blocks, DType::F32));
    a = tokens(40);
    a_next = tokens(1)[0];
    BatchInfo prompt;
    add_seq(prompt, a, 0, 1);
    logits_of(*model, prompt, {});
    BatchInfo decode;
    add_seq(decode, {a_next}, 40, 1);
    a_alone = logits_of(*model, decode, {0});
  }
  std::vector<int32_t> tokens(int n) {
    std::uniform_int_distribution<int32_t> tok(3, cfg.n_vocab - 1);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = tok(rng);
    return t;
  }
};

TEST(MlaForms, AStepWithCachedKeysAndALongWholePromptRunsBoth) {
  TinyMla t(512, 512, 1 + 4 + 32 + 32, 7);
  Model* model = t.model.get();
  const std::vector<int32_t> b = t.tokens(512);
  const int32_t a_next = t.a_next;
  const std::vector<float>& a_alone = t.a_alone;
  const auto n = static_cast<size_t>(t.cfg.n_vocab);

  // b alone (blocks 37..): the reference for b's last row.
  BatchInfo b_batch;
  add_seq(b_batch, b, 0, 37);
  const std::vector<float> b_alone = logits_of(*model, b_batch, {511});

  // Both in one step, b in blocks 5..36; a rewrites its token's K/V with the same values.
  BatchInfo mixed;
  add_seq(mixed, {a_next}, 40, 1);
  add_seq(mixed, b, 0, 5);
  trace::enable(true);
  const std::vector<float> both = logits_of(*model, mixed, {0, 512});
  const std::set<std::string> ops = traced_ops("mla-forms");
  EXPECT_TRUE(ops.count("attention"));
  EXPECT_TRUE(ops.count("attention_kv"));

  // Float sums in other orders only (other row counts per product): far
  // below what a wrong row would move (the other form's rows, or stale ones).
  EXPECT_LT(max_rel_gap(std::vector<float>(both.begin(), both.begin() + n), a_alone), 1e-5);
  EXPECT_LT(max_rel_gap(std::vector<float>(both.begin() + n, both.end()), b_alone), 1e-5);
}

TEST(MlaForms, AChunkAfterCachedKeysExpandsFromTheCache) {
  TinyMla t(1024, 1024, 1 + 4 + 35 + 35, 11);
  Model* model = t.model.get();
  const std::vector<int32_t> b = t.tokens(552);
  const int32_t a_next = t.a_next;
  const std::vector<float>& a_alone = t.a_alone;
  const auto n = static_cast<size_t>(t.cfg.n_vocab);
  const std::vector<int32_t> head(b.begin(), b.begin() + 40), chunk(b.begin() + 40, b.end());

  // The reference: b whole in one step (blocks 5..39).
  BatchInfo whole;
  add_seq(whole, b, 0, 5);
  const std::vector<float> b_whole = logits_of(*model, whole, {551});

  // b's first 40 tokens, then the other 512 as one chunk (blocks 40..74):
  // alone (every sequence expanded), then beside a's decode (both forms).
  BatchInfo first;
  add_seq(first, head, 0, 40);
  logits_of(*model, first, {});
  BatchInfo rest;
  add_seq(rest, chunk, 40, 40);
  int64_t since = trace::now_us();
  trace::enable(true);
  const std::vector<float> b_chunked = logits_of(*model, rest, {511});
  const std::set<std::string> alone_ops = traced_ops("mla-chunk", since);
  EXPECT_TRUE(alone_ops.count("gather_kv"));
  EXPECT_TRUE(alone_ops.count("attention_kv"));
  EXPECT_FALSE(alone_ops.count("attention"));
  EXPECT_LT(max_rel_gap(b_chunked, b_whole), 1e-5);

  BatchInfo mixed;
  add_seq(mixed, {a_next}, 40, 1);
  add_seq(mixed, chunk, 40, 40);
  since = trace::now_us();
  trace::enable(true);
  const std::vector<float> both = logits_of(*model, mixed, {0, 512});
  const std::set<std::string> mixed_ops = traced_ops("mla-chunk-mixed", since);
  EXPECT_TRUE(mixed_ops.count("gather_kv"));
  EXPECT_TRUE(mixed_ops.count("attention"));
  EXPECT_LT(max_rel_gap(std::vector<float>(both.begin(), both.begin() + n), a_alone), 1e-5);
  EXPECT_LT(max_rel_gap(std::vector<float>(both.begin() + n, both.end()), b_whole), 1e-5);

  // A shorter chunk after cached keys stays absorbed.
  BatchInfo short_chunk;
  add_seq(short_chunk, std::vector<int32_t>(chunk.begin(), chunk.begin() + 100), 40, 40);
  since = trace::now_us();
  trace::enable(true);
  logits_of(*model, short_chunk, {99});
  const std::set<std::string> short_ops = traced_ops("mla-chunk-short", since);
  EXPECT_FALSE(short_ops.count("gather_kv"));
  EXPECT_FALSE(short_ops.count("attention_kv"));
}

}  // namespace
}  // namespace pagellm
