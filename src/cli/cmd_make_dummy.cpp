// `pagellm make-dummy`: writes a random-weight model of a real shape to GGUF
// (so another engine, llama.cpp, can load the very same weights) or to a
// Hugging Face folder (config.json + safetensors, for transformers).
#include <fmt/format.h>

#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/dummy.h"
#include "format/gguf.h"
#include "model/hf_writer.h"

namespace pagellm::cli {

Command register_make_dummy(CLI::App& app) {
  auto* sub = app.add_subcommand("make-dummy", "Write a random-weight model of a named shape (GGUF or Hugging Face folder)");
  struct Opts {
    std::string shape = "tiny-llama", type = "f32", out, vocab, format = "gguf";
    uint64_t seed = 0;
    int threads = 0;
    int shards = 1;
  };
  auto o = std::make_shared<Opts>();
  std::string shapes;
  for (const auto& s : dummy_shape_names()) shapes += (shapes.empty() ? "" : ", ") + s;
  sub->add_option("--shape", o->shape, "Model shape: " + shapes)->capture_default_str();
  sub->add_option("--type", o->type,
                  "Weight type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, "
                  "mxfp4 (hf: f32, f16, bf16)")
      ->capture_default_str();
  sub->add_option("--format", o->format, "Output format: gguf (one file) or hf (folder: config.json + safetensors)")
      ->check(CLI::IsMember({"gguf", "hf"}))
      ->capture_default_str();
  sub->add_option("--shards", o->shards, "hf: split the weights into this many safetensors files")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  sub->add_option("--vocab", o->vocab, "gguf: copy the tokenizer from this GGUF (default: a synthetic vocabulary)");
  sub->add_option("-o,--output", o->out, "Output GGUF path, or folder for --format hf")->required();
  sub->add_option("-t,--threads", o->threads, "Threads (default: all cores)");
  return {sub, [o]() {
            DummySpec spec;
            spec.shape = o->shape;
            spec.wtype = dtype_from_name(o->type);
            spec.seed = o->seed;
            ThreadPool pool(o->threads);
            if (o->format == "hf") {
              PAGELLM_CHECK(o->vocab.empty(), "--vocab applies to --format gguf only");
              write_dummy_hf(o->out, spec, o->shards, pool);
            } else {
              PAGELLM_CHECK(o->shards == 1, "--shards applies to --format hf only");
              std::unique_ptr<GGUFFile> vocab;
              if (!o->vocab.empty()) vocab = GGUFFile::open(o->vocab);
              write_dummy_gguf(o->out, spec, vocab.get(), pool);
            }
            fmt::print(stderr, "wrote {} ({} {} {}, seed {})\n", o->out, o->format, o->shape, dtype_name(spec.wtype),
                       o->seed);
            return 0;
          }};
}

}  // namespace pagellm::cli
