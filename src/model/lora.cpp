#include "model/lora.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fp16.h"
#include "core/json_limits.h"
#include "core/quant_blocks.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/arch.h"
#include "model/model.h"

namespace pagellm {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kTargetNames[kLoraTargets] = {"q_proj",  "k_proj",    "v_proj", "o_proj",
                                                    "gate_proj", "up_proj", "down_proj", "q_proj"};

std::optional<LoraTarget> target_of(Slot s) {
  switch (s) {
    case Slot::Q: return LoraTarget::Q;
    case Slot::K: return LoraTarget::K;
    case Slot::V: return LoraTarget::V;
    case Slot::O: return LoraTarget::O;
    case Slot::Gate: return LoraTarget::Gate;
    case Slot::Up: return LoraTarget::Up;
    case Slot::Down: return LoraTarget::Down;
    case Slot::QGate: return LoraTarget::QGate;
    default: return std::nullopt;
  }
}

// Where one adapter tensor goes: its layer, and the targets it feeds. A fused
// projection (Phi-3's qkv_proj, gate_up_proj; Qwen3.5's q_proj, whose parts
// alternate per head) feeds several: each takes its rows of B (split as the
// table splits the weight) and the whole of A.
struct Place {
  int il = 0;
  std::vector<LoraTarget> targets;
  std::vector<int64_t> rows;  // B rows per target (fused only)
  int heads = 0;              // > 0: the parts alternate over this many heads
};

// A layer tensor's GGUF name ("blk.3.attn_q.weight") -> its place, if the
// table's spec for it is made of targets the model applies LoRA to (not
// experts, not parts alternating per head).
Place place_of(const std::string& gguf, const TensorSpec& spec, const ModelConfig& c, const std::string& what,
               const std::string& path) {
  Place p;
  for (Slot s : spec.slots)
    if (std::optional<LoraTarget> t = target_of(s)) p.targets.push_back(*t);
  if (p.targets.empty() || p.targets.size() != spec.slots.size() || spec.experts)
    throw Error(fmt::format("'{}': {} targets '{}', which LoRA adapters cannot target here (q/k/v/o and a dense "
                            "FFN's gate/up/down can; experts and linear-attention projections cannot)",
                            path, what, gguf));
  if (p.targets.size() > 1) p.rows = spec.split_rows(c);
  if (spec.split_per_head) p.heads = spec.split_heads ? spec.split_heads(c) : c.n_head;
  if (std::sscanf(gguf.c_str(), "blk.%d.", &p.il) != 1 || p.il < 0)
    throw Error(fmt::format("'{}': {} is not a layer tensor", path, what));
  return p;
}

// GGUF llama files keep Q/K rows permuted per head for adjacent-pair RoPE
// (row 2i + j of a head is row j * hd/2 + i of the HF layout); to_gguf
// applies that order to B's rows, else takes it back.
void permute_heads(std::vector<float>& b, int64_t rows, int64_t cols, int64_t head_dim, bool to_gguf) {
  std::vector<float> out(b.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < rows / head_dim; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t gguf_row = h * head_dim + 2 * i + j, hf_row = h * head_dim + j * half + i;
        const int64_t dst = to_gguf ? gguf_row : hf_row, src = to_gguf ? hf_row : gguf_row;
        std::copy_n(b.data() + src * cols, cols, out.data() + dst * cols);
      }
  b = std::move(out);
}

// The adapter's tensors, as they come from either format.
struct RawPair {
  std::vector<float> a, b;
  int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
  bool has_a = false, has_b = false;
};

// Stores A or B of a tensor at its place; a fused one's B is cut into each
// target's rows (its A is every target's).
void put(std::map<std::pair<int, int>, RawPair>& pairs, const Place& p, bool is_a, std::vector<float> data,
         int64_t rows, int64_t cols, const std::string& what, const std::string& path) {
  if (!is_a && p.targets.size() > 1) {
    int64_t total = 0;
    for (int64_t r : p.rows) total += r;
    PAGELLM_CHECK(rows == total, "'{}': {} has {} rows; the fused projection has {}", path, what, rows, total);
  }
  // Part k's rows: one run, or (per head) each head's k-th run.
  const int64_t heads = p.heads > 0 ? p.heads : 1;
  int64_t head_rows = 0;
  for (int64_t r : p.rows) head_rows += r / heads;
  int64_t first = 0;  // part k's offset within a head's rows
  for (size_t k = 0; k < p.targets.size(); ++k) {
    RawPair& rp = pairs[{p.il, static_cast<int>(p.targets[k])}];
    if (is_a) {
      rp.a = data, rp.a_rows = rows, rp.a_cols = cols, rp.has_a = true;
      continue;
    }
    const int64_t n = p.targets.size() > 1 ? p.rows[k] : rows, run = n / heads;
    rp.b.clear();
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t at = (p.heads > 0 ? h * head_rows : 0) + first + (p.heads > 0 ? 0 : h * run);
      rp.b.insert(rp.b.end(), data.begin() + at * cols, data.begin() + (at + run) * cols);
    }
    rp.b_rows = n, rp.b_cols = cols, rp.has_b = true;
    first += run;
  }
}
struct Raw {
  std::map<std::pair<int, int>, RawPair> pairs;  // (layer, target)
  float alpha = 0;
  bool rslora = false;
  bool gguf_layout = false;  // Q/K rows as GGUF llama files hold them
  std::vector<std::string> modules;
};

