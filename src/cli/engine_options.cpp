#include "cli/engine_options.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>

#include "cli/yaml_config.h"
#include "core/error.h"
#include "core/trace.h"

namespace pagellm::cli {

namespace {

using embed::ArgType;
using embed::EngineArg;

// "-m,--model,--alias", and ",!--no-..." for a switch.
std::string flag_names(const EngineArg& arg) {
  std::string names = arg.short_flag.empty() ? "" : arg.short_flag + ",";
  names += "--" + arg.name;
  for (const std::string& alias : arg.aliases) names += ",--" + alias;
  if (!arg.negation.empty()) names += ",!--" + arg.negation;
  return names;
}

const char* type_name(ArgType type) {
  switch (type) {
    case ArgType::Int: return "INT";
    case ArgType::Float: return "FLOAT";
    case ArgType::Size: return "SIZE";
    case ArgType::Map: return "KEY=VALUE";
    case ArgType::Json: return "JSON";
    default: return "TEXT";
  }
}

CLI::Option* add_flag(CLI::App* app, const EngineArg& arg) {
  if (arg.type == ArgType::Bool) return app->add_flag(flag_names(arg))->description(arg.help);
  CLI::Option* opt = app->add_option(flag_names(arg))->description(arg.help)->type_name(type_name(arg.type));
  if (arg.type == ArgType::List || arg.type == ArgType::Map) opt->expected(CLI::detail::expected_max_vector_size);
  if (!arg.default_text.empty()) opt->default_str(arg.default_text);
  // The table's check, for the command line and --config alike ("--block-size: 5 not in {8, 16, 32, 64}").
  opt->check(CLI::Validator(
      [&arg](std::string& text) -> std::string {
        try {
          embed::check_arg_text(arg, text);
        } catch (const embed::ArgValueError& e) {
          return e.what();
        }
        return "";
      },
      arg.range_text()));
  return opt;
}

}  // namespace

std::shared_ptr<EngineFlags> add_engine_flags(CLI::App* app) {
  auto f = std::make_shared<EngineFlags>();
  f->app = app;
  for (const EngineArg& arg : embed::engine_arg_table())
    if (arg.on_command_line()) f->options.emplace_back(&arg, add_flag(app, arg));
  app->add_option("--config", f->config_file,
                  "YAML file of flags, as vLLM's --config: `max-num-seqs: 64` per line (underscores or dashes); "
                  "flags on the command line override it");
  return f;
}

void EngineFlags::load_config_file() const {
  if (config_loaded) return;
  config_loaded = true;
  if (!config_file.empty()) apply_config_file(app, config_file);
}

std::vector<std::string> EngineFlags::texts(const EngineArg& arg, const CLI::Option& opt) const {
  if (const auto it = overrides.find(arg.name); it != overrides.end()) return {it->second};
  if (opt.count() == 0) return {};
  if (arg.type == ArgType::Bool) return {opt.as<bool>() ? "true" : "false"};
  return opt.results();
}

embed::EngineArgs EngineFlags::to_args() const {
  load_config_file();
  embed::EngineArgsBuilder builder;
  for (const auto& [arg, opt] : options) {
    const std::vector<std::string> values = texts(*arg, *opt);
    if (values.empty()) continue;
    try {
      builder.set_text(*arg, values);
    } catch (const embed::ArgValueError& e) {
      fail("{}: {}", opt->get_name(), e.what());
    }
  }
  return std::move(builder).finish();
}

std::string EngineFlags::text(const std::string& name) const {
  for (const auto& [arg, opt] : options) {
    if (arg->name != name) continue;
    const std::vector<std::string> values = texts(*arg, *opt);
    return values.empty() ? arg->default_text : values.back();
  }
  return "";
}

bool EngineFlags::given(const std::string& name) const {
  for (const auto& [arg, opt] : options)
    if (arg->name == name) return !texts(*arg, *opt).empty();
  return false;
}

TraceSession::TraceSession(std::string path) : path_(std::move(path)) {
  if (!path_.empty()) trace::enable(true);
}

TraceSession::~TraceSession() {
  if (path_.empty()) return;
  trace::enable(false);
  try {
    trace::write(path_);
    spdlog::info("trace written to {}", path_);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
}

LoadProgress load_progress_reporter() {
  if (!isatty(fileno(stderr))) return {};
  return [](size_t done, size_t total) {
    constexpr int kWidth = 40;
    const int filled = total ? static_cast<int>(kWidth * done / total) : kWidth;
    std::fprintf(stderr, "\rloading [%s%s] %zu/%zu tensors", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, ' ').c_str(), done, total);
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

}  // namespace pagellm::cli
