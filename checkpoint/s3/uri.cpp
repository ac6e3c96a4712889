#include "checkpoint/s3/uri.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace mx::s3 {

bool is_s3_uri(const std::string& s) { return s.rfind("s3://", 0) == 0; }

void validate_bucket_name(const std::string& b) {
  MX_REQUIRE(b.size() >= 3 && b.size() <= 63, "S3 bucket name '", b,
             "' must be 3 to 63 characters long");
  for (char c : b)
    MX_REQUIRE(std::islower(static_cast<unsigned char>(c)) ||
                   std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '-',
               "S3 bucket name '", b,
               "' may contain only lowercase letters, digits, '.' and '-'");
  auto alnum = [](char c) {
    return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c));
  };
  MX_REQUIRE(alnum(b.front()) && alnum(b.back()), "S3 bucket name '", b,
             "' must start and end with a letter or digit");
  MX_REQUIRE(b.find("..") == std::string::npos, "S3 bucket name '", b,
             "' must not contain '..'");
  int dots = 0;
  bool digits_and_dots = true;
  for (char c : b) {
    dots += c == '.';
    digits_and_dots &= std::isdigit(static_cast<unsigned char>(c)) || c == '.';
  }
  MX_REQUIRE(!(dots == 3 && digits_and_dots), "S3 bucket name '", b,
             "' must not look like an IP address");
}

S3Uri parse_s3_uri(const std::string& uri) {
  MX_REQUIRE(is_s3_uri(uri), "'", uri, "' is not an S3 URI: expected s3://bucket/prefix");
  std::string rest = uri.substr(5);
  size_t slash = rest.find('/');
  S3Uri out;
  out.bucket = rest.substr(0, slash);
  MX_REQUIRE(!out.bucket.empty(), "S3 URI '", uri, "' has no bucket: expected s3://bucket/prefix");
  validate_bucket_name(out.bucket);
  if (slash != std::string::npos) out.key = rest.substr(slash + 1);
  MX_REQUIRE(out.key.size() <= 1024, "S3 URI '", uri.substr(0, 80),
             "...' has a key longer than S3's 1024 bytes");
  // A control character would split the one-line messages that name the key (and S3 keys
  // with them are trouble anywhere); a "." or ".." segment is removed from the request path by
  // HTTP clients (libcurl) after signing: the upload then fails with SignatureDoesNotMatch
  // only at the first checkpoint, after the training.
  for (size_t i = 0; i < out.key.size(); ++i) {
    const auto c = static_cast<unsigned char>(out.key[i]);
    MX_REQUIRE(c >= 0x20 && c != 0x7f, "S3 URI of bucket ", out.bucket,
               " has a control character (byte ", int(c), ") in its prefix, at byte ", i);
  }
  for (size_t b = 0; b <= out.key.size();) {
    const size_t e = std::min(out.key.find('/', b), out.key.size());
    const std::string seg = out.key.substr(b, e - b);
    MX_REQUIRE(seg != "." && seg != "..", "S3 URI '", uri, "' has a '", seg,
               "' segment in its prefix (HTTP clients rewrite it away)");
    b = e + 1;
  }
  return out;
}

Endpoint parse_endpoint(const std::string& url, const std::string& what) {
  Endpoint e;
  size_t sep = url.find("://");
  MX_REQUIRE(sep != std::string::npos, what, "='", url,
             "' is not an endpoint URL: expected http(s)://host[:port]");
  e.scheme = url.substr(0, sep);
  for (char& c : e.scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  MX_REQUIRE(e.scheme == "http" || e.scheme == "https", what, "='", url,
             "' must start with http:// or https://");
  std::string rest = url.substr(sep + 3);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  MX_REQUIRE(!rest.empty(), what, "='", url, "' has no host");
  MX_REQUIRE(rest.find_first_of("/?#@") == std::string::npos, what, "='", url,
             "' must be just scheme://host[:port] (no path, query or user info)");
  std::string host = rest;
  if (host.front() == '[') {  // [::1]:port
    size_t close = host.find(']');
    MX_REQUIRE(close != std::string::npos, what, "='", url, "' has an unclosed IPv6 bracket");
    e.host = host.substr(0, close + 1);
    std::string tail = host.substr(close + 1);
    if (!tail.empty()) {
      MX_REQUIRE(tail[0] == ':', what, "='", url, "' has junk after the host");
      host = "x" + tail;  // parsed below as a port
    } else {
      host.clear();
    }
  }
  size_t colon = host.rfind(':');
  if (e.host.empty()) e.host = host.substr(0, colon);
  if (colon != std::string::npos) {
    std::string port = host.substr(colon + 1);
    MX_REQUIRE(!port.empty() && port.size() <= 5 &&
                   port.find_first_not_of("0123456789") == std::string::npos,
               what, "='", url, "' has an invalid port '", port, "'");
    e.port = std::stoi(port);
    MX_REQUIRE(e.port > 0 && e.port < 65536, what, "='", url, "' has an invalid port ", e.port);
    if ((e.scheme == "http" && e.port == 80) || (e.scheme == "https" && e.port == 443)) e.port = 0;
  }
  MX_REQUIRE(!e.host.empty(), what, "='", url, "' has no host");
  return e;
}

}  // namespace mx::s3
