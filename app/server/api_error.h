// An error answered to an HTTP client in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
// Handlers throw ApiError; the server turns it into the response, so that no bad request reaches the engine.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace mambacpp::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string type = "invalid_request_error",
           std::string code = {})
      : std::runtime_error(message),
        status(status),
        param(std::move(param)),
        type(std::move(type)),
        code(std::move(code)) {}

  int status;
  std::string param;  // the request field at fault; empty: none
  std::string type;   // invalid_request_error, authentication_error, server_error, ...
  std::string code;   // OpenAI's machine-readable code (e.g. invalid_api_key); empty: null

  nlohmann::json to_json() const {
    auto or_null = [](const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); };
    return {{"error", {{"message", what()}, {"type", type}, {"param", or_null(param)}, {"code", or_null(code)}}}};
  }
};

// A 400 naming the field: bad_request("max_tokens", "must be an integer in [0, 1048576], found 1e9").
inline ApiError bad_request(const std::string& param, const std::string& message) {
  return ApiError(400, param.empty() ? message : "'" + param + "': " + message, param);
}

}  // namespace mambacpp::server
