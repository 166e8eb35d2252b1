#include "api/output_render.h"

namespace pagellm::api {

const char* finish_reason_name(FinishReason r) { return r == FinishReason::None ? nullptr : to_string(r); }

StopReason stop_reason(const std::string& stop_string, int32_t stop_token) {
  if (!stop_string.empty()) return stop_string;
  if (stop_token >= 0) return stop_token;
  return {};
}

std::vector<PositionLogprobs> render_logprobs(const std::vector<TokenLogprob>& lps, const TokenPiece& piece) {
  std::vector<PositionLogprobs> out;
  out.reserve(lps.size());
  for (const TokenLogprob& lp : lps) {
    PositionLogprobs& pos = out.emplace_back();
    pos.chosen = {lp.token, lp.logprob, std::nullopt, piece(lp.token)};
    pos.top.reserve(lp.top.size());
    for (const auto& [id, logprob] : lp.top) {
      const int32_t rank = static_cast<int32_t>(pos.top.size()) + 1;
      if (id == lp.token && !pos.chosen.rank) pos.chosen.rank = rank;
      pos.top.push_back({id, logprob, rank, piece(id)});
    }
    if (lp.rank > 0) pos.chosen.rank = lp.rank;
  }
  return out;
}

CompletionData render_completion(const CompletionDelta& d, const TokenPiece& piece) {
  CompletionData c;
  c.index = d.index;
  c.text = d.text;
  c.token_ids = d.token_ids;
  if (!d.logprobs.empty()) {
    c.logprobs = render_logprobs(d.logprobs, piece);
    for (const TokenLogprob& lp : d.logprobs) c.logprob_sum += lp.logprob;
  }
  c.finish_reason = finish_reason_name(d.finish_reason);
  if (c.finish_reason) c.stop_reason = stop_reason(d.stop_string, d.stop_token);
  c.num_output_tokens = d.num_output_tokens;
  return c;
}

OutputData render_output(const RequestOutput& out, const TokenPiece& piece) {
  OutputData o;
  o.request_id = out.request_id;
  o.finished = out.finished;
  o.error = out.error;
  o.num_prompt_tokens = out.num_prompt_tokens;
  o.num_cached_tokens = out.num_cached_tokens;
  o.queue_seconds = out.queue_seconds;
  o.ttft_seconds = out.ttft_seconds;
  o.e2e_seconds = out.e2e_seconds;
  o.completions.reserve(out.completions.size());
  for (const CompletionDelta& d : out.completions) o.completions.push_back(render_completion(d, piece));
  if (!out.prompt_logprobs.empty()) o.prompt_logprobs = render_logprobs(out.prompt_logprobs, piece);
  return o;
}

}  // namespace pagellm::api
