#include "model/dummy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <unordered_map>

#include "core/quant_blocks.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/arch.h"
#include "format/gguf.h"

namespace pagellm {
namespace {

// Every family's dummy shapes (ArchInfo::dummy_shapes), by name.
struct Shape {
  const ArchInfo* arch;
  const DummyShape* s;
};

const std::map<std::string, Shape>& shapes() {
  static const std::map<std::string, Shape> all = [] {
    std::map<std::string, Shape> m;
    for (const ArchInfo& a : all_archs())
      for (const DummyShape& d : a.dummy_shapes) {
        PAGELLM_CHECK(!m.contains(d.name), "dummy shape '{}' is defined twice", d.name);
        m[d.name] = Shape{&a, &d};
      }
    return m;
  }();
  return all;
}

const DummyShape& find_shape(const std::string& name) {
  auto it = shapes().find(name);
  if (it == shapes().end()) {
    std::string known;
    for (const auto& [k, v] : shapes()) known += (known.empty() ? "" : ", ") + k;
    fail("unknown dummy model shape '{}' (known: {})", name, known);
  }
  return *it->second.s;
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Approximately normal(0, 1): the sum of four uniform(-1, 1) has variance 4/3.
// Integer draws and exact float ops only, so results are identical everywhere.
void fill_normal(float* out, int64_t n, uint64_t seed, float stddev) {
  uint64_t state = seed;
  const float k = stddev * 0.8660254f / 2147483648.0f;  // sqrt(3/4) / 2^31
  for (int64_t i = 0; i < n; ++i) {
    int64_t sum = 0;
    for (int r = 0; r < 2; ++r) {
      const uint64_t x = splitmix64(state);
      sum += static_cast<int32_t>(x & 0xffffffffu);
      sum += static_cast<int32_t>(x >> 32);
    }
    out[i] = static_cast<float>(sum) * k;
  }
}

class DummySource : public TensorSource {
 public:
  // Every tensor the architecture table requires for cfg, plus output.weight
  // for untied shapes.
  DummySource(const ModelConfig& cfg, const DummySpec& spec, ThreadPool& pool) {
    const ArchInfo& arch = arch_info(cfg.arch);
    const bool tied = find_shape(spec.shape).tied;
    auto make = [&](const TensorSpec& t, const std::string& name, int il) {
      const Slot s = t.slots[0];
      const std::vector<float>* rope = config_rope_factors(cfg, s);
      const bool wanted = s == Slot::Output ? !tied : rope || tensor_required(t, cfg, il);
      if (!wanted) return;
      const Dims shape = t.shape(il >= 0 ? cfg.layer_view(il) : cfg);
      const int64_t cols = shape[0];
      if (rope) {
        // Not random: the divisors the config states or implies, as a converter writes them.
        if (!rope->empty()) add_values(name, shape, *rope);
      } else if (t.slots[0] == Slot::TokEmbd) {
        // Unit variance for models that do not scale embeddings up.
        add(name, dummy_tensor_type(spec.wtype, cols), shape, arch.embd_scale_sqrt ? 0.05f : 1.0f, 0.0f, spec.seed,
            pool);
      } else if (t.matrix) {
        add(name, t.keep_f32 ? DType::F32 : dummy_tensor_type(spec.wtype, cols), shape, 1.0f / std::sqrt(static_cast<float>(cols)), 0.0f,
            spec.seed, pool);
      } else {
        // Norms center on 1; biases and conv taps on 0; decay rates (-exp(A_log)) on -1.
        const bool bias = std::string_view(t.gguf).ends_with(".bias") || t.transform == Transform::ConvTaps;
        const float mean = t.transform == Transform::NegExp ? -1.0f : bias ? 0.0f : 1.0f;
        add(name, DType::F32, shape, t.transform == Transform::ConvTaps ? 0.5f : 0.1f, mean, spec.seed, pool);
      }
    };
    for (const TensorSpec& t : arch.globals) make(t, t.gguf, -1);
    for (int il = 0; il < cfg.n_layer; ++il)
      for (const TensorSpec& t : arch.layer) make(t, layer_tensor_name(t, il), il);
  }

  const TensorData* find(const std::string& name) const override {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second].info;
  }
  size_t count() const override { return tensors_.size(); }

  struct Owned {
    TensorData info;
    std::vector<uint8_t> bytes;
  };
  const std::vector<Owned>& tensors() const { return tensors_; }

 private:
  void add(const std::string& name, DType type, std::vector<int64_t> shape, float stddev, float mean, uint64_t seed,
           ThreadPool& pool) {
    const int64_t cols = shape[0];
    int64_t rows = 1;  // stacked experts: every expert's rows
    for (size_t d = 1; d < shape.size(); ++d) rows *= shape[d];
    const size_t row_bytes = dtype_row_bytes(type, cols);
    Owned t;
    t.bytes.resize(row_bytes * static_cast<size_t>(rows));
    const uint64_t base = fnv1a(name) ^ (seed * 0x9e3779b97f4a7c15ull);
    pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = r0; r < r1; ++r) {
        fill_normal(row.data(), cols, base + static_cast<uint64_t>(r) * 0x632be59bd9b4e019ull, stddev);
        for (auto& v : row) v += mean;
        quantize_row_ref(type, row.data(), t.bytes.data() + static_cast<size_t>(r) * row_bytes, cols);
      }
    });
    push(std::move(t), name, type, std::move(shape));
  }

  void add_values(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
    Owned t;
    t.bytes.resize(values.size() * sizeof(float));
    std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
    push(std::move(t), name, DType::F32, std::move(shape));
  }

  void push(Owned t, const std::string& name, DType type, std::vector<int64_t> shape) {
    t.info = TensorData{name, type, std::move(shape), nullptr};
    index_[name] = tensors_.size();
    tensors_.push_back(std::move(t));
    // Pointers are fixed once all tensors exist (the vector may move them).
    for (auto& o : tensors_) o.info.data = o.bytes.data();
  }

  std::vector<Owned> tensors_;
  std::unordered_map<std::string, size_t> index_;
};


}  // namespace

