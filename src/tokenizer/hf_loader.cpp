// Tokenizer::from_hf_dir: a Hugging Face tokenizer.json (+ tokenizer_config.json,
// generation_config.json). Supports the BPE and WordPiece models and the
// normalizers / pre-tokenizers / post-processors current LLMs use; anything
// else is refused by name.
#include <fmt/format.h>

#include <charconv>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/json_limits.h"
#include "tokenizer/pipeline.h"

namespace pagellm {

namespace {

using json = nlohmann::json;
using tok::NormalizerStep;
using tok::PipelineTokenizer;
using tok::PreTokenizerStep;

// Real files nest Sequence steps 1-2 levels deep; the loader recurses per level.
constexpr int kMaxSequenceDepth = 16;

// tokenizer_config.json, generation_config.json (small files).
json read_json(const std::filesystem::path& p) { return read_json_file_bounded(p.string(), kConfigJsonLimits); }

void check_sequence_depth(int depth, const char* what) {
  if (depth > kMaxSequenceDepth)
    fail("tokenizer.json: {} Sequence nesting exceeds the limit of {}", what, kMaxSequenceDepth);
}

// A token id from JSON: an integer in [0, 2^31) (a float or huge value is
// refused, never converted).
int32_t json_token_id(const json& v) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0) ||
      v.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX))
    fail("tokenizer.json: token id {} is not an integer from 0 to {}", v.dump(), INT32_MAX);
  return static_cast<int32_t>(v.get<int64_t>());
}

// tokenizer.json parsed by SAX: the large model.vocab object and model.merges
// array stream into vectors (a DOM of them costs ~1 s for a 128k vocabulary);
// everything else becomes an ordinary json DOM.
struct TokenizerJson {
  json root;
  std::vector<std::pair<std::string, int64_t>> vocab;  // model.vocab when it is an object
  bool has_vocab = false;
  std::vector<std::pair<std::string, std::string>> merges;  // model.merges, either format
  bool has_merges = false;
};

class TokenizerJsonSax final : public nlohmann::json_sax<json> {
 public:
  explicit TokenizerJsonSax(TokenizerJson& out) : out_(out) {}

  bool null() override { return value(json()); }
  bool boolean(bool v) override { return value(v); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::Vocab) {
      out_.vocab.emplace_back(std::move(key_), v);
      return true;
    }
    return value(v);
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::Vocab) {
      out_.vocab.emplace_back(std::move(key_), static_cast<int64_t>(v));
      return true;
    }
    return value(v);
  }
  bool number_float(number_float_t v, const string_t&) override { return value(v); }
  bool binary(binary_t&) override { return value(json()); }
  bool string(string_t& v) override {
    if (mode_ == Mode::Merges) {
      if (merge_depth_ == 1) {  // "a b"
        const size_t sp = v.find(' ', 1);
        if (sp == std::string::npos)
          out_.merges.emplace_back();
        else
          out_.merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      } else {  // ["a", "b"]
        if (merge_part_ == 0) out_.merges.emplace_back(std::move(v), std::string());
        else if (merge_part_ == 1) out_.merges.back().second = std::move(v);
        ++merge_part_;
      }
      return true;
    }
    return value(std::move(v));
  }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool start_object(std::size_t) override {
    if (mode_ != Mode::Dom) return false;  // objects inside vocab / merges: not a format we know
    if (path_is_model() && key_ == "vocab") {
      mode_ = Mode::Vocab;
      out_.has_vocab = true;
      return true;
    }
    return open(json::object());
  }
  bool end_object() override {
    if (mode_ == Mode::Vocab) {
      mode_ = Mode::Dom;
      return true;
    }
    return close();
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::Merges) {
      ++merge_depth_;
      merge_part_ = 0;
      return merge_depth_ <= 2;
    }
    if (mode_ == Mode::Vocab) return false;
    if (path_is_model() && key_ == "merges") {
      mode_ = Mode::Merges;
      merge_depth_ = 1;
      out_.has_merges = true;
      return true;
    }
    return open(json::array());
  }
  bool end_array() override {
    if (mode_ == Mode::Merges) {
      if (--merge_depth_ == 0) mode_ = Mode::Dom;
      return true;
    }
    return close();
  }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = fmt::format("at byte {}: {}", pos, e.what());
    return false;
  }
  const std::string& error() const { return error_; }

 private:
  enum class Mode { Dom, Vocab, Merges };

  bool path_is_model() const { return stack_.size() == 2 && names_.size() == 2 && names_[1] == "model"; }
  // Adds v to the current container (or makes it the root); returns the stored value.
  json* insert(json&& v) {
    if (stack_.empty()) {
      out_.root = std::move(v);
      return &out_.root;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    json& slot = parent[key_];
    slot = std::move(v);
    return &slot;
  }
  bool value(json&& v) {
    if (mode_ != Mode::Dom) return false;
    insert(std::move(v));
    return true;
  }
  bool open(json&& container) {
    const std::string name = stack_.empty() || !stack_.back()->is_object() ? std::string() : key_;
    stack_.push_back(insert(std::move(container)));
    names_.push_back(name);
    return true;
  }
  bool close() {
    stack_.pop_back();
    names_.pop_back();
    return true;
  }

  TokenizerJson& out_;
  Mode mode_ = Mode::Dom;
  std::vector<json*> stack_;
  std::vector<std::string> names_;  // the key each open container was stored under
  std::string key_;
  int merge_depth_ = 0, merge_part_ = 0;
  std::string error_;
};

