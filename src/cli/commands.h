// Subcommand registry. Each cmd_*.cpp adds one function here.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace pagellm::cli {

struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command register_info(CLI::App& app);
Command register_make_dummy(CLI::App& app);
Command register_generate(CLI::App& app);
Command register_tokenize(CLI::App& app);
Command register_serve(CLI::App& app);
Command register_bench(CLI::App& app);
Command register_perplexity(CLI::App& app);
// `bench ops` (cmd_bench_ops.cpp), added under `bench`: returns it, sets run.
CLI::App* add_bench_ops(CLI::App& bench, std::function<int()>& run);

inline std::vector<Command> register_commands(CLI::App& app) {
  return {register_serve(app),  register_generate(app),   register_tokenize(app),
          register_info(app),   register_make_dummy(app), register_bench(app),
          register_perplexity(app)};
}

}  // namespace pagellm::cli