void read_peft(const std::string& dir, const ArchInfo& arch, const ModelConfig& c, Raw& raw) {
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  const json cfg = read_json_file_bounded(config_path, kConfigJsonLimits);
  try {
    const std::string type = cfg.value("peft_type", "LORA");
    PAGELLM_CHECK(type == "LORA", "'{}': peft_type '{}' is not served (LORA is)", config_path, type);
    PAGELLM_CHECK(cfg.contains("r") && cfg.contains("lora_alpha"), "'{}': r and lora_alpha are required",
                  config_path);
    raw.alpha = cfg.at("lora_alpha").get<float>();
    raw.rslora = cfg.value("use_rslora", false);
    auto refuse_set = [&](const char* key, const char* why) {
      if (cfg.contains(key) && !cfg[key].is_null() && !(cfg[key].is_boolean() && !cfg[key].get<bool>()) &&
          !(cfg[key].is_array() && cfg[key].empty()) && !(cfg[key].is_object() && cfg[key].empty()))
        throw Error(fmt::format("'{}': {} is not served ({})", config_path, key, why));
    };
    refuse_set("modules_to_save", "it replaces whole modules; only low-rank A/B pairs are applied");
    refuse_set("use_dora", "DoRA's magnitude vectors are not applied");
    refuse_set("rank_pattern", "one rank per adapter");
    refuse_set("alpha_pattern", "one alpha per adapter");
    refuse_set("fan_in_fan_out", "nn.Linear's orientation only");
    const std::string bias = cfg.value("bias", "none");
    PAGELLM_CHECK(bias == "none", "'{}': bias '{}' is not served (none is)", config_path, bias);
    if (cfg.contains("target_modules")) {
      const json& t = cfg["target_modules"];
      if (t.is_string()) raw.modules.push_back(t.get<std::string>());
      else if (t.is_array())
        for (const json& m : t) raw.modules.push_back(m.get<std::string>());
    }
  } catch (const json::exception& e) {
    throw Error(fmt::format("'{}': {}", config_path, e.what()));
  }
  const std::string st_path = (fs::path(dir) / "adapter_model.safetensors").string();
  PAGELLM_CHECK(fs::exists(st_path), "'{}': no adapter_model.safetensors (adapter_model.bin is not read)", dir);
  SafetensorsFile file(st_path);
  for (const auto& [key, info] : file.header().items()) {
    if (key == "__metadata__") continue;
    const bool is_a = key.ends_with(".lora_A.weight"), is_b = key.ends_with(".lora_B.weight");
    if (!is_a && !is_b)
      throw Error(fmt::format("'{}': tensor '{}' is not served (only lora_A / lora_B weights are applied)",
                              st_path, key));
    std::string module = key.substr(0, key.size() - std::string(".lora_A.weight").size());
    if (module.starts_with("base_model.model.")) module = module.substr(std::string("base_model.model.").size());
    const std::optional<HfTensor> t = hf_tensor(arch, module + ".weight");
    if (!t) throw Error(fmt::format("'{}': tensor '{}' targets '{}', which this model does not have", st_path, key,
                                    module));
    const Place p = place_of(t->gguf, *t->spec, c, fmt::format("tensor '{}'", key), st_path);
    SafetensorsEntry e;
    try {
      e = parse_safetensors_entry(info, key, file.data_size(), st_path);
    } catch (const json::exception& ex) {
      throw Error(fmt::format("'{}': tensor '{}': {}", st_path, key, ex.what()));
    }
    check_safetensors_entry_size(e, key, st_path);
    PAGELLM_CHECK(e.shape.size() == 2, "'{}': tensor '{}' has {} dimensions, not 2", st_path, key, e.shape.size());
    const DType type = safetensors_dtype(e.dtype, st_path);
    put(raw.pairs, p, is_a, dequantize_rows_ref(type, file.data() + e.begin, e.shape[0], e.shape[1]), e.shape[0],
        e.shape[1], fmt::format("tensor '{}'", key), st_path);
  }
}

