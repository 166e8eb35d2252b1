// The shared blocks of a decoder layer's forward pass: attention, the dense
// (gated) FFN and the Mixture-of-Experts FFN, each x += block(x) over the n
// tokens of a step, and the decoder layer that chains them. A family whose
// layer is something else (a different order, MLA, linear attention) gives
// ArchInfo::layer_forward its own function built from these and new blocks.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/lora.h"
#include "model/model_config.h"
#include "model/shard.h"

namespace pagellm {

// One layer's weights: an attention block and a feed-forward block. Which
// tensors a family has is its table (model/families/<family>.cpp).
struct AttnWeights {
  std::unique_ptr<Weight> norm;                 // [n_embd]
  std::unique_ptr<Weight> norm_b;               // [n_embd] LayerNorm bias (BERT), optional
  std::unique_ptr<Weight> wq, wk, wv, wo;       // [n_head*hd, n_embd] ... [n_embd, n_head*hd]
  std::unique_ptr<Weight> bq, bk, bv, bo;       // optional biases
  std::unique_ptr<Weight> q_norm, k_norm;       // [head_dim], optional
  std::unique_ptr<Weight> post_norm;            // [n_embd], optional
  std::unique_ptr<Weight> sinks;                // [n_head] sink logits (gpt-oss), optional
  std::unique_ptr<Weight> wq_gate;              // [n_head*hd, n_embd] output gate (Qwen3.5), optional
  // MLA (DeepSeek; ModelConfig::Mla, R rope dims, D = kv_lora_rank). wq is
  // q_b (or q_proj) with each head's rows reordered [rope | nope].
  std::unique_ptr<Weight> q_a, q_a_norm;        // [q_lora, n_embd], [q_lora]; null without q-LoRA
  std::unique_ptr<Weight> kv_rope;              // [R + D, n_embd]: k_pe rows, then zero rows
  std::unique_ptr<Weight> kv_latent;            // [R + D, n_embd]: zero rows, then c_kv rows
  std::unique_ptr<Weight> kv_norm;              // [R + D]: 0, then kv_a_layernorm's weight rescaled
  // Per head: [rope | nope] query -> [rope | W_UK^T nope] ([R + D, R + nope]),
  // and the latent output's c_kv part -> W_UV ([v, R + D], zero rope columns).
  std::vector<std::unique_ptr<Weight>> q_absorb, o_absorb;
  std::vector<const Weight*> q_absorb_view, o_absorb_view;
  // The expanded form (prefill): per head, the cache vector -> [rope | K nope
  // | V] ([R + nope + v, R + D]: the rope part passes through, then W_UK, W_UV).
  std::vector<std::unique_ptr<Weight>> kv_expand;
  std::vector<const Weight*> kv_expand_view;
};

// A Gated DeltaNet layer's mixer (Qwen3.5), in place of attention; its input
// norm is AttnWeights::norm.
struct LinearAttnWeights {
  std::unique_ptr<Weight> qkv;       // [conv_dim, n_embd]: q, k, v before the conv
  std::unique_ptr<Weight> z;         // [n_v * dv, n_embd]: the output gate
  std::unique_ptr<Weight> beta;      // [n_v, n_embd]: b (beta = sigmoid(b))
  std::unique_ptr<Weight> alpha;     // [n_v, n_embd]: a (the decay's input)
  std::unique_ptr<Weight> conv;      // [conv_dim * K] taps, channel-major
  std::unique_ptr<Weight> ssm_a;     // [n_v]: -exp(A_log)
  std::unique_ptr<Weight> dt_bias;   // [n_v]
  std::unique_ptr<Weight> norm;      // [dv]: RMSNorm of each head's output (plain weight)
  std::unique_ptr<Weight> out;       // [n_embd, n_v * dv]
};

struct FfnWeights {
  std::unique_ptr<Weight> norm;                 // [n_embd]
  std::unique_ptr<Weight> norm_b;               // [n_embd] LayerNorm bias (BERT), optional
  std::unique_ptr<Weight> up_b, down_b;         // [n_ff], [n_embd] biases (BERT), optional
  std::unique_ptr<Weight> gate, up, down;       // [n_ff, n_embd] x2, [n_embd, n_ff] (dense)
  std::unique_ptr<Weight> post_norm;            // [n_embd], optional
  // Mixture of experts (moe_ffn_block).
  std::unique_ptr<Weight> router;                          // [n_expert, n_embd]
  std::unique_ptr<Weight> router_bias;                     // [n_expert], optional (gpt-oss)
  std::unique_ptr<Weight> router_choice_bias;              // [n_expert], optional (DeepSeek V3)
  std::vector<std::unique_ptr<Weight>> gate_exps, up_exps, down_exps;  // [n_expert] of [n_ff_exp, n_embd] ...
  std::vector<std::unique_ptr<Weight>> gate_exps_b, up_exps_b, down_exps_b;  // per-expert biases, optional
  std::unique_ptr<Weight> gate_shexp, up_shexp, down_shexp;  // shared expert, optional
  std::unique_ptr<Weight> shexp_gate;                      // [1, n_embd]
  // Gemma 4: the dense MLP beside the experts (post_norm1), the experts'
  // own norms before and after, and the router input's scale.
  std::unique_ptr<Weight> post_norm1, norm2, post_norm2, router_in_scale;  // [n_embd]
  // Views for matmul_experts (pointers into the vectors above).
  std::vector<const Weight*> gate_view, up_view, down_view;
  std::vector<const Weight*> gate_b_view, up_b_view, down_b_view;  // empty: no biases
};

// A layer's branch of per-layer embeddings (Gemma 4's PLE).
struct PleWeights {
  std::unique_ptr<Weight> gate;       // [P, n_embd]: the residual's gate
  std::unique_ptr<Weight> proj;       // [n_embd, P]: back to the residual
  std::unique_ptr<Weight> post_norm;  // [n_embd]
};

struct LayerWeights {
  AttnWeights attn;
  LinearAttnWeights lin;  // linear-attention layers only
  FfnWeights ffn;
  PleWeights ple;         // per-layer embeddings only
  std::unique_ptr<Weight> out_scale_w;  // [1] (Gemma 4's layer_scalar), optional
  float out_scale = 1.0f;               // its value: the layer's output is multiplied by it
};

// Activation buffers in backend memory (the model grows them on demand).
struct ActivationBuffers {
  int64_t cap_tokens = 0, cap_logits = 0;
  BufferPtr x;       // [n, n_embd] residual stream
  BufferPtr h;       // [n, n_embd] normed input
  BufferPtr q;       // [n, n_head * hd]
  BufferPtr k;       // [n, n_head_kv * hd]
  BufferPtr v;       // [n, n_head_kv * hd]
  BufferPtr attn;    // [n, n_head * hd]
  BufferPtr o;       // [n, n_embd]
  BufferPtr gate;    // [n, n_ff]
  BufferPtr up;      // [n, n_ff]
  BufferPtr sel;     // [m, n_embd] rows that produce logits
  BufferPtr logits;  // [m, n_vocab]
  BufferPtr sampled; // [m] token ids drawn on the device (I32)
  // Mixture of experts (k = n_expert_used; empty for dense models).
  BufferPtr router;  // [n, n_expert] router logits
  BufferPtr ids;     // [n, k] chosen experts (I32)
  BufferPtr route_w; // [n, k] their weights
  BufferPtr eg, eu;  // [n * k, n_ff_exp] expert gate / up
  BufferPtr ed;      // [n * k, n_embd] expert outputs
  BufferPtr sh;      // [n, n_embd] shared expert output
  BufferPtr sg;      // [n] shared expert gate logits
  // Gated attention's output gate and Gated DeltaNet layers (empty otherwise).
  BufferPtr qgate;    // [n, n_head * hd]
  BufferPtr lin_qkv;  // [n, conv_dim] projected q, k, v
  BufferPtr lin_conv; // [n, conv_dim] after the causal conv
  BufferPtr lin_z;    // [n, n_v * dv]
  BufferPtr lin_a, lin_b;  // [n, n_v]
  BufferPtr lin_out;  // [n, n_v * dv]
  // MLA (empty otherwise).
  BufferPtr mla_qa;     // [n, q_lora]
  BufferPtr mla_kv;     // [n, R + D] the cache vector
  BufferPtr mla_kv2;    // [n, R + D] its latent half, before the sum
  BufferPtr mla_q;      // [n, n_head * (R + D)] absorbed queries, or [n, n_head * (R + nope + v)] expanded K, V
  BufferPtr mla_o;      // [n, n_head * v]
  BufferPtr mla_heads;  // I32 [n, n_head]: 0 .. n_head - 1 per row (the per-head products' "routes")
  // MLA's expanded form after cached keys: every key of the expanded
  // sequences (MlaPlan::context_rows <= cap_context), allocated on first use.
  BufferPtr mla_ctx;        // [rows, R + D] their cache vectors (gather_kv)
  BufferPtr mla_ctx_kv;     // [rows, n_head * (R + nope + v)] each head's K, V
  BufferPtr mla_ctx_heads;  // I32 [rows, n_head], as mla_heads
  int64_t cap_context = 0;
  // Per-layer embeddings (empty otherwise).
  BufferPtr ple;        // [n, n_layer * P]: every layer's input
  BufferPtr ple_tok;    // [n, n_layer * P]: the table's part of it
  BufferPtr ple_layer;  // [n, P]: this layer's
  BufferPtr ple_gate;   // [n, P]
  // LoRA (empty without adapters): each row's slot, A's products, B's.
  BufferPtr lora_ids;   // I32 [n]
  BufferPtr lora_t;     // [n, max rank]
  BufferPtr lora_d;     // [n, the widest target's rows]
};

// The forms multi-head latent attention takes in a step (Model::begin_pass
// chooses): Absorbed (attention over the cached latent), Expanded (every
// sequence: attention over each head's keys and values made from the
// latent, attention_kv), or Both (the sequences `expanded` marks expanded,
// the others absorbed).
enum class MlaForm { Absorbed, Expanded, Both };
struct MlaPlan {
  MlaForm form = MlaForm::Absorbed;
  std::vector<uint8_t> expanded;  // per sequence of the batch (empty: Absorbed)
  // Some expanded sequence has cached keys: every key of the expanded
  // sequences comes from the cache (gather_kv), context_rows of them, not
  // from the step's latent.
  bool context = false;
  int64_t context_rows = 0;
};

// What a block reads and writes during one pass: the config, this rank's
// share of the model (heads, FFN units, layers), the backend, the
// activations, the weights, and the tensor-parallel sum of a buffer's first
// `values` floats (nothing on one rank).
struct LayerPass {
  const ModelConfig& cfg;
  const ShardGeometry& geo;
  Backend& be;
  ActivationBuffers& buf;
  const std::vector<LayerWeights>& layers;
  std::function<void(Buffer& buf, int64_t values)> all_reduce;
  const LoraPass* lora = nullptr;  // the pass's adapters; null: no row has one
  const MlaPlan* mla = nullptr;  // null: absorbed
};

// x -> norm -> q, k, v -> (biases, q/k norm) -> rope -> cache -> attend ->
// (* sigmoid(output gate)) -> o -> (bias, post norm) -> x += o.
void attention_block(const LayerPass& p, int il, int64_t n);
// Gated DeltaNet (Qwen3.5's linear attention): x -> norm -> q, k, v (one
// projection), z, a, b -> causal conv + SiLU of q, k, v -> gated delta rule
// from the sequence's state -> per-head RMSNorm * silu(z) -> out -> x += out.
void linear_attention_block(const LayerPass& p, int il, int64_t n);
// Multi-head latent attention (DeepSeek V2 / V3): x -> norm -> q (q-LoRA:
// q_a, norm, q_b) -> rope of each head's rope part; the token's cache vector
// [rope(k_pe), norm(c_kv)] (one KV head). Absorbed form (decode, and any
// step with cached keys): per head [rope | W_UK^T nope] -> attention in the
// latent space -> per head W_UV of the c_kv part. Expanded form (long
// prompts and prompt chunks, LayerPass::mla): each head's K [rope | W_UK
// c_kv] and V W_UV c_kv from the step's cache vectors, or from all the
// sequence's cached ones after cached keys -> attention over those. Then o
// -> x += o.
void mla_attention_block(const LayerPass& p, int il, int64_t n);
// The latent's norm runs over the zero-padded row [0 (R), c_kv (D)]: its
// epsilon and the factor its weight is multiplied by at load.
float mla_kv_norm_eps(const ModelConfig::Mla& m, float eps);
float mla_kv_norm_weight_scale(const ModelConfig::Mla& m);
// x -> norm -> act(gate) * up -> down -> (post norm) -> x += out.
void dense_ffn_block(const LayerPass& p, int il, int64_t n);
// x -> norm -> router -> top-k experts, each act(gate) * up -> down, summed
// with the router's weights (+ the shared expert, scaled by its sigmoid
// gate) -> (post norm) -> x += out.
void moe_ffn_block(const LayerPass& p, int il, int64_t n);
// out = down(act(gate(h)) * up(h)) of the normed input buf.h, n_ff hidden
// units; with lora_layer >= 0, that layer's adapters on gate, up and down.
void glu_ffn(const LayerPass& p, const Weight& gate, const Weight& up, const Weight& down, int64_t n, int64_t n_ff,
             Buffer& out, int lora_layer = -1);
// y[i] += B (A x[i]) of row i's adapter (LoRA) on layer il's projection t;
// nothing when the pass has no adapters or none targets it.
void lora_add(const LayerPass& p, int il, LoraTarget t, const Buffer& x, int64_t n, Buffer& y);
// The shared decoder layer: attention, then the MoE FFN when the config has
// experts, else the dense one.
void decoder_layer(const LayerPass& p, int il, int64_t n);
// A hybrid layer: linear attention where cfg.is_linear says, else attention,
// then the FFN (Qwen3.5).
void hybrid_decoder_layer(const LayerPass& p, int il, int64_t n);

}  // namespace pagellm
