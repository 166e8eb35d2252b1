#include "model/blocks.h"

#include <cmath>

#include "core/error.h"

namespace pagellm {

void attention_block(const LayerPass& p, int il, int64_t n) {
  const ModelConfig& c = p.cfg;
  const AttnWeights& A = p.layers[il].attn;
  Backend& be = p.be;
  ActivationBuffers& buf = p.buf;
  const int hd = c.head_dim;
  const bool swa = c.is_swa[il];
  const int n_head = p.geo.n_head, n_head_kv = p.geo.n_head_kv;  // this rank's heads
  const int kv_layer = il - p.geo.layer_begin;                   // this stage's cache holds its layers only

  be.rms_norm(*buf.x, A.norm.get(), n, c.n_embd, c.norm_eps, *buf.h);
  be.matmul(*A.wq, *buf.h, n, *buf.q);
  be.matmul(*A.wk, *buf.h, n, *buf.k);
  be.matmul(*A.wv, *buf.h, n, *buf.v);
  lora_add(p, il, LoraTarget::Q, *buf.h, n, *buf.q);
  lora_add(p, il, LoraTarget::K, *buf.h, n, *buf.k);
  lora_add(p, il, LoraTarget::V, *buf.h, n, *buf.v);
  if (A.bq) {
    be.add_bias(*buf.q, *A.bq, n);
    be.add_bias(*buf.k, *A.bk, n);
    be.add_bias(*buf.v, *A.bv, n);
  }
  if (A.q_norm) {
    be.rms_norm(*buf.q, A.q_norm.get(), n * n_head, hd, c.norm_eps, *buf.q);
    be.rms_norm(*buf.k, A.k_norm.get(), n * n_head_kv, hd, c.norm_eps, *buf.k);
  }
  const RopeConfig& rope = swa ? c.rope_swa : c.rope;
  be.rope(*buf.q, n_head, hd, rope);
  be.store_kv(kv_layer, *buf.k, *buf.v, &rope);  // k rotated as it is written
  AttentionConfig ac;
  ac.n_head = n_head;
  ac.n_head_kv = n_head_kv;
  ac.head_dim = hd;
  ac.scale = c.attn_scale;
  ac.sliding_window = swa ? c.attention_window() : 0;
  ac.softcap = c.attn_softcap;
  ac.sinks = A.sinks.get();
  ac.non_causal = c.non_causal;
  be.attention(kv_layer, *buf.q, *buf.attn, ac);
  if (A.wq_gate) {
    be.matmul(*A.wq_gate, *buf.h, n, *buf.qgate);
    lora_add(p, il, LoraTarget::QGate, *buf.h, n, *buf.qgate);
    be.glu(*buf.qgate, *buf.attn, n * n_head * hd, Activation::Sigmoid, *buf.attn);
  }
  be.matmul(*A.wo, *buf.attn, n, *buf.o);
  lora_add(p, il, LoraTarget::O, *buf.attn, n, *buf.o);
  p.all_reduce(*buf.o, n * c.n_embd);  // row-parallel O: each rank's heads' share
  if (A.bo) be.add_bias(*buf.o, *A.bo, n);
  if (A.post_norm) be.rms_norm(*buf.o, A.post_norm.get(), n, c.n_embd, c.norm_eps, *buf.o);
  be.add(*buf.x, *buf.o, n * c.n_embd);
}

void linear_attention_block(const LayerPass& p, int il, int64_t n) {
  const ModelConfig& c = p.cfg;
  const AttnWeights& A = p.layers[il].attn;
  const LinearAttnWeights& L = p.layers[il].lin;
  Backend& be = p.be;
  ActivationBuffers& buf = p.buf;
  const ModelConfig::LinearAttn& la = p.geo.lin;  // this rank's heads
  const int state_layer = il - p.geo.layer_begin;  // this stage's layer, as the cache spec numbers them
  be.rms_norm(*buf.x, A.norm.get(), n, c.n_embd, c.norm_eps, *buf.h);
  be.matmul(*L.qkv, *buf.h, n, *buf.lin_qkv);
  be.matmul(*L.z, *buf.h, n, *buf.lin_z);
  be.matmul(*L.beta, *buf.h, n, *buf.lin_b);
  be.matmul(*L.alpha, *buf.h, n, *buf.lin_a);
  be.causal_conv1d(state_layer, *buf.lin_qkv, *L.conv, nullptr, *buf.lin_conv);
  GatedDeltaConfig g;
  g.n_k_heads = la.n_k_heads;
  g.n_v_heads = la.n_v_heads;
  g.head_k_dim = la.head_k_dim;
  g.head_v_dim = la.head_v_dim;
  g.scale = 1.0f / std::sqrt(static_cast<float>(la.head_k_dim));
  g.v_heads_tiled = la.v_heads_tiled;
  be.gated_delta_rule(state_layer, *buf.lin_conv, *buf.lin_a, *buf.lin_b, *L.ssm_a, *L.dt_bias, g, *buf.lin_out);
  be.rms_norm(*buf.lin_out, L.norm.get(), n * la.n_v_heads, la.head_v_dim, c.norm_eps, *buf.lin_out);
  be.glu(*buf.lin_z, *buf.lin_out, n * la.value_dim(), Activation::Silu, *buf.lin_out);
  be.matmul(*L.out, *buf.lin_out, n, *buf.o);
  p.all_reduce(*buf.o, n * c.n_embd);  // row-parallel out: each rank's value heads' share
  be.add(*buf.x, *buf.o, n * c.n_embd);
}

// mean(x^2) over the padded row [0 (R), c_kv (D)] is D / (R + D) of c_kv's:
// with eps scaled by that ratio and the weight by its square root, the
// padded norm is c_kv's own.
float mla_kv_norm_eps(const ModelConfig::Mla& m, float eps) {
  return eps * static_cast<float>(m.kv_lora_rank) / static_cast<float>(m.latent_dim());
}

float mla_kv_norm_weight_scale(const ModelConfig::Mla& m) {
  return std::sqrt(static_cast<float>(m.kv_lora_rank) / static_cast<float>(m.latent_dim()));
}

void mla_attention_block(const LayerPass& p, int il, int64_t n) {
  const ModelConfig& c = p.cfg;
  const ModelConfig::Mla& m = c.mla;
  const AttnWeights& A = p.layers[il].attn;
  Backend& be = p.be;
  ActivationBuffers& buf = p.buf;
  const int n_head = p.geo.n_head;  // this rank's query heads; every rank holds the whole latent
  const int64_t latent = m.latent_dim();
  const int kv_layer = il - p.geo.layer_begin;
  // q-LoRA's and the latent's norms are transformers' RMSNorm default (1e-6), not rms_norm_eps.
  constexpr float kLoraNormEps = 1e-6f;

  be.rms_norm(*buf.x, A.norm.get(), n, c.n_embd, c.norm_eps, *buf.h);
  if (A.q_a) {
    be.matmul(*A.q_a, *buf.h, n, *buf.mla_qa);
    be.rms_norm(*buf.mla_qa, A.q_a_norm.get(), n, m.q_lora_rank, kLoraNormEps, *buf.mla_qa);
    be.matmul(*A.wq, *buf.mla_qa, n, *buf.q);
  } else {
    be.matmul(*A.wq, *buf.h, n, *buf.q);
  }
  // Each head is [rope | nope]: the rope op turns its leading dims.
  be.rope(*buf.q, n_head, static_cast<int>(m.q_head_dim()), c.rope);
  const MlaForm form = A.kv_expand_view.empty() || !p.mla ? MlaForm::Absorbed : p.mla->form;
  if (form != MlaForm::Expanded) be.matmul_experts(A.q_absorb_view, *buf.q, n, n_head, true, *buf.mla_heads, *buf.mla_q);

  // The cache vector [k_pe, norm(c_kv)] as the sum of two zero-padded
  // products: the norm over the padded row is the norm over c_kv, as the
  // loader rescales its weight and epsilon (mla_kv_norm_eps).
  be.matmul(*A.kv_rope, *buf.h, n, *buf.mla_kv);
  be.matmul(*A.kv_latent, *buf.h, n, *buf.mla_kv2);
  be.rms_norm(*buf.mla_kv2, A.kv_norm.get(), n, latent, mla_kv_norm_eps(m, kLoraNormEps), *buf.mla_kv2);
  be.add(*buf.mla_kv, *buf.mla_kv2, n * latent);
  // One KV head; V is the same vector (its rope part meets zero columns of o_absorb).
  be.store_kv(kv_layer, *buf.mla_kv, *buf.mla_kv, &c.rope);

  AttentionConfig ac;
  ac.n_head = n_head;
  ac.scale = c.attn_scale;
  if (form != MlaForm::Expanded) {
    AttentionConfig absorbed = ac;
    absorbed.n_head_kv = 1;
    absorbed.head_dim = static_cast<int>(latent);
    if (form == MlaForm::Both) absorbed.kv_seqs = p.mla->expanded;  // attention_kv below writes their rows
    be.attention(kv_layer, *buf.mla_q, *buf.attn, absorbed);
    be.matmul_experts(A.o_absorb_view, *buf.attn, n, n_head, true, *buf.mla_heads, *buf.mla_o);
  }
  if (form != MlaForm::Absorbed) {
    // Per pair of tokens, q_head_dim + v (320) multiply-adds per head instead
    // of the latent's 2 x (R + D) (1152); per token, the expansion costs what
    // the absorbed query and output products do. (mla_q is free again: the
    // absorbed attention above has read it.)
    // After cached keys, every key of the expanded sequences is expanded
    // from the cache: per token of context, what the step's own tokens cost.
    const int64_t qd = m.q_head_dim(), row = qd + m.v_head_dim;
    ac.n_head_kv = n_head;
    ac.head_dim = static_cast<int>(qd);
    ac.kv_seqs = p.mla->expanded;
    const KvRowLayout layout{row, qd, static_cast<int>(m.v_head_dim), p.mla->context};
    if (p.mla->context) {
      be.gather_kv(kv_layer, p.mla->expanded, *buf.mla_ctx);
      be.matmul_experts(A.kv_expand_view, *buf.mla_ctx, p.mla->context_rows, n_head, false, *buf.mla_ctx_heads,
                        *buf.mla_ctx_kv);
      be.attention_kv(*buf.q, *buf.mla_ctx_kv, layout, *buf.mla_o, ac);
    } else {
      be.matmul_experts(A.kv_expand_view, *buf.mla_kv, n, n_head, false, *buf.mla_heads, *buf.mla_q);
      be.attention_kv(*buf.q, *buf.mla_q, layout, *buf.mla_o, ac);
    }
  }
  be.matmul(*A.wo, *buf.mla_o, n, *buf.o);
  p.all_reduce(*buf.o, n * c.n_embd);  // row-parallel O: each rank's heads' share
  be.add(*buf.x, *buf.o, n * c.n_embd);
}


void glu_ffn(const LayerPass& p, const Weight& gate, const Weight& up, const Weight& down, int64_t n, int64_t n_ff,
             Buffer& out, int lora_layer) {
  Backend& be = p.be;
  be.matmul(gate, *p.buf.h, n, *p.buf.gate);
  be.matmul(up, *p.buf.h, n, *p.buf.up);
  if (lora_layer >= 0) {
    lora_add(p, lora_layer, LoraTarget::Gate, *p.buf.h, n, *p.buf.gate);
    lora_add(p, lora_layer, LoraTarget::Up, *p.buf.h, n, *p.buf.up);
  }
  be.glu(*p.buf.gate, *p.buf.up, n * n_ff, p.cfg.act, *p.buf.gate);
  be.matmul(down, *p.buf.gate, n, out);
  if (lora_layer >= 0) lora_add(p, lora_layer, LoraTarget::Down, *p.buf.gate, n, out);
}

void lora_add(const LayerPass& p, int il, LoraTarget t, const Buffer& x, int64_t n, Buffer& y) {
  if (!p.lora) return;
  const auto& a = p.lora->layers[static_cast<size_t>(il)].a[static_cast<size_t>(t)];
  const auto& b = p.lora->layers[static_cast<size_t>(il)].b[static_cast<size_t>(t)];
  if (a.empty()) return;
  // Rows grouped by slot: each adapter's A and B stream once for all its rows.
  p.be.lora_matmul(a, b, x, n, *p.lora->row_slots, y, p.buf.lora_t.get(), p.buf.lora_d.get());
}

void dense_ffn_block(const LayerPass& p, int il, int64_t n) {
  const ModelConfig& c = p.cfg;
  const FfnWeights& F = p.layers[il].ffn;
  Backend& be = p.be;
  ActivationBuffers& buf = p.buf;
  be.rms_norm(*buf.x, F.norm.get(), n, c.n_embd, c.norm_eps, *buf.h);
  glu_ffn(p, *F.gate, *F.up, *F.down, n, p.geo.ff_units(il), *buf.o, il);
  p.all_reduce(*buf.o, n * c.n_embd);  // row-parallel down
  if (F.post_norm) be.rms_norm(*buf.o, F.post_norm.get(), n, c.n_embd, c.norm_eps, *buf.o);
  be.add(*buf.x, *buf.o, n * c.n_embd);
}

void moe_ffn_block(const LayerPass& p, int il, int64_t n) {
  const ModelConfig& c = p.cfg;
  const FfnWeights& F = p.layers[il].ffn;
  Backend& be = p.be;
  ActivationBuffers& buf = p.buf;
  const int k = c.n_expert_used;
  be.rms_norm(*buf.x, F.norm.get(), n, c.n_embd, c.norm_eps, *buf.h);
  be.matmul(*F.router, *buf.h, n, *buf.router);
  if (F.router_bias) be.add_bias(*buf.router, *F.router_bias, n);
  MoeRouting routing = c.routing();
  routing.choice_bias = F.router_choice_bias.get();
  be.moe_route(*buf.router, n, routing, *buf.ids, *buf.route_w);
  be.matmul_experts(F.gate_view, *buf.h, n, k, false, *buf.ids, *buf.eg, F.gate_b_view);
  be.matmul_experts(F.up_view, *buf.h, n, k, false, *buf.ids, *buf.eu, F.up_b_view);
  be.glu(*buf.eg, *buf.eu, n * k * p.geo.n_ff_exp, c.act, *buf.eg);
  be.matmul_experts(F.down_view, *buf.eg, n, k, true, *buf.ids, *buf.ed, F.down_b_view);
  be.moe_combine(*buf.ed, *buf.route_w, n, k, c.n_embd, *buf.o);
  if (F.gate_shexp) {
    glu_ffn(p, *F.gate_shexp, *F.up_shexp, *F.down_shexp, n, p.geo.n_ff_shexp, *buf.sh);
    if (F.shexp_gate) {  // Qwen2-MoE gates its shared expert; DeepSeek's are plain
      be.matmul(*F.shexp_gate, *buf.h, n, *buf.sg);
      be.scale_rows_sigmoid(*buf.sh, *buf.sg, n, c.n_embd);
    }
    be.add(*buf.o, *buf.sh, n * c.n_embd);
  }
  p.all_reduce(*buf.o, n * c.n_embd);  // every expert's down product is row-parallel
  if (F.post_norm) be.rms_norm(*buf.o, F.post_norm.get(), n, c.n_embd, c.norm_eps, *buf.o);
  be.add(*buf.x, *buf.o, n * c.n_embd);
}

void hybrid_decoder_layer(const LayerPass& p, int il, int64_t n) {
  if (p.cfg.layer_is_linear(il)) linear_attention_block(p, il, n);
  else attention_block(p, il, n);
  if (p.cfg.layer_is_moe(il)) moe_ffn_block(p, il, n);
  else dense_ffn_block(p, il, n);
}

void decoder_layer(const LayerPass& p, int il, int64_t n) {
  attention_block(p, il, n);
  if (p.cfg.layer_is_moe(il)) moe_ffn_block(p, il, n);
  else dense_ffn_block(p, il, n);
}

}  // namespace pagellm
