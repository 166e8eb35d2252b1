#include "server/http_errors.h"

#include "api/openai_request.h"
#include "chat/jinja/errors.h"
#include "engine/async_engine.h"

namespace pagellm::server {

const char* error_type_for_status(int status) { return status >= 500 ? "server_error" : "invalid_request_error"; }

nlohmann::json error_body(int status, const std::string& message, const std::string& param, const std::string& code) {
  nlohmann::json e = {
      {"message", message}, {"type", error_type_for_status(status)}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return {{"error", e}};
}

ErrorReply error_reply_for_current_exception() {
  auto reply = [](int status, const std::string& msg, const std::string& param = "", const std::string& code = "") {
    return ErrorReply{status, error_body(status, msg, param, code)};
  };
  try {
    throw;
  } catch (const HttpError& e) {
    return reply(e.status(), e.what(), e.param(), e.code());
  } catch (const api::ModelNotFound& e) {
    return reply(404, e.what(), e.param(), "model_not_found");
  } catch (const InvalidRequest& e) {
    return reply(400, e.what(), e.param());
  } catch (const TemplateError& e) {
    return reply(400, e.what(), "messages");
  } catch (const QueueFull& e) {
    return reply(503, e.what(), "", "overloaded");
  } catch (const ShuttingDown& e) {
    return reply(503, e.what(), "", "shutting_down");
  } catch (const nlohmann::json::exception& e) {
    // A body that parsed but holds a value of the wrong kind somewhere the
    // parsers did not check by hand.
    return reply(400, std::string("invalid request: ") + e.what());
  } catch (const std::exception& e) {
    return reply(500, std::string("internal error: ") + e.what(), "", "internal_error");
  } catch (...) {
    return reply(500, "internal error", "", "internal_error");
  }
}

HttpError error_for(const RequestOutput& out) {
  switch (out.error_kind) {
    case RequestError::Invalid: return HttpError(400, out.error, "", out.error_param);
    case RequestError::Unavailable: return HttpError(503, out.error, "unavailable");
    case RequestError::Internal: break;
  }
  return HttpError(500, out.error, "internal_error");
}

}  // namespace pagellm::server
