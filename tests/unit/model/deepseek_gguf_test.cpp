// DeepSeek (deepseek2) GGUF files: the layout llama.cpp's converter writes
// (kv_b split into attn_k_b / attn_v_b, the *_mla sizes) and the older one
// (one attn_kv_b, the expanded heads' key/value lengths) both load, read the
// config the dummy was made from and compute the same function.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "format/gguf.h"
#include "hostile_input.h"
#include "model/dummy.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/model_test_util.h"

namespace pagellm {
namespace {

std::vector<float> logits_of(Model& model, const std::vector<int32_t>& tokens) {
  test::PagedRunner runner(model, 16, 16, DType::F32);
  return runner.feed(tokens, 7, true);
}

std::vector<int32_t> some_tokens() {
  std::vector<int32_t> t;
  for (int i = 0; i < 20; ++i) t.push_back(1 + (i * 53) % 500);
  return t;
}

void expect_same_mla_config(const ModelConfig& got, const ModelConfig& want) {
  EXPECT_EQ(got.n_head_kv, 1);
  EXPECT_EQ(got.head_dim, want.head_dim);
  EXPECT_EQ(got.mla.q_lora_rank, want.mla.q_lora_rank);
  EXPECT_EQ(got.mla.kv_lora_rank, want.mla.kv_lora_rank);
  EXPECT_EQ(got.mla.qk_nope_head_dim, want.mla.qk_nope_head_dim);
  EXPECT_EQ(got.mla.qk_rope_head_dim, want.mla.qk_rope_head_dim);
  EXPECT_EQ(got.mla.v_head_dim, want.mla.v_head_dim);
  EXPECT_TRUE(got.rope_pairs_adjacent);
  EXPECT_FLOAT_EQ(got.attn_scale, want.attn_scale);
  EXPECT_FLOAT_EQ(got.rope.attn_factor, want.rope.attn_factor);
  EXPECT_EQ(got.n_dense_lead, want.n_dense_lead);
  EXPECT_EQ(got.n_ff_shexp, want.n_ff_shexp);
  EXPECT_EQ(got.expert_scoring, want.expert_scoring);
  EXPECT_EQ(got.expert_choice_bias, want.expert_choice_bias);
  EXPECT_EQ(got.expert_norm_topk, want.expert_norm_topk);
  EXPECT_FLOAT_EQ(got.expert_weights_scale, want.expert_weights_scale);
  EXPECT_EQ(got.routing().n_group, want.routing().n_group);
  EXPECT_EQ(got.routing().topk_group, want.routing().topk_group);
}

// The shape's dummy, and its logits computed in memory: the reference both
// files are held to.
class DeepseekGguf : public ::testing::TestWithParam<const char*> {
 protected:
  ThreadPool pool{2};
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  const std::string shape = GetParam();
  const DummySpec spec{shape, DType::F32, 3};
  const int n_vocab = dummy_vocab_size(shape, nullptr);
  const ModelConfig want = dummy_config(shape, n_vocab);
  const std::vector<float> reference =
      logits_of(*Model::from_source(want, *make_dummy_source(want, spec, pool), *backend), some_tokens());
};

TEST_P(DeepseekGguf, LoadsWithTheDummysConfigAndFunction) {
  test::ScratchDir dir("deepseek-gguf-" + shape);
  const std::string path = dir.file("model.gguf");
  write_dummy_gguf(path, spec, nullptr, pool);
  auto model = Model::load(path, *backend);
  EXPECT_FALSE(model->config().mla.kv_b_fused);
  expect_same_mla_config(model->config(), want);
  EXPECT_LE(test::max_rel_gap(logits_of(*model, some_tokens()), reference, n_vocab), 1e-6) << shape;
}

// Files converted before llama.cpp split kv_b: one attn_kv_b [kv_lora, n_head
// * (nope + v)] and key/value lengths of the expanded heads.
TEST_P(DeepseekGguf, OlderFilesWithOneKvBTensorLoadToo) {
  test::ScratchDir dir("deepseek-gguf-old-" + shape);
  const std::string split_path = dir.file("split.gguf"), old_path = dir.file("old.gguf");
  write_dummy_gguf(split_path, spec, nullptr, pool);
  auto split = GGUFFile::open(split_path);
  const ModelConfig::Mla& m = want.mla;
  const int64_t H = want.n_head, D = m.kv_lora_rank, nope = m.qk_nope_head_dim, v = m.v_head_dim;
  GGUFWriter w;
  for (const auto& [key, value] : split->metadata()) {
    if (key.ends_with("_mla")) continue;
    if (key == "deepseek2.attention.key_length") w.set_u32(key, static_cast<uint32_t>(nope + m.qk_rope_head_dim));
    else if (key == "deepseek2.attention.value_length") w.set_u32(key, static_cast<uint32_t>(v));
    else if (key == "deepseek2.attention.head_count_kv") w.set_u32(key, static_cast<uint32_t>(H));
    else w.set_value(key, value);
  }
  int joined = 0;
  for (const GGUFTensorInfo& t : split->tensors()) {
    const std::string name = t.name;
    const auto* data = reinterpret_cast<const float*>(t.data);
    const size_t bytes = static_cast<size_t>(t.cols() * t.rows()) * sizeof(float);
    if (name.ends_with("attn_v_b.weight")) continue;
    if (!name.ends_with("attn_k_b.weight")) {
      w.add_tensor(name, t.type, t.shape, std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(data),
                                                               reinterpret_cast<const uint8_t*>(data) + bytes));
      continue;
    }
    // Per head: nope key rows (k_b holds them transposed, D rows of nope), then v value rows.
    const std::string blk = name.substr(0, name.size() - std::string("attn_k_b.weight").size());
    const auto* vb = reinterpret_cast<const float*>(split->find_tensor(blk + "attn_v_b.weight")->data);
    std::vector<float> kv_b(static_cast<size_t>(H * (nope + v) * D));
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t j = 0; j < nope; ++j)
        for (int64_t d = 0; d < D; ++d) kv_b[(h * (nope + v) + j) * D + d] = data[(h * D + d) * nope + j];
      std::memcpy(&kv_b[(h * (nope + v) + nope) * D], vb + h * v * D, static_cast<size_t>(v * D) * sizeof(float));
    }
    std::vector<uint8_t> out(kv_b.size() * sizeof(float));
    std::memcpy(out.data(), kv_b.data(), out.size());
    w.add_tensor(blk + "attn_kv_b.weight", DType::F32, {D, H * (nope + v)}, out);
    ++joined;
  }
  ASSERT_EQ(joined, want.n_layer);
  w.write(old_path);
  auto model = Model::load(old_path, *backend);
  EXPECT_TRUE(model->config().mla.kv_b_fused);
  expect_same_mla_config(model->config(), want);
  EXPECT_LE(test::max_rel_gap(logits_of(*model, some_tokens()), reference, n_vocab), 1e-6) << shape;
}

