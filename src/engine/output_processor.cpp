#include "engine/output_processor.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "scheduler/scheduler.h"

namespace pagellm {

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    default: return "";
  }
}

void OutputProcessor::add(RequestState& r) {
  for (size_t i = 0; i < r.samples.size(); ++i) {
    SampleState& s = r.samples[i];
    s.detok = std::make_unique<IncrementalDetokenizer>(tokenizer_, r.params.skip_special_tokens);
    s.stop = std::make_unique<StopChecker>(r.params.stop, r.params.include_stop_str_in_output);
    s.delta.index = static_cast<int32_t>(i);
  }
  metrics_.prompt_tokens += static_cast<int64_t>(r.prompt.size());
}

void OutputProcessor::append(RequestState& r, SampleState& s, int32_t token, const SampleResult& res,
                             const Scheduler& scheduler) {
  const auto now = EngineClock::now();
  const SamplingParams& p = r.params;
  s.seq->token_ids.push_back(token);
  const int32_t n_out = s.seq->num_output_tokens();
  metrics_.generation_tokens++;
  if (!r.first_token) {
    r.first_token = now;
    metrics_.time_to_first_token.observe(std::chrono::duration<double>(now - r.arrival).count());
  } else if (n_out > 1) {
    metrics_.inter_token_latency.observe(std::chrono::duration<double>(now - s.last_token_time).count());
  }
  s.last_token_time = now;
  s.has_news = r.has_news = true;
  s.delta.token_ids.push_back(token);
  s.delta.num_output_tokens = n_out;
  if (p.logprobs >= 0) s.delta.logprobs.push_back({token, res.logprob, res.top_logprobs});
  if (s.grammar_dead_end) {
    s.pending_finish = FinishReason::Stop;
    return;
  }
  if (s.matcher) {
    // The mask allowed only tokens the grammar accepts; a stop token it
    // accepted ends the output, even with ignore_eos.
    if (!s.matcher->accept(token)) spdlog::warn("request {}: the grammar refused sampled token {}", r.id, token);
    if (s.matcher->terminated()) {
      s.pending_finish = FinishReason::Stop;
      return;
    }
  }

  const bool may_stop = n_out >= p.min_tokens;
  const bool stop_token = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
  if (may_stop && stop_token) {
    s.delta.stop_token = token;
    s.pending_finish = FinishReason::Stop;
    return;
  }
  if (may_stop && !p.ignore_eos && tokenizer_.is_eog(token)) {
    s.pending_finish = FinishReason::Stop;
    return;
  }
  const StopCheckResult sc = s.stop->feed(s.detok->push(token), may_stop);
  s.delta.text += sc.text;
  if (sc.stopped) {
    s.delta.stop_string = s.stop->matched_stop();
    s.pending_finish = FinishReason::Stop;
    return;
  }
  if (n_out >= p.max_tokens || scheduler.reached_max_model_len(*s.seq)) s.pending_finish = FinishReason::Length;
}

void OutputProcessor::finish(RequestState& r, SampleState& s, FinishReason reason) {
  if (s.finished) return;
  // Text held back for a possible stop string (or an unfinished character) is
  // final now, unless a stop string ended the sample.
  if (s.delta.stop_string.empty()) {
    std::string rest = s.detok->flush();
    s.delta.text += s.stop->feed(rest, false).text + s.stop->flush();
  }
  s.finished = true;
  s.delta.finish_reason = reason;
  s.has_news = r.has_news = true;
  r.finished_samples++;
}

void OutputProcessor::abort(RequestState& r) {
  for (SampleState& s : r.samples) {
    if (s.finished) continue;
    s.finished = true;
    s.delta.finish_reason = FinishReason::Abort;
    s.has_news = true;
    r.finished_samples++;
  }
  r.has_news = true;
}

RequestOutput OutputProcessor::collect(RequestState& r) {
  RequestOutput out;
  out.request_id = r.id;
  out.num_prompt_tokens = static_cast<int32_t>(r.prompt.size());
  out.num_cached_tokens = r.num_cached_tokens;
  if (r.prompt_logprobs_done && !r.prompt_logprobs_sent) {
    out.prompt_logprobs = std::move(r.prompt_logprobs);
    r.prompt_logprobs_sent = true;
  }
  for (SampleState& s : r.samples) {
    if (!s.has_news) continue;
    out.completions.push_back(std::move(s.delta));
    s.delta = CompletionDelta{};
    s.delta.index = out.completions.back().index;
    s.delta.num_output_tokens = out.completions.back().num_output_tokens;
    s.has_news = false;
  }
  r.has_news = false;
  const auto now = EngineClock::now();
  out.finished = r.finished_samples == r.params.n;
  if (r.first_scheduled) out.queue_seconds = std::chrono::duration<double>(*r.first_scheduled - r.arrival).count();
  if (r.first_token) out.ttft_seconds = std::chrono::duration<double>(*r.first_token - r.arrival).count();
  out.e2e_seconds = std::chrono::duration<double>(now - r.arrival).count();
  if (out.finished && !r.grammar_error.empty()) {
    out.error = r.grammar_error;
    out.error_kind = RequestError::Invalid;
    out.error_param = r.params.structured.field;
  }
  if (out.finished) {
    metrics_.e2e_request_latency.observe(out.e2e_seconds);
    FinishReason reason = FinishReason::Stop;
    for (const auto& c : out.completions)
      if (c.finish_reason != FinishReason::None) reason = c.finish_reason;
    metrics_.request_success[to_string(reason)]++;
  }
  return out;
}

}  // namespace pagellm
