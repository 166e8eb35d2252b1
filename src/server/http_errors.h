// HTTP failures in OpenAI's error shape:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// Handlers throw (HttpError, InvalidRequest, QueueFull, ...); one wrapper in
// http_server.cpp catches everything and calls error_reply_for_current_exception().
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace pagellm {
struct RequestOutput;
}

namespace pagellm::server {

class HttpError : public Error {
 public:
  HttpError(int status, const std::string& message, std::string code = "", std::string param = "")
      : Error(message), status_(status), code_(std::move(code)), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& code() const { return code_; }
  const std::string& param() const { return param_; }

 private:
  int status_;
  std::string code_;
  std::string param_;
};

struct ErrorReply {
  int status = 500;
  nlohmann::json body;
};

// OpenAI's error `type` for a status: invalid_request_error for 4xx,
// server_error for 5xx.
const char* error_type_for_status(int status);

// The error JSON; empty param / code become null.
nlohmann::json error_body(int status, const std::string& message, const std::string& param = "",
                          const std::string& code = "");

// Call inside a catch block: maps the exception being handled to a status
// and body. HttpError keeps its status; InvalidRequest, TemplateError and JSON
// errors are 400; QueueFull and ShuttingDown 503; anything else 500.
ErrorReply error_reply_for_current_exception();

// A request the engine failed: 400 (with the field it names), 503 or 500.
HttpError error_for(const RequestOutput& out);

}  // namespace pagellm::server
