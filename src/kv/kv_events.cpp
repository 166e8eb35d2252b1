#include "kv/kv_events.h"

#include <algorithm>

#include "core/error.h"

namespace pagellm {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

size_t weight_of(const std::vector<KvEvent>& events) {
  size_t w = 0;
  for (const KvEvent& e : events) w += std::max<size_t>(1, e.block_hashes.size());
  return w;
}

}  // namespace

const char* kv_event_type_name(KvEventType type) {
  switch (type) {
    case KvEventType::BlockStored: return "BlockStored";
    case KvEventType::BlockRemoved: return "BlockRemoved";
    case KvEventType::AllBlocksCleared: return "AllBlocksCleared";
  }
  return "?";
}

KvEventLog::KvEventLog(size_t capacity) : capacity_(capacity) {
  PAGELLM_CHECK(capacity >= 1, "the KV event buffer needs room for at least 1 event");
}

void KvEventLog::apply_locked(const KvEvent& e) {
  switch (e.type) {
    case KvEventType::AllBlocksCleared:
      if (e.medium.empty()) stored_.clear();
      else stored_.erase(e.medium);
      return;
    case KvEventType::BlockRemoved: {
      auto it = stored_.find(e.medium);
      if (it == stored_.end()) return;
      for (BlockHash h : e.block_hashes) it->second.erase(h);
      return;
    }
    case KvEventType::BlockStored: {
      auto& blocks = stored_[e.medium];
      std::optional<BlockHash> parent = e.parent_block_hash;
      const size_t bs = static_cast<size_t>(e.block_size);
      for (size_t i = 0; i < e.block_hashes.size(); ++i) {
        Stored s{parent, {}, e.block_size, e.lora_id, e.medium};
        if ((i + 1) * bs <= e.token_ids.size())
          s.tokens.assign(e.token_ids.begin() + static_cast<ptrdiff_t>(i * bs),
                          e.token_ids.begin() + static_cast<ptrdiff_t>((i + 1) * bs));
        blocks[e.block_hashes[i]] = std::move(s);
        parent = e.block_hashes[i];
      }
      return;
    }
  }
}

void KvEventLog::publish(std::vector<KvEvent> events) {
  if (events.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const KvEvent& e : events) apply_locked(e);
    Entry entry{KvEventBatch{++last_seq_, now_seconds(), std::move(events)}, 0, published_};
    entry.weight = weight_of(entry.batch.events);
    published_ += entry.batch.events.size();
    weight_ += entry.weight;
    window_.push_back(std::move(entry));
    // The newest batch stays even when it alone is over the capacity.
    while (weight_ > capacity_ && window_.size() > 1) {
      weight_ -= window_.front().weight;
      window_.pop_front();
    }
  }
  cv_.notify_all();
}

KvEventBatch KvEventLog::snapshot_locked() const {
  KvEventBatch snap{last_seq_, now_seconds(), {}};
  snap.events.push_back(kv_event(KvEventType::AllBlocksCleared));
  for (const auto& [medium, blocks] : stored_) {
    for (const auto& [hash, s] : blocks) {
      KvEvent e = kv_event(KvEventType::BlockStored);
      e.block_hashes = {hash};
      e.parent_block_hash = s.parent;
      e.token_ids = s.tokens;
      e.block_size = s.block_size;
      e.lora_id = s.lora_id;
      e.medium = s.medium;
      snap.events.push_back(std::move(e));
    }
  }
  return snap;
}

KvEventLog::Read KvEventLog::read(Cursor cursor, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (cursor.started && cursor.seq == last_seq_)
    cv_.wait_for(lock, timeout, [&] { return last_seq_ != cursor.seq; });
  Read r;
  const uint64_t oldest = window_.empty() ? last_seq_ + 1 : window_.front().batch.seq;
  if (!cursor.started || cursor.seq + 1 < oldest || cursor.seq > last_seq_) {
    if (cursor.started) {
      const uint64_t kept_from = window_.empty() ? published_ : window_.front().events_before;
      r.missed = kept_from > cursor.events ? kept_from - cursor.events : 0;
      dropped_ += r.missed;
      ++resyncs_;
    }
    r.resync = true;
    r.batches.push_back(snapshot_locked());
  } else {
    for (const Entry& e : window_)
      if (e.batch.seq > cursor.seq) r.batches.push_back(e.batch);
  }
  r.cursor = {true, last_seq_, published_};
  return r;
}

uint64_t KvEventLog::published_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_;
}

uint64_t KvEventLog::dropped_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

uint64_t KvEventLog::resyncs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return resyncs_;
}

KvEventCounts KvEventLog::counts() const {
  KvEventCounts c;
  c.enabled = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    c.published = published_;
    c.dropped = dropped_;
    c.resyncs = resyncs_;
  }
  c.stored_blocks = stored_blocks();
  c.subscribers = subscribers_.load();
  return c;
}

size_t KvEventLog::stored_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [medium, blocks] : stored_) n += blocks.size();
  return n;
}

}  // namespace pagellm
