#include "tokenizer/vocab.h"

#include <algorithm>
#include <cstring>

#include "core/util.h"

namespace pagellm::tok {

namespace {

size_t capacity_for(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  return cap;
}

}  // namespace

uint64_t hash_bytes(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0x2545F4914F6CDD1Dull);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ (w * 0x87C37B91114253D5ull)) * 0x4CF5AD432745937Full;
    h = (h << 31) | (h >> 33);
  }
  uint64_t tail = 0;
  for (size_t k = 0; i + k < n; ++k) tail |= uint64_t(p[i + k]) << (8 * k);
  return mix64(h ^ tail);
}

void TokenIndex::build(const std::vector<std::string>& texts) {
  texts_ = &texts;
  slots_.assign(capacity_for(texts.size()), Slot{});
  mask_ = slots_.size() - 1;
  for (size_t id = 0; id < texts.size(); ++id) {
    const std::string& t = texts[id];
    if (t.empty()) continue;
    const uint64_t h = hash_bytes(t);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (uint64_t slot = h & mask_;; slot = (slot + 1) & mask_) {
      Slot& s = slots_[slot];
      if (s.id < 0 || (s.tag == tag && texts[s.id] == t)) {
        s = {static_cast<int32_t>(id), tag};
        break;
      }
    }
  }
}

int32_t TokenIndex::find(std::string_view text) const {
  if (slots_.empty() || text.empty()) return -1;
  const uint64_t h = hash_bytes(text);
  const auto tag = static_cast<uint32_t>(h >> 32);
  for (uint64_t slot = h & mask_;; slot = (slot + 1) & mask_) {
    const Slot s = slots_[slot];
    if (s.id < 0) return -1;
    if (s.tag == tag && (*texts_)[s.id] == text) return s.id;
  }
}

void FlatMap64::reserve(size_t n) {
  if (capacity_for(n) <= slots_.size()) return;
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.resize(capacity_for(n));
  mask_ = slots_.size() - 1;
  size_ = 0;
  for (const Slot& s : old)
    if (s.used) insert(s.key, s.value);
}

void FlatMap64::grow() { reserve(std::max<size_t>(16, slots_.size())); }

bool FlatMap64::insert(uint64_t key, uint32_t value) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  for (uint64_t slot = mix64(key) & mask_;; slot = (slot + 1) & mask_) {
    Slot& s = slots_[slot];
    if (!s.used) {
      s = Slot{key, value, true};
      ++size_;
      return true;
    }
    if (s.key == key) return false;
  }
}

const uint32_t* FlatMap64::find(uint64_t key) const {
  if (slots_.empty()) return nullptr;
  for (uint64_t slot = mix64(key) & mask_;; slot = (slot + 1) & mask_) {
    const Slot& s = slots_[slot];
    if (!s.used) return nullptr;
    if (s.key == key) return &s.value;
  }
}

int32_t SpecialTokenMatcher::child(int32_t node, uint8_t byte) const {
  const auto& edges = nodes_[node].edges;
  auto it = std::lower_bound(edges.begin(), edges.end(), byte,
                             [](const std::pair<uint8_t, int32_t>& e, uint8_t b) { return e.first < b; });
  return (it != edges.end() && it->first == byte) ? it->second : -1;
}

void SpecialTokenMatcher::add(std::string_view text, int32_t id, bool always, bool lstrip, bool rstrip) {
  if (text.empty()) return;
  int32_t node = 0;
  for (char ch : text) {
    const auto b = static_cast<uint8_t>(ch);
    int32_t next = child(node, b);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& edges = nodes_[node].edges;
      auto it = std::lower_bound(edges.begin(), edges.end(), b,
                                 [](const std::pair<uint8_t, int32_t>& e, uint8_t x) { return e.first < x; });
      edges.insert(it, {b, next});
    }
    node = next;
  }
  Node& n = nodes_[node];
  n.token = id;
  n.always = always;
  n.lstrip = lstrip;
  n.rstrip = rstrip;
  first_byte_[static_cast<uint8_t>(text[0])] = true;
}

void SpecialTokenMatcher::split(std::string_view text, bool parse_special, std::vector<Segment>& out) const {
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  size_t raw_begin = 0;  // start of the pending raw-text segment
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    // Longest allowed token starting at pos.
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = child(node, static_cast<uint8_t>(text[i]));
      if (node < 0) break;
      const Node& n = nodes_[node];
      if (n.token >= 0 && (parse_special || n.always)) {
        best = node;
        best_end = i + 1;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const Node& tok = nodes_[best];
    size_t raw_end = pos;
    if (tok.lstrip)
      while (raw_end > raw_begin && is_space(text[raw_end - 1])) --raw_end;
    if (raw_end > raw_begin) out.push_back({-1, raw_begin, raw_end});
    out.push_back({tok.token, pos, best_end});
    pos = best_end;
    if (tok.rstrip)
      while (pos < text.size() && is_space(text[pos])) ++pos;
    raw_begin = pos;
  }
  if (text.size() > raw_begin) out.push_back({-1, raw_begin, text.size()});
}

}  // namespace pagellm::tok
