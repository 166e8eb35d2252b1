// `pagellm tokenize -m MODEL [--no-special] [--parse-special] TEXT`: the ids
// TEXT encodes to, as a one-line JSON array. MODEL is a GGUF file (model or
// vocab-only) or a Hugging Face folder / tokenizer.json.
#include <fmt/format.h>

#include <memory>

#include "cli/commands.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::cli {

Command register_tokenize(CLI::App& app) {
  auto* sub = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  struct Options {
    std::string model, text;
    bool no_special = false, parse_special = false;
  };
  auto opt = std::make_shared<Options>();
  sub->add_option("-m,--model", opt->model, "GGUF file, or Hugging Face folder with tokenizer.json")->required();
  sub->add_flag("--no-special", opt->no_special, "Do not add BOS/EOS");
  sub->add_flag("--parse-special", opt->parse_special, "Turn special-token text (e.g. <|im_start|>) into its token");
  sub->add_option("text", opt->text, "Text to tokenize")->required();
  return {sub, [opt]() {
            auto tok = Tokenizer::load(opt->model);
            const auto ids = tok->encode(opt->text, !opt->no_special, opt->parse_special);
            fmt::print("[{}]\n", fmt::join(ids, ", "));
            return 0;
          }};
}

}  // namespace pagellm::cli
