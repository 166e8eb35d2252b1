// Runs token sequences through a Model over a paged KV cache the way the
// engine does (chunked prefill, then one-token decode steps), with block tables
// deliberately non-contiguous so paging is exercised.
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "format/gguf.h"
#include "model/model.h"

namespace pagellm::test {

class PagedRunner {
 public:
  PagedRunner(Model& model, int num_blocks, int block_size, DType kv_dtype, uint32_t seed = 3)
      : model_(model), block_size_(block_size) {
    // One sequence: one linear-attention state slot when the model has such layers.
    model.backend().allocate_kv_cache(model.kv_cache_spec(block_size, num_blocks, kv_dtype, nullptr, 1));
    free_.resize(num_blocks - 1);
    std::iota(free_.begin(), free_.end(), 1);  // block 0 is the padding block
    std::mt19937 rng(seed);
    std::shuffle(free_.begin(), free_.end(), rng);
  }

  // Appends `tokens` to the sequence in chunks of `chunk`; returns the logits
  // of every token when all_logits, else of the last one ([rows, n_vocab]).
  std::vector<float> feed(const std::vector<int32_t>& tokens, int chunk, bool all_logits) {
    const int V = model_.config().n_vocab;
    std::vector<float> out;
    for (size_t at = 0; at < tokens.size(); at += chunk) {
      const int n = static_cast<int>(std::min<size_t>(chunk, tokens.size() - at));
      BatchInfo b;
      SeqInfo s;
      s.q_start = 0;
      s.q_len = n;
      s.ctx_len = ctx_ + n;
      while (static_cast<int>(table_.size()) * block_size_ < s.ctx_len) {
        table_.push_back(free_.back());
        free_.pop_back();
      }
      s.block_table = table_;
      s.state_slot = model_.has_linear_layers() ? 0 : -1;
      for (int i = 0; i < n; ++i) {
        const int pos = ctx_ + i;
        b.token_ids.push_back(tokens[at + i]);
        b.positions.push_back(pos);
        b.slot_mapping.push_back(static_cast<int64_t>(table_[pos / block_size_]) * block_size_ + pos % block_size_);
      }
      b.seqs.push_back(s);
      std::vector<int32_t> rows;
      const bool last_chunk = at + n == tokens.size();
      if (all_logits) {
        rows.resize(n);
        std::iota(rows.begin(), rows.end(), 0);
      } else if (last_chunk) {
        rows.push_back(n - 1);
      }
      std::vector<float> logits(rows.size() * V);
      model_.forward(b, rows, logits.data());
      out.insert(out.end(), logits.begin(), logits.end());
      ctx_ += n;
    }
    return out;
  }

  // Greedy decoding of n tokens after `prompt`; also returns each step's logits.
  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int n, int chunk,
                              std::vector<std::vector<float>>* step_logits = nullptr) {
    std::vector<float> logits = feed(prompt, chunk, false);
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      const int32_t tok = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (step_logits) step_logits->push_back(logits);
      out.push_back(tok);
      if (i + 1 < n) logits = feed({tok}, 1, false);
    }
    return out;
  }

 private:
  Model& model_;
  int block_size_;
  int ctx_ = 0;
  std::vector<int32_t> table_;
  std::vector<int32_t> free_;
};

// Reference fixtures: JSON metadata and raw little-endian float32 logits.
// A converter fixture's metadata (tools/gen_convert_fixtures.py: key ->
// {"type", "value"}) set on a GGUF writer. Returns the first key whose type
// it cannot set ("" when every key was set).
inline std::string set_converter_metadata(GGUFWriter& w, const nlohmann::json& metadata) {
  for (const auto& [key, kv] : metadata.items()) {
    const std::string type = kv["type"].get<std::string>();
    if (type == "UINT32") w.set_u32(key, kv["value"].get<uint32_t>());
    else if (type == "INT32") w.set_i32(key, kv["value"].get<int32_t>());
    else if (type == "FLOAT32") w.set_f32(key, kv["value"].get<float>());
    else if (type == "BOOL") w.set_bool(key, kv["value"].get<bool>());
    else if (type == "STRING") w.set_string(key, kv["value"].get<std::string>());
    else if (type == "array:BOOL") w.set_bool_array(key, kv["value"].get<std::vector<bool>>());
    else if (type == "array:INT32") w.set_i32_array(key, kv["value"].get<std::vector<int32_t>>());
    else if (type == "array:FLOAT32") w.set_f32_array(key, kv["value"].get<std::vector<float>>());
    else if (type == "array:STRING") w.set_string_array(key, kv["value"].get<std::vector<std::string>>());
    else if (type == "array:UINT8") {  // bytes (a UGM vocabulary's precompiled_charsmap)
      const auto bytes = kv["value"].get<std::vector<uint8_t>>();
      GGUFValue v;
      v.type = GGUFType::ARRAY;
      v.elem_type = GGUFType::U8;
      v.count = bytes.size();
      v.raw = bytes.data();
      w.set_value(key, v);
    } else return key + " (" + type + ")";
  }
  return "";
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

inline std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(0, std::ios::end);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

// Per position: max |a - b| / max |b|; returns the worst position's value.
inline double max_rel_gap(const std::vector<float>& a, const std::vector<float>& b, int n_vocab) {
  double worst = 0;
  for (size_t r = 0; r * n_vocab < b.size(); ++r) {
    double num = 0, den = 0;
    for (int v = 0; v < n_vocab; ++v) {
      num = std::max(num, std::fabs(static_cast<double>(a[r * n_vocab + v]) - b[r * n_vocab + v]));
      den = std::max(den, std::fabs(static_cast<double>(b[r * n_vocab + v])));
    }
    worst = std::max(worst, num / den);
  }
  return worst;
}

}  // namespace pagellm::test
