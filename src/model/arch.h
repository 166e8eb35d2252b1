// One table entry per model family, in the spirit of llama.cpp's llama-arch:
// the GGUF architecture name, the Hugging Face classes, the family's fixed
// features and config defaults, every tensor with its GGUF and HF names,
// shape, presence rule and load-time transform, the family's config quirks
// (hooks), its dummy shapes and, when the shared decoder layer does not fit,
// its own layer. The loader, the dummy-weight generator, the HF writer and the
// safetensors source all read it. Each family is one file,
// src/model/families/<family>.cpp; family.cpp lists them
// (docs/adding-a-model.md).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model_config.h"

namespace pagellm {

class GGUFFile;
class TensorSource;
struct LayerPass;

// Where a loaded tensor goes (Model's weight slots). Global tensors, then
// one layer's attention block, then its feed-forward block.
enum class Slot {
  TokEmbd, OutputNorm, Output, RopeFreqs, RopeFactorsShort, RopeFactorsLong,
  AttnNorm, Q, K, V, O, QBias, KBias, VBias, OBias, QNorm, KNorm, PostAttnNorm, AttnSinks,
  FfnNorm, Gate, Up, Down, PostFfnNorm,
  // Mixture of experts: the router, the experts (TensorSpec::experts), and
  // the shared expert with its gate.
  Router, GateExps, UpExps, DownExps, GateShexp, UpShexp, DownShexp, ShexpGate,
  // gpt-oss: biases of the router and of every expert's three products.
  RouterBias, GateExpsBias, UpExpsBias, DownExpsBias,
  // Qwen3.5: the gated attention's output gate (the second half of each head
  // of q_proj), and a Gated DeltaNet layer's tensors.
  QGate, LinQkv, LinZ, LinBeta, LinAlpha, LinConv, LinA, LinDtBias, LinNorm, LinOut,
  // DeepSeek: the router's choice bias, and MLA: q-LoRA's down projection
  // and norm, then the weights derived at load (Need::Derived) for the
  // absorbed form (model/families/deepseek2.cpp).
  RouterChoiceBias, MlaQA, MlaQANorm, MlaKvRope, MlaKvLatent, MlaKvNorm, MlaQAbsorb, MlaOAbsorb, MlaKvExpand,
  // Gemma 4: per-layer embeddings (the table, the input embedding's
  // projection and its norm; per layer the gate, the projection back and
  // its norm), V's unweighted norm has no tensor; the layer's output scale.
  PleTokEmbd, PleModelProj, PleProjNorm, PleGate, PleProj, PlePostNorm, LayerOutScale,
  // Gemma 4's MoE block: the router input's scale, the dense MLP's own post
  // norm, the experts' pre and post norms (the expert scales are folded into
  // the experts' down projections at load).
  RouterInScale, PostFfnNorm1, FfnNorm2, PostFfnNorm2,
  // Encoders (BERT): the learned position table and the token-type table
  // (both kept on the host: the model adds a row of each per token), the
  // embeddings' LayerNorm, and the biases of the LayerNorms and FFN.
  PosEmbd, TokTypes, TokEmbdNorm, TokEmbdNormBias, AttnNormBias, FfnNormBias, UpBias, DownBias,
  // Read (and checked) but not uploaded: what derived weights are made from.
  Unused,
};

// When a tensor must be in the file.
enum class Need {
  Required,
  Optional,    // loaded when present (output.weight: absent means tied)
  IfQkvBias,   // required when cfg.qkv_bias, else loaded when present
  IfQkNorm,    // required when cfg.qk_norm
  IfPostNorms, // required when cfg.post_norms
  IfDense,     // required when the config has no experts (the dense FFN)
  IfMoe,       // required when cfg.n_expert > 0
  IfSharedExpert,  // required when cfg.n_ff_shexp > 0
  IfLinearLayer,   // required in linear-attention layers (cfg.is_linear), absent in the others
  IfAttnLayer,     // required in full-attention layers of a model with linear ones, absent in those
  IfQLora,         // MLA with q-LoRA (q_lora_rank > 0): required, absent otherwise
  IfNoQLora,       // MLA without q-LoRA: required, absent otherwise
  IfChoiceBias,    // required when cfg.expert_choice_bias (in MoE layers)
  IfKvBSplit,      // MLA's kv_b as llama.cpp writes it now (attn_k_b, attn_v_b): required, absent otherwise
  IfKvBFused,      // MLA's kv_b in one tensor (GGUF files from before that split): required, absent otherwise
  IfOwnKv,         // required in layers that keep their own K/V, absent in those that reuse another's (kv_source)
  IfOwnV,          // IfOwnKv, and absent where values are the keys (ModelConfig::layer_v_is_k)
  IfPle,           // required with per-layer embeddings (n_embd_per_layer > 0), absent otherwise
  IfClassifier,    // a sequence classifier's head (n_cls_out > 0): required, else loaded when present
  // Not in files: computed at load from the layer's other tensors
  // (ArchInfo::derive_tensors); no HF name, no dummy values.
  Derived,
};

// How a tensor differs between the GGUF layout (what the forward pass
// computes with) and the HF checkpoint.
enum class Transform {
  None,
  // Gemma's RMSNorm multiplies by (1 + w); GGUF stores w + 1, so HF weights
  // get 1 added at load (and the HF writer subtracts it).
  NormPlusOne,
  // GGUF llama files permute Q/K rows per head for adjacent-pair RoPE; HF
  // rotates halves. The loader keeps each file's layout (cfg.rope.neox says
  // which); the HF writer un-permutes GGUF rows.
  RopePermute,
  // gpt-oss checkpoints stack the experts in one tensor, multiplied as
  // x @ W ([n_expert, in, out]); the source transposes each expert.
  ExpertsInOut,
  // ... and gate and up in one [n_expert, in, 2 * out] tensor, interleaved:
  // gate the even columns, up the odd ones (the same for its bias [n_expert, 2 * out]).
  GateUpEven,
  GateUpOdd,
  // Stacked experts in nn.Linear's orientation ([n_expert, out, in], GGUF's
  // own layout) with gate and up fused as halves of the rows: [n_expert,
  // 2 * ff, in], gate first (Qwen3.5-MoE, transformers 5's fused experts).
  GateUpFirstHalf,
  GateUpSecondHalf,
  // Gated DeltaNet's A_log: GGUF files (and the kernels) hold -exp(A_log).
  NegExp,
  // Qwen3.5's depthwise conv1d weight [conv_dim, 1, K] is GGUF's [K, conv_dim]
  // (F32): conv_dim rows of K taps.
  ConvTaps,
  // MLA's kv_b_proj ([n_head * (nope + v), kv_lora] in HF) as llama.cpp's
  // converter splits it: per head, the key rows transposed (attn_k_b, ne
  // [nope, kv_lora, n_head]) and the value rows (attn_v_b, [kv_lora, v, n_head]).
  KvBKeys,
  KvBValues,
  // Qwen3-Next's in_proj_qkvz: per key head [q | k | v | z] rows (v and z
  // that key head's value heads); GGUF holds [all q | all k | all v] (attn_qkv,
  // QkvzQkv) and [all z] (attn_gate, QkvzZ), as llama.cpp's converter regroups it.
  QkvzQkv,
  QkvzZ,
  // A learned position table whose first ModelConfig::hf_pos_offset rows
  // (RoBERTa's padding row and the one before it) come before position 0 in
  // HF checkpoints: the source drops them, the HF writer puts zero rows back.
  PositionOffset,
  // A token-type table of which only row 0 is read: RoBERTa's tokenizers give
  // no token_type_ids, so transformers adds type 0 to every token (whatever
  // type_vocab_size says); the source keeps that row alone.
  FirstRowOnly,
};

// Linear-attention tensors with a value-head axis, which llama.cpp's
// converter stores in tiled order (ModelConfig::LinearAttn::v_heads_tiled):
// the HF writer regroups them. Rows: the last n_v_heads units of rows (a
// head_v_dim run each, or one row when there are n_v_heads rows; a vector's
// elements count as rows); Cols: the columns, head_v_dim each.
enum class VHeads { None, Rows, Cols };

using Dims = std::vector<int64_t>;  // ne order: Dims[0] is the row length

struct TensorSpec {
  const char* gguf;  // "attn_q.weight" (per layer: after "blk.N.")
  const char* hf;    // "self_attn.q_proj.weight" (per layer: after "model.layers.N."); "" when HF has none
  Dims (*shape)(const ModelConfig&);
  Need need = Need::Required;
  Transform transform = Transform::None;
  // Where it is loaded. A fused tensor (Phi-3's qkv) lists several slots and
  // split_rows gives each one's rows, in storage order: each part is uploaded
  // as its own Weight from a row range of the one tensor.
  std::vector<Slot> slots;
  std::vector<int64_t> (*split_rows)(const ModelConfig&) = nullptr;
  // A weight matrix (random dummy values scaled by 1/sqrt(cols)) rather than
  // a norm weight or bias.
  bool matrix = false;
  // One matrix (or bias vector) per expert: GGUF stacks them ([cols, rows,
  // n_expert] or [cols, n_expert], shape gives that); HF names each one ("{}"
  // in `hf` is the expert index) or, without "{}", stacks them too (gpt-oss).
  bool experts = false;
  // llama.cpp's quantizer keeps it F32 (MoE routers): so do quantized dummies.
  bool keep_f32 = false;
  // The parts alternate every head rather than follow each other (Qwen3.5's
  // q_proj, [q | gate] per head): part k is each head's k-th run of
  // split_rows(c)[k] / n_head rows.
  bool split_per_head = false;
  VHeads vheads = VHeads::None;
  // With split_per_head: how many heads the parts alternate over (null:
  // n_head; Qwen3-Next's in_proj_ba: the linear layers' key heads).
  int (*split_heads)(const ModelConfig&) = nullptr;
};

// How config.json marks sliding-window layers.
enum class HfSwa {
  None,
  EveryLayer,   // Mistral v0.1: every layer when sliding_window is set
  UseFlag,      // Qwen: use_sliding_window, then layer_types or max_window_layers
  Pattern,      // Gemma: layer_types or every sliding_window_pattern-th layer global
};

struct HfClass {
  const char* name;  // architectures[0]
  HfSwa swa = HfSwa::None;
};


// transformers' config-class defaults for fields a config.json may omit.
// nullopt: the field is required (or derived: num_key_value_heads defaults
// to num_attention_heads, head_dim to hidden_size / num_attention_heads).
struct HfDefaults {
  std::optional<int> vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
      intermediate_size, head_dim;
  std::optional<int> max_position_embeddings = 2048;
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  const char* hidden_act = "silu";
  int sliding_window = 0;             // Gemma: the window when config.json omits it
  float query_pre_attn_scalar = 0;    // > 0: attention scale is its inverse square root
  float attn_logit_softcapping = 0, final_logit_softcapping = 0;  // when absent (null: none)
  // rope_parameters (JSON) when config.json states no RoPE scaling (gpt-oss: YaRN).
  const char* rope_parameters = nullptr;
};

// How the HF writer states a MoE config's experts.
enum class HfMoeKeys {
  Routed,        // Qwen-MoE: num_experts, moe_intermediate_size, shared expert, norm_topk_prob
  LocalExperts,  // Mixtral, gpt-oss: num_local_experts of intermediate_size, always renormalised
};

// A named dummy model of the family (model/dummy.h): real shapes for
// benchmarks, tiny ones for tests (sized so K-quants fit: every matrix has a
// multiple of 256 inputs).
struct DummyShape {
  const char* name;
  int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ctx;
  float rope_base, norm_eps;
  bool tied;
  int sliding_window;
  int n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;  // Mixture of experts
  // What the shape sets beyond the fields above (RoPE scaling, caps), or null.
  void (*extras)(ModelConfig&) = nullptr;
};

struct ArchInfo {
  Arch arch = Arch::Llama;
  const char* gguf_name = "";      // general.architecture
  const char* hf_model_type = "";  // config.json model_type the HF writer writes
  std::vector<HfClass> hf_classes;  // [0] is what the HF writer writes

