// Engine flags shared by serve, generate, bench and perplexity, named as vLLM's.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "embed/engine_arg_table.h"
#include "engine/engine.h"

namespace pagellm::cli {

// The engine flags of a command, one per command-line row of
// embed/engine_arg_table.h, and --config.
struct EngineFlags {
  CLI::App* app = nullptr;
  std::vector<std::pair<const embed::EngineArg*, CLI::Option*>> options;
  std::string config_file;  // --config FILE.yaml
  std::map<std::string, std::string> overrides;  // set() by the command: they win

  // Reads --config into the command's options not given on the command line
  // (once; to_args() calls it too). Commands call it before reading their
  // own flags.
  void load_config_file() const;
  // The flags through the table. Throws Error naming the flag.
  embed::EngineArgs to_args() const;
  EngineConfig to_config() const { return to_args().config; }
  // The text given for a flag (its last value; "true" or "false" for a
  // switch), else its default; empty when neither.
  std::string text(const std::string& name) const;
  bool given(const std::string& name) const;
  void set(const std::string& name, std::string text) { overrides[name] = std::move(text); }

  mutable bool config_loaded = false;

 private:
  std::vector<std::string> texts(const embed::EngineArg& arg, const CLI::Option& opt) const;
};

// Registers the flags on `app` (and --config); the returned object reads them once parsed.
std::shared_ptr<EngineFlags> add_engine_flags(CLI::App* app);

// Starts the --trace timeline when asked; writes it when destroyed.
class TraceSession {
 public:
  explicit TraceSession(std::string path);
  ~TraceSession();

 private:
  std::string path_;
};

// Loading progress: a bar on a terminal, one log line otherwise.
LoadProgress load_progress_reporter();

}  // namespace pagellm::cli
