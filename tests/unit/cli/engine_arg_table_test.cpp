// The table of engine arguments through its three paths: the command line,
// --config YAML and the library's JSON give the same config for the same
// value, and the same words for a bad one.
#include "embed/engine_arg_table.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "cli/engine_options.h"
#include "core/error.h"

namespace pagellm {
namespace {

using embed::ArgType;
using embed::EngineArg;
using embed::EngineArgs;
using nlohmann::json;

// Every field a row can set, to compare configs.
json snapshot(const EngineArgs& a) {
  const EngineConfig& c = a.config;
  const SchedulerConfig& s = c.scheduler;
  const structured::GrammarCompilerOptions& g = c.grammar;
  return {{"model", c.model},
          {"tokenizer", c.tokenizer},
          {"load_format", c.load_format},
          {"dummy_shape", c.dummy_shape},
          {"dummy_type", static_cast<int>(c.dummy_type)},
          {"device", c.device},
          {"backend_plugins", c.backend_plugins},
          {"backend_options", c.backend_options},
          {"gpu_memory_utilization", c.gpu_memory_utilization},
          {"block_size", c.block_size},
          {"kv_cache_memory", c.kv_cache_memory},
          {"kv_cache_dtype", static_cast<int>(c.kv_cache_dtype)},
          {"enable_prefix_caching", c.enable_prefix_caching},
          {"block_allocation", static_cast<int>(c.block_allocation)},
          {"swap_space_bytes", c.swap_space_bytes},
          {"kv_offload_host_bytes", c.kv_offload_host_bytes},
          {"kv_offload_dir", c.kv_offload_dir},
          {"kv_offload_disk_bytes", c.kv_offload_disk_bytes},
          {"kv_events", c.kv_events},
          {"kv_events_buffer", c.kv_events_buffer},
          {"max_model_len", s.max_model_len},
          {"max_num_seqs", s.max_num_seqs},
          {"max_num_batched_tokens", s.max_num_batched_tokens},
          {"long_prefill_token_threshold", s.long_prefill_token_threshold},
          {"admission_policy", static_cast<int>(s.admission_policy)},
          {"priority_aging_steps", s.priority_aging_steps},
          {"enable_chunked_prefill", s.enable_chunked_prefill},
          {"policy", static_cast<int>(s.policy)},
          {"composition", static_cast<int>(s.composition)},
          {"kv_eviction", static_cast<int>(s.kv_eviction)},
          {"attention_sinks", s.attention_sinks},
          {"preemption_mode", static_cast<int>(s.preemption_mode)},
          {"speculative", c.speculative.describe()},
          {"profile", c.profile},
          {"deterministic", c.deterministic},
          {"device_sampling", c.device_sampling},
          {"task", static_cast<int>(c.task)},
          {"hf_overrides", c.hf_overrides},
          {"score_template", c.score_template},
          {"enable_lora", c.lora.enabled},
          {"lora_modules", [&] {
             json m = json::array();
             for (const LoraModule& l : c.lora.modules) m.push_back({l.name, l.path});
             return m;
           }()},
          {"max_loras", c.lora.max_loras},
          {"max_lora_rank", c.lora.max_lora_rank},
          {"max_cpu_loras", c.lora.max_cpu_loras},
          {"lora_dtype", c.lora.dtype ? json(static_cast<int>(*c.lora.dtype)) : json()},
          {"pooling", c.pooling ? json(static_cast<int>(*c.pooling)) : json()},
          {"pooling_normalize", c.pooling_normalize ? json(*c.pooling_normalize) : json()},
          {"kv_cache_groups", c.kv_cache_groups},
          {"config_seed", c.seed ? json(*c.seed) : json()},
          {"tensor_parallel_size", c.tensor_parallel_size},
          {"pipeline_parallel_size", c.pipeline_parallel_size},
          {"pipeline_micro_batches", c.pipeline_micro_batches},
          {"pipeline_layer_partition", c.pipeline_layer_partition},
          {"pipeline_balance_stages", c.pipeline_balance_stages},
          {"grammar_max_bytes", g.limits.max_bytes},
          {"grammar_max_depth", g.limits.max_depth},
          {"grammar_max_nodes", g.limits.max_nodes},
          {"grammar_workers", g.workers},
          {"grammar_time_ms", g.budget.time.count()},
          {"grammar_memory", g.budget.memory_bytes},
          {"grammar_cache", g.cache_bytes},
          {"seed", a.seed ? json(*a.seed) : json()},
          {"chat_template", a.chat_template},
          {"trace", a.trace}};
}

// A value of the row other than its default: as the command line and YAML
// write it (several entries for a list), and as JSON.
struct Sample {
  std::vector<std::string> texts;
  json value;
};

Sample sample(const EngineArg& arg) {
  static const std::map<std::string, std::string> kText = {
      {"model", "m.gguf"},      {"tokenizer", "t.gguf"},   {"dummy-shape", "tiny-llama"},
      {"dummy-type", "f32"},    {"device", "opencl:1"},    {"pipeline-layer-partition", "3,2"},
      {"trace", "trace.json"},  {"chat-template", "{{x}}"}, {"dtype", "bfloat16"},
      {"hf-overrides", "{}"},   {"score-template", "raw"}, {"kv-offload-dir", "/tmp/kv"},
      {"kv-events-config", R"({"enable_kv_cache_events": true, "max_queue_size": 100})"}};
  switch (arg.type) {
    case ArgType::Int: {
      if (!arg.choices.empty()) {
        const std::string t = arg.choices.back() != arg.default_text ? arg.choices.back() : arg.choices.front();
        return {{t}, std::stoll(t)};
      }
      int64_t v = std::clamp<int64_t>(3, arg.min, arg.max);
      if (std::to_string(v) == arg.default_text) v = arg.min;
      return {{std::to_string(v)}, v};
    }
    case ArgType::Float: {
      const double v = (arg.min_f + arg.max_f) / 2;
      return {{fmt::format("{}", v)}, v};
    }
    case ArgType::Bool: {
      const bool v = arg.default_text != "true";
      return {{v ? "true" : "false"}, v};
    }
    case ArgType::Size:
      return {{"32MiB"}, "32MiB"};
    case ArgType::Choice: {
      const std::string t = arg.choices.back() != arg.default_text ? arg.choices.back() : arg.choices.front();
      return {{t}, t};
    }
    case ArgType::List:  // (name=path: --lora-modules' form; a plugin path may have '=' too)
      return {{"a=a.so", "b=b.so"}, json::array({"a=a.so", "b=b.so"})};
    case ArgType::Map:
      return {{"k=v", "threads=2"}, {{"k", "v"}, {"threads", 2}}};
    case ArgType::Json:
      return {{R"({"method": "ngram", "num_speculative_tokens": 3})"},
              {{"method", "ngram"}, {"num_speculative_tokens", 3}}};
    default:
      return {{kText.at(arg.name)}, kText.at(arg.name)};
  }
}

// The command line given `args` (after the command's name).
class Command {
 public:
  explicit Command(std::vector<std::string> args) : flags_(cli::add_engine_flags(&app_)) {
    args.insert(args.begin(), "pagellm");
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    app_.parse(static_cast<int>(argv.size()), argv.data());
  }
  EngineArgs args() const { return flags_->to_args(); }
  std::string help() const { return app_.help(); }