TokenizerJson read_tokenizer_json(const std::filesystem::path& p) {
  const std::string text = read_text_file_bounded(p.string(), kTokenizerJsonLimits.max_text_bytes);
  // The SAX parser is iterative, but the DOM it builds is walked recursively.
  check_json_limits(text, kTokenizerJsonLimits, "'" + p.string() + "'");
  TokenizerJson out;
  TokenizerJsonSax sax(out);
  if (!json::sax_parse(text, &sax) || !out.root.is_object())
    fail("'{}' is not a valid tokenizer.json: {}", p.string(), sax.error().empty() ? "unexpected structure" : sax.error());
  return out;
}

// A token given as "text" or {"content": "text"} (tokenizer_config.json style).
std::string token_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return "";
}

std::string regex_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

std::shared_ptr<const tok::Regex> pattern_regex(const json& pattern, const char* where) {
  if (pattern.contains("Regex")) return std::make_shared<tok::Regex>(pattern.at("Regex").get<std::string>());
  if (pattern.contains("String"))
    return std::make_shared<tok::Regex>(regex_escape(pattern.at("String").get<std::string>()));
  fail("tokenizer.json: {} pattern must be String or Regex", where);
}

tok::SplitBehavior parse_behavior(const std::string& b) {
  if (b == "Isolated") return tok::SplitBehavior::Isolated;
  if (b == "Removed") return tok::SplitBehavior::Removed;
  if (b == "MergedWithPrevious") return tok::SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return tok::SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return tok::SplitBehavior::Contiguous;
  fail("tokenizer.json: unsupported split behavior '{}'", b);
}