  // Fixed features of the family (finalize_config applies them).
  bool qkv_bias = false;
  bool qk_norm = false;
  bool post_norms = false;
  Activation act = Activation::Silu;
  bool embd_scale_sqrt = false;    // token embeddings times sqrt(n_embd)
  bool gguf_permuted_qk = false;   // GGUF stores Q/K for adjacent-pair RoPE
  bool softcaps = false;           // reads attn/final logit softcapping (GGUF keys, config.json fields)
  int swa_pattern = 0;             // > 0: every swa_pattern-th layer is global, the rest sliding
  bool swa_every_layer = false;    // a GGUF sliding_window applies to every layer (Phi-3)
  bool partial_rotary = false;     // config.json may set partial_rotary_factor < 1
  float swa_rope_base = 0;         // > 0: RoPE base of sliding-window layers (no scaling there)
  int gguf_sliding_window = 0;     // window when a GGUF with swa layers omits it (0: no window key read)
  bool attn_sinks = false;         // a learned sink logit per head (gpt-oss)
  bool attn_out_gate = false;      // q_proj also gives a sigmoid output gate per head (Qwen3.5)
  bool non_causal = false;         // bidirectional attention: an encoder (ModelConfig::non_causal)
  // GGUF files of this family carry another family's architecture name, whose
  // layout they share (llama.cpp's converter writes XLM-RoBERTa as "bert"):
  // arch_by_gguf_name finds that family, never this one.
  bool gguf_shared = false;
  // HF parameter names: where the layers are ("encoder.layer." for BERT),
  // and a prefix a task head's class puts before the base model's names
  // ("bert." in BertForSequenceClassification), or null.
  const char* hf_layers = "model.layers.";
  const char* hf_base_prefix = nullptr;
  // Backend ops the family's layer runs beyond every family's (asked at load).
  std::vector<pglb_op> extra_ops;
  bool moe = false;            // layers may be Mixture-of-Experts (n_expert > 0)
  bool moe_only = false;       // ... and must be (Qwen-MoE files always have experts)
  bool moe_norm_topk = false;  // renormalise the chosen experts' weights when the file does not say
  bool hf_mxfp4_experts = false;  // HF checkpoints may ship MXFP4 experts (quant_method mxfp4: gpt-oss)
  bool gguf_expert_ff_key = true;  // GGUF states expert_feed_forward_length (Mixtral-style llama files do not)
  // GGUF key/value lengths describe an MLA latent cache and the YaRN log
  // multiplier is DeepSeek's mscale: read_gguf reads them (deepseek2).
  bool gguf_mla = false;
  // Gemma 4's GGUF keys: head_count_kv and feed_forward_length may be
  // per-layer arrays (the config takes layer 0's, read_gguf the rest), and
  // key_length is the global layers' head, *_swa the local layers'.
  bool gguf_layer_sizes = false;
  HfDefaults hf;

