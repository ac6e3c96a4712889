// One HTTP request over libcurl, synchronously. Each thread keeps its own curl handle, so
// connections (and TLS sessions) are reused across requests on that thread. No retries here:
// the S3 client decides what to retry.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mx::s3 {

struct HttpTimeouts {
  long connect_ms = 10000;
  long total_ms = 0;            // 0: no overall limit (large bodies); stalls are caught below
  long low_speed_bytes_s = 1;   // a transfer slower than this ...
  long low_speed_time_s = 60;   // ... for this long is abandoned (a timeout, retried)
};

struct HttpRequest {
  std::string method;  // GET HEAD PUT POST DELETE
  std::string url;     // already encoded
  std::vector<std::pair<std::string, std::string>> headers;
  const uint8_t* body = nullptr;  // not owned; must outlive the call
  size_t body_size = 0;
  // When set, a 2xx response body goes here instead of HttpResponse::body; return false to
  // abort the transfer. Non-2xx bodies (error documents) are always buffered.
  std::function<bool(const char* data, size_t size)> sink;
  HttpTimeouts timeouts;
  // A 2xx body buffered in HttpResponse::body (no sink) longer than this fails the transfer
  // (body_too_long); of other bodies (error documents) the first kMaxErrorBody bytes are kept
  // and the rest dropped. An answer of any size never makes memory grow past these.
  size_t max_buffered_body = 64u << 20;
};

struct HttpResponse {
  long status = 0;                            // 0 when the transfer failed (see curl_code)
  std::map<std::string, std::string> headers;  // names lowercased; last value wins
  std::string body;
  int curl_code = 0;       // CURLcode; 0 = OK
  std::string curl_error;  // curl's message for curl_code
  bool sink_aborted = false;
  bool body_too_long = false;  // a buffered 2xx body went past max_buffered_body

  bool transport_ok() const { return curl_code == 0; }
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

inline constexpr size_t kMaxErrorBody = 64u << 10;

HttpResponse http_perform(const HttpRequest& req);

// Whether a failed transfer (curl_code != 0) is worth another try: connection refused/reset,
// timeouts, DNS hiccups, TLS handshakes, partial bodies. Not: malformed URLs, unsupported
// protocols, our own sink aborting.
bool is_retryable_transport_error(int curl_code);

}  // namespace mx::s3
