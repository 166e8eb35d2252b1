// `pagellm make-dummy`: writes a random-weight model of a real shape to GGUF,
// so another engine (llama.cpp) can load the very same weights.
#include <fmt/format.h>

#include <memory>

#include "cli/commands.h"
#include "core/thread_pool.h"
#include "model/dummy.h"
#include "model/gguf.h"

namespace pagellm::cli {

Command register_make_dummy(CLI::App& app) {
  auto* sub = app.add_subcommand("make-dummy", "Write a random-weight model of a named shape to a GGUF file");
  struct Opts {
    std::string shape = "tiny-llama", type = "f32", out, vocab;
    uint64_t seed = 0;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  std::string shapes;
  for (const auto& s : dummy_shape_names()) shapes += (shapes.empty() ? "" : ", ") + s;
  sub->add_option("--shape", o->shape, "Model shape: " + shapes)->capture_default_str();
  sub->add_option("--type", o->type, "Weight type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k")
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  sub->add_option("--vocab", o->vocab, "Copy the tokenizer from this GGUF (default: a synthetic vocabulary)");
  sub->add_option("-o,--output", o->out, "Output GGUF path")->required();
  sub->add_option("-t,--threads", o->threads, "Threads (default: all cores)");
  return {sub, [o]() {
            DummySpec spec;
            spec.shape = o->shape;
            spec.wtype = dtype_from_name(o->type);
            spec.seed = o->seed;
            std::unique_ptr<GGUFFile> vocab;
            if (!o->vocab.empty()) vocab = GGUFFile::open(o->vocab);
            ThreadPool pool(o->threads);
            write_dummy_gguf(o->out, spec, vocab.get(), pool);
            fmt::print(stderr, "wrote {} ({} {}, seed {})\n", o->out, o->shape, dtype_name(spec.wtype), o->seed);
            return 0;
          }};
}

}  // namespace pagellm::cli