INSTANTIATE_TEST_SUITE_P(Shapes, DeepseekGguf, ::testing::Values("tiny-deepseek3", "tiny-deepseek2"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(DeepseekGguf, RefusesWhatItCannotRead) {
  ThreadPool pool(2);
  auto backend = make_cpu_backend(1);
  test::ScratchDir dir("deepseek-gguf-bad");
  const std::string good = dir.file("good.gguf");
  write_dummy_gguf(good, DummySpec{"tiny-deepseek3", DType::F32, 1}, nullptr, pool);
  auto f = GGUFFile::open(good);
  auto rewrite = [&](const std::string& key, const GGUFValue* value, const std::string& out) {
    GGUFWriter w;
    for (const auto& [k, v] : f->metadata())
      if (k != key) w.set_value(k, v);
    if (value) w.set_value(key, *value);
    for (const GGUFTensorInfo& t : f->tensors()) {
      w.add_tensor(t.name, t.type, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
    }
    w.write(out);
    return out;
  };
  const std::string no_rank = rewrite("deepseek2.attention.kv_lora_rank", nullptr, dir.file("a.gguf"));
  test::expect_error_with([&] { Model::load(no_rank, *backend); }, "kv_lora_rank");
  GGUFValue gating;
  gating.type = GGUFType::U32;
  gating.u = 3;
  const std::string bad_gating = rewrite("deepseek2.expert_gating_func", &gating, dir.file("b.gguf"));
  test::expect_error_with([&] { Model::load(bad_gating, *backend); }, "expert_gating_func 3 is not supported");
}

}  // namespace
}  // namespace pagellm