void read_gguf_lora(const std::string& path, const ArchInfo& arch, const ModelConfig& c, Raw& raw) {
  const std::unique_ptr<GGUFFile> f = GGUFFile::open(path);
  const std::string type = f->get_string("general.type", "");
  PAGELLM_CHECK(type == "adapter" && f->get_string("adapter.type", "") == "lora",
                "'{}': not a LoRA adapter (general.type '{}', adapter.type '{}')", path, type,
                f->get_string("adapter.type", ""));
  const std::string file_arch = f->get_string("general.architecture", "");
  PAGELLM_CHECK(file_arch == arch.gguf_name, "'{}': an adapter for '{}' models, not '{}'", path, file_arch,
                arch.gguf_name);
  raw.alpha = static_cast<float>(f->get_float("adapter.lora.alpha", 0.0));
  raw.gguf_layout = true;
  for (const GGUFTensorInfo& t : f->tensors()) {
    const bool is_a = t.name.ends_with(".lora_a"), is_b = t.name.ends_with(".lora_b");
    if (!is_a && !is_b)
      throw Error(fmt::format("'{}': tensor '{}' is not served (only .lora_a / .lora_b tensors are applied)", path,
                              t.name));
    const std::string base = t.name.substr(0, t.name.size() - 7);
    const TensorSpec* spec = nullptr;
    int il = -1;
    if (std::sscanf(base.c_str(), "blk.%d.", &il) == 1)
      for (const TensorSpec& s : arch.layer)
        if (layer_tensor_name(s, il) == base) spec = &s;
    if (!spec) throw Error(fmt::format("'{}': tensor '{}' targets '{}', which this model does not have", path,
                                       t.name, base));
    const Place p = place_of(base, *spec, c, fmt::format("tensor '{}'", t.name), path);
    PAGELLM_CHECK(t.shape.size() == 2, "'{}': tensor '{}' has {} dimensions, not 2", path, t.name, t.shape.size());
    // GGUF shapes list the row length first: A is [rank rows of `in`], B [out rows of `rank`].
    put(raw.pairs, p, is_a, dequantize_rows_ref(t.type, t.data, t.shape[1], t.shape[0]), t.shape[1], t.shape[0],
        fmt::format("tensor '{}'", t.name), path);
    for (LoraTarget target : p.targets) {
      const std::string module = kTargetNames[static_cast<int>(target)];
      if (std::find(raw.modules.begin(), raw.modules.end(), module) == raw.modules.end()) raw.modules.push_back(module);
    }
  }
}

}  // namespace

const char* lora_target_name(LoraTarget t) { return kTargetNames[static_cast<int>(t)]; }

size_t LoraAdapter::bytes() const {
  size_t n = 0;
  for (const auto& layer : layers)
    for (const Pair& p : layer) n += (p.a.size() + p.b.size()) * sizeof(float);
  return n;
}