void add_synthetic_vocab(GGUFWriter& w, int n_vocab) {
  PAGELLM_CHECK(n_vocab >= 259 + 1, "a synthetic vocabulary needs at least 260 tokens");
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  auto push = [&](std::string t, float score, int32_t type) {
    tokens.push_back(std::move(t));
    scores.push_back(score);
    types.push_back(type);
  };
  push("<unk>", 0, 2);
  push("<s>", 0, 3);
  push("</s>", 0, 3);
  for (int b = 0; b < 256; ++b) push(fmt::format("<0x{:02X}>", b), 0, 6);
  for (int i = static_cast<int>(tokens.size()); i < n_vocab; ++i) push(fmt::format("\xe2\x96\x81tok{}", i), -static_cast<float>(i), 1);
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_f32_array("tokenizer.ggml.scores", scores);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
}

std::vector<std::string> dummy_shape_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : shapes()) names.push_back(k);
  return names;
}

DType dummy_tensor_type(DType wanted, int64_t cols) {
  if (cols % 256 == 0) return wanted;
  switch (wanted) {
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::IQ4_XS: return DType::IQ4_NL;
    case DType::Q4_K: return DType::Q5_0;
    case DType::Q5_K: return DType::Q5_1;
    case DType::Q6_K: return DType::Q8_0;
    default: return wanted;
  }
}

int dummy_vocab_size(const std::string& shape, const GGUFFile* vocab) {
  const DummyShape& s = find_shape(shape);
  if (vocab) return static_cast<int>(vocab->get_string_array("tokenizer.ggml.tokens").size());
  return s.n_vocab;
}

ModelConfig dummy_config(const std::string& shape, int n_vocab) {
  const DummyShape& s = find_shape(shape);
  const ArchInfo& arch = *shapes().at(shape).arch;
  ModelConfig c;
  c.arch = arch.arch;
  c.name = "dummy " + shape;
  c.n_vocab = n_vocab;
  c.n_embd = s.n_embd;
  c.n_layer = s.n_layer;
  c.n_head = s.n_head;
  c.n_head_kv = s.n_head_kv;
  c.head_dim = s.head_dim;
  c.n_ff = s.n_ff;
  c.n_ctx_train = s.n_ctx;
  c.norm_eps = s.norm_eps;
  c.rope.freq_base = s.rope_base;
  c.sliding_window = s.sliding_window;
  c.n_expert = s.n_expert;
  c.n_expert_used = s.n_expert_used;
  c.n_ff_exp = s.n_ff_exp;
  c.n_ff_shexp = s.n_ff_shexp;
  c.expert_norm_topk = s.n_expert > 0 && arch.moe_norm_topk;
  if (s.extras) s.extras(c);
  finalize_config(c, true);  // the weights are laid out as a GGUF file's
  return c;
}

std::unique_ptr<TensorSource> make_dummy_source(const ModelConfig& cfg, const DummySpec& spec, ThreadPool& pool) {
  return std::make_unique<DummySource>(cfg, spec, pool);
}

