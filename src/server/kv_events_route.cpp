// GET /v1/kv_events: the engine's KV events (kv/kv_events.h) as Server-Sent
// Events, one `data:` line per batch:
//
//   {"seq": N, "ts": seconds, "events": [{"type": "BlockStored", "block_hashes": [...],
//     "parent_block_hash": h or null, "token_ids": [...], "block_size": 16,
//     "lora_id": null, "medium": "CPU"}, {"type": "BlockRemoved", ...}, ...]}
//
// A subscriber first gets a snapshot (AllBlocksCleared, then a BlockStored
// for every block stored now, at the seq it is current at), then each step's
// batch in order. Each subscriber only holds a cursor into the engine's
// bounded window: one that reads too slowly (or a step that stored more than
// the window holds) gets a fresh snapshot instead of what it missed, counted
// as dropped events. The engine never waits for a subscriber.
#include <httplib.h>

#include <memory>

#include "engine/async_engine.h"
#include "server/http_connections.h"
#include "server/http_errors.h"
#include "server/openai_response.h"
#include "server/openai_server.h"

namespace pagellm::server {
namespace {

using nlohmann::json;

// Idle subscribers get an SSE comment this often, so that a client (or a
// proxy) sees the stream alive and a vanished one is noticed.
constexpr std::chrono::seconds kKeepAlive{10};

json event_json(const KvEvent& e) {
  json j = {{"type", kv_event_type_name(e.type)}};
  if (e.type != KvEventType::AllBlocksCleared) j["block_hashes"] = e.block_hashes;
  if (e.type == KvEventType::BlockStored) {
    j["parent_block_hash"] = e.parent_block_hash ? json(*e.parent_block_hash) : json(nullptr);
    j["token_ids"] = e.token_ids;
    j["block_size"] = e.block_size;
    j["lora_id"] = e.lora_id ? json(e.lora_id) : json(nullptr);
  }
  j["medium"] = e.medium.empty() ? json(nullptr) : json(e.medium);
  return j;
}

std::string sse_data(const KvEventBatch& b) {
  json events = json::array();
  for (const KvEvent& e : b.events) events.push_back(event_json(e));
  return "data: " + dump_json({{"seq", b.seq}, {"ts", b.ts}, {"events", std::move(events)}}) + "\n\n";
}

struct Subscription {
  Subscription(const OpenAIServer& server, KvEventLog& log) : active(server), log(log) { log.add_subscriber(1); }
  ~Subscription() { log.add_subscriber(-1); }
  ActiveRequest active;  // shutdown waits for it: it ends within a poll once draining
  KvEventLog& log;
  ClientWatch watch = ClientWatch::current();
  KvEventLog::Cursor cursor;
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
};

}  // namespace

void OpenAIServer::kv_events(const httplib::Request&, httplib::Response& res) {
  require_accepting();
  KvEventLog* log = engine_.kv_events();
  if (!log)
    throw HttpError(404, "KV events are off: start the server with --kv-events", "kv_events_disabled");
  auto sub = std::make_shared<Subscription>(*this, *log);
  const auto poll = options_.poll_interval;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, log, sub, poll](size_t, httplib::DataSink& sink) {
    auto write = [&](const std::string& data) {
      sub->last_write = std::chrono::steady_clock::now();
      return sink.write(data.data(), data.size());
    };
    while (!draining_) {
      const KvEventLog::Read r = log->read(sub->cursor, poll);
      sub->cursor = r.cursor;
      for (const KvEventBatch& b : r.batches)
        if (!write(sse_data(b))) return false;
      if (r.batches.empty() && std::chrono::steady_clock::now() - sub->last_write >= kKeepAlive &&
          !write(": keep-alive\n\n"))
        return false;
      if (sub->watch.gone([&] { return write(": keep-alive\n\n"); })) return false;
    }
    sink.done();
    return true;
  });
}

}  // namespace pagellm::server