LoraAdapter read_lora_adapter(const std::string& path, const Model& model, int32_t max_rank) {
  const ModelConfig& c = model.config();
  const ArchInfo& arch = arch_info(c.arch);
  PAGELLM_CHECK(fs::exists(path), "LoRA adapter '{}' does not exist", path);
  Raw raw;
  if (fs::is_directory(path)) read_peft(path, arch, c, raw);
  else read_gguf_lora(path, arch, c, raw);
  PAGELLM_CHECK(!raw.pairs.empty(), "'{}': the adapter has no LoRA tensors", path);

  LoraAdapter out;
  out.path = path;
  out.alpha = raw.alpha;
  out.target_modules = raw.modules;
  out.layers.resize(static_cast<size_t>(c.n_layer));
  const LoraSlots::Shapes shapes = model.lora_shapes();
  // Q/K rows: the base's layout (GGUF llama files: permuted) against the adapter's.
  const bool base_permuted = arch.gguf_permuted_qk && !c.rope.neox;
  for (auto& [key, rp] : raw.pairs) {
    const auto [il, ti] = key;
    const auto t = static_cast<LoraTarget>(ti);
    const std::string what = fmt::format("layer {} {}", il, kTargetNames[ti]);
    PAGELLM_CHECK(rp.has_a && rp.has_b, "'{}': {} has {} but not {}", path, what, rp.has_a ? "A" : "B",
                  rp.has_a ? "B" : "A");
    PAGELLM_CHECK(il < c.n_layer, "'{}': {}: the model has {} layers", path, what, c.n_layer);
    const auto [rows, cols] = shapes[static_cast<size_t>(il)][static_cast<size_t>(ti)];
    PAGELLM_CHECK(rows > 0, "'{}': {}: the model's layer {} has no such projection (a MoE or linear-attention "
                  "layer)", path, what, il);
    const int64_t r = rp.a_rows;
    PAGELLM_CHECK(rp.a_cols == cols && rp.b_rows == rows && rp.b_cols == r,
                  "'{}': {}: A is [{}, {}] and B [{}, {}]; the base weight is [{}, {}]", path, what, rp.a_rows,
                  rp.a_cols, rp.b_rows, rp.b_cols, rows, cols);
    PAGELLM_CHECK(r >= 1 && r <= max_rank, "'{}': rank {} is over --max-lora-rank {}", path, r, max_rank);
    PAGELLM_CHECK(out.rank == 0 || out.rank == r, "'{}': {} has rank {}, other targets {} (one rank per adapter)",
                  path, what, r, out.rank);
    out.rank = static_cast<int32_t>(r);
    if ((t == LoraTarget::Q || t == LoraTarget::K) && raw.gguf_layout != base_permuted && arch.gguf_permuted_qk)
      permute_heads(rp.b, rows, r, c.head_dim, base_permuted);
    LoraAdapter::Pair& p = out.layers[static_cast<size_t>(il)][static_cast<size_t>(ti)];
    p.a = std::move(rp.a);
    p.b = std::move(rp.b);
  }
  PAGELLM_CHECK(raw.alpha > 0 && std::isfinite(raw.alpha), "'{}': lora_alpha {} is not a positive number", path,
                raw.alpha);
  out.scale = raw.alpha / (raw.rslora ? std::sqrt(static_cast<float>(out.rank)) : static_cast<float>(out.rank));
  for (auto& layer : out.layers)
    for (LoraAdapter::Pair& p : layer)
      for (float& v : p.b) v *= out.scale;
  for (const auto& layer : out.layers)
    for (const LoraAdapter::Pair& p : layer) {
      for (float v : p.a) PAGELLM_CHECK(std::isfinite(v), "'{}': a LoRA A value is not finite", path);
      for (float v : p.b) PAGELLM_CHECK(std::isfinite(v), "'{}': a LoRA B value is not finite", path);
    }
  return out;
}