void write_dummy_gguf(const std::string& path, const DummySpec& spec, const GGUFFile* vocab, ThreadPool& pool) {
  const DummyShape& s = find_shape(spec.shape);
  const int n_vocab = dummy_vocab_size(spec.shape, vocab);
  const ModelConfig cfg = dummy_config(spec.shape, n_vocab);
  const ArchInfo& arch = arch_info(cfg.arch);
  DummySource src(cfg, spec, pool);
  GGUFWriter w;
  const std::string a = arch.gguf_name;
  w.set_string("general.architecture", a);
  w.set_string("general.name", fmt::format("dummy {} {} seed {}", spec.shape, dtype_name(spec.wtype), spec.seed));
  w.set_u32("general.alignment", 32);
  w.set_u32(a + ".vocab_size", static_cast<uint32_t>(n_vocab));
  w.set_u32(a + ".context_length", static_cast<uint32_t>(s.n_ctx));
  w.set_u32(a + ".embedding_length", static_cast<uint32_t>(s.n_embd));
  w.set_u32(a + ".block_count", static_cast<uint32_t>(s.n_layer));
  w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(s.n_head));
  if (cfg.layers_alike()) {
    w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(s.n_ff));
    w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  } else {
    // Per-layer arrays, as llama.cpp's Gemma 4 converter writes them.
    std::vector<int32_t> ff, kv;
    for (int il = 0; il < cfg.n_layer; ++il) {
      ff.push_back(cfg.layer_ff(il));
      kv.push_back(cfg.layer_n_head_kv(il));
    }
    w.set_i32_array(a + ".feed_forward_length", ff);
    w.set_i32_array(a + ".attention.head_count_kv", kv);
  }
  if (arch.gguf_layer_sizes) {
    // The local layers' head under *_swa (key_length is the global layers'),
    // and the per-layer input size even when 0: llama.cpp requires them.
    w.set_u32(a + ".attention.key_length_swa", static_cast<uint32_t>(s.head_dim));
    w.set_u32(a + ".attention.value_length_swa", static_cast<uint32_t>(s.head_dim));
    w.set_u32(a + ".rope.dimension_count_swa", static_cast<uint32_t>(cfg.rope_swa.n_rot));
    w.set_f32(a + ".rope.freq_base_swa", cfg.rope_swa.freq_base);
    w.set_u32(a + ".embedding_length_per_layer_input", static_cast<uint32_t>(cfg.n_embd_per_layer));
  }
  const int key_length = cfg.head_dim_global > 0 ? cfg.head_dim_global : s.head_dim;
  w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(key_length));
  // MLA: the cache's one latent head is [rope | kv_lora] keys and kv_lora values.
  w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(cfg.is_mla() ? cfg.mla.kv_lora_rank : key_length));
  w.set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(cfg.rope.n_rot));
  w.set_f32(a + ".rope.freq_base", s.rope_base);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", s.norm_eps);
  if (s.sliding_window) w.set_u32(a + ".attention.sliding_window", static_cast<uint32_t>(s.sliding_window));
  if (s.n_expert) {
    w.set_u32(a + ".expert_count", static_cast<uint32_t>(s.n_expert));
    w.set_u32(a + ".expert_used_count", static_cast<uint32_t>(s.n_expert_used));
    if (arch.gguf_expert_ff_key) w.set_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(s.n_ff_exp));
    if (s.n_ff_shexp && !cfg.is_mla())
      w.set_u32(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(s.n_ff_shexp));
    if (cfg.expert_scoring == RouterScoring::Sigmoid || cfg.n_dense_lead > 0 || cfg.expert_groups > 1) {
      // DeepSeek-style routing, under the keys llama.cpp's converter writes
      // (expert_gating_func: 1 softmax, 2 sigmoid).
      w.set_u32(a + ".leading_dense_block_count", static_cast<uint32_t>(cfg.n_dense_lead));
      w.set_u32(a + ".expert_gating_func", cfg.expert_scoring == RouterScoring::Sigmoid ? 2 : 1);
      w.set_f32(a + ".expert_weights_scale", cfg.expert_weights_scale);
      w.set_bool(a + ".expert_weights_norm", cfg.expert_norm_topk);
      w.set_u32(a + ".expert_group_count", static_cast<uint32_t>(cfg.expert_groups));
      w.set_u32(a + ".expert_group_used_count", static_cast<uint32_t>(cfg.expert_groups_used));
      w.set_u32(a + ".expert_shared_count", static_cast<uint32_t>(cfg.n_ff_shexp / cfg.n_ff_exp));
    }
  }
  if (cfg.is_mla()) {
    // DeepSeek's MLA sizes, as llama.cpp's converter writes them (the router's keys are above).
    const ModelConfig::Mla& m = cfg.mla;
    // Stated even when 0 (V2-Lite has no q-LoRA): llama.cpp requires the key
    // unless the model has V2-Lite's exact layer count.
    w.set_u32(a + ".attention.q_lora_rank", static_cast<uint32_t>(m.q_lora_rank));
    w.set_u32(a + ".attention.kv_lora_rank", static_cast<uint32_t>(m.kv_lora_rank));
    w.set_u32(a + ".attention.key_length_mla", static_cast<uint32_t>(m.q_head_dim()));
    w.set_u32(a + ".attention.value_length_mla", static_cast<uint32_t>(m.v_head_dim));
    if (cfg.rope.ext_factor > 0) {
      PAGELLM_CHECK(m.yarn_mscale == m.yarn_mscale_all_dim, "a GGUF file states DeepSeek's mscale_all_dim only");
      w.set_f32(a + ".rope.scaling.yarn_log_multiplier", 0.1f * m.yarn_mscale_all_dim);
    }
  }
  if (cfg.rope.ext_factor > 0) {
    w.set_string(a + ".rope.scaling.type", "yarn");
    w.set_f32(a + ".rope.scaling.factor", 1.0f / cfg.rope.freq_scale);
    w.set_u32(a + ".rope.scaling.original_context_length", static_cast<uint32_t>(cfg.rope.n_ctx_orig));
  }
  if (cfg.longrope()) {
    // As llama.cpp's Phi-3 converter writes them (the factors are tensors).
    w.set_string(a + ".rope.scaling.type", "longrope");
    w.set_f32(a + ".rope.scaling.attn_factor", cfg.rope.attn_factor);
    w.set_u32(a + ".rope.scaling.original_context_length", static_cast<uint32_t>(cfg.rope.n_ctx_orig));
  }
  if (cfg.n_linear_layers() > 0) {
    // Gated DeltaNet sizes under llama.cpp's SSM keys, as its converter writes them.
    const ModelConfig::LinearAttn& la = cfg.linear;
    w.set_u32(a + ".ssm.conv_kernel", static_cast<uint32_t>(la.conv_kernel));
    w.set_u32(a + ".ssm.state_size", static_cast<uint32_t>(la.head_k_dim));
    w.set_u32(a + ".ssm.group_count", static_cast<uint32_t>(la.n_k_heads));
    w.set_u32(a + ".ssm.time_step_rank", static_cast<uint32_t>(la.n_v_heads));
    w.set_u32(a + ".ssm.inner_size", static_cast<uint32_t>(la.value_dim()));
    std::vector<bool> recurrent;
    for (int il = 0; il < cfg.n_layer; ++il) recurrent.push_back(cfg.layer_is_linear(il));
    w.set_bool_array(a + ".attention.recurrent_layers", recurrent);
    // Qwen3.5's multimodal RoPE sections, as its configs state them; text
    // tokens have one position in every section, so they do not change the
    // text model (llama.cpp requires the key).
    w.set_i32_array(a + ".rope.dimension_sections", {11, 11, 10, 0});
  }
  if (std::find(cfg.is_swa.begin(), cfg.is_swa.end(), true) != cfg.is_swa.end()) {
    // The sliding-window layers as llama.cpp's newer converters list them
    // (families with a fixed pattern ignore the key).
    w.set_bool_array(a + ".attention.sliding_window_pattern", cfg.is_swa);
  }
  if (!cfg.kv_source.empty()) {
    // llama.cpp's form: the last N layers read earlier ones' K/V.
    int shared = 0;
    for (int il = 0; il < cfg.n_layer; ++il) shared += cfg.layer_reuses_kv(il) ? 1 : 0;
    w.set_u32(a + ".attention.shared_kv_layers", static_cast<uint32_t>(shared));
  }
  if (cfg.n_embd_per_layer > 0 && !arch.gguf_layer_sizes)
    w.set_u32(a + ".embedding_length_per_layer_input", static_cast<uint32_t>(cfg.n_embd_per_layer));
  if (cfg.attn_softcap > 0) w.set_f32(a + ".attn_logit_softcapping", cfg.attn_softcap);
  if (cfg.final_softcap > 0) w.set_f32(a + ".final_logit_softcapping", cfg.final_softcap);
  if (vocab) {
    for (const auto& [k, v] : vocab->metadata())
      if (k.rfind("tokenizer.", 0) == 0) w.set_value(k, v);
  } else {
    add_synthetic_vocab(w, n_vocab);
  }
  for (const auto& t : src.tensors()) w.add_tensor(t.info.name, t.info.type, t.info.shape, t.bytes);
  w.write(path);
}

}  // namespace pagellm
