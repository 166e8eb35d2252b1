// `pagellm generate`: one prompt streamed to stdout, or a JSONL batch run
// through the engine at once (the offline API).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "api/openai_request.h"
#include "embed/chat_template_source.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "core/error.h"
#include "core/json_limits.h"
#include "engine/engine.h"
#include "engine/parallel.h"

namespace pagellm::cli {
namespace {

struct GenerateFlags {
  std::string prompt;
  std::string batch;
  std::string chat_template;
  int max_tokens = 128;
  float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f, repetition_penalty = 1.0f;
  int top_k = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool parse_special = false;
  bool no_bos = false;
};

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int run_single(Engine& engine, const GenerateFlags& g) {
  EngineRequest req;
  req.id = "0";
  req.prompt_ids = engine.tokenizer().encode(g.prompt, !g.no_bos, g.parse_special);
  SamplingParams& p = req.params;
  p.temperature = g.temperature;
  p.top_p = g.top_p;
  p.top_k = g.top_k;
  p.min_p = g.min_p;
  p.repetition_penalty = g.repetition_penalty;
  p.max_tokens = g.max_tokens;
  p.stop = g.stop;
  p.ignore_eos = g.ignore_eos;
  const size_t n_prompt = req.prompt_ids.size();
  const auto t0 = Clock::now();
  engine.add_request(std::move(req));
  std::optional<Clock::time_point> t_first;
  int n_gen = 0;
  FinishReason reason = FinishReason::None;
  while (engine.has_unfinished()) {
    for (const RequestOutput& out : engine.step()) {
      for (const CompletionDelta& d : out.completions) {
        if (!d.token_ids.empty() && !t_first) t_first = Clock::now();
        n_gen = d.num_output_tokens;
        std::fwrite(d.text.data(), 1, d.text.size(), stdout);
        if (d.finish_reason != FinishReason::None) reason = d.finish_reason;
      }
      std::fflush(stdout);
    }
  }
  const auto t_end = Clock::now();
  std::fputc('\n', stdout);
  const double prefill = t_first ? seconds(t0, *t_first) : seconds(t0, t_end);
  const double decode = t_first ? seconds(*t_first, t_end) : 0.0;
  std::fprintf(stderr, "prompt: %zu tokens in %.3f s (%.1f tokens/s); generation: %d tokens in %.3f s (%.1f tokens/s); "
               "finish: %s\n",
               n_prompt, prefill, prefill > 0 ? n_prompt / prefill : 0.0, n_gen, decode,
               (n_gen > 1 && decode > 0) ? (n_gen - 1) / decode : 0.0, to_string(reason));
  if (engine.config().profile) std::fprintf(stderr, "profile: %s\n", engine.profile_report().c_str());
  return 0;
}

// One JSON object per line in, one per line out, in input order.
int run_batch(Engine& engine, const GenerateFlags& g) {
  std::ifstream file;
  std::istream* in = &std::cin;
  if (g.batch != "-") {
    file.open(g.batch);
    if (!file) fail("cannot open '{}'", g.batch);
    in = &file;
  }
  struct Result {
    nlohmann::json line;
    std::vector<std::string> texts;
    std::vector<std::vector<int32_t>> tokens;
    std::vector<nlohmann::json> logprobs;  // per sample: one entry per token, when the line asks for them
    std::vector<std::string> reasons;
    int prompt_tokens = 0;
    bool done = false;
  };
  std::vector<Result> results;
  std::string line;
  const auto t0 = Clock::now();
  int64_t total_prompt = 0;
  api::ServedModel served;  // what the shared request parser checks lines against
  served.tokenizer = &engine.tokenizer();
  served.chat_template = embed::load_chat_template(g.chat_template, engine);
  served.vocab_size = engine.model_config().n_vocab;
  served.max_model_len = engine.max_model_len();
  served.default_max_tokens = g.max_tokens;
  while (std::getline(*in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Result r;
    const size_t index = results.size();
    r.line = {{"index", index}};
    try {
      nlohmann::json body;
      try {
        body = parse_json_bounded(line, kRequestJsonLimits, fmt::format("line {}", index + 1));
      } catch (const std::exception& e) {
        throw InvalidRequest(e.what());
      }
      // A line is the body of a /v1/chat/completions request (it has
      // "messages") or of a /v1/completions one with a single prompt.
      const bool chat = body.is_object() && body.contains("messages");
      if (!chat && !(body.is_object() && body.contains("prompt")))
        throw InvalidRequest("each line needs a \"prompt\" (a string or a list of token ids) or chat \"messages\"",
                             "prompt");
      const api::GenerationRequest parsed = chat ? api::parse_chat_request(body, served, line)
                                                 : api::parse_completion_request(body, served, line);
      if (parsed.prompts.size() != 1) throw InvalidRequest("each line holds one prompt, not a batch of them", "prompt");
      if (parsed.stream) throw InvalidRequest("'stream' has no meaning in a batch file", "stream");
      EngineRequest req = std::move(api::to_engine_requests(parsed, std::to_string(index), served).front());
      // (--enable-lora: a line's "model" may name an adapter; other names are not checked here.)
      if (engine.lora() && body.contains("model") && body["model"].is_string() &&
          engine.lora()->has(body["model"].get<std::string>()))
        req.lora = body["model"].get<std::string>();
      r.prompt_tokens = static_cast<int>(req.prompt_ids.size());
      r.texts.resize(req.params.n);
      r.tokens.resize(req.params.n);
      r.reasons.resize(req.params.n);
      r.logprobs.assign(req.params.n, nlohmann::json::array());
      total_prompt += r.prompt_tokens;
      engine.add_request(std::move(req));
    } catch (const std::exception& e) {
      r.line["error"] = e.what();
      r.done = true;
    }
    results.push_back(std::move(r));
  }
  int64_t total_gen = 0;
  while (engine.has_unfinished()) {
    for (const RequestOutput& out : engine.step()) {
      Result& r = results[std::stoul(out.request_id)];
      for (const CompletionDelta& d : out.completions) {
        r.texts[d.index] += d.text;
        r.tokens[d.index].insert(r.tokens[d.index].end(), d.token_ids.begin(), d.token_ids.end());
        for (const TokenLogprob& lp : d.logprobs) {
          nlohmann::json top = nlohmann::json::array();
          for (const auto& [token, logprob] : lp.top) top.push_back({token, logprob});
          r.logprobs[d.index].push_back({{"token", lp.token}, {"logprob", lp.logprob}, {"top", top}});
        }
        total_gen += static_cast<int64_t>(d.token_ids.size());
        if (d.finish_reason != FinishReason::None) r.reasons[d.index] = to_string(d.finish_reason);
      }
      r.done = out.finished;
    }
  }
  for (Result& r : results) {
    if (!r.line.contains("error")) {
      r.line["text"] = r.texts[0];
      r.line["token_ids"] = r.tokens[0];
      r.line["finish_reason"] = r.reasons[0];
      if (!r.logprobs[0].empty()) r.line["logprobs"] = r.logprobs[0];
      r.line["prompt_tokens"] = r.prompt_tokens;
      size_t completion = 0;
      for (const auto& t : r.tokens) completion += t.size();
      r.line["completion_tokens"] = completion;
      if (r.texts.size() > 1) {
        nlohmann::json all = nlohmann::json::array();
        for (size_t i = 0; i < r.texts.size(); ++i)
          all.push_back({{"text", r.texts[i]}, {"token_ids", r.tokens[i]}, {"finish_reason", r.reasons[i]}});
        r.line["outputs"] = all;
      }
    }
    std::cout << r.line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  std::cout.flush();
  const double s = seconds(t0, Clock::now());
  if (engine.config().profile) std::fprintf(stderr, "profile: %s\n", engine.profile_report().c_str());
  std::fprintf(stderr, "batch: %zu requests, %lld prompt + %lld generated tokens in %.2f s (%.1f tokens/s total, %.1f "
               "generated tokens/s)\n",
               results.size(), static_cast<long long>(total_prompt), static_cast<long long>(total_gen), s,
               (total_prompt + total_gen) / s, total_gen / s);
  return 0;
}

}  // namespace

Command register_generate(CLI::App& app) {
  auto* sub = app.add_subcommand("generate", "Generate text from a prompt (or a JSONL batch of requests)");
  auto engine = add_engine_flags(sub);
  auto g = std::make_shared<GenerateFlags>();
  sub->add_option("-p,--prompt", g->prompt, "Prompt text");
  sub->add_option("--batch", g->batch,
                  "JSONL file ('-': stdin): one request per line, the body of a completions (\"prompt\") or chat "
                  "completions (\"messages\") request; writes one JSON line per request in input order");
  sub->add_option("--chat-template", g->chat_template,
                  "Jinja chat template file (or inline template) replacing the model's, for --batch chat lines");
  sub->add_option("-n,--max-tokens", g->max_tokens, "Tokens to generate at most")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--temp,--temperature", g->temperature, "Temperature; 0 is greedy")->capture_default_str();
  sub->add_option("--top-p", g->top_p, "Nucleus sampling mass")->capture_default_str();
  sub->add_option("--top-k", g->top_k, "Keep the k most likely tokens (0: all)")->capture_default_str();
  sub->add_option("--min-p", g->min_p, "Drop tokens below min-p x the top probability")->capture_default_str();
  sub->add_option("--repetition-penalty", g->repetition_penalty, "Penalty on repeated tokens")->capture_default_str();
  sub->add_option("--stop", g->stop, "Stop string (repeatable)");
  sub->add_flag("--ignore-eos", g->ignore_eos, "Keep generating past end-of-sequence tokens");
  sub->add_flag("--parse-special", g->parse_special, "Recognise special-token text in the prompt");
  sub->add_flag("--no-bos", g->no_bos, "Do not add the BOS token");
  return {sub, [sub, engine, g]() {
            engine->load_config_file();
            if (g->prompt.empty() == g->batch.empty()) fail("give exactly one of -p PROMPT or --batch FILE");
            SamplingParams check;
            check.temperature = g->temperature;
            check.top_p = g->top_p;
            check.top_k = g->top_k;
            check.min_p = g->min_p;
            check.repetition_penalty = g->repetition_penalty;
            check.max_tokens = g->max_tokens;
            try {
              check.validate();
            } catch (const InvalidRequest& e) {
              fail("invalid --{}: {}", e.param(), e.what());
            }
            TraceSession trace(engine->text("trace"));
            const EngineConfig config = engine->to_config();
            run_worker_if_parallel(config);
            Engine eng(config, load_progress_reporter());
            spdlog::info("{}", eng.describe());
            return g->batch.empty() ? run_single(eng, *g) : run_batch(eng, *g);
          }};
}

}  // namespace pagellm::cli
