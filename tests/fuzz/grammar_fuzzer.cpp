// libFuzzer entry point; the body is in targets/grammar.cpp.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return pagellm::fuzz::grammar(data, size); }