  // The HF writer: a MoE config is written as hf_moe_class / hf_moe_model_type
  // when set (Llama with experts is Mixtral), its experts as hf_moe_keys says.
  const char* hf_moe_class = nullptr;
  const char* hf_moe_model_type = nullptr;
  HfMoeKeys hf_moe_keys = HfMoeKeys::Routed;
  const char* hf_moe_name = "";  // in the writer's errors ("Mixtral")

  std::vector<TensorSpec> globals;  // token_embd, output_norm, ...
  std::vector<TensorSpec> layer;    // one layer's tensors (attention, then FFN)

  // Family hooks; null: nothing beyond the shared rules.
  // config.json fields only this family has, read after the shared ones
  // (inside config_from_hf_json's JSON error handling; throws Error).
  void (*read_hf)(const nlohmann::json& j, ModelConfig& c, const std::string& path) = nullptr;
  // GGUF keys or rules only this family has, applied before finalize_config.
  void (*read_gguf)(const GGUFFile& f, ModelConfig& c) = nullptr;
  // config.json fields only this family has (activation name, sliding
  // layers, ...), written after the shared ones; throws Error for a config
  // the family's HF class cannot express.
  void (*write_hf)(const ModelConfig& c, nlohmann::ordered_json& j) = nullptr;
  // One layer of the forward pass; null: the shared decoder layer
  // (model/blocks.h: attention, then the dense or MoE FFN).
  void (*layer_forward)(const LayerPass& p, int il, int64_t n) = nullptr;
  // ... which applies LoRA adapters itself (lora_add after its q/k/v/o, the
  // layer index to glu_ffn); others than the shared layers refuse adapters.
  bool layer_applies_lora = false;
  // The tensors of the table's Need::Derived specs, made at load from the
  // file's (the returned source serves them and everything `src` has; it
  // lives as long as the model).
  std::unique_ptr<TensorSource> (*derive_tensors)(const ModelConfig& c, const TensorSource& src) = nullptr;

