#include "model/arch.h"

#include <algorithm>
#include <cctype>
#include <string_view>

#include "core/error.h"
#include "model/families/families.h"

namespace pagellm {

const std::vector<SizeParam>& size_params() {
  using L = ModelSizeLimits;
  using C = ModelConfig;
  using H = HfDefaults;
  // n_vocab comes last: GGUF files may give it only as token_embd.weight's rows.
  static const std::vector<SizeParam> p = {
      {&C::n_embd, "n_embd", "embedding_length", "hidden_size", L::kEmbd, std::nullopt, &H::hidden_size},
      {&C::n_layer, "n_layer", "block_count", "num_hidden_layers", L::kLayers, std::nullopt, &H::num_hidden_layers},
      {&C::n_ff, "n_ff", "feed_forward_length", "intermediate_size", L::kFeedForward, std::nullopt,
       &H::intermediate_size},
      {&C::n_head, "n_head", "attention.head_count", "num_attention_heads", L::kHeads, std::nullopt,
       &H::num_attention_heads},
      {&C::n_head_kv, "n_head_kv", "attention.head_count_kv", "num_key_value_heads", L::kHeads, std::nullopt,
       &H::num_key_value_heads, Derived::HeadCount},
      {&C::n_ctx_train, "n_ctx_train", "context_length", "max_position_embeddings", L::kContext, 2048,
       &H::max_position_embeddings},
      {&C::head_dim, "head_dim", "attention.key_length", "head_dim", L::kHeadDim, std::nullopt, &H::head_dim,
       Derived::EmbdOverHeads},
      {&C::n_vocab, "n_vocab", "vocab_size", "vocab_size", L::kVocab, std::nullopt, &H::vocab_size},
  };
  return p;
}

// The registry: every family, listed here (no self-registration, which a
// static library could drop at link time).
const std::vector<ArchInfo>& all_archs() {
  static const std::vector<ArchInfo> archs = {family::llama(),    family::qwen2(),  family::qwen3(),
                                              family::qwen2moe(), family::qwen3moe(), family::gemma2(),
                                              family::gemma3(),   family::phi3(),   family::gptoss(),
                                              family::qwen35(), family::qwen35moe(), family::deepseek2(), family::glm4moe(),
                                              family::qwen3next(), family::gemma4(), family::bert(),
                                              family::gemma_embedding(), family::xlm_roberta()};
  return archs;
}

const ArchInfo& arch_info(Arch a) {
  for (const ArchInfo& i : all_archs())
    if (i.arch == a) return i;
  fail("architecture {} has no table entry", static_cast<int>(a));
}

const char* arch_name(Arch a) { return arch_info(a).gguf_name; }

const ArchInfo* arch_by_gguf_name(const std::string& name) {
  for (const ArchInfo& i : all_archs())
    if (name == i.gguf_name && !i.gguf_shared) return &i;
  return nullptr;
}

const ArchInfo* arch_by_hf_class(const std::string& cls, HfSwa* swa) {
  for (const ArchInfo& i : all_archs())
    for (const HfClass& h : i.hf_classes)
      if (cls == h.name) {
        if (swa) *swa = h.swa;
        return &i;
      }
  return nullptr;
}

std::string supported_gguf_names() {
  std::string s;
  for (const ArchInfo& i : all_archs())
    if (!i.gguf_shared) s += (s.empty() ? "" : ", ") + std::string(i.gguf_name);
  return s;
}

std::string supported_hf_classes() {
  std::string s;
  for (const ArchInfo& i : all_archs())
    for (const HfClass& h : i.hf_classes) s += (s.empty() ? "" : ", ") + std::string(h.name);
  return s;
}

const std::vector<float>* config_rope_factors(const ModelConfig& c, Slot s) {
  switch (s) {
    case Slot::RopeFreqs: return &c.rope_freq_factors;
    case Slot::RopeFactorsShort: return &c.rope_factors_short;
    case Slot::RopeFactorsLong: return &c.rope_factors_long;
    default: return nullptr;
  }
}

bool tensor_in_layer(const TensorSpec& t, const ModelConfig& c, int il) {
  if (t.need == Need::IfLinearLayer) return il >= 0 && c.layer_is_linear(il);
  if (t.need == Need::IfAttnLayer) return il < 0 || !c.layer_is_linear(il);
  if (t.need == Need::IfQLora) return c.mla.q_lora_rank > 0;
  if (t.need == Need::IfNoQLora) return c.mla.q_lora_rank == 0;
  if (t.need == Need::IfKvBSplit) return !c.mla.kv_b_fused;
  if (t.need == Need::IfKvBFused) return c.mla.kv_b_fused;
  if (t.need == Need::IfOwnKv) return il < 0 || !c.layer_reuses_kv(il);
  if (t.need == Need::IfOwnV) return il < 0 || (!c.layer_reuses_kv(il) && !c.layer_v_is_k(il));
  if (t.need == Need::IfPle) return c.n_embd_per_layer > 0;
  // Leading dense layers (DeepSeek's first_k_dense_replace) hold no experts, the others no dense FFN.
  if (c.n_dense_lead > 0 && il >= 0) {
    if (t.need == Need::IfDense) return !c.layer_is_moe(il);
    if (t.need == Need::IfMoe || t.need == Need::IfSharedExpert || t.need == Need::IfChoiceBias)
      return c.layer_is_moe(il);
  }
  return true;
}

bool tensor_required(const TensorSpec& t, const ModelConfig& c, int il) {
  if (!tensor_in_layer(t, c, il)) return false;
  switch (t.need) {
    case Need::IfLinearLayer:
    case Need::IfAttnLayer: return true;
    case Need::Required: return true;
    case Need::Optional: return false;
    case Need::IfQkvBias: return c.qkv_bias;
    case Need::IfQkNorm: return c.qk_norm;
    case Need::IfPostNorms: return c.post_norms;
    case Need::IfDense: return il >= 0 ? !c.layer_is_moe(il) : !c.moe();
    case Need::IfMoe: return il >= 0 ? c.layer_is_moe(il) : c.moe();
    case Need::IfSharedExpert: return c.n_ff_shexp > 0;
    case Need::IfQLora:
    case Need::IfNoQLora:
    case Need::IfKvBSplit:
    case Need::IfKvBFused: return true;
    case Need::IfOwnKv:
    case Need::IfOwnV:
    case Need::IfPle: return true;
    case Need::IfClassifier: return c.n_cls_out > 0;
    case Need::IfChoiceBias: return c.moe() && c.expert_choice_bias;
    case Need::Derived: return false;  // served by ArchInfo::derive_tensors, never by a file
  }
  return true;
}

std::string layer_tensor_name(const TensorSpec& t, int il) { return "blk." + std::to_string(il) + "." + t.gguf; }

namespace {

// The expert whose own matrix `rest` ("mlp.experts.5.up_proj.weight") is, for
// a spec stacking them as transformers 5 does ("mlp.experts.gate_up_proj"
// halves, "mlp.experts.down_proj"); nullopt otherwise.
std::optional<int> per_expert_index(const TensorSpec& t, const std::string& rest) {
  if (!t.matrix) return std::nullopt;
  const std::string_view stacked = t.hf;
  const char* one = nullptr;
  if (stacked.ends_with(".experts.gate_up_proj") && t.transform == Transform::GateUpFirstHalf) one = "gate_proj";
  else if (stacked.ends_with(".experts.gate_up_proj") && t.transform == Transform::GateUpSecondHalf) one = "up_proj";
  else if (stacked.ends_with(".experts.down_proj") && t.transform == Transform::None) one = "down_proj";
  if (!one) return std::nullopt;
  const std::string head(stacked.substr(0, stacked.rfind('.') + 1)), tail = std::string(".") + one + ".weight";
  if (rest.size() <= head.size() + tail.size() || !rest.starts_with(head) || !rest.ends_with(tail))
    return std::nullopt;
  const std::string e = rest.substr(head.size(), rest.size() - head.size() - tail.size());
  if (e.empty() || e.size() > 6 || !std::all_of(e.begin(), e.end(), [](unsigned char ch) { return std::isdigit(ch); }))
    return std::nullopt;
  return std::stoi(e);
}

}  // namespace

std::vector<HfTensor> hf_tensors(const ArchInfo& a, const std::string& hf_name) {
  std::vector<HfTensor> found;
  std::string n = hf_name;
  // Multimodal checkpoints nest the language model.
  for (const char* p : {"language_model.model.", "model.language_model."})
    if (n.starts_with(p)) n = "model." + n.substr(std::string(p).size());
  if (n == "language_model.lm_head.weight") n = "lm_head.weight";
  if (a.hf_base_prefix && n.starts_with(a.hf_base_prefix)) n = n.substr(std::string(a.hf_base_prefix).size());
  const std::string layers = a.hf_layers;
  if (n.starts_with(layers)) {
    size_t i = layers.size();
    while (i < n.size() && std::isdigit(static_cast<unsigned char>(n[i]))) ++i;
    if (i == layers.size() || i >= n.size() || n[i] != '.') return found;
    const std::string index = n.substr(layers.size(), i - layers.size());
    const std::string rest = n.substr(i + 1);
    for (const TensorSpec& t : a.layer) {
      const std::string_view pattern = t.hf;
      const size_t at = pattern.find("{}");
      if (!t.experts || at == std::string_view::npos) {
        if (rest == t.hf) found.push_back(HfTensor{"blk." + index + "." + t.gguf, &t});
        else if (auto e = per_expert_index(t, rest))
          found.push_back(HfTensor{"blk." + index + "." + t.gguf + "[" + std::to_string(*e) + "]", &t, true});
        continue;
      }
      // "mlp.experts.{}.up_proj.weight": the digits in place of {} name the expert.
      const std::string_view head = pattern.substr(0, at), tail = pattern.substr(at + 2);
      if (rest.size() <= head.size() + tail.size() || !rest.starts_with(head) || !rest.ends_with(tail)) continue;
      const std::string e = rest.substr(head.size(), rest.size() - head.size() - tail.size());
      if (e.size() > 6 || !std::all_of(e.begin(), e.end(), [](unsigned char ch) { return std::isdigit(ch); }))
        continue;
      found.push_back(HfTensor{"blk." + index + "." + t.gguf + "[" + std::to_string(std::stoi(e)) + "]", &t});
    }
    return found;
  }
  for (const TensorSpec& t : a.globals)
    if (*t.hf && n == t.hf) found.push_back(HfTensor{t.gguf, &t});
  return found;
}

std::optional<HfTensor> hf_tensor(const ArchInfo& a, const std::string& hf_name) {
  std::vector<HfTensor> found = hf_tensors(a, hf_name);
  if (found.empty()) return std::nullopt;
  return found.front();
}

}  // namespace pagellm
