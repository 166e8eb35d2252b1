#include "server/openai_response.h"

#include <fmt/format.h>

#include <random>
#include <variant>

#include "api/utf8_check.h"

namespace pagellm::server {

using namespace api;  // request parsing and UTF-8 checks (src/api)

using nlohmann::json;

namespace {

// A chat choice's message (or, streaming, its delta) from the parsed output.
void put_chat_fields(json& message, const chat::ChatDelta& d, bool reasoning_parser, bool whole_message) {
  if (reasoning_parser && (whole_message || !d.reasoning.empty()))
    message["reasoning_content"] = d.reasoning.empty() ? json(nullptr) : json(d.reasoning);
  if (whole_message)
    message["content"] = d.content.empty() && !d.calls.empty() ? json(nullptr) : json(d.content);
  else if (!d.content.empty())
    message["content"] = d.content;
}

json finish_json(FinishReason r, size_t num_calls) {
  if (num_calls > 0 && (r == FinishReason::Stop || r == FinishReason::Length)) return "tool_calls";
  return finish_reason_json(r);
}

json bytes_json(const std::string& raw) {
  json b = json::array();
  for (unsigned char c : raw) b.push_back(static_cast<int>(c));
  return b;
}

// Each prompt's tokens count once, from its first output that knows them.
void count_prompt(std::vector<bool>& prompt_seen, Usage& usage, size_t prompt_index, const RequestOutput& out) {
  if (prompt_seen[prompt_index] || (out.num_prompt_tokens == 0 && !out.finished)) return;
  prompt_seen[prompt_index] = true;
  usage.prompt_tokens += out.num_prompt_tokens;
  usage.cached_tokens += out.num_cached_tokens;
}

// A sample's delta, counted into its choice and the usage; its text and
// logprobs are the caller's (streaming sends them, collecting keeps them).
void count_completion(ChoiceState& c, Usage& usage, const CompletionDelta& d) {
  c.num_tokens += static_cast<int64_t>(d.token_ids.size());
  usage.completion_tokens += static_cast<int64_t>(d.token_ids.size());
  if (d.finish_reason == FinishReason::None) return;
  c.finish = d.finish_reason;
  c.stop_reason = api::stop_reason(d.stop_string, d.stop_token);
}

}  // namespace

std::string make_tool_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("chatcmpl-tool-{:016x}{:016x}", rng(), rng());
}

