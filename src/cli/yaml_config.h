// `--config FILE.yaml` (vLLM's): every flag of a command readable from a YAML
// mapping, `max-num-seqs: 64` or `max_num_seqs: 64`, lists for repeatable
// flags, nested mappings (speculative-config) as JSON. Flags given on the
// command line win over the file. Read with yaml-cpp.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace pagellm::cli {

struct YamlFlag {
  std::string name;  // as the long flag, dashes: "max-num-seqs"
  std::vector<std::string> values;
};

// Throws Error for YAML that does not parse or is not a mapping of flags.
std::vector<YamlFlag> read_yaml_flags(std::istream& in, const std::string& path);

// Gives each flag of the file to `app`'s option of that name unless the
// command line set it already (its validators run as for typed flags).
// Throws Error for a file that cannot be read, an unknown flag or a bad value.
void apply_config_file(CLI::App* app, const std::string& path);

}  // namespace pagellm::cli
