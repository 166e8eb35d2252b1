#include "server/response_store.h"

namespace pagellm::server {

ResponseStore::ResponseStore(size_t max_entries, size_t max_bytes) : max_entries_(max_entries), max_bytes_(max_bytes) {}

void ResponseStore::put(const std::string& id, nlohmann::json conversation, nlohmann::json response,
                        nlohmann::json input_items) {
  if (max_entries_ == 0) return;
  // Its serialized size stands for its memory (the DOM is a small multiple).
  const auto size_of = [](const nlohmann::json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size();
  };
  const size_t bytes = size_of(conversation) + size_of(response) + size_of(input_items) + id.size();
  if (bytes > max_bytes_) return;  // would evict everything and still not fit
  std::lock_guard lock(mu_);
  erase_locked(id);
  lru_.push_front({id, std::move(conversation), std::move(response), std::move(input_items), bytes});
  by_id_[id] = lru_.begin();
  bytes_ += bytes;
  evict_locked();
}

const ResponseStore::Entry* ResponseStore::find_locked(const std::string& id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return &lru_.front();
}

std::optional<nlohmann::json> ResponseStore::get(const std::string& id) {
  std::lock_guard lock(mu_);
  const Entry* e = find_locked(id);
  if (!e) return std::nullopt;
  return e->conversation;
}

std::optional<nlohmann::json> ResponseStore::response(const std::string& id) {
  std::lock_guard lock(mu_);
  const Entry* e = find_locked(id);
  if (!e) return std::nullopt;
  return e->response;
}

std::optional<nlohmann::json> ResponseStore::input_items(const std::string& id) {
  std::lock_guard lock(mu_);
  const Entry* e = find_locked(id);
  if (!e) return std::nullopt;
  return e->input_items;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mu_);
  return erase_locked(id);
}

bool ResponseStore::erase_locked(const std::string& id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  bytes_ -= it->second->bytes;
  lru_.erase(it->second);
  by_id_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

void ResponseStore::evict_locked() {
  while (!lru_.empty() && (lru_.size() > max_entries_ || bytes_ > max_bytes_)) {
    bytes_ -= lru_.back().bytes;
    by_id_.erase(lru_.back().id);
    lru_.pop_back();
  }
}

}  // namespace pagellm::server
