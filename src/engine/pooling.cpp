#include "engine/pooling.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "core/json_limits.h"
#include "core/quant_blocks.h"
#include "format/gguf.h"
#include "format/safetensors.h"

namespace pagellm {

PoolRows pool_rows(PoolingType type) {
  switch (type) {
    case PoolingType::Last: return PoolRows::Last;
    case PoolingType::Mean: return PoolRows::All;
    case PoolingType::Cls: return PoolRows::First;
  }
  return PoolRows::None;
}

void Pooler::add(const float* rows, int32_t first_pos, int32_t count) {
  if (count <= 0) return;
  if (first_pos == 0) {
    std::fill(sum_.begin(), sum_.end(), 0.0);
    rows_ = 0;
  }
  const size_t d = static_cast<size_t>(dim_);
  switch (type_) {
    case PoolingType::Mean:
      for (int32_t j = 0; j < count; ++j)
        for (size_t k = 0; k < d; ++k) sum_[k] += rows[static_cast<size_t>(j) * d + k];
      rows_ += count;
      break;
    case PoolingType::Last:  // the caller passes the last position's row
      std::copy_n(rows + static_cast<size_t>(count - 1) * d, d, sum_.begin());
      rows_ = 1;
      break;
    case PoolingType::Cls:
      if (first_pos == 0) {
        std::copy_n(rows, d, sum_.begin());
        rows_ = 1;
      }
      break;
  }
  last_pos_ = first_pos + count - 1;
}

std::vector<float> Pooler::result(int32_t num_tokens, bool normalize) const {
  const bool complete = type_ == PoolingType::Mean ? rows_ == num_tokens : rows_ == 1;
  PAGELLM_CHECK(complete && (type_ != PoolingType::Last || last_pos_ == num_tokens - 1),
                "pooling: {} rows of a {}-token input", rows_, num_tokens);
  std::vector<float> out(sum_.size());
  const double scale = type_ == PoolingType::Mean ? 1.0 / num_tokens : 1.0;
  for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<float>(sum_[k] * scale);
  if (normalize) l2_normalize(out);
  return out;
}

void l2_normalize(std::span<float> x) {
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  // sentence-transformers' Normalize (torch's F.normalize) divides by max(norm, 1e-12).
  const double norm = std::max(std::sqrt(ss), 1e-12);
  for (float& v : x) v = static_cast<float>(v / norm);
}

std::vector<double> run_dense_layers(const std::vector<DenseLayer>& layers, std::vector<double> x, const char* what) {
  for (const DenseLayer& l : layers) {
    // (A file's layers may not chain: refused here rather than read past x.)
    PAGELLM_CHECK(static_cast<size_t>(l.in) == x.size() && l.weight.size() == static_cast<size_t>(l.in) * l.out &&
                      (l.bias.empty() || l.bias.size() == static_cast<size_t>(l.out)),
                  "{}: a dense layer of {} x {} after {} values", what, l.out, l.in, x.size());
    std::vector<double> y(static_cast<size_t>(l.out));
    for (int32_t o = 0; o < l.out; ++o) {
      const float* w = l.weight.data() + static_cast<size_t>(o) * l.in;
      double acc = l.bias.empty() ? 0.0 : l.bias[o];
      for (int32_t i = 0; i < l.in; ++i) acc += static_cast<double>(w[i]) * x[i];
      switch (l.activation) {
        case HeadActivation::None: break;
        case HeadActivation::Tanh: acc = std::tanh(acc); break;
        case HeadActivation::Gelu: acc = 0.5 * acc * (1.0 + std::erf(acc / std::sqrt(2.0))); break;
        case HeadActivation::Relu: acc = std::max(acc, 0.0); break;
      }
      y[o] = acc;
    }
    x = std::move(y);
  }
  return x;
}

std::vector<float> finish_embedding(const PoolingSpec& spec, std::vector<float> pooled) {
  const std::vector<double> x = run_dense_layers(spec.dense, std::vector<double>(pooled.begin(), pooled.end()),
                                                 "embedding");
  std::vector<float> out(x.begin(), x.end());
  if (spec.normalize) l2_normalize(out);
  return out;
}

std::vector<float> truncate_embedding(std::vector<float> v, int32_t n, bool normalize) {
  PAGELLM_CHECK(n >= 1 && static_cast<size_t>(n) <= v.size(), "dimensions {} outside [1, {}]", n, v.size());
  v.resize(static_cast<size_t>(n));
  if (normalize) l2_normalize(v);
  return v;
}

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// config.json and sentence-transformers' files, parsed within the limits every JSON file we read has.
json read_json(const fs::path& path) { return read_json_file_bounded(path.string(), kConfigJsonLimits); }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A sentence-transformers Pooling module's config: the legacy
// pooling_mode_* flags or the newer pooling_mode; neither means mean.
PoolingType st_pooling_type(const fs::path& config_path) {
  const json cfg = read_json(config_path);
  std::vector<std::string> modes;
  if (cfg.contains("pooling_mode")) {
    const json& m = cfg["pooling_mode"];
    if (m.is_string()) modes.push_back(m.get<std::string>());
    else if (m.is_array())
      for (const json& x : m) modes.push_back(x.get<std::string>());
  } else {
    const std::pair<const char*, const char*> flags[] = {
        {"pooling_mode_cls_token", "cls"},       {"pooling_mode_max_tokens", "max"},
        {"pooling_mode_mean_tokens", "mean"},    {"pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"},
        {"pooling_mode_weightedmean_tokens", "weightedmean"}, {"pooling_mode_lasttoken", "lasttoken"}};
    for (const auto& [key, mode] : flags)
      if (cfg.value(key, false)) modes.emplace_back(mode);
  }
  if (modes.empty()) modes.emplace_back("mean");
  PAGELLM_CHECK(modes.size() == 1, "{}: several pooling modes at once are not served", config_path.string());
  PAGELLM_CHECK(cfg.value("include_prompt", true), "{}: include_prompt false is not served", config_path.string());
  const std::string& mode = modes[0];
  if (mode == "lasttoken") return PoolingType::Last;
  if (mode == "mean") return PoolingType::Mean;
  if (mode == "cls") return PoolingType::Cls;
  throw Error(fmt::format("{}: pooling mode '{}' is not served (last-token, mean and cls are)", config_path.string(),
                          mode));
}

// Each layer takes what the one before gives.
void check_dense_chain(const std::vector<DenseLayer>& layers, const std::string& where) {
  for (size_t k = 1; k < layers.size(); ++k)
    PAGELLM_CHECK(layers[k].in == layers[k - 1].out, "{}: dense layer {} takes {} values, the one before gives {}",
                  where, k + 1, layers[k].in, layers[k - 1].out);
}

// A sentence-transformers Dense module: config.json (in_features,
// out_features, bias, activation_function) and model.safetensors
// (linear.weight [out, in], linear.bias).
DenseLayer st_dense(const fs::path& dir) {
  const fs::path config_path = dir / "config.json";
  const json cfg = read_json(config_path);
  DenseLayer l;
  try {
    l.in = cfg.at("in_features").get<int32_t>();
    l.out = cfg.at("out_features").get<int32_t>();
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: in_features / out_features: {}", config_path.string(), e.what()));
  }
  PAGELLM_CHECK(l.in >= 1 && l.out >= 1 && l.in <= (1 << 20) && l.out <= (1 << 20), "{}: a dense layer of {} x {}",
                config_path.string(), l.out, l.in);
  // The module's default activation is tanh; EmbeddingGemma names the identity.
  const std::string act = cfg.value("activation_function", "torch.nn.modules.activation.Tanh");
  if (act == "torch.nn.modules.activation.Tanh") l.activation = HeadActivation::Tanh;
  else PAGELLM_CHECK(act == "torch.nn.modules.linear.Identity", "{}: activation_function '{}' is not served "
                     "(Identity and Tanh are)", config_path.string(), act);
  PAGELLM_CHECK(!cfg.value("use_residual", false), "{}: use_residual is not served", config_path.string());
  const std::string path = (dir / "model.safetensors").string();
  PAGELLM_CHECK(fs::exists(path), "{}: a Dense module without model.safetensors (pytorch_model.bin is not read)",
                dir.string());
  SafetensorsFile file(path);
  auto tensor = [&](const std::string& name, std::vector<int64_t> shape) -> std::vector<float> {
    if (!file.header().contains(name)) return {};
    try {
      const SafetensorsEntry e = parse_safetensors_entry(file.header()[name], name, file.data_size(), path);
      check_safetensors_entry_size(e, name, path);
      PAGELLM_CHECK(e.shape == shape, "'{}': {} has shape [{}], expected [{}]", path, name, fmt::join(e.shape, ", "),
                    fmt::join(shape, ", "));
      return dequantize_rows_ref(safetensors_dtype(e.dtype, path), file.data() + e.begin, 1,
                                 static_cast<int64_t>(e.elements));
    } catch (const json::exception& e) {
      throw Error(fmt::format("'{}': {}: {}", path, name, e.what()));
    }
  };
  l.weight = tensor("linear.weight", {l.out, l.in});
  PAGELLM_CHECK(!l.weight.empty(), "'{}': no linear.weight", path);
  l.bias = tensor("linear.bias", {l.out});
  PAGELLM_CHECK(!cfg.value("bias", true) || !l.bias.empty(), "'{}': config.json says bias, and there is no linear.bias",
                path);
  return l;
}

// llama.cpp's converter writes EmbeddingGemma's Dense modules (with
// --sentence-transformers-dense-modules) as dense_2.weight [in, out] and
// dense_3.weight, identity activation, no bias.
std::vector<DenseLayer> gguf_dense(const GGUFFile& gguf) {
  std::vector<DenseLayer> layers;
  for (const char* name : {"dense_2.weight", "dense_3.weight"}) {
    const GGUFTensorInfo* t = gguf.find_tensor(name);
    if (!t) continue;
    PAGELLM_CHECK(t->shape.size() == 2, "{}: {} has {} dimensions, expected 2", gguf.path(), name, t->shape.size());
    DenseLayer l;
    l.in = static_cast<int32_t>(t->shape[0]);
    l.out = static_cast<int32_t>(t->shape[1]);
    l.weight = dequantize_rows_ref(t->type, t->data, l.out, l.in);
    layers.push_back(std::move(l));
  }
  check_dense_chain(layers, gguf.path());
  return layers;
}

std::optional<PoolingSpec> st_pooling(const fs::path& folder) {
  const fs::path modules_path = folder / "modules.json";
  if (!fs::exists(modules_path)) return std::nullopt;
  const json modules = read_json(modules_path);
  PAGELLM_CHECK(modules.is_array(), "{}: expected a list of modules", modules_path.string());
  std::optional<PoolingType> type;
  bool normalize = false;
  std::vector<DenseLayer> dense;
  for (const json& m : modules) {
    const std::string kind = m.value("type", ""), path = m.value("path", "");
    if (ends_with(kind, ".Pooling")) {
      type = st_pooling_type(folder / path / "config.json");
    } else if (ends_with(kind, ".Dense")) {
      PAGELLM_CHECK(type.has_value() && !normalize, "{}: a Dense module must come after Pooling and before "
                    "Normalize", modules_path.string());
      dense.push_back(st_dense(folder / path));
    } else if (ends_with(kind, ".Normalize")) {
      normalize = true;
    } else if (!ends_with(kind, ".Transformer")) {
      throw Error(fmt::format("{}: module '{}' is not served (Transformer, Pooling, Dense and Normalize are)",
                              modules_path.string(), kind));
    }
  }
  PAGELLM_CHECK(type.has_value(), "{}: no Pooling module", modules_path.string());
  check_dense_chain(dense, modules_path.string());
  return PoolingSpec{*type, normalize, std::move(dense)};
}

}  // namespace

PoolingSpec model_pooling(const std::string& model_path, const GGUFFile* gguf) {
  if (gguf) {
    const std::string arch = gguf->get_string("general.architecture", "");
    const int64_t t = gguf->get_int(arch + ".pooling_type", -1);
    // llama.cpp's enum llama_pooling_type: 0 none, 1 mean, 2 cls, 3 last, 4 rank.
    if (t == 1) return {PoolingType::Mean, true, gguf_dense(*gguf)};
    if (t == 2) return {PoolingType::Cls, true, gguf_dense(*gguf)};
    if (t == 3) return {PoolingType::Last, true, gguf_dense(*gguf)};
    // Rank: a reranker, whose pooled row feeds its score head
    // (engine/score_head.h); it has no embeddings to give.
    PAGELLM_CHECK(t != 4, "{}: a reranker (rank pooling) gives scores, not embeddings: serve it with --task score "
                  "(/v1/rerank, /v1/score)", model_path);
    return {PoolingType::Last, true, gguf_dense(*gguf)};
  }
  std::error_code ec;
  if (fs::is_directory(model_path, ec))
    if (auto spec = st_pooling(model_path)) return *spec;
  return {};
}

}  // namespace pagellm