// Const json access goes through at(): operator[] of a missing key is undefined.
void parse_normalizer(const json& n, std::vector<NormalizerStep>& out, int depth = 0) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  if (type == "Sequence") {
    check_sequence_depth(depth + 1, "normalizer");
    for (const auto& sub : n.at("normalizers")) parse_normalizer(sub, out, depth + 1);
  } else if (type == "Prepend") {
    out.push_back({NormalizerStep::Kind::Prepend, n.at("prepend").get<std::string>(), ""});
  } else if (type == "Replace") {
    NormalizerStep s{NormalizerStep::Kind::Replace, "", n.at("content").get<std::string>()};
    const json& pattern = n.at("pattern");
    if (pattern.contains("String"))
      s.a = pattern.at("String").get<std::string>();
    else
      s.regex = pattern_regex(pattern, "Replace");
    out.push_back(std::move(s));
  } else if (type == "NFC") {
    out.push_back({NormalizerStep::Kind::NFC, "", ""});
  } else if (type == "NFD") {
    out.push_back({NormalizerStep::Kind::NFD, "", ""});
  } else if (type == "Lowercase") {
    out.push_back({NormalizerStep::Kind::Lowercase, "", ""});
  } else if (type == "Strip") {
    NormalizerStep s{NormalizerStep::Kind::Strip, "", ""};
    s.strip_left = n.value("strip_left", true);
    s.strip_right = n.value("strip_right", true);
    out.push_back(s);
  } else if (type == "BertNormalizer") {
    NormalizerStep s{NormalizerStep::Kind::Bert, "", ""};
    s.bert.clean_text = n.value("clean_text", true);
    s.bert.handle_chinese_chars = n.value("handle_chinese_chars", true);
    s.bert.lowercase = n.value("lowercase", true);
    const json& sa = n.contains("strip_accents") ? n.at("strip_accents") : json();
    s.bert.strip_accents = sa.is_boolean() ? sa.get<bool>() : s.bert.lowercase;
    out.push_back(s);
  } else if (type == "Precompiled" && (!n.contains("precompiled_charsmap") || n.at("precompiled_charsmap").is_null())) {
    // empty charsmap: nothing to do
  } else if (type == "Precompiled") {
    const json& map = n.at("precompiled_charsmap");
    if (!map.is_string()) fail("tokenizer.json: Precompiled precompiled_charsmap must be a base64 string");
    NormalizerStep s{NormalizerStep::Kind::Precompiled, "", ""};
    s.charsmap = std::make_shared<const tok::PrecompiledCharsmap>(
        tok::PrecompiledCharsmap::from_base64(map.get<std::string>()));
    out.push_back(s);
  } else {
    fail("tokenizer.json: unsupported normalizer '{}'", type);
  }
}

struct PreTokenizerResult {
  bool byte_level = false;
};

void add_split(PipelineTokenizer& t, std::shared_ptr<const tok::Regex> re, tok::SplitBehavior b, bool invert) {
  PreTokenizerStep s{PreTokenizerStep::Kind::Split, {std::move(re), b, invert}};
  t.pre_tokenizers.push_back(std::move(s));
}

void parse_pre_tokenizer(const json& p, PipelineTokenizer& t, PreTokenizerResult& r, int depth = 0) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  if (r.byte_level && type != "ByteLevel")
    fail("tokenizer.json: pre-tokenizer '{}' after ByteLevel is not supported", type);
  if (type == "Sequence") {
    check_sequence_depth(depth + 1, "pre-tokenizer");
    for (const auto& sub : p.at("pretokenizers")) parse_pre_tokenizer(sub, t, r, depth + 1);
  } else if (type == "Split") {
    add_split(t, pattern_regex(p.at("pattern"), "Split"), parse_behavior(p.value("behavior", "Isolated")),
              p.value("invert", false));
  } else if (type == "ByteLevel") {
    if (p.value("add_prefix_space", false)) {
      if (!t.pre_tokenizers.empty())
        fail("tokenizer.json: ByteLevel add_prefix_space after other pre-tokenizers is not supported");
      NormalizerStep s{NormalizerStep::Kind::PrependIfMissing, " ", ""};
      t.normalizers.push_back(s);
    }
    if (p.value("use_regex", true))
      add_split(t, std::make_shared<tok::Regex>(tok::kGpt2Pattern), tok::SplitBehavior::Isolated, false);
    r.byte_level = true;
  } else if (type == "Metaspace") {
    if (!t.pre_tokenizers.empty()) fail("tokenizer.json: Metaspace after other pre-tokenizers is not supported");
    const std::string rep = p.value("replacement", std::string("\xE2\x96\x81"));
    std::string scheme = p.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = p.value("add_prefix_space", true) ? "always" : "never";
    t.normalizers.push_back({NormalizerStep::Kind::Replace, " ", rep});
    if (scheme != "never") {
      NormalizerStep s{NormalizerStep::Kind::PrependIfMissing, rep, ""};
      s.first_only = scheme == "first";
      t.normalizers.push_back(s);
    }
    if (p.value("split", true))
      add_split(t, std::make_shared<tok::Regex>(regex_escape(rep)), tok::SplitBehavior::MergedWithNext, false);
  } else if (type == "Digits") {
    add_split(t, std::make_shared<tok::Regex>(p.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)"),
              tok::SplitBehavior::Isolated, false);
  } else if (type == "BertPreTokenizer") {
    t.pre_tokenizers.push_back({PreTokenizerStep::Kind::Bert, {}});
  } else if (type == "WhitespaceSplit") {
    add_split(t, std::make_shared<tok::Regex>(R"(\s+)"), tok::SplitBehavior::Removed, false);
  } else if (type == "Whitespace") {
    add_split(t, std::make_shared<tok::Regex>(R"(\w+|[^\w\s]+)"), tok::SplitBehavior::Removed, true);
  } else if (type == "Punctuation") {
    add_split(t, std::make_shared<tok::Regex>(R"([\p{P}!-/:-@\[-`{-~])"),
              parse_behavior(p.value("behavior", "Isolated")), false);
  } else {
    fail("tokenizer.json: unsupported pre-tokenizer '{}'", type);
  }
}

