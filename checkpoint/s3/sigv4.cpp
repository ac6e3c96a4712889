#include "checkpoint/s3/sigv4.h"

#include <algorithm>
#include <cctype>

#include "checkpoint/s3/crypto.h"
#include "core/error.h"

namespace mx::s3 {

std::string uri_encode(const std::string& s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3);
  for (unsigned char c : s) {
    bool unreserved = std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

std::string canonical_query(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> enc;
  enc.reserve(query.size());
  for (const auto& [k, v] : query) enc.emplace_back(uri_encode(k, false), uri_encode(v, false));
  std::sort(enc.begin(), enc.end());
  std::string out;
  for (const auto& [k, v] : enc) {
    if (!out.empty()) out += '&';
    out += k + "=" + v;
  }
  return out;
}

std::string amz_date(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string signing_key(const std::string& secret, const std::string& yyyymmdd,
                        const std::string& region, const std::string& service) {
  std::string k = hmac_sha256("AWS4" + secret, yyyymmdd);
  k = hmac_sha256(k, region);
  k = hmac_sha256(k, service);
  return hmac_sha256(k, "aws4_request");
}

// Header values: leading/trailing spaces trimmed, inner runs of spaces collapsed to one.
static std::string canonical_header_value(const std::string& v) {
  std::string out;
  bool in_space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      in_space = true;
      continue;
    }
    if (in_space && !out.empty()) out += ' ';
    in_space = false;
    out += c;
  }
  return out;
}

static std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

Signature sign_v4(const SigningInput& in, const Credentials& creds, const std::string& region,
                  const std::string& service, const std::string& amz_datetime) {
  MX_ASSERT(amz_datetime.size() == 16, "x-amz-date must be YYYYMMDDTHHMMSSZ");
  std::vector<std::pair<std::string, std::string>> headers;
  for (const auto& [k, v] : in.headers) headers.emplace_back(lower(k), canonical_header_value(v));
  std::sort(headers.begin(), headers.end());

  Signature s;
  std::string canonical_headers;
  for (size_t i = 0; i < headers.size(); ++i) {
    // Repeated names are joined with commas, as the protocol says (we never send any).
    if (i > 0 && headers[i].first == headers[i - 1].first) {
      canonical_headers.back() = ',';
      canonical_headers += headers[i].second + "\n";
      continue;
    }
    canonical_headers += headers[i].first + ":" + headers[i].second + "\n";
    if (!s.signed_headers.empty()) s.signed_headers += ';';
    s.signed_headers += headers[i].first;
  }
  s.canonical_request = in.method + "\n" + in.encoded_path + "\n" + canonical_query(in.query) +
                        "\n" + canonical_headers + "\n" + s.signed_headers + "\n" +
                        in.payload_sha256_hex;

  const std::string date = amz_datetime.substr(0, 8);
  const std::string scope = date + "/" + region + "/" + service + "/aws4_request";
  s.string_to_sign = "AWS4-HMAC-SHA256\n" + amz_datetime + "\n" + scope + "\n" +
                     sha256_hex(s.canonical_request);
  s.signature = to_hex(
      hmac_sha256(signing_key(creds.secret_access_key, date, region, service), s.string_to_sign));
  s.authorization = "AWS4-HMAC-SHA256 Credential=" + creds.access_key_id + "/" + scope +
                    ",SignedHeaders=" + s.signed_headers + ",Signature=" + s.signature;
  return s;
}

void add_signing_headers(SigningInput& in, const Credentials& creds,
                         const std::string& amz_datetime) {
  in.headers.emplace_back("x-amz-date", amz_datetime);
  in.headers.emplace_back("x-amz-content-sha256", in.payload_sha256_hex);
  if (!creds.session_token.empty())
    in.headers.emplace_back("x-amz-security-token", creds.session_token);
}

}  // namespace mx::s3
