// The conversations behind previous_response_id (/v1/responses): each stored
// response keeps the chat messages up to and including its own output, so a
// follow-up request continues it, its response object (GET
// /v1/responses/{id}) and its input items (GET /v1/responses/{id}/input_items). In memory, bounded by a number of responses
// and a number of bytes; the least recently used go first. Thread-safe.
#pragma once

#include <cstddef>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>

namespace pagellm::server {

class ResponseStore {
 public:
  // max_entries 0: nothing is stored.
  ResponseStore(size_t max_entries, size_t max_bytes);
  void put(const std::string& id, nlohmann::json conversation, nlohmann::json response = nullptr,
           nlohmann::json input_items = nlohmann::json::array());
  // The conversation, or nothing when unknown or evicted (a use counts as recent).
  std::optional<nlohmann::json> get(const std::string& id);
  // The response object, or nothing.
  std::optional<nlohmann::json> response(const std::string& id);
  // The input items the response was made from, oldest first, or nothing.
  std::optional<nlohmann::json> input_items(const std::string& id);
  // Forgets a response (DELETE /v1/responses/{id}); false when unknown.
  bool erase(const std::string& id);
  size_t size() const;

 private:
  struct Entry {
    std::string id;
    nlohmann::json conversation;
    nlohmann::json response;
    nlohmann::json input_items;
    size_t bytes = 0;
  };
  void evict_locked();
  bool erase_locked(const std::string& id);
  // The entry, made the most recent; null when unknown.
  const Entry* find_locked(const std::string& id);

  size_t max_entries_, max_bytes_;
  size_t bytes_ = 0;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_id_;
};

}  // namespace pagellm::server