bool decoder_is_byte_level(const json& d, int depth = 0) {
  if (!d.is_object()) return false;
  if (d.value("type", "") == "ByteLevel") return true;
  if (d.value("type", "") == "Sequence") {
    check_sequence_depth(depth + 1, "decoder");
    for (const auto& sub : d.at("decoders"))
      if (decoder_is_byte_level(sub, depth + 1)) return true;
  }
  return false;
}

struct Template {
  bool found = false;
  std::vector<int32_t> prefix, suffix;
  // The pair template's specials before $A, between $A and $B, after $B.
  bool pair_found = false;
  std::vector<int32_t> pair_prefix, pair_middle, pair_suffix;
};

// A post-processor id is added to every encoded prompt: one past the
// vocabulary would index past the embedding table.
int32_t vocab_token_id(const json& v, const tok::Vocabulary& vocab) {
  const int32_t id = json_token_id(v);
  if (id >= vocab.size())
    fail("tokenizer.json: post-processor token id {} is outside the vocabulary [0, {})", id, vocab.size());
  return id;
}

void parse_post_processor(const json& p, const tok::Vocabulary& vocab, Template& tpl, int depth = 0) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    check_sequence_depth(depth + 1, "post-processor");
    for (const auto& sub : p.at("processors")) parse_post_processor(sub, vocab, tpl, depth + 1);
  } else if (type == "TemplateProcessing") {
    tpl.found = true;
    auto special_ids = [&](const json& item) {
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      std::vector<int32_t> ids;
      if (p.contains("special_tokens") && p.at("special_tokens").contains(name)) {
        for (const auto& id : p.at("special_tokens").at(name).at("ids")) ids.push_back(vocab_token_id(id, vocab));
      } else if (int32_t id = vocab.find(name); id >= 0) {
        ids.push_back(id);
      } else {
        fail("tokenizer.json: TemplateProcessing names unknown token '{}'", name);
      }
      return ids;
    };
    // Each template's specials, by how many texts ($A, $B) come before them.
    auto parse = [&](const json& items, std::vector<std::vector<int32_t>*> parts) {
      for (auto* part : parts) part->clear();
      size_t texts = 0;
      for (const auto& item : items) {
        if (item.contains("Sequence")) {
          texts = std::min(texts + 1, parts.size() - 1);
          continue;
        }
        if (!item.contains("SpecialToken")) continue;
        const std::vector<int32_t> ids = special_ids(item);
        parts[texts]->insert(parts[texts]->end(), ids.begin(), ids.end());
      }
    };
    parse(p.at("single"), {&tpl.prefix, &tpl.suffix});
    tpl.pair_found = p.contains("pair") && p.at("pair").is_array();
    if (tpl.pair_found) parse(p.at("pair"), {&tpl.pair_prefix, &tpl.pair_middle, &tpl.pair_suffix});
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    tpl.found = true;
    tpl.prefix = {vocab_token_id(p.at("cls").at(1), vocab)};
    tpl.suffix = {vocab_token_id(p.at("sep").at(1), vocab)};
    // Pairs: BERT [CLS] a [SEP] b [SEP], RoBERTa <s> a </s></s> b </s>.
    tpl.pair_found = true;
    tpl.pair_prefix = tpl.prefix;
    tpl.pair_middle = tpl.suffix;
    if (type == "RobertaProcessing") tpl.pair_middle.push_back(tpl.suffix.front());
    tpl.pair_suffix = tpl.suffix;
  } else if (type == "ByteLevel") {
    // offsets only
  } else {
    fail("tokenizer.json: unsupported post-processor '{}'", type);
  }
}

