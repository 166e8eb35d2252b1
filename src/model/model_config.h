// Hyperparameters of a decoder-only transformer, read from GGUF metadata or a
// Hugging Face config.json. One struct covers every architecture we run; the
// flags say which parts a family uses.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace pagellm {

class GGUFFile;

enum class Arch { Llama, Qwen2, Qwen3, Qwen2Moe, Qwen3Moe, Gemma2, Gemma3, Phi3, GptOss, Qwen35, Qwen35Moe, Deepseek2, Glm4Moe, Qwen3Next, Gemma4, Bert, GemmaEmbedding, XlmRoberta };

// The largest sizes a model file may state. Each is far above every released
// model (the largest have ~126 layers, hidden 16384, 128 heads, vocab 262k),
// and together they keep every size product far from int64 overflow, so a
// hostile value is refused before anything is allocated from it.
struct ModelSizeLimits {
  static constexpr int64_t kLayers = 1024;
  static constexpr int64_t kEmbd = int64_t{1} << 17;
  static constexpr int64_t kHeads = 1024;
  static constexpr int64_t kHeadDim = 1024;
  static constexpr int64_t kFeedForward = int64_t{1} << 20;
  static constexpr int64_t kVocab = int64_t{1} << 24;
  static constexpr int64_t kContext = int64_t{1} << 26;
  static constexpr int64_t kExperts = 1024;  // DeepSeek V3 / Kimi K2: 256-384
};
const char* arch_name(Arch a);

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string name;       // general.name or the folder name
  int n_vocab = 0;
  int n_embd = 0;         // hidden size
  int n_layer = 0;
  int n_head = 0, n_head_kv = 0;
  int head_dim = 0;       // per head (key_length)
  int n_ff = 0;           // feed-forward hidden size
  int n_ctx_train = 0;    // context length the model was trained for
  float norm_eps = 1e-5f;

  // RoPE. Global layers use rope; sliding-window layers (Gemma 3) use rope_swa.
  RopeConfig rope;
  RopeConfig rope_swa;
  float rope_swa_base = 0;      // RoPE base of sliding-window layers (0: family default)
  // Llama 3 frequency scaling as config.json states it (factor 0: none).
  struct Llama3Rope {
    float factor = 0, low_freq_factor = 0, high_freq_factor = 0;
    int original_context = 0;  // original_max_position_embeddings
  } rope_llama3;
  // Per-dimension RoPE divisors [n_rot / 2] a config implies (Llama 3
  // scaling). GGUF files store them as rope_freqs.weight; the HF source
  // serves these under that name.
  std::vector<float> rope_freq_factors;
  // LongRoPE (Phi-3 / Phi-3.5 / Phi-4-mini long-context configs): per-pair
  // divisors for contexts up to rope.n_ctx_orig (short) and beyond (long);
  // the model picks one set for the context it serves (llama.cpp's rule),
  // and rope.attn_factor scales cos / sin. GGUF files store them as
  // rope_factors_short/long.weight; the HF source serves these under those names.
  std::vector<float> rope_factors_short, rope_factors_long;
  bool longrope() const { return !rope_factors_long.empty() || !rope_factors_short.empty(); }

  // Attention.
  float attn_scale = 0;         // 1/sqrt(head_dim) unless the family says otherwise
  // Tokens, for layers with is_swa[il]: as config.json and GGUF files state
  // it (attention_window() is what the attention op gets).
  int sliding_window = 0;
  std::vector<bool> is_swa;     // [n_layer]
  float attn_softcap = 0;

  // Family features.
  bool qkv_bias = false;        // q/k/v projections have biases (Qwen 2)
  bool qk_norm = false;         // per-head RMSNorm of q and k (Qwen 3, Gemma 3)
  // Gated attention (Qwen3.5): q_proj also gives a per-head output gate, and
  // the attention output is multiplied by its sigmoid before o_proj.
  bool attn_out_gate = false;
  bool post_norms = false;      // norms after attention and FFN outputs (Gemma 3)
  // Bidirectional attention (encoders: BERT): every token attends to every
  // token of its sequence. Such a model's prompt is computed whole, in one
  // step, never from the prefix cache (a prefix's K/V depend on what follows
  // it), and it generates nothing: it serves embeddings only.
  bool non_causal = false;
  // The sliding layers' window as AttentionConfig takes it: causal, a query
  // at p sees p - W < j <= p; bidirectional (EmbeddingGemma), |p - j| <= W / 2,
  // i.e. |p - j| < W / 2 + 1 (transformers' Gemma3TextConfig turns W into
  // W // 2 + 1, llama.cpp's symmetric SWA masks |p - j| > W / 2).
  int attention_window() const { return non_causal && sliding_window > 0 ? sliding_window / 2 + 1 : sliding_window; }
  int n_token_types = 0;        // rows of an encoder's token-type table (BERT's type_vocab_size); 0: none
  int n_cls_out = 0;            // a sequence-classification head's outputs (labels), read by name; 0: none
  // Rows of a Hugging Face checkpoint's learned position table before
  // position 0 (RoBERTa / XLM-R: padding_idx + 1, as their position ids
  // start past the padding row); the loader drops them, as llama.cpp's
  // converter does. 0: none (GGUF files hold the table from position 0).
  int hf_pos_offset = 0;
  float embd_scale = 1.0f;      // token embeddings are multiplied by this (Gemma: sqrt(n_embd))
  Activation act = Activation::Silu;
  float final_softcap = 0;
  // HF configs: the output matrix is the token embedding (lm_head.weight, if
  // stored, is ignored as transformers ignores it). GGUF files tie by omitting output.weight.
  bool tie_word_embeddings = false;

  // Mixture of experts (n_expert > 0): each layer's FFN sends every token to
  // n_expert_used of n_expert experts (SwiGLU of n_ff_exp hidden units), plus
  // a shared expert of n_ff_shexp units behind a sigmoid gate (Qwen2-MoE).
  int n_expert = 0, n_expert_used = 0;
  int n_ff_exp = 0;
  int n_ff_shexp = 0;
  bool expert_norm_topk = false;  // the chosen experts' weights are renormalised to sum to 1
  // DeepSeek's router: sigmoid scores, a choice bias (exp_probs_b), groups,
  // a scale on the routed weights; and first_k_dense_replace dense layers
  // before the MoE ones.
  RouterScoring expert_scoring = RouterScoring::Softmax;
  bool expert_choice_bias = false;  // the router has e_score_correction_bias
  float expert_weights_scale = 1.0f;
  int expert_groups = 1, expert_groups_used = 1;
  GroupScore expert_group_score = GroupScore::Top2Sum;
  int n_dense_lead = 0;
  bool moe_dense_ffn = false;  // MoE layers also run the dense FFN beside the experts (Gemma 4)
  bool moe() const { return n_expert > 0; }
  bool layer_is_moe(int il) const { return moe() && il >= n_dense_lead; }
  MoeRouting routing() const {
    MoeRouting r{n_expert, n_expert_used, expert_scoring, expert_norm_topk, expert_weights_scale};
    r.n_group = expert_groups;
    r.topk_group = expert_groups_used;
    r.group_score = expert_group_score;
    return r;
  }

  // Multi-head latent attention (DeepSeek V2 / V3, kv_lora_rank > 0). The
  // cache keeps one vector per token, [rope(k_pe), norm(c_kv)]: one KV head
  // of head_dim = qk_rope_head_dim + kv_lora_rank; each query head attends
  // in that latent space (the absorbed form, model/families/deepseek2.cpp).
  struct Mla {
    int q_lora_rank = 0;  // 0: one q_proj (V2-Lite)
    int kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
    float yarn_mscale = 0, yarn_mscale_all_dim = 0;  // as config.json states them (the HF writer's)
    // kv_b as one tensor (attn_kv_b: GGUF files converted before llama.cpp
    // split it into attn_k_b / attn_v_b); HF folders and newer files: false.
    bool kv_b_fused = false;
    int64_t q_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
    int64_t latent_dim() const { return qk_rope_head_dim + kv_lora_rank; }
  } mla;
  bool is_mla() const { return mla.kv_lora_rank > 0; }
  // RoPE rotates adjacent pairs in an HF checkpoint (DeepSeek's interleaved RoPE).
  bool rope_pairs_adjacent = false;

  // Linear-attention (Gated DeltaNet) layers (Qwen3.5): is_linear[il] layers
  // keep a fixed-size state instead of K/V; the others are full attention.
  std::vector<bool> is_linear;  // [n_layer], or empty: none
  struct LinearAttn {
    int n_k_heads = 0, n_v_heads = 0, head_k_dim = 0, head_v_dim = 0, conv_kernel = 0;
    // Value heads in llama.cpp's tiled order (GGUF files, dummies) rather
    // than grouped by key head (HF checkpoints): GatedDeltaConfig::key_head.
    bool v_heads_tiled = false;
    int64_t key_dim() const { return static_cast<int64_t>(n_k_heads) * head_k_dim; }
    int64_t value_dim() const { return static_cast<int64_t>(n_v_heads) * head_v_dim; }
    int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  } linear;
  bool layer_is_linear(int il) const { return !is_linear.empty() && is_linear[static_cast<size_t>(il)]; }
  int n_linear_layers() const;

  // KV sharing (Gemma 4's last num_kv_shared_layers): kv_source[il] >= 0 is
  // the earlier layer whose K/V layer il attends over; such a layer keeps no
  // cache of its own and computes no K/V. Empty: every layer keeps its own.
  // The cache holds the layers that keep K/V ("cache layers"), in order.
  std::vector<int32_t> kv_source;  // [n_layer], or empty
  bool layer_reuses_kv(int il) const { return !kv_source.empty() && kv_source[static_cast<size_t>(il)] >= 0; }
  // The layers below il that keep their own K/V: the cache layer of il (when it keeps K/V).
  int cache_layers_before(int il) const;
  // The cache layer layer il reads (its own, or its source's).
  int cache_layer_of(int il) const {
    return cache_layers_before(layer_reuses_kv(il) ? kv_source[static_cast<size_t>(il)] : il);
  }

  // Per-layer input embeddings (Gemma 4's PLE, n_embd_per_layer > 0): a
  // second embedding table of n_layer * n_embd_per_layer per token, plus a
  // projection of the input embedding, give each layer its own input,
  // which gates a residual branch after its FFN.
  int n_embd_per_layer = 0;

  // Global (not sliding-window) layers of their own shape (Gemma 4's
  // global_head_dim and num_global_key_value_heads; 0: head_dim, n_head_kv),
  // whose values may be their keys before the key norm and RoPE (its
  // attention_k_eq_v: no v projection); and per-layer FFN sizes (its
  // double-wide MLP in the shared layers; empty: n_ff everywhere).
  int head_dim_global = 0, n_head_kv_global = 0;
  bool global_v_is_k = false;
  std::vector<int32_t> layer_n_ff;  // [n_layer], or empty
  int layer_head_dim(int il) const { return head_dim_global > 0 && !is_swa_layer(il) ? head_dim_global : head_dim; }
  int layer_n_head_kv(int il) const { return n_head_kv_global > 0 && !is_swa_layer(il) ? n_head_kv_global : n_head_kv; }
  int layer_ff(int il) const { return layer_n_ff.empty() ? n_ff : layer_n_ff[static_cast<size_t>(il)]; }
  bool layer_v_is_k(int il) const { return global_v_is_k && !is_swa_layer(il); }
  bool is_swa_layer(int il) const { return !is_swa.empty() && is_swa[static_cast<size_t>(il)]; }
  // Whether every layer has the model's head_dim, n_head_kv and n_ff.
  bool layers_alike() const { return head_dim_global == 0 && n_head_kv_global == 0 && layer_n_ff.empty(); }
  // The config with layer il's head_dim, n_head_kv and n_ff (its tensors'
  // shapes), or this one where all layers are alike.
  ModelConfig layer_view(int il) const;
  // The largest head_dim, n_head_kv * head_dim and n_ff of any layer (buffer sizes).
  int max_head_dim() const;
  int64_t max_kv_row() const;
  int max_ff() const;

  std::string describe() const;
  // Sizes within ModelSizeLimits (checked before anything is sized from them).
  void check_sizes() const;
  void validate() const;  // check_sizes, then consistency; throws Error
};

