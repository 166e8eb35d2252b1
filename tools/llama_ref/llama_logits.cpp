// Reference logits from llama.cpp for the converter fixtures
// (tools/gen_convert_fixtures.py --llama-build): runs a GGUF file over a
// token sequence in one batch, F32 KV cache, and writes every position's
// logits as float32 [n_tokens, n_vocab]. Built against a llama.cpp build
// tree by the script; not part of pagellm. With --lora, a GGUF LoRA adapter
// (scale 1) is applied on top (tools/gen_lora_fixtures.py --llama-build).
//
//   llama_logits [--lora ADAPTER.gguf] MODEL.gguf OUT.bin TOKEN...
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  const char* lora_path = nullptr;
  if (argc > 2 && std::string(argv[1]) == "--lora") {
    lora_path = argv[2];
    argv[2] = argv[0];
    argc -= 2;
    argv += 2;
  }
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s [--lora ADAPTER.gguf] MODEL.gguf OUT.bin TOKEN...\n", argv[0]);
    return 2;
  }
  std::vector<llama_token> tokens;
  for (int i = 3; i < argc; ++i) tokens.push_back(static_cast<llama_token>(std::atoi(argv[i])));
  const int n = static_cast<int>(tokens.size());
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return std::fprintf(stderr, "cannot load %s\n", argv[1]), 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 512;
  cp.n_batch = cp.n_ubatch = 512;
  cp.n_threads = cp.n_threads_batch = 2;
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  // Its CPU flash attention rounds to F16 (about 1e-3 of the logits); the
  // plain path is float throughout, like the reference it is compared with.
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return std::fprintf(stderr, "cannot create a context\n"), 1;
  if (lora_path) {
    llama_adapter_lora* adapter = llama_adapter_lora_init(model, lora_path);
    if (!adapter) return std::fprintf(stderr, "cannot load the adapter %s\n", lora_path), 1;
    float scale = 1.0f;
    if (llama_set_adapters_lora(ctx, &adapter, 1, &scale) != 0) return std::fprintf(stderr, "cannot set the adapter\n"), 1;
  }
  llama_batch batch = llama_batch_init(n, 0, 1);
  batch.n_tokens = n;
  for (int i = 0; i < n; ++i) {
    batch.token[i] = tokens[i];
    batch.pos[i] = i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  if (llama_decode(ctx, batch) != 0) return std::fprintf(stderr, "llama_decode failed\n"), 1;
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  FILE* out = std::fopen(argv[2], "wb");
  if (!out) return std::fprintf(stderr, "cannot write %s\n", argv[2]), 1;
  for (int i = 0; i < n; ++i) std::fwrite(llama_get_logits_ith(ctx, i), sizeof(float), n_vocab, out);
  std::fclose(out);
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
