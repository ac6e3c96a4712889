#include "checkpoint/s3/credentials.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "checkpoint/s3/http.h"
#include "checkpoint/s3/uri.h"
#include "core/error.h"
#include "core/json_input.h"
#include "core/log.h"

namespace mx::s3 {

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

static std::optional<std::string> nonempty(const EnvLookup& env, const std::string& name) {
  auto v = env(name);
  if (!v || v->empty()) return std::nullopt;
  return v;
}

std::optional<Credentials> credentials_from_env(const EnvLookup& env) {
  auto id = nonempty(env, "AWS_ACCESS_KEY_ID");
  auto secret = nonempty(env, "AWS_SECRET_ACCESS_KEY");
  if (!id && !secret) return std::nullopt;
  MX_REQUIRE(id && secret, "AWS credentials in the environment are incomplete: ",
             id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID",
             " is not set while the other key variable is");
  Credentials c;
  c.access_key_id = *id;
  c.secret_access_key = *secret;
  c.session_token = nonempty(env, "AWS_SESSION_TOKEN").value_or("");
  return c;
}

std::time_t parse_iso8601_utc(const std::string& s) {
  std::tm tm{};
  int y, mo, d, h, mi;
  double sec;
  // The time comes from a credentials endpoint's answer: one that is unusable is the AWS
  // side's failure (exit 3), not the user's input, and the answer is never quoted.
  if (s.size() > 64 ||
      std::sscanf(s.c_str(), "%d-%d-%dT%d:%d:%lf", &y, &mo, &d, &h, &mi, &sec) != 6 ||
      y < 1970 || y > 9999 || mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 ||
      mi < 0 || mi > 59 || !(sec >= 0 && sec < 61))
    throw StorageError(str("the credentials' Expiration (", s.size(),
                           " characters, not shown) is not an ISO 8601 time"));
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = static_cast<int>(sec);
  std::time_t t = timegm(&tm);
  // A numeric offset (+01:00) instead of Z: convert to UTC.
  size_t tpos = s.find('T');
  size_t sign = s.find_first_of("+-", tpos);
  if (sign != std::string::npos) {
    int oh = 0, om = 0;
    const int got = std::sscanf(s.c_str() + sign + 1, "%d:%d", &oh, &om);
    // (+999999999:0 overflowed oh * 3600: real offsets are within a day)
    if (got >= 1 && (oh < 0 || oh > 23 || om < 0 || om > 59))
      throw StorageError(str("the credentials' Expiration (", s.size(),
                             " characters, not shown) has no valid UTC offset"));
    if (got >= 1) t -= (s[sign] == '+' ? 1 : -1) * (oh * 3600 + om * 60);
  }
  return t;
}

Credentials parse_credentials_json(const std::string& body, const std::string& what) {
  std::string why;
  const nlohmann::json j = parse_json_input(body, &why);
  if (j.is_discarded())  // the body may hold secrets: never quote it (nor its keys)
    throw StorageError(str(what, " returned a response that is not usable JSON (", body.size(),
                           " bytes)"));
  // The code is shown only when it looks like one (a word: "Failed", "AccessDenied"): the
  // body is the endpoint's and may hold anything, secrets included.
  if (j.contains("Code") && j["Code"].is_string() && j["Code"] != "Success") {
    const std::string code = j["Code"].get<std::string>();
    const bool word = !code.empty() && code.size() <= 40 &&
                      std::all_of(code.begin(), code.end(), [](char ch) {
                        return std::isalnum(static_cast<unsigned char>(ch)) != 0;
                      });
    throw StorageError(str(what, " returned Code=", word ? code : "(not shown: not a plain word)"));
  }
  auto field = [&](const char* name) -> std::string {
    if (!j.contains(name) || !j[name].is_string()) return "";
    return j[name].get<std::string>();
  };
  Credentials c;
  c.access_key_id = field("AccessKeyId");
  c.secret_access_key = field("SecretAccessKey");
  c.session_token = field("Token");
  if (c.access_key_id.empty() || c.secret_access_key.empty())
    throw StorageError(str(what, " returned no AccessKeyId/SecretAccessKey"));
  std::string exp = field("Expiration");
  if (!exp.empty()) {
    try {
      c.expiration = parse_iso8601_utc(exp);
    } catch (const StorageError& e) {
      throw StorageError(str(what, " returned an unusable answer: ", e.what()));
    }
  }
  return c;
}

static bool is_loopback_or_container_host(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "[::1]" ||
         host == "169.254.170.2" || host == "169.254.170.23" || host == "[fd00:ec2::23]";
}

static HttpResponse metadata_request(const CredentialSources& src, HttpRequest req) {
  req.timeouts.connect_ms = src.metadata_timeout_ms;
  req.timeouts.total_ms = src.metadata_timeout_ms * 2;
  HttpResponse r;
  for (int i = 0; i < std::max(1, src.metadata_attempts); ++i) {
    r = http_perform(req);
    if (r.transport_ok() && r.status < 500) return r;
  }
  return r;
}

static std::string describe_failure(const HttpResponse& r) {
  if (!r.transport_ok()) return r.curl_error;
  return str("HTTP ", r.status);
}

static Credentials from_container(const CredentialSources& src) {
  std::string url;
  if (auto rel = nonempty(src.env, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")) {
    url = src.container_host + (rel->front() == '/' ? "" : "/") + *rel;
  } else {
    url = *nonempty(src.env, "AWS_CONTAINER_CREDENTIALS_FULL_URI");
    Endpoint e = parse_endpoint(url.substr(0, url.find('/', url.find("://") + 3)),
                                "AWS_CONTAINER_CREDENTIALS_FULL_URI");
    MX_REQUIRE(e.scheme == "https" || is_loopback_or_container_host(e.host),
               "AWS_CONTAINER_CREDENTIALS_FULL_URI must use https or a loopback/container host, "
               "not ", e.host);
  }
  HttpRequest req;
  req.method = "GET";
  req.url = url;
  std::string token;
  if (auto t = nonempty(src.env, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")) {
    std::ifstream f(*t);
    MX_REQUIRE(f.good(), "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE '", *t, "' cannot be read");
    std::stringstream ss;
    ss << f.rdbuf();
    token = ss.str();
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  } else if (auto t2 = nonempty(src.env, "AWS_CONTAINER_AUTHORIZATION_TOKEN")) {
    token = *t2;
  }
  if (!token.empty()) req.headers.emplace_back("Authorization", token);
  HttpResponse r = metadata_request(src, req);
  if (!r.transport_ok() || r.status != 200)
    throw StorageError(str("container credentials endpoint failed: ", describe_failure(r)));
  return parse_credentials_json(r.body, "the container credentials endpoint");
}

// IAM role names: 1 to 64 of letters, digits and + = , . @ _ - (and the path's / never
// appears in the listing). Anything else in the role listing is not a role name: it is never
// echoed (an endpoint answering its credentials document there had it quoted in the error).
static bool plausible_role_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) &&
        std::string("+=,.@_-").find(ch) == std::string::npos)
      return false;
  return true;
}

