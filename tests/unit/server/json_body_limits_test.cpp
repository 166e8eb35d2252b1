// parse_json_body refuses deep and DOM-heavy bodies with errors that map to 400.
#include <gtest/gtest.h>

#include "server/http_errors.h"
#include "server/openai_server.h"

namespace pagellm::server {
namespace {

ErrorReply reply_for_body(const std::string& body, const JsonLimits& limits = kRequestJsonLimits) {
  try {
    parse_json_body(body, limits);
  } catch (...) {
    return error_reply_for_current_exception();
  }
  return ErrorReply{200, {}};
}

TEST(ServerJsonBody, LimitsMapTo400) {
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  const ErrorReply r = reply_for_body(R"({"messages": [{"role": "user", "content": )" + deep + "}]}");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["message"].get<std::string>().rfind(
                "the request body: JSON nesting depth exceeds the limit of 64", 0),
            0u)
      << r.body.dump();

  JsonLimits small = kRequestJsonLimits;
  small.max_memory_bytes = 2048;
  const ErrorReply m =
      reply_for_body(R"({"messages": [{}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {},
                                        {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}]})",
                     small);
  EXPECT_EQ(m.status, 400);
  EXPECT_NE(m.body["error"]["message"].get<std::string>().find("JSON estimated memory exceeds the limit of 2048"),
            std::string::npos)
      << m.body.dump();

  EXPECT_EQ(reply_for_body("{\"prompt\": [1, 2").status, 400);
  EXPECT_EQ(reply_for_body("{\"prompt\": \"hi\"}").status, 200);
}

}  // namespace
}  // namespace pagellm::server