void load_vocab(const TokenizerJson& tj, const json& added, PipelineTokenizer& t) {
  if (!tj.has_vocab) fail("model.vocab must be an object of token -> id");
  int64_t max_id = -1;
  for (const auto& [text, id] : tj.vocab) max_id = std::max(max_id, id);
  for (const auto& a : added) max_id = std::max<int64_t>(max_id, json_token_id(a.at("id")));
  if (max_id < 0 || max_id >= (int64_t(1) << 30)) fail("bad vocabulary size {}", max_id + 1);
  // The table is sized by the largest id: ids far past the tokens listed
  // would allocate for nothing (real vocabularies are dense).
  const size_t listed = tj.vocab.size() + added.size();
  if (static_cast<size_t>(max_id) >= 2 * listed + 1024)
    fail("token id {} is far past the {} tokens listed (vocabulary ids must be dense)", max_id, listed);
  const size_t n = static_cast<size_t>(max_id + 1);
  t.vocab.text.assign(n, std::string());
  t.vocab.type.assign(n, TokenType::Unused);
  t.vocab.score.assign(n, 0.0f);
  for (const auto& [text, id] : tj.vocab) {
    if (id < 0) fail("negative token id {}", id);
    t.vocab.text[id] = text;
    t.vocab.type[id] = TokenType::Normal;
  }
  for (const auto& a : added) {
    const int32_t id = json_token_id(a.at("id"));
    t.vocab.text[id] = a.at("content").get<std::string>();
    t.vocab.type[id] = a.value("special", false) ? TokenType::Control : TokenType::UserDefined;
  }
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_hf_dir(const std::string& where) {
  namespace fs = std::filesystem;
  fs::path dir(where), file;
  if (fs::is_directory(dir)) {
    file = dir / "tokenizer.json";
  } else {
    file = dir;
    dir = dir.parent_path();
  }
  if (!fs::exists(file)) fail("'{}' has no tokenizer.json", where);
  const TokenizerJson tj = read_tokenizer_json(file);
  const json& j = tj.root;
  json config = json::object();
  if (fs::exists(dir / "tokenizer_config.json")) config = read_json(dir / "tokenizer_config.json");

  try {
    auto t = std::make_unique<PipelineTokenizer>();
    const json& model = j.at("model");
    std::string model_type = model.value("type", "");
    if (model_type.empty() && tj.has_merges) model_type = "BPE";

    // Added tokens: tokenizer.json first, then any extra from tokenizer_config.json.
    json added = j.contains("added_tokens") && j.at("added_tokens").is_array() ? j.at("added_tokens") : json::array();
    if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
      std::set<int64_t> known;
      for (const auto& a : added) known.insert(json_token_id(a.at("id")));
      for (auto it = config["added_tokens_decoder"].begin(); it != config["added_tokens_decoder"].end(); ++it) {
        int64_t id = -1;
        const std::string& key = it.key();
        const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
        if (ec != std::errc() || end != key.data() + key.size() || id < 0)
          fail("tokenizer_config.json: added_tokens_decoder key '{}' is not a token id", key);
        if (known.count(id)) continue;
        json a = it.value();
        a["id"] = id;
        added.push_back(a);
      }
    }
    if (model_type != "BPE" && model_type != "WordPiece" && model_type != "Unigram")
      fail("unsupported tokenizer model '{}' (supported: BPE, WordPiece, Unigram)", model_type);
    if (model_type == "Unigram") {
      // Unigram's vocab is a list of [piece, score]: ids are positions.
      TokenizerJson pieces;
      std::vector<float> scores;
      if (!model.contains("vocab") || !model.at("vocab").is_array()) fail("Unigram model.vocab must be a list");
      for (const json& e : model.at("vocab")) {
        if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
          fail("Unigram model.vocab entries must be [piece, score]");
        pieces.vocab.emplace_back(e[0].get<std::string>(), static_cast<int64_t>(pieces.vocab.size()));
        scores.push_back(e[1].get<float>());
      }
      pieces.has_vocab = true;
      load_vocab(pieces, added, *t);
      std::copy(scores.begin(), scores.end(), t->vocab.score.begin());
    } else {
      load_vocab(tj, added, *t);
    }

    const std::string unk_text = model.contains("unk_token") && model.at("unk_token").is_string()
                                     ? model.at("unk_token").get<std::string>()
                                     : std::string();
    const bool byte_fallback = model.value("byte_fallback", false);
    t->vocab.index.build(t->vocab.text);
    if (byte_fallback)
      for (int32_t id : tok::find_byte_tokens(t->vocab))
        if (id >= 0 && t->vocab.type[id] == TokenType::Normal) t->vocab.type[id] = TokenType::Byte;
    int32_t unk = unk_text.empty() ? -1 : t->vocab.find(unk_text);
    if (model_type == "Unigram" && model.contains("unk_id") && model.at("unk_id").is_number_integer()) {
      unk = model.at("unk_id").get<int32_t>();
      if (unk < 0 || unk >= t->vocab.size()) fail("Unigram unk_id {} is outside the vocabulary", unk);
    }
    if (unk >= 0 && t->vocab.type[unk] == TokenType::Normal) t->vocab.type[unk] = TokenType::Unknown;

    parse_normalizer(j.contains("normalizer") ? j.at("normalizer") : json(), t->normalizers);
    PreTokenizerResult pre;
    parse_pre_tokenizer(j.contains("pre_tokenizer") ? j.at("pre_tokenizer") : json(), *t, pre);
    t->byte_level = pre.byte_level;

    if (model_type == "BPE") {
      auto str_or_empty = [&](const char* key) {
        return model.contains(key) && model.at(key).is_string() ? model.at(key).get<std::string>() : std::string();
      };
      if (!str_or_empty("continuing_subword_prefix").empty() || !str_or_empty("end_of_word_suffix").empty())
        fail("BPE with continuing_subword_prefix / end_of_word_suffix is not supported");
      tok::BpeModel::Options opt;
      opt.byte_fallback = byte_fallback;
      opt.unk_id = unk;
      opt.fuse_unk = model.value("fuse_unk", false);
      opt.ignore_merges = model.value("ignore_merges", false);
      auto bpe = std::make_unique<tok::BpeModel>(t->vocab, opt);
      if (!tj.has_merges) fail("BPE model without merges");
      std::string joined;
      for (size_t r = 0; r < tj.merges.size(); ++r) {
        const auto& [a, b] = tj.merges[r];
        if (a.empty() || b.empty()) continue;
        joined.assign(a);
        joined += b;
        const int32_t ia = t->vocab.find(a), ib = t->vocab.find(b), im = t->vocab.find(joined);
        if (ia >= 0 && ib >= 0 && im >= 0) bpe->add_merge(ia, ib, im, static_cast<uint32_t>(r));
      }
      t->description = fmt::format("Hugging Face BPE{}, {} tokens, {} merges", pre.byte_level ? " (byte-level)" : "",
                                   t->vocab.size(), bpe->merge_count());
      t->model = std::move(bpe);
    } else if (model_type == "Unigram") {
      t->model = std::make_unique<tok::UnigramModel>(t->vocab, unk, byte_fallback);
      t->description = fmt::format("Hugging Face Unigram, {} tokens", t->vocab.size());
    } else {
      const std::string prefix = model.value("continuing_subword_prefix", std::string("##"));
      t->model = std::make_unique<tok::WordPieceModel>(t->vocab, unk, /*gguf_style=*/false, prefix,
                                                       model.value("max_input_chars_per_word", 100));
      t->description = fmt::format("Hugging Face WordPiece, {} tokens", t->vocab.size());
    }
    if (pre.byte_level || decoder_is_byte_level(j.contains("decoder") ? j.at("decoder") : json()))
      t->piece_style = tok::PieceStyle::ByteLevel;
    else if (model_type == "WordPiece")
      t->piece_style = tok::PieceStyle::WordPieceHf;
    else
      t->piece_style = tok::PieceStyle::SentencePiece;

    for (const auto& a : added)
      t->specials.add(a.at("content").get<std::string>(), json_token_id(a.at("id")), !a.value("special", false),
                      a.value("lstrip", false), a.value("rstrip", false));

    // BOS / EOS and what add_special adds.
    auto config_token = [&](const char* key) {
      if (!config.contains(key)) return -1;
      const std::string text = token_content(config[key]);
      return text.empty() ? -1 : t->vocab.find(text);
    };
    int32_t bos = config_token("bos_token"), eos = config_token("eos_token");
    Template tpl;
    parse_post_processor(j.contains("post_processor") ? j.at("post_processor") : json(), t->vocab, tpl);
    bool add_bos = false, add_eos = false;
    if (tpl.found) {
      t->prefix_ids = tpl.prefix;
      t->suffix_ids = tpl.suffix;
      add_bos = !tpl.prefix.empty();
      add_eos = !tpl.suffix.empty();
      if (bos < 0 && add_bos) bos = tpl.prefix.front();
      if (tpl.pair_found) t->set_pair_template(tpl.pair_prefix, tpl.pair_middle, tpl.pair_suffix);
    } else {
      add_bos = config.value("add_bos_token", false) && bos >= 0;
      add_eos = config.value("add_eos_token", false) && eos >= 0;
      if (add_bos) t->prefix_ids = {bos};
      if (add_eos) t->suffix_ids = {eos};
    }

    std::string chat_template;
    if (config.contains("chat_template")) {
      const json& ct = config["chat_template"];
      if (ct.is_string()) {
        chat_template = ct.get<std::string>();
      } else if (ct.is_array()) {
        for (const auto& named : ct)
          if (chat_template.empty() || named.value("name", "") == "default")
            chat_template = named.value("template", "");
      }
    }
    if (chat_template.empty() && fs::exists(dir / "chat_template.jinja"))
      chat_template = read_text_file_bounded((dir / "chat_template.jinja").string(), kConfigJsonLimits.max_text_bytes);

    std::vector<int32_t> eog;
    if (fs::exists(dir / "generation_config.json")) {
      const json gen = read_json(dir / "generation_config.json");
      if (gen.contains("eos_token_id")) {
        const json& e = gen.at("eos_token_id");
        if (e.is_number_integer()) eog.push_back(e.get<int32_t>());
        if (e.is_array())
          for (const auto& x : e)
            if (x.is_number_integer()) eog.push_back(x.get<int32_t>());
      }
    }
    t->set_special(bos, eos, unk, add_bos, add_eos, std::move(eog), std::move(chat_template));
    return t;
  } catch (const json::exception& e) {
    fail("'{}': unexpected tokenizer.json structure: {}", file.string(), e.what());
  } catch (const Error& e) {
    if (std::string_view(e.what()).find(file.string()) != std::string_view::npos) throw;
    fail("'{}': {}", file.string(), e.what());
  }
}

}  // namespace pagellm
