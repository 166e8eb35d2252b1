// bench serve against a tiny fake OpenAI server (cpp-httplib) on loopback:
// streamed chunks, usage, errors, stalls, and the concurrency bound.
#include "bench/serve_client.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <map>
#include <thread>

#include "core/error.h"

namespace pagellm::bench {
namespace {

TEST(BenchServeUrl, Parse) {
  BaseUrl u = parse_base_url("http://127.0.0.1:8000");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 8000);
  EXPECT_EQ(u.prefix, "");
  u = parse_base_url("http://localhost/api/");
  EXPECT_EQ(u.host, "localhost");
  EXPECT_EQ(u.port, 80);
  EXPECT_EQ(u.prefix, "/api");
  u = parse_base_url("http://[::1]:9000/x");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 9000);
  EXPECT_EQ(u.prefix, "/x");
  for (const char* bad : {"https://127.0.0.1", "127.0.0.1:8000", "http://", "http://:80", "http://h:0", "http://h:99999",
                          "http://h:8x", "http://[::1", "http://h:"})
    EXPECT_THROW(parse_base_url(bad), Error) << bad;
}

TEST(BenchServeUrl, Loopback) {
  for (const char* h : {"localhost", "LOCALHOST", "127.0.0.1", "127.1.2.3", "::1"}) EXPECT_TRUE(is_loopback_host(h)) << h;
  for (const char* h : {"10.0.0.1", "example.com", "127.0.0.256", "127.0.0", "128.0.0.1", "localhost.evil.com", "0.0.0.0"})
    EXPECT_FALSE(is_loopback_host(h)) << h;
}

TEST(BenchServeOptions, RefusesRemoteUnlessAllowed) {
  ServeOptions o;
  o.base_url = "http://10.1.2.3:8000";
  EXPECT_THROW(o.validate(), Error);
  o.allow_remote = true;
  EXPECT_NO_THROW(o.validate());
  o.base_url = "http://127.0.0.1:8000";
  o.num_prompts = 0;
  EXPECT_THROW(o.validate(), Error);
  o.num_prompts = 1;
  o.prompt_format = "words";
  EXPECT_THROW(o.validate(), Error);
}

TEST(BenchServeOptions, RequestBody) {
  ServeOptions o;
  o.input_len = 16;
  o.output_len = 7;
  o.extra_body = {{"min_tokens", 7}, {"temperature", 0.5}};
  nlohmann::json b = completion_body(o, "m", 3, nullptr);
  EXPECT_EQ(b["model"], "m");
  EXPECT_EQ(b["max_tokens"], 7);
  EXPECT_EQ(b["stream"], true);
  EXPECT_EQ(b["ignore_eos"], true);
  EXPECT_EQ(b["min_tokens"], 7);
  EXPECT_EQ(b["temperature"], 0.5);  // extra body wins
  EXPECT_TRUE(b["prompt"].is_string());
  EXPECT_EQ(completion_body(o, "m", 3, nullptr)["prompt"], b["prompt"]);  // seeded
  EXPECT_NE(completion_body(o, "m", 4, nullptr)["prompt"], b["prompt"]);
  o.prompt_format = "tokens";
  o.vocab_size = 500;
  b = completion_body(o, "m", 0, nullptr);
  ASSERT_TRUE(b["prompt"].is_array());
  EXPECT_EQ(b["prompt"].size(), 16u);
  for (const auto& id : b["prompt"]) EXPECT_LT(id.get<int>(), 500);
}

// Streams max_tokens one-token chunks, then usage and [DONE]. Model names
// pick misbehaviours: "fail" answers 500, "stall" sends nothing, "noisy"
// streams an error event.
class FakeServer {
 public:
  FakeServer() {
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})", "application/json");
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      const auto body = nlohmann::json::parse(req.body);
      {
        std::lock_guard g(mu_);
        bodies_.push_back(body);
      }
      const std::string model = body.value("model", "");
      if (model == "fail") {
        res.status = 500;
        res.set_content(R"({"error":{"message":"boom"}})", "application/json");
        return;
      }
      const int n = body.value("max_tokens", 16);
      const int now = ++in_flight_;
      for (int seen = max_in_flight_.load(); now > seen && !max_in_flight_.compare_exchange_weak(seen, now);) {
      }
      auto sent = std::make_shared<int>(0);
      // Leaves the in-flight count before the last write: the client may send
      // its next request as soon as it reads it, before the releaser runs.
      auto left = std::make_shared<std::atomic<bool>>(false);
      auto leave = [this, left] {
        if (!left->exchange(true)) --in_flight_;
      };
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, n, sent, model, leave](size_t, httplib::DataSink& sink) {
            if (model == "stall") {
              std::this_thread::sleep_for(std::chrono::milliseconds(5));
              return !stop_.load();
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            std::string chunk;
            if (model == "noisy" && *sent == 2) {
              chunk = "data: {\"error\":{\"message\":\"engine died\"}}\n\n";
            } else if (*sent < n) {
              chunk = "data: {\"choices\":[{\"index\":0,\"text\":\" tok\",\"finish_reason\":null}]}\n\n";
            } else {
              leave();
              chunk = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":" + std::to_string(n) +
                      "}}\n\ndata: [DONE]\n\n";
            }
            if (!sink.write(chunk.data(), chunk.size())) return false;
            if (++*sent > n) sink.done();
            return true;
          },
          [leave](bool) { leave(); });
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeServer() {
    stop_ = true;
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int max_in_flight() const { return max_in_flight_; }
  std::vector<nlohmann::json> bodies() {
    std::lock_guard g(mu_);
    return bodies_;
  }

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> in_flight_{0}, max_in_flight_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<nlohmann::json> bodies_;
};

