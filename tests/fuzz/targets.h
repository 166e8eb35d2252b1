// The bodies of the libFuzzer targets. Each *_fuzzer.cpp is a one-line
// LLVMFuzzerTestOneInput around one of these, and the unit tests
// (tests/unit/fuzz) replay the seed corpus and every saved crash through the
// very same functions, so a fixed crash stays fixed.
//
// A clean refusal (pagellm::Error, or an exception the real caller turns into
// an error message) returns normally. A crash, a sanitizer report, an
// exception the caller would not handle, or a broken invariant (abort) is a
// finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace pagellm::fuzz {

// A GGUF file: header, metadata, tensor table, model config, vocabulary.
int gguf(const uint8_t* data, size_t size);
// A model.safetensors file (header JSON and tensor table), as two architectures.
int safetensors(const uint8_t* data, size_t size);
// A Hugging Face tokenizer.json, then a short string through the tokenizer.
int tokenizer_json(const uint8_t* data, size_t size);
// An HTTP body for /v1/completions and /v1/chat/completions, down to EngineRequests.
int request(const uint8_t* data, size_t size);
// A Jinja chat template (parsed and rendered), and message content for two real templates.
int chat_template(const uint8_t* data, size_t size);
// Bytes from an HTTP client: request heads and bodies (chunked, compressed) through HttpRequestReader.
int http_request(const uint8_t* data, size_t size);
// A structured-output spec (schema, regex, grammar, choices, structural tag): validated, then compiled.
int grammar(const uint8_t* data, size_t size);

struct Target {
  std::string_view name;  // folder name under tests/fuzz/corpus and tests/fuzz/regressions
  int (*run)(const uint8_t* data, size_t size);
};
std::span<const Target> all_targets();

}  // namespace pagellm::fuzz
