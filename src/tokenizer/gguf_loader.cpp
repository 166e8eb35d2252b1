// Tokenizer::from_gguf: a vocabulary from tokenizer.ggml.* metadata.
#include <fmt/format.h>

#include "core/error.h"
#include "format/gguf.h"
#include "tokenizer/charsmap.h"
#include "tokenizer/pipeline.h"

namespace pagellm {

namespace {

using tok::PipelineTokenizer;

constexpr const char* kSpaceMarker = "\xE2\x96\x81";  // U+2581

// A special-token id key, or `fallback` when absent or out of range; -1 when
// the fallback is out of range too (a small vocabulary has no id 101).
int32_t token_id_key(const GGUFFile& f, const std::string& key, int32_t fallback, int32_t n_vocab) {
  if (fallback >= n_vocab) fallback = -1;
  const GGUFValue* v = f.find(key);
  if (!v || !v->is_integer()) return fallback;
  const int64_t id = f.get_int(key);
  return (id >= 0 && id < n_vocab) ? static_cast<int32_t>(id) : fallback;
}

void load_tokens(const GGUFFile& f, tok::Vocabulary& vocab) {
  const GGUFValue* tokens = f.find("tokenizer.ggml.tokens");
  if (!tokens || tokens->type != GGUFType::ARRAY || tokens->elem_type != GGUFType::STRING)
    fail("'{}' has no vocabulary (tokenizer.ggml.tokens missing or not a string array)", f.path());
  const size_t n = tokens->strings.size();
  if (n == 0 || n > (size_t(1) << 30)) fail("'{}': vocabulary of {} tokens", f.path(), n);
  vocab.text.reserve(n);
  for (std::string_view s : tokens->strings) vocab.text.emplace_back(s);

  vocab.score.assign(n, 0.0f);
  if (f.has("tokenizer.ggml.scores")) {
    auto scores = f.get_float_array("tokenizer.ggml.scores");
    if (scores.size() != n) fail("'{}': {} token scores for {} tokens", f.path(), scores.size(), n);
    vocab.score = std::move(scores);
  }
  vocab.type.assign(n, TokenType::Normal);
  if (f.has("tokenizer.ggml.token_type")) {
    auto types = f.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != n) fail("'{}': {} token types for {} tokens", f.path(), types.size(), n);
    for (size_t i = 0; i < n; ++i)
      vocab.type[i] = (types[i] >= 0 && types[i] <= 6) ? static_cast<TokenType>(types[i]) : TokenType::Undefined;
  }
  vocab.index.build(vocab.text);
}

void load_merges(const GGUFFile& f, PipelineTokenizer& t, tok::BpeModel& bpe) {
  const GGUFValue* merges = f.find("tokenizer.ggml.merges");
  if (!merges || merges->type != GGUFType::ARRAY || merges->elem_type != GGUFType::STRING)
    fail("'{}': BPE vocabulary without tokenizer.ggml.merges", f.path());
  std::string joined;
  uint32_t rank = 0;
  for (std::string_view m : merges->strings) {
    const size_t sp = m.find(' ', 1);
    const uint32_t r = rank++;
    if (sp == std::string_view::npos) continue;
    const std::string_view a = m.substr(0, sp), b = m.substr(sp + 1);
    joined.assign(a);
    joined += b;
    const int32_t ia = t.vocab.find(a), ib = t.vocab.find(b), im = t.vocab.find(joined);
    if (ia < 0 || ib < 0 || im < 0) continue;
    bpe.add_merge(ia, ib, im, r);
  }
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GGUFFile& f) {
  const GGUFValue* model_key = f.find("tokenizer.ggml.model");
  if (!model_key || model_key->type != GGUFType::STRING)
    fail("'{}' has no vocabulary (tokenizer.ggml.model missing)", f.path());
  const std::string model(model_key->str);
  if (model == "none" || model == "no_vocab") fail("'{}' has no vocabulary (tokenizer.ggml.model = '{}')", f.path(), model);

  auto t = std::make_unique<PipelineTokenizer>();
  load_tokens(f, t->vocab);
  const int32_t n = t->vocab.size();
  const std::string pre = f.get_string("tokenizer.ggml.pre", "");

  int32_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false, add_eos = false;
  if (model == "llama") {
    bos = token_id_key(f, "tokenizer.ggml.bos_token_id", n > 1 ? 1 : -1, n);
    eos = token_id_key(f, "tokenizer.ggml.eos_token_id", n > 2 ? 2 : -1, n);
    unk = token_id_key(f, "tokenizer.ggml.unknown_token_id", 0, n);
    add_bos = true;
    const bool space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", true);
    if (space_prefix) t->normalizers.push_back({tok::NormalizerStep::Kind::Prepend, kSpaceMarker, ""});
    t->normalizers.push_back({tok::NormalizerStep::Kind::Replace, " ", kSpaceMarker});
    t->model = std::make_unique<tok::SentencePieceModel>(t->vocab, unk);
    t->piece_style = tok::PieceStyle::SentencePiece;
    t->description = fmt::format("SentencePiece BPE, {} tokens{}", n, space_prefix ? "" : ", no space prefix");
  } else if (model == "gpt2") {
    const auto preset = tok::gguf_pre_tokenizer(pre);
    bos = token_id_key(f, "tokenizer.ggml.bos_token_id", -1, n);
    eos = token_id_key(f, "tokenizer.ggml.eos_token_id", -1, n);
    unk = token_id_key(f, "tokenizer.ggml.unknown_token_id", -1, n);
    add_bos = preset.add_bos;
    for (const auto& p : preset.patterns)
      t->pre_tokenizers.push_back({tok::PreTokenizerStep::Kind::Split, {std::make_shared<tok::Regex>(p)}});
    t->byte_level = true;
    tok::BpeModel::Options opt;
    opt.ignore_merges = preset.ignore_merges;
    auto bpe = std::make_unique<tok::BpeModel>(t->vocab, opt);
    load_merges(f, *t, *bpe);
    t->description = fmt::format("byte-level BPE, {} tokens, {} merges, pre-tokenizer '{}'", n, bpe->merge_count(),
                                 pre.empty() ? "default" : pre);
    t->model = std::move(bpe);
    t->piece_style = tok::PieceStyle::ByteLevel;
  } else if (model == "gemma4") {
    // Gemma 4: SentencePiece-style BPE over UTF-8 characters, not bytes.
    // Spaces become U+2581 (no prefix), each line and each run of newlines is
    // a piece (a run that is a token stays whole), and characters outside the
    // vocabulary become <0xNN> byte tokens; as llama.cpp's gemma4 vocabulary.
    bos = token_id_key(f, "tokenizer.ggml.bos_token_id", -1, n);
    eos = token_id_key(f, "tokenizer.ggml.eos_token_id", -1, n);
    unk = token_id_key(f, "tokenizer.ggml.unknown_token_id", -1, n);
    t->normalizers.push_back({tok::NormalizerStep::Kind::Replace, " ", kSpaceMarker});
    t->pre_tokenizers.push_back(
        {tok::PreTokenizerStep::Kind::Split, {std::make_shared<tok::Regex>("[^\\n]+|[\\n]+")}});
    tok::BpeModel::Options opt;
    opt.byte_fallback = true;
    opt.whole_newline_runs = true;
    auto bpe = std::make_unique<tok::BpeModel>(t->vocab, opt);
    load_merges(f, *t, *bpe);
    t->description = fmt::format("Gemma 4 BPE, {} tokens, {} merges", n, bpe->merge_count());
    t->model = std::move(bpe);
    t->piece_style = tok::PieceStyle::SentencePiece;
  } else if (model == "bert") {
    bos = token_id_key(f, "tokenizer.ggml.bos_token_id", token_id_key(f, "tokenizer.ggml.cls_token_id", 101, n), n);
    eos = token_id_key(f, "tokenizer.ggml.eos_token_id", -1, n);
    unk = token_id_key(f, "tokenizer.ggml.unknown_token_id", 100, n);
    int32_t sep = token_id_key(f, "tokenizer.ggml.seperator_token_id", -1, n);  // sic: the key llama.cpp writes
    sep = token_id_key(f, "tokenizer.ggml.separator_token_id", sep < 0 ? 102 : sep, n);
    add_bos = true;
    tok::NormalizerStep bert{tok::NormalizerStep::Kind::Bert, "", ""};
    t->normalizers.push_back(bert);
    t->pre_tokenizers.push_back({tok::PreTokenizerStep::Kind::Bert, {}});
    t->model = std::make_unique<tok::WordPieceModel>(t->vocab, unk, /*gguf_style=*/true);
    t->piece_style = tok::PieceStyle::WordPieceGguf;
    if (sep >= 0) t->suffix_ids.push_back(sep);
    // Pairs as BERT's tokenizer joins them: [CLS] a [SEP] b [SEP].
    if (sep >= 0 && bos >= 0) t->set_pair_template({bos}, {sep}, {sep});
    t->description = fmt::format("WordPiece, {} tokens", n);
  } else if (model == "t5") {
    // llama.cpp's UGM (SentencePiece Unigram: T5, and XLM-RoBERTa as its
    // converter writes it): the precompiled charsmap, then spaces as U+2581
    // (with remove_extra_whitespaces, leading and trailing ones dropped and
    // every word after exactly one), then the best-scoring segmentation of
    // the whole text. Defaults are llama.cpp's: eos 1, unk 2, pad 0, no bos,
    // an eos added.
    bos = token_id_key(f, "tokenizer.ggml.bos_token_id", -1, n);
    eos = token_id_key(f, "tokenizer.ggml.eos_token_id", n > 1 ? 1 : -1, n);
    unk = token_id_key(f, "tokenizer.ggml.unknown_token_id", n > 2 ? 2 : -1, n);
    int32_t sep = token_id_key(f, "tokenizer.ggml.seperator_token_id", -1, n);  // sic: the key llama.cpp writes
    sep = token_id_key(f, "tokenizer.ggml.separator_token_id", sep, n);
    add_eos = true;
    PAGELLM_CHECK(f.get_bool("tokenizer.ggml.escape_whitespaces", true),
                  "'{}': a UGM vocabulary with escape_whitespaces false is not supported", f.path());
    if (const GGUFValue* map = f.find("tokenizer.ggml.precompiled_charsmap")) {
      PAGELLM_CHECK(map->type == GGUFType::ARRAY && (map->elem_type == GGUFType::U8 || map->elem_type == GGUFType::I8),
                    "'{}': tokenizer.ggml.precompiled_charsmap is not an array of bytes", f.path());
      if (map->count > 0) {
        tok::NormalizerStep step{tok::NormalizerStep::Kind::Precompiled};
        step.charsmap = std::make_shared<const tok::PrecompiledCharsmap>(
            std::string(reinterpret_cast<const char*>(map->raw), static_cast<size_t>(map->count)));
        t->normalizers.push_back(std::move(step));
      }
    }
    const bool space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", false);
    const bool merge_spaces = f.get_bool("tokenizer.ggml.remove_extra_whitespaces", false);
    auto replace = [&](const char* pattern, const char* with) {
      tok::NormalizerStep step{tok::NormalizerStep::Kind::Replace, "", with};
      step.regex = std::make_shared<tok::Regex>(pattern);
      t->normalizers.push_back(std::move(step));
    };
    if (merge_spaces) {
      replace("^ +| +$", "");
      replace(" {2,}", " ");
    }
    if (space_prefix || merge_spaces) t->normalizers.push_back({tok::NormalizerStep::Kind::Prepend, kSpaceMarker, ""});
    t->normalizers.push_back({tok::NormalizerStep::Kind::Replace, " ", kSpaceMarker});
    t->model = std::make_unique<tok::UnigramModel>(t->vocab, unk, /*byte_fallback=*/false, /*by_token_type=*/true);
    t->piece_style = tok::PieceStyle::SentencePiece;
    // Pairs as llama-server joins them for rerank: [bos] a [eos] [sep] b [eos],
    // each part as the file's add_* flags say (XLM-R: <s> a </s></s> b </s>).
    const bool add_sep = f.get_bool("tokenizer.ggml.add_sep_token", false) && sep >= 0;
    const bool pair_bos = f.get_bool("tokenizer.ggml.add_bos_token", false) && bos >= 0;
    const bool pair_eos = f.get_bool("tokenizer.ggml.add_eos_token", true) && eos >= 0;
    std::vector<int32_t> middle;
    if (pair_eos) middle.push_back(eos);
    if (add_sep) middle.push_back(sep);
    if (!middle.empty())
      t->set_pair_template(pair_bos ? std::vector<int32_t>{bos} : std::vector<int32_t>{}, middle,
                           pair_eos ? std::vector<int32_t>{eos} : std::vector<int32_t>{});
    t->description = fmt::format("SentencePiece Unigram (UGM), {} tokens{}", n,
                                 t->normalizers.front().kind == tok::NormalizerStep::Kind::Precompiled
                                     ? ", precompiled charsmap" : "");
  } else {
    fail("'{}': unsupported tokenizer model '{}' (tokenizer.ggml.model; supported: llama, gpt2, gemma4, bert, t5)",
         f.path(), model);
  }

  add_bos = f.get_bool("tokenizer.ggml.add_bos_token", add_bos);
  if (model == "gemma4") add_bos = true;  // whatever the file says, as llama.cpp
  add_eos = f.get_bool("tokenizer.ggml.add_eos_token", add_eos);
  if (add_bos && bos < 0) add_bos = false;
  if (add_eos && eos < 0) add_eos = false;
  if (add_bos) t->prefix_ids.insert(t->prefix_ids.begin(), bos);
  if (add_eos) t->suffix_ids.push_back(eos);

  // EOT-like tokens end generation and are control tokens, whatever the file says (as llama.cpp).
  std::vector<int32_t> eog;
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id", "tokenizer.ggml.fim_pad_token_id",
                          "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id"})
    if (int32_t id = token_id_key(f, key, -1, n); id >= 0) eog.push_back(id);
  for (int32_t id = 0; id < n; ++id)
    if (tok::is_eot_like_text(t->vocab.text[id])) t->vocab.type[id] = TokenType::Control;
  t->build_special_matcher_from_types();
  t->set_special(bos, eos, unk, add_bos, add_eos, std::move(eog), f.get_string("tokenizer.chat_template", ""));
  return t;
}

}  // namespace pagellm