json tool_call_json(const chat::ToolCall& call, const std::string& id) {
  return {{"id", id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json finish_reason_json(FinishReason r) {
  const char* name = api::finish_reason_name(r);
  return name ? json(name) : json(nullptr);
}

json stop_reason_json(const api::StopReason& r) {
  if (const auto* text = std::get_if<std::string>(&r)) return *text;
  if (const auto* token = std::get_if<int32_t>(&r)) return *token;
  return nullptr;
}

json completion_logprobs_json(const std::vector<api::PositionLogprobs>& lps, size_t first_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  size_t offset = first_offset;
  for (const api::PositionLogprobs& lp : lps) {
    const std::string text = sanitize_utf8(lp.chosen.piece);
    tokens.push_back(text);
    token_logprobs.push_back(lp.chosen.logprob);
    offsets.push_back(offset);
    offset += utf8_length(text);
    // Keyed by text: a later token with the same text as an earlier one is left out.
    json alternatives = json::object();
    for (const api::RankedToken& alt : lp.top) {
      const std::string alt_text = sanitize_utf8(alt.piece);
      if (!alternatives.contains(alt_text)) alternatives[alt_text] = alt.logprob;
    }
    if (!alternatives.contains(text)) alternatives[text] = lp.chosen.logprob;
    top.push_back(std::move(alternatives));
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

json prompt_logprobs_json(const std::vector<TokenLogprob>& lps, int32_t top, const TokenPiece& piece) {
  json out = json::array({nullptr});
  for (const TokenLogprob& lp : lps) {
    json position = json::object();
    const auto put = [&](int32_t id, float logprob, int32_t rank) {
      const std::string key = std::to_string(id);
      if (!position.contains(key))
        position[key] = {{"logprob", logprob}, {"rank", rank}, {"decoded_token", sanitize_utf8(piece(id))}};
    };
    const size_t shown = std::min(lp.top.size(), static_cast<size_t>(std::max(top, 0)));
    for (size_t i = 0; i < shown; ++i) put(lp.top[i].first, lp.top[i].second, static_cast<int32_t>(i) + 1);
    put(lp.token, lp.logprob, lp.rank);
    out.push_back(std::move(position));
  }
  return out;
}

json echo_logprobs_json(int32_t first_token, const std::vector<TokenLogprob>& prompt,
                        const std::vector<TokenLogprob>& completion, int32_t top, const TokenPiece& piece) {
  std::vector<TokenLogprob> all;
  all.reserve(prompt.size() + completion.size());
  for (TokenLogprob lp : prompt) {
    if (lp.top.size() > static_cast<size_t>(std::max(top, 0))) lp.top.resize(static_cast<size_t>(std::max(top, 0)));
    all.push_back(std::move(lp));
  }
  all.insert(all.end(), completion.begin(), completion.end());
  const std::string first = sanitize_utf8(piece(first_token));
  json rest = completion_logprobs_json(api::render_logprobs(all, piece), utf8_length(first));
  json out = {{"tokens", json::array({first})},
              {"token_logprobs", json::array({nullptr})},
              {"top_logprobs", json::array({nullptr})},
              {"text_offset", json::array({0})}};
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (auto& v : rest[key]) out[key].push_back(std::move(v));
  return out;
}

json chat_logprobs_json(const std::vector<api::PositionLogprobs>& lps) {
  const auto token_json = [](const api::RankedToken& t) {
    return json{{"token", sanitize_utf8(t.piece)}, {"logprob", t.logprob}, {"bytes", bytes_json(t.piece)}};
  };
  json content = json::array();
  for (const api::PositionLogprobs& lp : lps) {
    json top = json::array();
    for (const api::RankedToken& alt : lp.top) top.push_back(token_json(alt));
    json entry = token_json(lp.chosen);
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", content}, {"refusal", nullptr}};
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

// ---- non-streaming ----

ResponseCollector::ResponseCollector(ResponseMeta meta, size_t num_prompts, int32_t n, bool logprobs,
                                     std::vector<std::string> echo_prefixes, chat::ChatOutputOptions output,
                                     PromptLogprobsView prompt_view)
    : meta_(std::move(meta)),
      n_(n),
      logprobs_(logprobs),
      echo_(std::move(echo_prefixes)),
      output_(std::move(output)),
      prompt_view_(std::move(prompt_view)),
      prompt_logprobs_(num_prompts),
      choices_(num_prompts * static_cast<size_t>(n)),
      prompt_seen_(num_prompts, false) {
  echo_.resize(num_prompts);
  prompt_view_.first_tokens.resize(num_prompts);
}

void ResponseCollector::add(size_t prompt_index, const RequestOutput& out) {
  if (prompt_index >= prompt_seen_.size()) return;
  count_prompt(prompt_seen_, usage_, prompt_index, out);
  if (!out.prompt_logprobs.empty()) prompt_logprobs_[prompt_index] = out.prompt_logprobs;
  for (const CompletionDelta& d : out.completions) {
    if (d.index < 0 || d.index >= n_) continue;
    ChoiceState& c = choices_[prompt_index * static_cast<size_t>(n_) + static_cast<size_t>(d.index)];
    count_completion(c, usage_, d);
    c.text += d.text;
    c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
  }
}

json ResponseCollector::render(const TokenPiece& piece) const {
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const ChoiceState& c = choices_[i];
    const std::string& prefix = echo_[i / static_cast<size_t>(n_)];
    json choice = {{"index", i}};
    size_t num_calls = 0;
    std::vector<api::PositionLogprobs> logprobs;
    if (logprobs_) logprobs = api::render_logprobs(c.logprobs, piece);
    if (meta_.chat) {
      const chat::ChatDelta d = chat::parse_chat_output(output_, c.text);
      json message = {{"role", "assistant"}};
      put_chat_fields(message, d, output_.reasoning != nullptr, true);
      message["refusal"] = nullptr;
      if (!d.calls.empty()) {
        json calls = json::array();
        for (const auto& call : d.calls) calls.push_back(tool_call_json(call, make_tool_call_id()));
        message["tool_calls"] = std::move(calls);
      }
      num_calls = d.calls.size();
      choice["message"] = std::move(message);
      choice["logprobs"] = logprobs_ ? chat_logprobs_json(logprobs) : json(nullptr);
    } else {
      const size_t prompt = i / static_cast<size_t>(n_);
      choice["text"] = prefix + c.text;
      if (prompt_view_.echo_top >= 0)
        choice["logprobs"] = echo_logprobs_json(prompt_view_.first_tokens[prompt], prompt_logprobs_[prompt], c.logprobs,
                                                prompt_view_.echo_top, piece);
      else
        choice["logprobs"] = logprobs_ ? completion_logprobs_json(logprobs, utf8_length(prefix)) : json(nullptr);
      if (prompt_view_.prompt_logprobs >= 0)
        choice["prompt_logprobs"] = prompt_logprobs_json(prompt_logprobs_[prompt], prompt_view_.prompt_logprobs, piece);
    }
    choice["finish_reason"] = finish_json(c.finish, num_calls);
    choice["stop_reason"] = stop_reason_json(c.stop_reason);
    choices.push_back(std::move(choice));
  }
  json reply = {{"id", meta_.id},
                {"object", meta_.chat ? "chat.completion" : "text_completion"},
                {"created", meta_.created},
                {"model", meta_.model},
                {"choices", std::move(choices)},
                {"usage", usage_json(usage_)}};
  if (meta_.chat && prompt_view_.prompt_logprobs >= 0 && !prompt_logprobs_.empty())
    reply["prompt_logprobs"] = prompt_logprobs_json(prompt_logprobs_[0], prompt_view_.prompt_logprobs, piece);
  return reply;
}

// ---- streaming ----

StreamRenderer::StreamRenderer(ResponseMeta meta, size_t num_prompts, int32_t n, bool logprobs, bool include_usage,
                               std::vector<std::string> echo_prefixes, TokenPiece piece, chat::ChatOutputOptions output,
                               PromptLogprobsView prompt_view)
    : meta_(std::move(meta)),
      n_(n),
      logprobs_(logprobs),
      include_usage_(include_usage),
      echo_(std::move(echo_prefixes)),
      piece_(std::move(piece)),
      choices_(num_prompts * static_cast<size_t>(n)),
      prompt_view_(std::move(prompt_view)),
      prompt_logprobs_(num_prompts),
      prompt_seen_(num_prompts, false) {
  echo_.resize(num_prompts);
  prompt_view_.first_tokens.resize(num_prompts);
  if (meta_.chat) {
    for (size_t i = 0; i < choices_.size(); ++i) outputs_.push_back(std::make_unique<chat::ChatOutputStream>(output));
    calls_sent_.assign(choices_.size(), 0);
  }
}

json StreamRenderer::chunk(json choice) const {
  json c = {{"id", meta_.id},
            {"object", meta_.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", meta_.created},
            {"model", meta_.model},
            {"choices", json::array({std::move(choice)})}};
  if (include_usage_) c["usage"] = nullptr;
  return c;
}

std::string StreamRenderer::begin() {
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    if (meta_.chat) {
      out += sse_event(chunk({{"index", i},
                              {"delta", {{"role", "assistant"}, {"content", ""}}},
                              {"logprobs", nullptr},
                              {"finish_reason", nullptr}}));
    } else {
      const std::string& prefix = echo_[i / static_cast<size_t>(n_)];
      if (prefix.empty() || prompt_view_.echo_top >= 0) continue;  // (then with its logprobs, in add())
      choices_[i].text_offset = utf8_length(prefix);
      out += sse_event(chunk({{"index", i},
                              {"text", prefix},
                              {"logprobs", nullptr},
                              {"finish_reason", nullptr},
                              {"stop_reason", nullptr}}));
    }
  }
  return out;
}

std::string StreamRenderer::add(size_t prompt_index, const RequestOutput& out) {
  if (prompt_index >= prompt_seen_.size()) return {};
  count_prompt(prompt_seen_, usage_, prompt_index, out);
  if (!out.prompt_logprobs.empty() || (prompt_view_.any() && out.num_prompt_tokens == 1))
    prompt_logprobs_[prompt_index] = out.prompt_logprobs;
  std::string events;
  for (const CompletionDelta& d : out.completions) {
    if (d.index < 0 || d.index >= n_) continue;
    const size_t index = prompt_index * static_cast<size_t>(n_) + static_cast<size_t>(d.index);
    ChoiceState& c = choices_[index];
    count_completion(c, usage_, d);
    const api::CompletionData r = api::render_completion(d, piece_);
    // This choice's first chunk since its prompt's logprobs are known carries them.
    const bool send_prompt = prompt_view_.any() && !c.prompt_sent && prompt_logprobs_[prompt_index].has_value();
    const bool has_logprobs = (logprobs_ && r.logprobs) || send_prompt;
    const bool finished = r.finish_reason != nullptr;
    chat::ChatDelta parsed;
    if (meta_.chat) {
      parsed = outputs_[index]->feed(r.text);
      if (finished) parsed.append(outputs_[index]->finish());
      if (parsed.empty() && !has_logprobs && !finished) {
        c.text += r.text;  // held back by a parser
        continue;
      }
    } else if (r.text.empty() && !has_logprobs && !finished) {
      continue;
    }
    json choice = {{"index", index}};
    if (meta_.chat) {
      json delta = json::object();
      put_chat_fields(delta, parsed, true, false);
      if (!parsed.calls.empty()) {
        // OpenAI's chunk shape: each call once, whole, with its index among the choice's calls.
        json calls = json::array();
        for (const auto& call : parsed.calls) {
          json tc = tool_call_json(call, make_tool_call_id());
          tc["index"] = calls_sent_[index]++;
          calls.push_back(std::move(tc));
        }
        delta["tool_calls"] = std::move(calls);
      }
      choice["delta"] = std::move(delta);
      choice["logprobs"] = logprobs_ && r.logprobs ? chat_logprobs_json(*r.logprobs) : json(nullptr);
    } else if (send_prompt && prompt_view_.echo_top >= 0) {
      // echo with logprobs: the prompt's text and logprobs, then the first tokens'.
      const std::string& prefix = echo_[prompt_index];
      choice["text"] = prefix + r.text;
      json lp = echo_logprobs_json(prompt_view_.first_tokens[prompt_index], *prompt_logprobs_[prompt_index], d.logprobs,
                                   prompt_view_.echo_top, piece_);
      // Later chunks' offsets go on from the end of these tokens' text.
      const json& tokens = lp["tokens"];
      c.text_offset = lp["text_offset"].back().get<size_t>() + utf8_length(tokens.back().get_ref<const std::string&>());
      c.text_offset -= utf8_length(r.text);  // (added back below with the text)
      choice["logprobs"] = std::move(lp);
    } else {
      choice["text"] = r.text;
      const bool with_logprobs = logprobs_ && r.logprobs;
      choice["logprobs"] = with_logprobs ? completion_logprobs_json(*r.logprobs, c.text_offset) : json(nullptr);
    }
    const size_t num_calls = meta_.chat ? static_cast<size_t>(calls_sent_[index]) : 0;
    choice["finish_reason"] = finish_json(d.finish_reason, num_calls);
    choice["stop_reason"] = stop_reason_json(r.stop_reason);
    json prompt_logprobs;
    if (send_prompt) {
      c.prompt_sent = true;
      if (prompt_view_.prompt_logprobs >= 0)
        prompt_logprobs = prompt_logprobs_json(*prompt_logprobs_[prompt_index], prompt_view_.prompt_logprobs, piece_);
    }
    if (!meta_.chat && !prompt_logprobs.is_null()) choice["prompt_logprobs"] = prompt_logprobs;
    c.text += r.text;
    c.text_offset += utf8_length(r.text);
    json event = chunk(std::move(choice));
    if (meta_.chat && !prompt_logprobs.is_null() && index == 0) event["prompt_logprobs"] = std::move(prompt_logprobs);
    events += sse_event(event);
  }
  return events;
}

std::string StreamRenderer::error(const json& error_body) const { return sse_event(error_body); }

std::string StreamRenderer::end() const {
  std::string out;
  if (include_usage_) {
    out += sse_event({{"id", meta_.id},
                      {"object", meta_.chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", meta_.created},
                      {"model", meta_.model},
                      {"choices", json::array()},
                      {"usage", usage_json(usage_)}});
  }
  out += kSseDone;
  return out;
}

}  // namespace pagellm::server
