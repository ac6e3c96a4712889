// s3://bucket/prefix URIs and endpoint URLs, parsed with errors a user can act on.
#pragma once
#include <string>

namespace mx::s3 {

struct S3Uri {
  std::string bucket;
  std::string key;  // the object key or prefix; may be empty ("s3://bucket" or "s3://bucket/")
  std::string str() const { return "s3://" + bucket + (key.empty() ? "" : "/" + key); }
};

// "s3://bucket/a/b" -> {bucket, "a/b"}. UserError when the scheme is not s3://, the bucket is
// missing or not a valid bucket name (3-63 chars of a-z 0-9 . -, starting and ending with a
// letter or digit, no "..", not an IP address), or the key is over 1024 bytes.
S3Uri parse_s3_uri(const std::string& uri);
bool is_s3_uri(const std::string& s);  // starts with "s3://"

// Throws UserError naming `bucket` and the rule it breaks.
void validate_bucket_name(const std::string& bucket);

// An endpoint URL: "http://127.0.0.1:5000", "https://s3.us-west-2.amazonaws.com".
struct Endpoint {
  std::string scheme;  // http or https
  std::string host;    // without port
  int port = 0;        // 0: the scheme's default
  // "host" or "host:port" as it appears in the Host header.
  std::string authority() const { return port ? host + ":" + std::to_string(port) : host; }
  std::string url() const { return scheme + "://" + authority(); }
};

// UserError for anything but http(s)://host[:port][/] (a path, query or user info is refused).
// `what` names the setting in the message ("AWS_ENDPOINT_URL_S3").
Endpoint parse_endpoint(const std::string& url, const std::string& what);

}  // namespace mx::s3