 private:
  CLI::App app_{"test"};
  std::shared_ptr<cli::EngineFlags> flags_;
};

class EngineArgTable : public ::testing::Test {
 protected:
  void SetUp() override {
    yaml_path_ = (std::filesystem::temp_directory_path() /
                  ("engine_arg_table_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + ".yaml"))
                     .string();
  }
  void TearDown() override { std::filesystem::remove(yaml_path_); }

  // No default model needed: dummy weights unless the row itself is load-format.
  EngineArgs from_command_line(const EngineArg& arg, const std::vector<std::string>& texts) {
    std::vector<std::string> args;
    if (arg.name != "load-format") args = {"--load-format", "dummy"};
    if (arg.type == ArgType::Bool) {
      args.push_back(texts[0] == "true" ? "--" + arg.name : "--" + arg.negation);
    } else {
      args.push_back("--" + arg.name);
      args.insert(args.end(), texts.begin(), texts.end());
    }
    return Command(args).args();
  }

  EngineArgs from_yaml(const EngineArg& arg, const std::vector<std::string>& texts) {
    std::ofstream out(yaml_path_);
    if (arg.name != "load-format") out << "load_format: dummy\n";
    out << arg.key() << ": ";  // the snake_case spelling
    if (arg.type == ArgType::List || arg.type == ArgType::Map) {
      out << "[";
      for (size_t i = 0; i < texts.size(); ++i) out << (i ? ", " : "") << texts[i];
      out << "]\n";
    } else {
      out << json(texts[0]).dump() << "\n";  // a quoted YAML scalar
    }
    out.close();
    return Command({"--config", yaml_path_}).args();
  }

  static EngineArgs from_json(const EngineArg& arg, const json& value) {
    json args = {{"load_format", "dummy"}};
    args[arg.key()] = value;
    return embed::parse_engine_args(args);
  }

  std::string yaml_path_;
};

bool is_parallel_size(const EngineArg& arg) { return arg.name.ends_with("-parallel-size"); }

TEST_F(EngineArgTable, EveryRowGivesTheSameConfigOnEveryPath) {
  const json defaults = snapshot(embed::parse_engine_args({{"load_format", "dummy"}}));
  for (const EngineArg& arg : embed::engine_arg_table()) {
    SCOPED_TRACE(arg.name);
    const Sample s = sample(arg);
    std::vector<json> results;
    if (arg.on_command_line()) {
      results.push_back(snapshot(from_command_line(arg, s.texts)));
      results.push_back(snapshot(from_yaml(arg, s.texts)));
    }
    if (arg.in_library() && !is_parallel_size(arg)) results.push_back(snapshot(from_json(arg, s.value)));
    ASSERT_FALSE(results.empty());
    for (const json& r : results) EXPECT_EQ(r, results[0]);
    // (dummy is the format of every run here.)
    const bool no_effect = arg.name == "load-format" || arg.help == "vLLM's; no effect";
    if (!no_effect) {
      EXPECT_NE(results[0], defaults) << "the value changed nothing";
    }
  }
}

TEST_F(EngineArgTable, DefaultsAreTheConfigsOwn) {
  json table = snapshot(embed::parse_engine_args({{"load_format", "dummy"}}));
  json plain = snapshot(EngineArgs{});
  plain["load_format"] = "dummy";
  // The one default that differs on purpose: 0 is the model's own context length.
  EXPECT_EQ(table["max_model_len"], 0);
  table.erase("max_model_len");
  plain.erase("max_model_len");
  EXPECT_EQ(table, plain);
}

// A value out of the row's range or choices, as text.
std::optional<std::string> bad_text(const EngineArg& arg) {
  switch (arg.type) {
    case ArgType::Int:
      if (!arg.choices.empty()) return "5";
      if (arg.max < INT64_MAX) return std::to_string(arg.max + 1);
      return std::nullopt;
    case ArgType::Float:
      return fmt::format("{}", arg.max_f * 2);
    case ArgType::Size:
      return arg.min > 0 ? std::optional<std::string>(std::to_string(arg.min - 1)) : std::nullopt;
    case ArgType::Choice:
      return "nope";
    default:
      return std::nullopt;
  }
}

TEST_F(EngineArgTable, ABadValueGetsTheSameWordsOnEveryPath) {
  int checked = 0;
  for (const EngineArg& arg : embed::engine_arg_table()) {
    const std::optional<std::string> bad = bad_text(arg);
    if (!bad) continue;
    SCOPED_TRACE(arg.name);
    ++checked;
    std::string why;
    try {
      embed::arg_value_from_text(arg, {*bad});
      FAIL() << *bad << " accepted";
    } catch (const embed::ArgValueError& e) {
      why = e.what();
    }
    if (arg.on_command_line()) {
      try {
        from_command_line(arg, {*bad});
        ADD_FAILURE() << "the command line took " << *bad;
      } catch (const CLI::ParseError& e) {
        EXPECT_EQ(std::string(e.what()), "--" + arg.name + ": " + why);
      }
      try {
        from_yaml(arg, {*bad});
        ADD_FAILURE() << "--config took " << *bad;
      } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()), "--config " + yaml_path_ + ": --" + arg.name + ": " + why);
      }
    }
    if (arg.in_library()) {
      json value = arg.type == ArgType::Choice || arg.type == ArgType::Size ? json(*bad) : json::parse(*bad);
      try {
        from_json(arg, value);
        ADD_FAILURE() << "JSON took " << *bad;
      } catch (const InvalidRequest& e) {
        EXPECT_EQ(std::string(e.what()), "engine argument '" + arg.key() + "': " + why);
        EXPECT_EQ(e.param(), arg.key());
      }
    }
  }
  EXPECT_GT(checked, 20);
}

TEST_F(EngineArgTable, MessagesSayWhatFits) {
  const auto why = [](const char* name, const std::string& text) {
    try {
      embed::arg_value_from_text(*embed::find_engine_arg(name), {text});
    } catch (const embed::ArgValueError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(why("block-size", "5"), "5 not in {8, 16, 32, 64}");
  EXPECT_EQ(why("max-num-seqs", "0"), "must be an integer in [1, 1048576], got 0");
  EXPECT_EQ(why("max-num-seqs", "many"), "must be an integer, got 'many'");
  EXPECT_EQ(why("gpu-memory-utilization", "1.5"), "must be a number in [0, 1], got 1.5");
  EXPECT_EQ(why("swap-space", "0"), "must be a number in (0, 1048576], got 0");
  EXPECT_EQ(why("kv-cache-memory", "lots"), "must be a size such as 2GiB, 512MiB or 1000000, got 'lots'");
  EXPECT_EQ(why("grammar-compile-memory", "8MiB"), "must be at least 16MiB, got '8MiB'");
  EXPECT_EQ(why("kv-cache-dtype", "q3"), "'q3' not in {auto, fp16, f16, float16, f32, fp32, float32, int8, i8}");
  EXPECT_EQ(why("backend-option", "threads"), "must be KEY=VALUE, got 'threads'");
}

TEST_F(EngineArgTable, HelpListsEveryCommandLineRow) {
  const std::string help = Command({}).help();
  for (const EngineArg& arg : embed::engine_arg_table()) {
    SCOPED_TRACE(arg.name);
    if (!arg.on_command_line()) {
      EXPECT_EQ(help.find("--" + arg.name), std::string::npos);
      continue;
    }
    EXPECT_NE(help.find("--" + arg.name), std::string::npos);
    EXPECT_NE(help.find(arg.help.substr(0, 40)), std::string::npos);
    for (const std::string& alias : arg.aliases) EXPECT_NE(help.find("--" + alias), std::string::npos);
  }
  EXPECT_NE(help.find("--config"), std::string::npos);
}

TEST_F(EngineArgTable, PresetsFillWhatIsNotGiven) {
  const EngineArgs cli =
      Command({"--load-format", "dummy", "--scheduling-preset", "latency", "--max-num-seqs", "7"}).args();
  const EngineArgs lib =
      embed::parse_engine_args({{"load_format", "dummy"}, {"scheduling_preset", "latency"}, {"max_num_seqs", 7}});
  for (const EngineArgs& a : {cli, lib}) {
    EXPECT_EQ(a.config.scheduler.max_num_seqs, 7);
    EXPECT_EQ(a.config.scheduler.max_num_batched_tokens, 512);
    EXPECT_EQ(a.config.scheduler.long_prefill_token_threshold, 128);
    EXPECT_EQ(a.config.scheduler.admission_policy, AdmissionPolicy::Conservative);
  }
}

TEST_F(EngineArgTable, AliasesAndSwitches) {
  const EngineArgs a = Command({"--load-format", "dummy", "--num-threads", "2", "--kv-cache-memory-bytes", "4096",
                                "--no-prefix-caching", "--no-chunked-prefill"})
                           .args();
  EXPECT_EQ(a.config.backend_options.at("threads"), "2");
  EXPECT_EQ(a.config.kv_cache_memory, 4096);
  EXPECT_FALSE(a.config.enable_prefix_caching);
  EXPECT_FALSE(a.config.scheduler.enable_chunked_prefill);
  // In YAML a switch's negation means what its name says.
  std::ofstream(yaml_path_) << "load_format: dummy\nno-prefix-caching: true\n";
  EXPECT_FALSE(Command({"--config", yaml_path_}).args().config.enable_prefix_caching);
  // JSON: either spelling, not both; only the snake_case names.
  EXPECT_EQ(embed::parse_engine_args({{"load_format", "dummy"}, {"threads", 3}}).config.backend_options.at("threads"),
            "3");
  try {
    embed::parse_engine_args({{"load_format", "dummy"}, {"threads", 3}, {"num_threads", 3}});
    ADD_FAILURE();
  } catch (const InvalidRequest& e) {
    EXPECT_EQ(std::string(e.what()), "give num_threads or threads, not both");
  }
  EXPECT_THROW(embed::parse_engine_args({{"max-num-seqs", 3}}), InvalidRequest);
  EXPECT_THROW(embed::parse_engine_args({{"trace", "t.json"}}), InvalidRequest);  // the command line's
}

TEST_F(EngineArgTable, TheTargetsOwnChecksNameTheFlag) {
  try {
    Command({"--load-format", "dummy", "--speculative-config", "{\"method\": 1}"});
    ADD_FAILURE();
  } catch (const CLI::ParseError& e) {
    EXPECT_EQ(std::string(e.what()), "--speculative-config: \"method\" must be a string");
  }
  try {
    Command({"--load-format", "dummy", "--pipeline-layer-partition", "3,x"});
    ADD_FAILURE();
  } catch (const CLI::ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("--pipeline-layer-partition: expected 'balanced'"), std::string::npos);
  }
  const EngineArgs balanced = Command({"--load-format", "dummy", "--pipeline-layer-partition", "balanced"}).args();
  EXPECT_TRUE(balanced.config.pipeline_balance_stages);
}

}  // namespace
}  // namespace pagellm
