#include <gtest/gtest.h>

#include "api/openai_request.h"
#include "chat/jinja/errors.h"
#include "engine/async_engine.h"
#include "server/auth.h"
#include "server/http_errors.h"

namespace pagellm::server {
namespace {

TEST(ServerAuth, BearerKey) {
  EXPECT_TRUE(authorization_matches("Bearer sekret", "sekret"));
  EXPECT_TRUE(authorization_matches("bearer sekret", "sekret"));
  EXPECT_TRUE(authorization_matches("Bearer   sekret ", "sekret"));
  EXPECT_FALSE(authorization_matches("Bearer sekret2", "sekret"));
  EXPECT_FALSE(authorization_matches("Bearer sekre", "sekret"));
  EXPECT_FALSE(authorization_matches("Bearer ", "sekret"));
  EXPECT_FALSE(authorization_matches("Basic sekret", "sekret"));
  EXPECT_FALSE(authorization_matches("sekret", "sekret"));
  EXPECT_FALSE(authorization_matches("Bearer x", ""));  // an empty key never matches
}

TEST(ServerAuth, GuardedRoutes) {
  for (const char* p : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize"})
    EXPECT_TRUE(route_needs_api_key(p)) << p;
  for (const char* p : {"/health", "/metrics", "/version", "/"}) EXPECT_FALSE(route_needs_api_key(p)) << p;
}

ErrorReply reply_for(const std::function<void()>& thrower) {
  try {
    thrower();
  } catch (...) {
    return error_reply_for_current_exception();
  }
  return {};
}

TEST(ServerErrors, ExceptionsMapToStatusAndShape) {
  struct Case {
    std::function<void()> thrower;
    int status;
    const char* type;
    nlohmann::json param, code;
  };
  const Case cases[] = {
      {[] { throw InvalidRequest("bad top_p", "top_p"); }, 400, "invalid_request_error", "top_p", nullptr},
      {[] { throw InvalidRequest("bad body"); }, 400, "invalid_request_error", nullptr, nullptr},
      {[] { throw TemplateError("roles must alternate"); }, 400, "invalid_request_error", "messages", nullptr},
      {[] { throw HttpError(404, "no such model", "model_not_found", "model"); }, 404, "invalid_request_error", "model",
       "model_not_found"},
      {[] { throw api::ModelNotFound("no such model"); }, 404, "invalid_request_error", "model", "model_not_found"},
      {[] { throw HttpError(401, "key", "invalid_api_key"); }, 401, "invalid_request_error", nullptr,
       "invalid_api_key"},
      {[] { throw QueueFull("full"); }, 503, "server_error", nullptr, "overloaded"},
      {[] { throw ShuttingDown("bye"); }, 503, "server_error", nullptr, "shutting_down"},
      {[] { (void)nlohmann::json(5).get<std::string>(); }, 400, "invalid_request_error", nullptr, nullptr},
      {[] { throw std::runtime_error("boom"); }, 500, "server_error", nullptr, "internal_error"},
      {[] { throw 42; }, 500, "server_error", nullptr, "internal_error"},
  };
  for (const Case& c : cases) {
    const ErrorReply r = reply_for(c.thrower);
    EXPECT_EQ(r.status, c.status) << r.body;
    const auto& e = r.body.at("error");
    EXPECT_EQ(e.size(), 4u) << r.body;
    EXPECT_TRUE(e.at("message").is_string() && !e.at("message").get<std::string>().empty());
    EXPECT_EQ(e.at("type"), c.type) << r.body;
    EXPECT_EQ(e.at("param"), c.param) << r.body;
    EXPECT_EQ(e.at("code"), c.code) << r.body;
  }
  EXPECT_EQ(reply_for([] { throw TemplateError("roles must alternate"); }).body["error"]["message"],
            "roles must alternate");
}

}  // namespace
}  // namespace pagellm::server
