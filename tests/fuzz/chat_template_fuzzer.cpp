// libFuzzer entry point; the body is in targets/chat_template.cpp.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return pagellm::fuzz::chat_template(data, size); }
