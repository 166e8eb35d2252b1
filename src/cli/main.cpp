// pagellm: one binary, one subcommand per job. Each subcommand registers its
// options in its own file (commands.h); main only dispatches and maps errors to
// a one-line message and a non-zero exit.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "dist/communicator.h"

int main(int argc, char** argv) {
  auto logger = spdlog::stderr_color_mt("pagellm");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%^%l%$ %v");

  CLI::App app{"pagellm: paged-KV-cache LLM inference and serving engine"};
  app.set_version_flag("--version", std::string("pagellm ") + PAGELLM_VERSION);
  app.require_subcommand(1);
  std::vector<pagellm::cli::Command> commands = pagellm::cli::register_commands(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line naming the problem (CLI11 would add a second, generic one).
    std::fprintf(stderr, "error: %s (see --help)\n", e.what());
    return e.get_exit_code() ? e.get_exit_code() : 2;
  }
  try {
    for (auto& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    // Under mpirun the other ranks may wait for this one in a collective:
    // end them all rather than finalize MPI (which waits for them).
    pagellm::dist::abort_job_if_parallel(1);
    return 1;
  }
  return 0;
}