  std::vector<DummyShape> dummy_shapes;
};

// The sizes every family has, in the order they are read, and where each
// format keeps them. A size absent from a file takes, in this order: the
// format's default here (GGUF) or the family's HfDefaults (HF), then the
// derived value, else it is an error.
enum class Derived { None, HeadCount, EmbdOverHeads };
struct SizeParam {
  int ModelConfig::*field;
  const char* name;  // in error messages about ModelConfig ("n_layer")
  const char* gguf;  // key after "<arch>."
  const char* hf;    // config.json key
  int64_t max;
  std::optional<int> gguf_default;
  std::optional<int> HfDefaults::*hf_default;
  Derived derived = Derived::None;
};
const std::vector<SizeParam>& size_params();

const std::vector<ArchInfo>& all_archs();
const ArchInfo& arch_info(Arch a);
const ArchInfo* arch_by_gguf_name(const std::string& name);
const ArchInfo* arch_by_hf_class(const std::string& cls, HfSwa* swa = nullptr);
// "llama, qwen2, ..." / "LlamaForCausalLM, ..." for error messages.
std::string supported_gguf_names();
std::string supported_hf_classes();

// RoPE divisor tensors (rope_freqs, LongRoPE's short / long sets): GGUF
// files store them, HF configs state or imply them. The values a config
// gives for such a slot (empty: none), or null for any other slot.
const std::vector<float>* config_rope_factors(const ModelConfig& c, Slot s);

// Whether the tensor must be present for this config (il: its layer, -1 for
// a global).
bool tensor_required(const TensorSpec& t, const ModelConfig& c, int il = -1);
// Whether a layer tensor belongs in layer il at all (a linear-attention layer
// has no q_proj, a full-attention one no conv1d); loaded only where it does.
bool tensor_in_layer(const TensorSpec& t, const ModelConfig& c, int il);
// The GGUF tensor name of a per-layer spec ("blk.3.attn_q.weight").
std::string layer_tensor_name(const TensorSpec& t, int il);

// An HF checkpoint tensor name resolved against the table.
struct HfTensor {
  std::string gguf;  // GGUF name ("blk.3.attn_q.weight")
  const TensorSpec* spec;
  // One expert's own matrix standing in for a stacked spec (gguf ends in
  // "[e]"): used as it is, without the spec's transform.
  bool one_expert = false;
};
// HF parameter name -> its tensor, or nullopt when the model does not use it.
// Accepts the prefixes multimodal checkpoints put before "model."
// ("language_model.model.", "model.language_model.").
std::optional<HfTensor> hf_tensor(const ArchInfo& a, const std::string& hf_name);
// Every tensor an HF parameter holds: one, or two for a fused gate_up that
// the table splits (gpt-oss), in table order. A table stating experts
// stacked as transformers 5 keeps them (".experts.gate_up_proj" split in
// halves, ".experts.down_proj") also takes them one per expert, as released
// checkpoints ship them (".experts.{e}.gate_proj.weight", "up_proj",
// "down_proj"; transformers merges these on load the same way).
std::vector<HfTensor> hf_tensors(const ArchInfo& a, const std::string& hf_name);

}  // namespace pagellm
