#include "bench/serve_metrics.h"

#include <gtest/gtest.h>

namespace pagellm::bench {
namespace {

RequestRecord ok(int32_t prompt, int32_t out, double ttft, double latency, std::vector<double> itl) {
  RequestRecord r;
  r.success = true;
  r.prompt_tokens = prompt;
  r.output_tokens = out;
  r.ttft_s = ttft;
  r.latency_s = latency;
  r.itl_s = std::move(itl);
  return r;
}

TEST(BenchServeMetrics, Aggregates) {
  std::vector<RequestRecord> recs = {ok(10, 3, 0.5, 1.5, {0.4, 0.6}), ok(20, 5, 1.0, 3.0, {0.5, 0.5, 0.5, 0.5}),
                                     ok(30, 1, 0.2, 0.2, {})};
  RequestRecord bad;
  bad.error = "HTTP 500: boom";
  recs.push_back(bad);
  recs.push_back(bad);  // duplicate errors are listed once
  const ServeMetrics m = compute_serve_metrics(recs, 4.0);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.total_input_tokens, 60);
  EXPECT_EQ(m.total_output_tokens, 9);
  EXPECT_DOUBLE_EQ(m.request_throughput, 0.75);
  EXPECT_DOUBLE_EQ(m.output_throughput, 2.25);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 69 / 4.0);
  EXPECT_EQ(m.ttft_s.count, 3u);
  EXPECT_DOUBLE_EQ(m.ttft_s.median, 0.5);
  // TPOT only for requests with more than one token: (1.5-0.5)/2, (3-1)/4.
  EXPECT_EQ(m.tpot_s.count, 2u);
  EXPECT_DOUBLE_EQ(m.tpot_s.min, 0.5);
  EXPECT_DOUBLE_EQ(m.tpot_s.max, 0.5);
  EXPECT_EQ(m.itl_s.count, 6u);  // every gap of every request
  EXPECT_DOUBLE_EQ(m.itl_s.median, 0.5);
  EXPECT_DOUBLE_EQ(m.e2el_s.max, 3.0);
  ASSERT_EQ(m.errors.size(), 1u);
  EXPECT_EQ(m.errors[0], "HTTP 500: boom");
}

TEST(BenchServeMetrics, JsonShapeInMilliseconds) {
  const ServeMetrics m = compute_serve_metrics({ok(10, 3, 0.5, 1.5, {0.4, 0.6})}, 2.0);
  const nlohmann::json j = serve_metrics_json(m);
  for (const char* key : {"completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens",
                          "request_throughput", "output_throughput", "total_token_throughput", "ttft_ms", "tpot_ms",
                          "itl_ms", "e2el_ms", "errors"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_NEAR(j["ttft_ms"]["median"].get<double>(), 500.0, 1e-9);
  EXPECT_NEAR(j["itl_ms"]["p99"].get<double>(), 598.0, 1e-9);
  EXPECT_FALSE(serve_metrics_summary(m).empty());
}

TEST(BenchServeMetrics, NothingCompleted) {
  RequestRecord bad;
  bad.error = "x";
  const ServeMetrics m = compute_serve_metrics({bad}, 1.0);
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.output_throughput, 0);
  EXPECT_EQ(m.ttft_s.count, 0u);
  EXPECT_NE(serve_metrics_summary(m).find("TTFT"), std::string::npos);
}

}  // namespace
}  // namespace pagellm::bench
