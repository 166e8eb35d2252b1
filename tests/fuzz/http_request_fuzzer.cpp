// libFuzzer entry point; the body is in targets/http_request.cpp.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return pagellm::fuzz::http_request(data, size);
}
