// Helpers for the tokenizer tests: llama.cpp test-vector files and id printing.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace pagellm::test {

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TokenizerVectors {
  std::vector<std::string> inputs;
  std::vector<std::vector<int32_t>> expected;
};

// ggml-vocab-NAME.gguf.inp / .out (format: ../shared/data/tokenizer/README.md).
inline TokenizerVectors read_vectors(const std::string& inp_path, const std::string& out_path) {
  TokenizerVectors v;
  const std::string inp = read_file(inp_path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t at = 0;;) {
    const size_t hit = inp.find(sep, at);
    if (hit == std::string::npos) break;
    v.inputs.push_back(inp.substr(at, hit - at));
    at = hit + sep.size();
  }
  std::istringstream out(read_file(out_path));
  std::string line;
  while (v.expected.size() < v.inputs.size() && std::getline(out, line)) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    for (int32_t id; ls >> id;) ids.push_back(id);
    v.expected.push_back(ids);
  }
  return v;
}

inline std::string ids_string(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

}  // namespace pagellm::test