static std::string trim(std::string s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// nullopt when IMDS does not answer at all (not on EC2): the chain then reports "no credentials".
static std::optional<Credentials> from_imds(const CredentialSources& src) {
  std::string base = nonempty(src.env, "AWS_EC2_METADATA_SERVICE_ENDPOINT").value_or(src.imds_endpoint);
  while (!base.empty() && base.back() == '/') base.pop_back();
  HttpRequest put;
  put.method = "PUT";
  put.url = base + "/latest/api/token";
  put.headers.emplace_back("X-aws-ec2-metadata-token-ttl-seconds", "21600");
  HttpResponse tok = metadata_request(src, put);
  if (!tok.transport_ok()) return std::nullopt;
  if (tok.status != 200)
    throw StorageError(str("EC2 instance metadata (IMDSv2) token request failed: HTTP ", tok.status));
  std::string token = trim(tok.body);

  HttpRequest get;
  get.method = "GET";
  get.url = base + "/latest/meta-data/iam/security-credentials/";
  get.headers.emplace_back("X-aws-ec2-metadata-token", token);
  HttpResponse role = metadata_request(src, get);
  if (!role.transport_ok() || role.status == 404) return std::nullopt;  // no instance profile
  if (role.status != 200)
    throw StorageError(str("EC2 instance metadata role lookup failed: ", describe_failure(role)));
  std::string name = trim(role.body.substr(0, role.body.find('\n')));
  if (name.empty()) return std::nullopt;
  if (!plausible_role_name(name))
    throw StorageError(str("EC2 instance metadata role lookup failed: the answer (",
                           role.body.size(), " bytes, not shown) is not an IAM role name"));

  get.url = base + "/latest/meta-data/iam/security-credentials/" + uri_encode(name, false);
  HttpResponse cr = metadata_request(src, get);
  if (!cr.transport_ok() || cr.status != 200)
    throw StorageError(str("EC2 instance metadata credentials for role '", name,
                           "' failed: ", describe_failure(cr)));
  return parse_credentials_json(cr.body, "EC2 instance metadata");
}

DefaultCredentialsChain::DefaultCredentialsChain(CredentialSources sources)
    : src_(std::move(sources)) {}

Credentials DefaultCredentialsChain::fetch(std::string& source) {
  if (auto c = credentials_from_env(src_.env)) {
    source = "environment";
    return *c;
  }
  if (nonempty(src_.env, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") ||
      nonempty(src_.env, "AWS_CONTAINER_CREDENTIALS_FULL_URI")) {
    source = "container";
    return from_container(src_);
  }
  std::string disabled = src_.env("AWS_EC2_METADATA_DISABLED").value_or("");
  for (char& ch : disabled) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (disabled != "true") {
    if (auto c = from_imds(src_)) {
      source = "imds";
      return *c;
    }
  }
  throw UserError(
      "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
      "AWS_SESSION_TOKEN for temporary keys), or run where a container credentials endpoint "
      "or EC2 instance metadata provides them");
}

Credentials DefaultCredentialsChain::get() {
  std::lock_guard<std::mutex> lock(mu_);
  std::time_t now = src_.now();
  if (cached_ && (cached_->expiration == 0 ||
                  static_cast<double>(cached_->expiration - now) > src_.refresh_before_s))
    return *cached_;
  try {
    std::string source;
    Credentials c = fetch(source);
    if (cached_ && source_ != source) info("S3 credentials now from ", source);
    cached_ = c;
    source_ = source;
  } catch (const std::exception& e) {
    // Keep using credentials that have not expired yet; the next call tries again.
    if (cached_ && cached_->expiration > now) {
      warn(str("refreshing S3 credentials failed (", e.what(), "); using the current ones until ",
               "they expire"));
      return *cached_;
    }
    throw;
  }
  return *cached_;
}

void DefaultCredentialsChain::invalidate() {
  std::lock_guard<std::mutex> lock(mu_);
  cached_.reset();
}

std::string DefaultCredentialsChain::source() const {
  std::lock_guard<std::mutex> lock(mu_);
  return source_;
}

}  // namespace mx::s3