TEST(BenchServeClient, StreamsAndMeasures) {
  FakeServer server;
  ServeOptions o;
  o.base_url = server.url();
  o.num_prompts = 6;
  o.max_concurrency = 2;
  o.input_len = 8;
  o.output_len = 5;
  o.timeout_s = 30;
  const ServeResult r = run_serve(o);
  EXPECT_EQ(r.model, "fake-model");  // from /v1/models
  const ServeMetrics& m = r.metrics;
  EXPECT_EQ(m.completed, 6) << (m.errors.empty() ? "" : m.errors[0]);
  EXPECT_EQ(m.failed, 0);
  EXPECT_EQ(m.total_output_tokens, 30);
  EXPECT_EQ(m.total_input_tokens, 48);
  EXPECT_EQ(m.itl_s.count, 6u * 4);  // 5 chunks: 4 gaps each
  EXPECT_GT(m.ttft_s.min, 0);
  // Only bounds that a slow machine cannot break: the server sleeps 2 ms
  // before each of its 6 writes, so no request ends sooner than 12 ms; a
  // stalled client may read chunks together, so single gaps can be ~0, but
  // they always fit between the first chunk and the end.
  EXPECT_GE(m.e2el_s.min, 0.010);
  for (const RequestRecord& rec : r.records) {
    double gaps = 0;
    for (double g : rec.itl_s) {
      EXPECT_GE(g, 0);
      gaps += g;
    }
    EXPECT_LE(gaps, rec.latency_s - rec.ttft_s + 1e-9);
  }
  EXPECT_GE(m.e2el_s.min, m.ttft_s.min);
  EXPECT_GT(m.output_throughput, 0);
  EXPECT_LE(server.max_in_flight(), 2);
  const auto bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 6u);
  EXPECT_EQ(bodies[0]["stream"], true);
  EXPECT_EQ(bodies[0]["ignore_eos"], true);
  EXPECT_EQ(bodies[0]["max_tokens"], 5);
  const nlohmann::json j = serve_json(r, o);
  EXPECT_EQ(j["requests"].size(), 6u);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["metrics"]["completed"], 6);
}

TEST(BenchServeClient, MultiTurnPromptsGrowByTheReplyAndNewText) {
  FakeServer server;
  ServeOptions o;
  o.base_url = server.url();
  o.num_prompts = 3;  // conversations
  o.turns = 4;
  o.max_concurrency = 2;
  o.input_len = 8;
  o.turn_input_len = 4;
  o.output_len = 3;
  o.think_time_s = 0.01;
  o.timeout_s = 30;
  const ServeResult r = run_serve(o);
  EXPECT_EQ(r.metrics.completed, 12) << (r.metrics.errors.empty() ? "" : r.metrics.errors[0]);
  EXPECT_LE(server.max_in_flight(), 2);
  ASSERT_EQ(r.records.size(), 12u);
  for (size_t i = 0; i < r.records.size(); ++i) EXPECT_EQ(r.records[i].turn, static_cast<int32_t>(i % 4));
  // Each later prompt is an earlier one of its conversation, its reply (" tok" x 3) and new text.
  const auto bodies = server.bodies();
  int extended = 0;
  for (const auto& a : bodies)
    for (const auto& b : bodies) {
      const std::string pa = a["prompt"], pb = b["prompt"];
      if (pb.size() > pa.size() && pb.rfind(pa + " tok tok tok ", 0) == 0) ++extended;
    }
  EXPECT_GE(extended, 9);  // turns 1..3 of 3 conversations
  const TurnTtft t = turn_ttft(r.records);
  EXPECT_EQ(t.first.count, 3u);
  EXPECT_EQ(t.later.count, 9u);
  const nlohmann::json j = serve_json(r, o);
  EXPECT_EQ(j["multi_turn"]["turns"], 4);
  EXPECT_EQ(j["multi_turn"]["ttft_ms_later_turns"]["count"], 9);
  EXPECT_EQ(j["requests"][5]["turn"], 1);
  o.prompt_format = "tokens";
  EXPECT_THROW(o.validate(), Error);
}

