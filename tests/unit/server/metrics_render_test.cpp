#include "server/metrics_render.h"

#include <gtest/gtest.h>

#include <sstream>

namespace pagellm::server {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l == line) return true;
  return false;
}

TEST(ServerMetrics, ValueFormat) {
  EXPECT_EQ(format_metric_value(0), "0.0");
  EXPECT_EQ(format_metric_value(3), "3.0");
  EXPECT_EQ(format_metric_value(0.25), "0.25");
  EXPECT_EQ(format_metric_value(0.001), "0.001");
  EXPECT_EQ(format_metric_value(1.0 / 0.0), "+Inf");
  EXPECT_EQ(format_metric_value(0.0 / 0.0), "NaN");
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(ServerMetrics, RendersVllmNamedFamilies) {
  EngineStats s;
  EngineMetrics& m = s.metrics;
  m.num_requests_running = 3;
  m.num_requests_waiting = 1;
  m.kv_cache_usage = 0.5;
  m.kv_blocks_total = 100;
  m.kv_blocks_used = 50;
  m.kv_blocks_cached = 10;
  m.kv_blocks_free = 50;
  m.kv_state_slots_total = 8;
  m.kv_state_slots_used = 3;
  m.prompt_tokens = 1234;
  m.generation_tokens = 77;
  m.prefix_cache_queries = 64;
  m.prefix_cache_hits = 32;
  m.request_success["length"] = 4;
  m.time_to_first_token.observe(0.003);
  m.time_to_first_token.observe(0.003);
  m.time_to_first_token.observe(1000);  // past the last bound: only +Inf
  m.iteration_tokens.observe(16);
  m.spec_decode_num_drafts = 10;
  m.spec_decode_num_draft_tokens = 40;
  m.spec_decode_num_accepted_tokens = 25;
  m.spec_decode_accepted_per_pos = {9, 7, 5, 4};
  const std::string text = render_metrics(s, "my \"model\"", {{{"/v1/completions", 200}, 5}});
  const std::string l = "{model_name=\"my \\\"model\\\"\"";
  EXPECT_TRUE(has_line(text, "# TYPE pagellm:num_requests_running gauge"));
  EXPECT_TRUE(has_line(text, "pagellm:num_requests_running" + l + "} 3.0"));
  EXPECT_TRUE(has_line(text, "pagellm:num_requests_waiting" + l + "} 1.0"));
  EXPECT_TRUE(has_line(text, "pagellm:kv_cache_usage_perc" + l + "} 0.5"));
  EXPECT_TRUE(has_line(text, "pagellm:kv_blocks_total" + l + "} 100.0"));
  EXPECT_TRUE(has_line(text, "pagellm:kv_blocks_cached" + l + "} 10.0"));
  EXPECT_TRUE(has_line(text, "pagellm:kv_state_slots_total" + l + "} 8.0"));
  EXPECT_TRUE(has_line(text, "pagellm:kv_state_slots_used" + l + "} 3.0"));
  EXPECT_TRUE(has_line(text, "# TYPE pagellm:prompt_tokens_total counter"));
  EXPECT_TRUE(has_line(text, "pagellm:prompt_tokens_total" + l + "} 1234.0"));
  EXPECT_TRUE(has_line(text, "pagellm:generation_tokens_total" + l + "} 77.0"));
  EXPECT_TRUE(has_line(text, "pagellm:prefix_cache_hits_total" + l + "} 32.0"));
  // Every finish reason has a series, counted or not.
  EXPECT_TRUE(has_line(text, "pagellm:request_success_total" + l + ",finished_reason=\"length\"} 4.0"));
  EXPECT_TRUE(has_line(text, "pagellm:request_success_total" + l + ",finished_reason=\"stop\"} 0.0"));
  EXPECT_TRUE(has_line(text, "pagellm:request_success_total" + l + ",finished_reason=\"abort\"} 0.0"));
  // Histograms: cumulative buckets, +Inf == count.
  EXPECT_TRUE(has_line(text, "# TYPE pagellm:time_to_first_token_seconds histogram"));
  EXPECT_TRUE(has_line(text, "pagellm:time_to_first_token_seconds_bucket" + l + ",le=\"0.001\"} 0.0"));
  EXPECT_TRUE(has_line(text, "pagellm:time_to_first_token_seconds_bucket" + l + ",le=\"0.005\"} 2.0"));
  EXPECT_TRUE(has_line(text, "pagellm:time_to_first_token_seconds_bucket" + l + ",le=\"640.0\"} 2.0"));
  EXPECT_TRUE(has_line(text, "pagellm:time_to_first_token_seconds_bucket" + l + ",le=\"+Inf\"} 3.0"));
  EXPECT_TRUE(has_line(text, "pagellm:time_to_first_token_seconds_count" + l + "} 3.0"));
  EXPECT_TRUE(has_line(text, "pagellm:time_to_first_token_seconds_sum" + l + "} 1000.006"));
  EXPECT_TRUE(has_line(text, "pagellm:iteration_tokens_total_bucket" + l + ",le=\"16.0\"} 1.0"));
  for (const char* h : {"inter_token_latency_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"})
    EXPECT_TRUE(has_line(text, std::string("# TYPE pagellm:") + h + " histogram")) << h;
  EXPECT_TRUE(has_line(text, "pagellm:http_requests_total" + l + ",route=\"/v1/completions\",status=\"200\"} 5.0"));
  // Each family's TYPE line comes once, before its samples.
  size_t types = 0;
  for (size_t pos = 0; (pos = text.find("# TYPE ", pos)) != std::string::npos; ++pos) ++types;
  EXPECT_EQ(types, 51u);
  // Speculative decoding, by vLLM's names.
  EXPECT_TRUE(has_line(text, "pagellm:spec_decode_num_drafts_total" + l + "} 10.0"));
  EXPECT_TRUE(has_line(text, "pagellm:spec_decode_num_draft_tokens_total" + l + "} 40.0"));
  EXPECT_TRUE(has_line(text, "pagellm:spec_decode_num_accepted_tokens_total" + l + "} 25.0"));
  EXPECT_TRUE(has_line(text, "pagellm:spec_decode_num_accepted_tokens_per_pos_total" + l + ",position=\"0\"} 9.0"));
  EXPECT_TRUE(has_line(text, "pagellm:spec_decode_num_accepted_tokens_per_pos_total" + l + ",position=\"3\"} 4.0"));
  EXPECT_TRUE(has_line(text, "# TYPE pagellm:structured_output_cache_hits_total counter"));
  EXPECT_TRUE(has_line(text, "pagellm:preemptions_by_mode_total" + l + ",mode=\"swap\"} 0.0"));
  EXPECT_TRUE(has_line(text, "pagellm:kv_swapped_bytes_total" + l + ",direction=\"out\"} 0.0"));
  // What the tuning guides watch: preemptions by cause, scheduler time, batch fill, phase split.
  EXPECT_TRUE(has_line(text, "pagellm:preemptions_by_cause_total" + l + ",cause=\"priority\"} 0.0"));
  EXPECT_TRUE(has_line(text, "pagellm:preemptions_by_cause_total" + l + ",cause=\"fairness\"} 0.0"));
  EXPECT_TRUE(has_line(text, "# TYPE pagellm:scheduler_seconds histogram"));
  EXPECT_TRUE(has_line(text, "# TYPE pagellm:batch_fill_ratio histogram"));
  EXPECT_TRUE(has_line(text, "pagellm:step_tokens_total" + l + ",phase=\"decode\"} 0.0"));
  EXPECT_TRUE(has_line(text, "# TYPE pagellm:kv_fragmentation gauge"));
  EXPECT_TRUE(has_line(text, "# TYPE pagellm:kv_evicted_blocks_total counter"));

  // vLLM's prefix: the same families under vllm:, or both sets.
  const std::string vllm = render_metrics(s, "m", {}, MetricsPrefix::Vllm);
  EXPECT_TRUE(has_line(vllm, "vllm:num_requests_running{model_name=\"m\"} 3.0"));
  EXPECT_EQ(vllm.find("pagellm:"), std::string::npos);
  const std::string both = render_metrics(s, "m", {}, MetricsPrefix::Both);
  EXPECT_TRUE(has_line(both, "vllm:num_requests_running{model_name=\"m\"} 3.0"));
  EXPECT_TRUE(has_line(both, "pagellm:num_requests_running{model_name=\"m\"} 3.0"));
  EXPECT_EQ(metrics_prefix_from_name("both"), MetricsPrefix::Both);
  EXPECT_THROW(metrics_prefix_from_name("prometheus"), Error);
}

TEST(ServerMetrics, KvEventFamiliesOnlyWithKvEventsAndUnderEachPrefix) {
  EngineStats s;
  EXPECT_EQ(render_metrics(s, "m").find("kv_events_"), std::string::npos);
  s.kv_events = {.enabled = true, .published = 7, .dropped = 2, .resyncs = 1, .stored_blocks = 3, .subscribers = 1};
  const std::string both = render_metrics(s, "m", {}, MetricsPrefix::Both);
  for (const char* prefix : {"pagellm:", "vllm:"}) {
    const std::string p = prefix;
    EXPECT_TRUE(has_line(both, p + "kv_events_published_total{model_name=\"m\"} 7.0")) << p;
    EXPECT_TRUE(has_line(both, p + "kv_events_dropped_total{model_name=\"m\"} 2.0")) << p;
    EXPECT_TRUE(has_line(both, p + "kv_events_resyncs_total{model_name=\"m\"} 1.0")) << p;
    EXPECT_TRUE(has_line(both, p + "kv_events_stored_blocks{model_name=\"m\"} 3.0")) << p;
    EXPECT_TRUE(has_line(both, p + "kv_events_subscribers{model_name=\"m\"} 1.0")) << p;
  }
}

TEST(ServerMetrics, HttpCounters) {
  HttpCounters c;
  c.add("/health", 200);
  c.add("/health", 200);
  c.add("other", 404);
  const auto snap = c.snapshot();
  EXPECT_EQ(snap.at({"/health", 200}), 2);
  EXPECT_EQ(snap.at({"other", 404}), 1);
}

}  // namespace
}  // namespace pagellm::server