// The RoPE divisor of a pair that does not turn (proportional RoPE), as
// llama.cpp's converter writes it.
inline constexpr float kStillRopePair = 1e30f;

// Fills the family's fixed features (flags, activation, RoPE style, SWA rope)
// and derived defaults, then validates. gguf_layout: Q/K stored as GGUF's
// llama converter permutes them (adjacent-pair RoPE for llama).
void finalize_config(ModelConfig& c, bool gguf_layout);

// The divisors of transformers' _compute_llama3_parameters: 1 for short
// wavelengths, `factor` for long ones, interpolated between.
std::vector<float> llama3_rope_factors(const ModelConfig::Llama3Rope& p, float freq_base, int n_rot);

// Reads the architecture's GGUF keys. Throws Error for unknown architectures.
ModelConfig config_from_gguf(const GGUFFile& f);
// Reads a Hugging Face config.json (architectures[0] picks the family).
ModelConfig config_from_hf_json(const std::string& config_json_path);
// A number field of a config.json, or `fallback` when absent or null (for
// family hooks, model/arch.h); throws Error for a field of another type.
double hf_float(const nlohmann::json& j, const char* key, double fallback);
// An integer GGUF key in [lo, hi], or `fallback` when absent (nullopt: the
// key is required); throws Error naming the file and key (for family hooks).
int gguf_size(const GGUFFile& f, const std::string& key, std::optional<int64_t> fallback, int64_t lo, int64_t hi);

}  // namespace pagellm
