#include "engine/pooling.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "format/gguf.h"

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

std::vector<float> truncate_embedding(std::vector<float> v, int32_t n, bool normalize) {
  PAGELLM_CHECK(n >= 1 && static_cast<size_t>(n) <= v.size(), "dimensions {} outside [1, {}]", n, v.size());
  v.resize(static_cast<size_t>(n));
  if (normalize) l2_normalize(v);
  return v;
}

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json read_json(const fs::path& path) {
  std::ifstream in(path);
  PAGELLM_CHECK(in.good(), "cannot read {}", path.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: {}", path.string(), e.what()));
  }
}

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

std::optional<PoolingSpec> st_pooling(const fs::path& folder) {
  const fs::path modules_path = folder / "modules.json";
  if (!fs::exists(modules_path)) return std::nullopt;
  const json modules = read_json(modules_path);
  PAGELLM_CHECK(modules.is_array(), "{}: expected a list of modules", modules_path.string());
  std::optional<PoolingType> type;
  bool normalize = false;
  for (const json& m : modules) {
    const std::string kind = m.value("type", ""), path = m.value("path", "");
    if (ends_with(kind, ".Pooling")) type = st_pooling_type(folder / path / "config.json");
    else if (ends_with(kind, ".Normalize")) normalize = true;
    else if (!ends_with(kind, ".Transformer"))
      throw Error(fmt::format("{}: module '{}' is not served (Transformer, Pooling and Normalize are)",
                              modules_path.string(), kind));
  }
  PAGELLM_CHECK(type.has_value(), "{}: no Pooling module", modules_path.string());
  return PoolingSpec{*type, normalize};
}

}  // namespace

PoolingSpec model_pooling(const std::string& model_path, const GGUFFile* gguf) {
  if (gguf) {
    const std::string arch = gguf->get_string("general.architecture", "");
    const int64_t t = gguf->get_int(arch + ".pooling_type", -1);
    // llama.cpp's enum llama_pooling_type: 0 none, 1 mean, 2 cls, 3 last, 4 rank.
    if (t == 1) return {PoolingType::Mean, true};
    if (t == 2) return {PoolingType::Cls, true};
    if (t == 3) return {PoolingType::Last, true};
    // Rank: a reranker, whose pooled row feeds its score head
    // (engine/score_head.h); it has no embeddings to give.
    PAGELLM_CHECK(t != 4, "{}: a reranker (rank pooling) gives scores, not embeddings: serve it with --task score "
                  "(/v1/rerank, /v1/score)", model_path);
    return {};
  }
  std::error_code ec;
  if (fs::is_directory(model_path, ec))
    if (auto spec = st_pooling(model_path)) return *spec;
  return {};
}

}  // namespace pagellm