LoraSlots::LoraSlots(Backend& backend, Shapes shapes, int32_t max_loras, int32_t max_rank, DType dtype)
    : backend_(backend), shapes_(std::move(shapes)), max_loras_(max_loras), rank_(max_rank), dtype_(dtype) {
  PAGELLM_CHECK(max_loras >= 1 && max_rank >= 1, "LoRA slots: {} adapters of rank {}", max_loras, max_rank);
  PAGELLM_CHECK(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16,
                "LoRA slots hold F32, F16 or BF16, not {}", dtype_name(dtype));
  PAGELLM_CHECK(backend.supports_weight(dtype), "the {} backend cannot multiply {} weights (--lora-dtype)",
                backend.name(), dtype_name(dtype));
  held_.resize(static_cast<size_t>(max_loras) + 1);
  for (auto& slot : held_) slot.resize(shapes_.size());
  pass_.rank = max_rank;
  pass_.layers.resize(shapes_.size());
  for (size_t il = 0; il < shapes_.size(); ++il)
    for (int t = 0; t < kLoraTargets; ++t) {
      if (shapes_[il][t].first == 0) continue;
      pass_.layers[il].a[t].assign(held_.size(), nullptr);
      pass_.layers[il].b[t].assign(held_.size(), nullptr);
    }
  for (int32_t s = 0; s <= max_loras; ++s) set(s, nullptr);
}

int64_t LoraSlots::max_out() const {
  int64_t m = 0;
  for (const auto& layer : shapes_)
    for (const auto& [rows, cols] : layer) m = std::max(m, rows);
  return m;
}

void LoraSlots::set(int32_t slot, const LoraAdapter* adapter) {
  PAGELLM_CHECK(slot >= 0 && slot <= max_loras_ && (slot > 0 || !adapter), "LoRA slot {} of {}", slot, max_loras_);
  for (size_t il = 0; il < shapes_.size(); ++il)
    for (int t = 0; t < kLoraTargets; ++t) {
      const auto [rows, cols] = shapes_[il][t];
      if (rows == 0) continue;
      // Padded to the slots' rank: A's extra rows and B's extra columns are zero.
      std::vector<float> a(static_cast<size_t>(rank_ * cols), 0.0f), b(static_cast<size_t>(rows * rank_), 0.0f);
      if (adapter && !adapter->layers[il][t].a.empty()) {
        const LoraAdapter::Pair& p = adapter->layers[il][t];
        const int64_t r = adapter->rank;
        std::copy(p.a.begin(), p.a.end(), a.begin());
        for (int64_t row = 0; row < rows; ++row) std::copy_n(p.b.data() + row * r, r, b.data() + row * rank_);
      }
      upload(slot, static_cast<int>(il), t, a, b);
    }
}

namespace {

// Values in `type`'s bytes (F32, F16 or BF16).
std::vector<uint8_t> encode(const std::vector<float>& v, DType type) {
  std::vector<uint8_t> out(v.size() * (type == DType::F32 ? 4 : 2));
  if (type == DType::F32) {
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  }
  auto* h = reinterpret_cast<uint16_t*>(out.data());
  for (size_t i = 0; i < v.size(); ++i) h[i] = type == DType::F16 ? fp32_to_fp16(v[i]) : fp32_to_bf16(v[i]);
  return out;
}

}  // namespace

void LoraSlots::upload(int32_t slot, int il, int t, const std::vector<float>& a, const std::vector<float>& b) {
  const auto [rows, cols] = shapes_[static_cast<size_t>(il)][static_cast<size_t>(t)];
  Held next;
  next.a = encode(a, dtype_);
  next.b = encode(b, dtype_);
  const std::string name = fmt::format("lora[{}].blk.{}.{}", slot, il, kTargetNames[t]);
  next.wa = backend_.upload(TensorData{name + ".a", dtype_, {cols, rank_}, next.a.data()});
  next.wb = backend_.upload(TensorData{name + ".b", dtype_, {rank_, rows}, next.b.data()});
  Held& h = held_[static_cast<size_t>(slot)][static_cast<size_t>(il)][static_cast<size_t>(t)];
  if (h.wa) bytes_ -= h.wa->held_bytes + h.wb->held_bytes;
  bytes_ += next.wa->held_bytes + next.wb->held_bytes;
  pass_.layers[static_cast<size_t>(il)].a[t][static_cast<size_t>(slot)] = next.wa.get();
  pass_.layers[static_cast<size_t>(il)].b[t][static_cast<size_t>(slot)] = next.wb.get();
  h = std::move(next);  // the old weights go after the views point at the new ones
}

}  // namespace pagellm