// The arrival process is a pure function of the options, so it is checked as
// numbers, not by timing threads on a machine of unknown speed.
TEST(BenchServeSchedule, PoissonArrivals) {
  ServeOptions o;
  o.num_prompts = 4000;
  o.request_rate = 50;
  o.seed = 3;
  const std::vector<double> a = arrival_schedule(o);
  ASSERT_EQ(a.size(), 4000u);
  EXPECT_EQ(a[0], 0.0);
  std::vector<double> gaps;
  for (size_t i = 1; i < a.size(); ++i) {
    ASSERT_GE(a[i], a[i - 1]) << i;
    gaps.push_back(a[i] - a[i - 1]);
  }
  // Exponential gaps: mean 1/rate and standard deviation equal to the mean
  // (4000 draws: both within a few percent; the seed makes it exact anyway).
  double mean = 0, var = 0;
  for (double g : gaps) mean += g;
  mean /= static_cast<double>(gaps.size());
  for (double g : gaps) var += (g - mean) * (g - mean);
  const double sd = std::sqrt(var / static_cast<double>(gaps.size()));
  EXPECT_NEAR(mean, 1.0 / 50, 0.1 / 50);
  EXPECT_NEAR(sd, 1.0 / 50, 0.15 / 50);
  EXPECT_EQ(arrival_schedule(o), a);  // seeded
  o.seed = 4;
  EXPECT_NE(arrival_schedule(o), a);
  o.request_rate = std::numeric_limits<double>::infinity();  // all at once
  EXPECT_EQ(arrival_schedule(o), std::vector<double>(4000, 0.0));
}

// At a finite rate every request is sent, none before its arrival time (a
// lower bound: a slow machine only sends later).
TEST(BenchServeClient, PoissonArrivalsAreHonoured) {
  FakeServer server;
  ServeOptions o;
  o.base_url = server.url();
  o.model = "fake-model";
  o.num_prompts = 4;
  o.max_concurrency = 0;
  o.request_rate = 200;  // ~5 ms apart
  o.input_len = 4;
  o.output_len = 2;
  const ServeResult r = run_serve(o);
  EXPECT_EQ(r.metrics.completed, 4);
  const std::vector<double> due = arrival_schedule(o);
  ASSERT_EQ(r.records.size(), due.size());
  for (size_t i = 0; i < due.size(); ++i) EXPECT_GE(r.records[i].start_s, due[i] - 1e-6) << i;
}

TEST(BenchServeClient, HttpErrorsAndStreamErrorsFail) {
  FakeServer server;
  ServeOptions o;
  o.base_url = server.url();
  o.num_prompts = 2;
  o.output_len = 4;
  o.model = "fail";
  ServeResult r = run_serve(o);
  EXPECT_EQ(r.metrics.completed, 0);
  EXPECT_EQ(r.metrics.failed, 2);
  ASSERT_FALSE(r.metrics.errors.empty());
  EXPECT_NE(r.metrics.errors[0].find("HTTP 500"), std::string::npos) << r.metrics.errors[0];
  EXPECT_NE(r.metrics.errors[0].find("boom"), std::string::npos);
  o.model = "noisy";
  r = run_serve(o);
  EXPECT_EQ(r.metrics.failed, 2);
  ASSERT_FALSE(r.metrics.errors.empty());
  EXPECT_NE(r.metrics.errors[0].find("engine died"), std::string::npos) << r.metrics.errors[0];
}

TEST(BenchServeClient, TimeoutBoundsAStalledServer) {
  FakeServer server;
  ServeOptions o;
  o.base_url = server.url();
  o.model = "stall";
  o.num_prompts = 3;
  o.max_concurrency = 1;
  o.timeout_s = 0.5;
  const auto t0 = std::chrono::steady_clock::now();
  const ServeResult r = run_serve(o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The stalled server never ends a stream: returning at all is the point;
  // the bound only keeps a regression from hanging until ctest's timeout.
  EXPECT_LT(s, 120.0);
  EXPECT_EQ(r.metrics.completed, 0);
  EXPECT_EQ(r.metrics.failed, 3);  // one timed out in flight, two never sent
}

// A loopback port nothing listens on: bound, never listened, closed again.
int unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(BenchServeClient, UnreachableServer) {
  ServeOptions o;
  o.base_url = "http://127.0.0.1:" + std::to_string(unused_port());
  o.model = "m";
  o.num_prompts = 1;
  o.timeout_s = 300;
  const auto t0 = std::chrono::steady_clock::now();
  const ServeResult r = run_serve(o);
  EXPECT_EQ(r.metrics.failed, 1);
  ASSERT_FALSE(r.metrics.errors.empty());
  EXPECT_NE(r.metrics.errors[0].find("HTTP request failed"), std::string::npos) << r.metrics.errors[0];
  // Refused at once rather than waiting out the timeout: the two differ by
  // far more than any machine's speed.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
  o.model = "";
  EXPECT_THROW(run_serve(o), Error);  // no model name to be had
}

}  // namespace
}  // namespace pagellm::bench
