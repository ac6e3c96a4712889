// AWS Signature Version 4 for S3 requests (header-based, single-chunk payload): canonical
// request -> string to sign -> HMAC-SHA256 key chain -> Authorization header. Pure functions of
// their inputs (the time is passed in), so the published AWS examples are exact tests.
#pragma once
#include <ctime>
#include <string>
#include <utility>
#include <vector>

namespace mx::s3 {

// What a request is signed with. `session_token` is empty for long-term keys. `expiration` is
// 0 for credentials that do not expire.
struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;
  std::time_t expiration = 0;
};

inline constexpr const char* kEmptyPayloadSha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
inline constexpr const char* kUnsignedPayload = "UNSIGNED-PAYLOAD";

// The request as it will go on the wire. `encoded_path` is already URI-encoded (S3 encodes the
// key once, keeping '/'); `query` holds raw (unencoded) names and values; `headers` are any
// case, and all of them are signed (pass only the ones that go on the wire: host, range, date,
// content-md5, x-amz-*).
struct SigningInput {
  std::string method;
  std::string encoded_path;
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_sha256_hex;  // or kUnsignedPayload
};

struct Signature {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signed_headers;  // "host;range;x-amz-date"
  std::string signature;       // 64 hex digits
  std::string authorization;   // the Authorization header value
};

// RFC 3986 unreserved characters stay, every other byte becomes %XY (uppercase hex);
// '/' stays when `keep_slash` (object keys in paths).
std::string uri_encode(const std::string& s, bool keep_slash);

// "key=value&..." sorted by encoded name, then value; the same string is used on the wire.
std::string canonical_query(const std::vector<std::pair<std::string, std::string>>& query);

// "20130524T000000Z" for a UTC time.
std::string amz_date(std::time_t t);

// kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request").
std::string signing_key(const std::string& secret, const std::string& yyyymmdd,
                        const std::string& region, const std::string& service);

// Signs `in` at `amz_datetime` ("YYYYMMDDTHHMMSSZ"); the caller sends the x-amz-date,
// x-amz-content-sha256 and (with a session token) x-amz-security-token headers it listed in
// `in.headers`: see add_signing_headers.
Signature sign_v4(const SigningInput& in, const Credentials& creds, const std::string& region,
                  const std::string& service, const std::string& amz_datetime);

// Adds x-amz-date, x-amz-content-sha256 and x-amz-security-token (when the credentials have a
// session token) to `in.headers`, so that they are signed and sent.
void add_signing_headers(SigningInput& in, const Credentials& creds,
                         const std::string& amz_datetime);

}  // namespace mx::s3
