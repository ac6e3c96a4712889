#include "checkpoint/s3/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <mutex>
#include <stdexcept>

namespace mx::s3 {

namespace {

std::once_flag g_curl_init;

struct CurlHandle {
  CURL* h = nullptr;
  CurlHandle() {
    std::call_once(g_curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    h = curl_easy_init();
    if (!h) throw std::runtime_error("curl_easy_init failed");
  }
  ~CurlHandle() {
    if (h) curl_easy_cleanup(h);
  }
};

struct Transfer {
  const HttpRequest* req;
  HttpResponse* resp;
  CURL* curl;
  size_t read_pos = 0;
  int status_known = 0;  // 0 unknown, 1 2xx (sink), 2 2xx (buffer), 3 other (first bytes kept)
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {  // a new status line (also after 100 Continue)
    t->resp->headers.clear();
    t->status_known = 0;
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string value = line.substr(colon + 1);
    size_t b = value.find_first_not_of(" \t");
    size_t e = value.find_last_not_of(" \t\r\n");
    value = b == std::string::npos ? "" : value.substr(b, e - b + 1);
    t->resp->headers[name] = value;
  }
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t bytes = size * n;
  if (t->status_known == 0) {
    long code = 0;
    curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &code);
    const bool ok = code >= 200 && code < 300;
    t->status_known = ok && t->req->sink ? 1 : ok ? 2 : 3;
    if (t->status_known == 2 && t->resp->body.empty()) {
      std::string len = t->resp->headers.count("content-length")
                            ? t->resp->headers["content-length"] : "";
      // A hint only, and never more than a body may be: a 200 claiming 99 GB made reserve()
      // throw out of this C callback.
      if (!len.empty() && len.size() < 12 &&
          len.find_first_not_of("0123456789") == std::string::npos)
        t->resp->body.reserve(std::min<size_t>(std::stoull(len), t->req->max_buffered_body));
    }
  }
  if (t->status_known == 1) {
    if (!t->req->sink(data, bytes)) {
      t->resp->sink_aborted = true;
      return 0;  // makes curl fail with CURLE_WRITE_ERROR
    }
    return bytes;
  }
  if (t->status_known == 3) {  // an error document: its start says what went wrong
    const size_t room = kMaxErrorBody - std::min(kMaxErrorBody, t->resp->body.size());
    t->resp->body.append(data, std::min(room, bytes));
    return bytes;
  }
  const size_t limit = t->req->max_buffered_body;
  if (bytes > limit - std::min(limit, t->resp->body.size())) {
    t->resp->body_too_long = true;
    return 0;  // makes curl fail with CURLE_WRITE_ERROR
  }
  t->resp->body.append(data, bytes);
  return bytes;
}

size_t on_read(char* buf, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t left = t->req->body_size - t->read_pos;
  size_t k = std::min(left, size * n);
  if (k) std::memcpy(buf, t->req->body + t->read_pos, k);
  t->read_pos += k;
  return k;
}

int on_seek(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > t->req->body_size)
    return CURL_SEEKFUNC_FAIL;
  t->read_pos = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

}  // namespace

HttpResponse http_perform(const HttpRequest& req) {
  thread_local CurlHandle handle;
  CURL* c = handle.h;
  curl_easy_reset(c);

  HttpResponse resp;
  Transfer t{&req, &resp, c};
  char errbuf[CURL_ERROR_SIZE] = {0};

  curl_easy_setopt(c, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, req.timeouts.connect_ms);
  if (req.timeouts.total_ms > 0) curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, req.timeouts.total_ms);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, req.timeouts.low_speed_bytes_s);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, req.timeouts.low_speed_time_s);
  // Proxies from the environment would see (and could alter) signed requests to loopback
  // test servers and instance metadata; S3 traffic goes direct like the AWS SDKs' defaults
  // for 169.254.x.x. HTTPS_PROXY is still honoured for real endpoints by curl itself.
  curl_easy_setopt(c, CURLOPT_NOPROXY, "127.0.0.1,localhost,::1,169.254.169.254,169.254.170.2");

  if (req.method == "HEAD") {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (req.method == "PUT") {
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(c, CURLOPT_READDATA, &t);
    curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, on_seek);
    curl_easy_setopt(c, CURLOPT_SEEKDATA, &t);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body_size));
  } else if (req.method == "POST") {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, req.body ? reinterpret_cast<const char*>(req.body) : "");
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body_size));
  } else if (req.method != "GET") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  }

  curl_slist* list = nullptr;
  bool has_content_type = false;
  for (const auto& [k, v] : req.headers) {
    std::string line = k + ": " + v;
    list = curl_slist_append(list, line.c_str());
    if (k.size() == 12 && strncasecmp(k.c_str(), "content-type", 12) == 0) has_content_type = true;
  }
  list = curl_slist_append(list, "Expect:");  // no 100-continue round trip
  if (!has_content_type) list = curl_slist_append(list, "Content-Type:");  // none from curl
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);

  CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(list);
  resp.curl_code = static_cast<int>(rc);
  if (rc != CURLE_OK) {
    resp.curl_error = errbuf[0] ? errbuf : curl_easy_strerror(rc);
    resp.status = 0;
    return resp;
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &resp.status);
  return resp;
}

bool is_retryable_transport_error(int code) {
  switch (static_cast<CURLcode>(code)) {
    case CURLE_OK:
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
    case CURLE_NOT_BUILT_IN:
    case CURLE_WRITE_ERROR:  // our sink refused the data
    case CURLE_ABORTED_BY_CALLBACK:
    case CURLE_OUT_OF_MEMORY:
    case CURLE_BAD_FUNCTION_ARGUMENT:
    case CURLE_PEER_FAILED_VERIFICATION:  // a certificate problem will not fix itself
      return false;
    default:
      return true;
  }
}

}  // namespace mx::s3
