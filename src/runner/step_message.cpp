#include "runner/step_message.h"

#include <cstring>

#include "core/error.h"

namespace pagellm {
namespace {

constexpr uint32_t kMagic = 0x50535452;  // "RTSP": with linear-attention state slots

struct Writer {
  std::vector<uint8_t>& out;
  template <class T>
  void pod(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  template <class T>
  void array(const std::vector<T>& v) {
    pod(static_cast<uint64_t>(v.size()));
    if (v.empty()) return;  // data() may be null
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    out.insert(out.end(), p, p + v.size() * sizeof(T));
  }
};

struct Reader {
  const std::vector<uint8_t>& in;
  size_t at = 0;
  template <class T>
  T pod() {
    PAGELLM_CHECK(at + sizeof(T) <= in.size(), "truncated step message");
    T v;
    std::memcpy(&v, in.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  template <class T>
  void array(std::vector<T>& v) {
    const auto n = pod<uint64_t>();
    PAGELLM_CHECK(n <= (in.size() - at) / sizeof(T), "truncated step message");
    v.resize(n);
    if (n == 0) return;  // memcpy must not see the null data() of an empty vector
    std::memcpy(v.data(), in.data() + at, n * sizeof(T));
    at += n * sizeof(T);
  }
};

}  // namespace

std::vector<uint8_t> encode_step(const StepMessage& m) {
  std::vector<uint8_t> out;
  Writer w{out};
  w.pod(kMagic);
  w.pod(static_cast<int32_t>(m.kind));
  w.array(m.swap_out);
  w.array(m.swap_in);
  w.array(m.block_copies);
  w.array(m.state_copies);
  w.array(m.batch.token_ids);
  w.array(m.batch.positions);
  w.array(m.batch.slot_mapping);
  w.pod(static_cast<uint64_t>(m.batch.group_slots.size()));
  for (const auto& slots : m.batch.group_slots) w.array(slots);
  w.pod(static_cast<uint64_t>(m.batch.seqs.size()));
  for (const SeqInfo& s : m.batch.seqs) {
    w.pod(s.q_start);
    w.pod(s.q_len);
    w.pod(s.ctx_len);
    w.pod(s.kv_sinks);
    w.pod(s.kv_evicted_to);
    w.pod(s.state_slot);
    w.array(s.block_table);
    w.pod(static_cast<uint64_t>(s.group_tables.size()));
    for (const auto& table : s.group_tables) w.array(table);
  }
  w.array(m.logits_rows);
  w.array(m.hidden_rows);
  return out;
}

StepMessage decode_step(const std::vector<uint8_t>& bytes) {
  Reader r{bytes};
  PAGELLM_CHECK(r.pod<uint32_t>() == kMagic, "step message with a bad header (ranks of different builds?)");
  StepMessage m;
  const auto kind = r.pod<int32_t>();
  PAGELLM_CHECK(kind == StepMessage::Step || kind == StepMessage::Shutdown, "step message of unknown kind {}", kind);
  m.kind = static_cast<StepMessage::Kind>(kind);
  r.array(m.swap_out);
  r.array(m.swap_in);
  r.array(m.block_copies);
  r.array(m.state_copies);
  r.array(m.batch.token_ids);
  r.array(m.batch.positions);
  r.array(m.batch.slot_mapping);
  const auto n_groups = r.pod<uint64_t>();
  PAGELLM_CHECK(n_groups <= 1024, "step message with {} KV-cache groups", n_groups);
  m.batch.group_slots.resize(n_groups);
  for (auto& slots : m.batch.group_slots) r.array(slots);
  const auto n_seqs = r.pod<uint64_t>();
  PAGELLM_CHECK(n_seqs <= bytes.size(), "truncated step message");
  m.batch.seqs.resize(n_seqs);
  for (SeqInfo& s : m.batch.seqs) {
    s.q_start = r.pod<int32_t>();
    s.q_len = r.pod<int32_t>();
    s.ctx_len = r.pod<int32_t>();
    s.kv_sinks = r.pod<int32_t>();
    s.kv_evicted_to = r.pod<int32_t>();
    s.state_slot = r.pod<int32_t>();
    r.array(s.block_table);
    const auto n_tables = r.pod<uint64_t>();
    PAGELLM_CHECK(n_tables == n_groups, "step message: a sequence with {} group tables of {}", n_tables, n_groups);
    s.group_tables.resize(n_tables);
    for (auto& table : s.group_tables) r.array(table);
  }
  r.array(m.logits_rows);
  r.array(m.hidden_rows);
  PAGELLM_CHECK(r.at == bytes.size(), "step message with {} trailing bytes", bytes.size() - r.at);
  return m;
}

}  // namespace pagellm
