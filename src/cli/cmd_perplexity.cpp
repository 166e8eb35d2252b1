// `pagellm perplexity -m MODEL -f TEXT [--ctx N] [--stride N]`: the model's
// perplexity on a text file (runner/perplexity.h has the two ways to cut it).
// Prints llama-perplexity's progress line and final estimate; --output-json
// writes a record.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/parallel.h"
#include "runner/perplexity.h"

namespace pagellm::cli {

Command register_perplexity(CLI::App& app) {
  auto* sub = app.add_subcommand("perplexity", "Perplexity of a model on a text file (the quality check after a "
                                               "precision change)");
  auto engine = add_engine_flags(sub);
  struct Options {
    std::string file, output_json;
    int ctx = 512, stride = 0, batch = 128, chunks = 0;
  };
  auto o = std::make_shared<Options>();
  sub->add_option("-f,--file", o->file, "Text file")->required();
  sub->add_option("--ctx", o->ctx, "Tokens per chunk / window")->check(CLI::Range(2, 1 << 20))->capture_default_str();
  sub->add_option("--stride", o->stride,
                  "0: llama-perplexity's chunks (score each chunk's second half); N: windows every N tokens, each "
                  "scoring the tokens no earlier window scored (Hugging Face's recipe)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--batch", o->batch, "Tokens per forward pass")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--chunks", o->chunks, "Stop after this many chunks / windows (0: all)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--output-json", o->output_json, "Write a JSON record here");
  return {sub, [sub, engine, o]() {
            engine->load_config_file();
            std::ifstream in(o->file, std::ios::binary);
            if (!in) fail("cannot open '{}'", o->file);
            std::stringstream ss;
            ss << in.rdbuf();
            const std::string text = ss.str();
            EngineConfig c = engine->to_config();
            // One sequence of ctx tokens at a time: a small KV cache.
            if (sub->count("--max-model-len") == 0) c.scheduler.max_model_len = o->ctx;
            if (sub->count("--max-num-seqs") == 0) c.scheduler.max_num_seqs = 1;
            PAGELLM_CHECK(c.scheduler.max_model_len >= o->ctx, "--ctx {} is longer than --max-model-len {}", o->ctx,
                          c.scheduler.max_model_len);
            run_worker_if_parallel(c);  // ranks > 0 run their shard of each pass and exit there
            Engine eng(c, load_progress_reporter());
            spdlog::info("{}", eng.describe());
            const Tokenizer& tok = eng.tokenizer();
            const std::vector<int32_t> tokens = tok.encode(text, /*add_special=*/true, /*parse_special=*/false);
            PerplexityOptions po;
            po.ctx = o->ctx;
            po.stride = o->stride;
            po.batch = o->batch;
            po.max_chunks = o->chunks;
            po.bos_id = tok.add_bos() ? tok.bos_id() : -1;
            if (c.scheduler.kv_eviction == KvEviction::Sliding) po.sinks = c.scheduler.attention_sinks;
            const std::string how = po.sinks >= 0 ? fmt::format("one stream, sliding KV window with {} sinks "
                                                                "(segment perplexities)", po.sinks)
                                    : o->stride ? fmt::format("stride {}", o->stride)
                                                : std::string("llama.cpp chunks");
            std::fprintf(stderr, "perplexity: %zu tokens, ctx %d, %s\n", tokens.size(), o->ctx, how.c_str());
            const auto t0 = std::chrono::steady_clock::now();
            // The engine is idle: its model and KV memory serve the calculation.
            const PerplexityResult r = compute_perplexity(eng.model(), eng.kv_config(), tokens, po,
                                                          [](size_t done, size_t, double ppl) {
                                                            std::printf("[%zu]%.4f,", done, ppl);
                                                            std::fflush(stdout);
                                                          },
                                                          parallel_communicator(c), c.pipeline_micro_batches);
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl(), r.ppl_stderr());
            std::fprintf(stderr, "perplexity: %lld tokens scored in %.1f s (%.1f tokens/s)\n",
                         static_cast<long long>(r.tokens_scored), s, r.tokens_scored / s);
            if (!o->output_json.empty()) {
              nlohmann::json j = {{"model", c.model},       {"file", o->file},         {"ctx", o->ctx},
                                  {"stride", o->stride},    {"tokens", tokens.size()}, {"scored", r.tokens_scored},
                                  {"ppl", r.ppl()},         {"ppl_stderr", r.ppl_stderr()},
                                  {"running_ppl", r.running_ppl}, {"seconds", s},
                                  {"segment_ppl", r.segment_ppl}, {"attention_sinks", po.sinks},
                                  {"kv_cache_dtype", dtype_name(c.kv_cache_dtype)}};
              std::ofstream(o->output_json) << j.dump(1) << "\n";
            }
            return 0;
          }};
}

}  // namespace pagellm::cli
