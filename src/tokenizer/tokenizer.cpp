#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "format/gguf.h"
#include "tokenizer/unicode.h"

namespace pagellm {

std::vector<int32_t> Tokenizer::encode_pair(std::string_view first, std::string_view second) const {
  if (!pair_.found) {
    std::vector<int32_t> ids = encode(first, true, false);
    const std::vector<int32_t> more = encode(second, false, false);
    ids.insert(ids.end(), more.begin(), more.end());
    return ids;
  }
  std::vector<int32_t> ids = pair_.prefix;
  for (const auto* part : {&first, &second}) {
    const std::vector<int32_t> text = encode(*part, false, false);
    ids.insert(ids.end(), text.begin(), text.end());
    const std::vector<int32_t>& after = part == &first ? pair_.middle : pair_.suffix;
    ids.insert(ids.end(), after.begin(), after.end());
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    out += token_to_piece(id, /*render_special=*/!skip_special);
  }
  return out;
}

bool Tokenizer::is_eog(int32_t id) const { return std::find(eog_ids_.begin(), eog_ids_.end(), id) != eog_ids_.end(); }

bool Tokenizer::is_special(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  const TokenType t = token_type(id);
  return t == TokenType::Control || t == TokenType::Unknown;
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return from_hf_dir(path);
  if (!fs::exists(path, ec)) fail("tokenizer: '{}' does not exist", path);
  if (fs::path(path).filename() == "tokenizer.json") return from_hf_dir(path);
  char magic[4] = {};
  std::ifstream(path, std::ios::binary).read(magic, 4);
  if (std::string_view(magic, 4) == "GGUF") return from_gguf(*GGUFFile::open(path));
  fail("tokenizer: '{}' is neither a GGUF file nor a Hugging Face tokenizer (folder or tokenizer.json)", path);
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tok_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_ += tok_.token_to_piece(id, !skip_special_);
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const size_t len = unicode::valid_char_len(pending_, pos);
    if (len > 0) {
      out.append(pending_, pos, len);
      pos += len;
      continue;
    }
    // Invalid here: either a character still arriving (a valid prefix running
    // to the end of the buffer) or bytes that can never be one.
    const auto b0 = static_cast<uint8_t>(pending_[pos]);
    const size_t need = b0 >= 0xF0 && b0 <= 0xF4 ? 4 : b0 >= 0xE0 && b0 <= 0xEF ? 3 : b0 >= 0xC2 && b0 <= 0xDF ? 2 : 0;
    const size_t have = pending_.size() - pos;
    if (need > have) {
      // A prefix is pending only if appending continuation bytes could make it valid.
      std::string probe = pending_.substr(pos);
      probe.append(need - have, '\x80');
      if (probe[0] == '\xE0' && have == 1) probe[1] = '\xA0';
      if (probe[0] == '\xF0' && have == 1) probe[1] = '\x90';
      if (unicode::valid_char_len(probe, 0) == need) break;
    }
    out += "\xEF\xBF\xBD";  // U+FFFD
    pos += 1;
  }
  pending_.erase(0, pos);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  if (pending_.empty()) return {};
  pending_.clear();
  return "\xEF\xBF\xBD";
}

}  // namespace pagellm
