// Reference token ids from llama.cpp for the tokenizer fixtures
// (tools/gen_tokenizer_fixtures.py --llama-build): loads a GGUF vocabulary
// only and tokenizes each text of IN (each text followed by a line
// "__case__"), writing one line of space-separated ids per text to OUT.
// Built against a llama.cpp build tree by the script; not part of pagellm.
//
//   llama_tokenize VOCAB.gguf IN OUT ADD_SPECIAL PARSE_SPECIAL
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s VOCAB.gguf IN OUT ADD_SPECIAL PARSE_SPECIAL\n", argv[0]);
    return 2;
  }
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return std::fprintf(stderr, "cannot load %s\n", argv[1]), 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::ifstream in(argv[2], std::ios::binary);
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str(), sep = "\n__case__\n";
  std::ofstream out(argv[3]);
  const bool add_special = std::atoi(argv[4]) != 0, parse_special = std::atoi(argv[5]) != 0;
  for (size_t at = 0;;) {
    const size_t end = text.find(sep, at);
    if (end == std::string::npos) break;
    const std::string one = text.substr(at, end - at);
    std::vector<llama_token> ids(one.size() + 8);
    int n = llama_tokenize(vocab, one.data(), static_cast<int32_t>(one.size()), ids.data(),
                           static_cast<int32_t>(ids.size()), add_special, parse_special);
    if (n < 0) return std::fprintf(stderr, "tokenize failed\n"), 1;
    for (int i = 0; i < n; ++i) out << (i ? " " : "") << ids[i];
    out << "\n";
    at = end + sep.size();
  }
  llama_model_free(model);
  return 0;
}
