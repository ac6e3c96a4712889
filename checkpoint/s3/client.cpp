#include "checkpoint/s3/client.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_set>

#include "checkpoint/s3/crypto.h"
#include "checkpoint/s3/sigv4.h"
#include "checkpoint/s3/xml.h"
#include "core/error.h"
#include "core/log.h"

namespace mx::s3 {

struct S3Client::Request {
  Request(std::string op_, std::string method_, std::string bucket_, std::string key_,
          bool object_level_ = true)
      : op(std::move(op_)), method(std::move(method_)), bucket(std::move(bucket_)),
        key(std::move(key_)), object_level(object_level_) {}
  std::string op;  // the S3 API name, for messages: "PutObject"
  std::string method;
  std::string bucket;
  std::string key;
  bool object_level = true;  // the path names the key (false: bucket-level request)
  std::string listed_prefix;  // a listing's prefix, for messages (its key is empty)
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::pair<std::string, std::string>> headers;
  const uint8_t* body = nullptr;
  size_t body_size = 0;
  std::function<bool(const char*, size_t)> sink;
  std::function<void()> before_attempt;  // resets a sink's state
  bool allow_404 = false;
};

struct S3Client::Response {
  long status = 0;
  std::map<std::string, std::string> headers;
  std::string body;
  std::string header(const std::string& n) const {
    auto it = headers.find(n);
    return it == headers.end() ? std::string() : it->second;
  }
};

// ------------------------------------------------------------------ helpers

std::string redact(std::string text, const Credentials& c) {
  for (const std::string* s : {&c.secret_access_key, &c.session_token, &c.access_key_id}) {
    if (s->size() < 4) continue;
    size_t pos = 0;
    while ((pos = text.find(*s, pos)) != std::string::npos) {
      text.replace(pos, s->size(), "***");
      pos += 3;
    }
  }
  return text;
}

std::string multipart_etag(const std::vector<std::string>& part_md5_raw) {
  std::string all;
  for (const auto& m : part_md5_raw) all += m;
  return to_hex(md5(all.data(), all.size())) + "-" + std::to_string(part_md5_raw.size());
}

static std::string unquote(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

// The ETag is the MD5 of the bytes unless the object is encrypted with KMS or a customer key.
static bool etag_is_md5(const std::map<std::string, std::string>& h) {
  auto it = h.find("x-amz-server-side-encryption");
  if (it != h.end() && it->second.rfind("aws:kms", 0) == 0) return false;
  return h.find("x-amz-server-side-encryption-customer-algorithm") == h.end();
}

static std::mt19937_64& rng() {
  thread_local std::mt19937_64 g{std::random_device{}()};
  return g;
}

static const char* status_text(long status) {
  switch (status) {
    case 400: return "BadRequest";
    case 403: return "Forbidden";
    case 404: return "NotFound";
    case 405: return "MethodNotAllowed";
    case 409: return "Conflict";
    case 412: return "PreconditionFailed";
    case 416: return "InvalidRange";
    case 429: return "TooManyRequests";
    case 500: return "InternalError";
    case 503: return "ServiceUnavailable";
    default: return "";
  }
}

// Refusals that only a change of configuration (credentials, bucket, region) can fix.
static bool is_configuration_error(long status, const std::string& code) {
  return status == 403 || status == 301 || code == "NoSuchBucket" ||
         code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" ||
         code == "AccessDenied" || code == "InvalidToken" || code == "ExpiredToken" ||
         code == "AuthorizationHeaderMalformed" || code == "PermanentRedirect" ||
         code == "InvalidBucketName" || code == "AllAccessDisabled";
}

// ------------------------------------------------------------------ config

S3Config S3Config::from_env(const EnvLookup& env) {
  S3Config c;
  auto get = [&](const char* n) -> std::string { return env(n).value_or(""); };
  if (!get("AWS_REGION").empty()) c.region = get("AWS_REGION");
  else if (!get("AWS_DEFAULT_REGION").empty()) c.region = get("AWS_DEFAULT_REGION");
  if (!get("AWS_ENDPOINT_URL_S3").empty()) c.endpoint_url = get("AWS_ENDPOINT_URL_S3");
  else if (!get("AWS_ENDPOINT_URL").empty()) c.endpoint_url = get("AWS_ENDPOINT_URL");
  std::string a = get("MXTRAIN_S3_ADDRESSING");
  if (a.empty() || a == "auto") c.addressing = Addressing::kAuto;
  else if (a == "path") c.addressing = Addressing::kPath;
  else if (a == "virtual") c.addressing = Addressing::kVirtualHost;
  else throw UserError(str("MXTRAIN_S3_ADDRESSING='", a, "' must be auto, path or virtual"));
  return c;
}

S3Client::S3Client(S3Config config, std::shared_ptr<CredentialsProvider> credentials)
    : cfg_(std::move(config)), creds_(std::move(credentials)) {
  MX_REQUIRE(!cfg_.region.empty(), "the S3 region is empty: set AWS_REGION");
  for (char c : cfg_.region)
    MX_REQUIRE(std::isalnum(static_cast<unsigned char>(c)) || c == '-', "S3 region '",
               cfg_.region, "' is not a region name like us-east-1");
  MX_REQUIRE(cfg_.part_size >= kMinPartSize, "S3 part size ", cfg_.part_size,
             " is below S3's minimum of 5 MiB (", kMinPartSize, " bytes)");
  MX_REQUIRE(cfg_.part_size <= (5ull << 30), "S3 part size ", cfg_.part_size,
             " is above S3's maximum of 5 GiB");
  MX_REQUIRE(cfg_.download_chunk >= 1, "S3 download chunk must be positive");
  MX_REQUIRE(cfg_.parallelism >= 1 && cfg_.parallelism <= 256, "S3 parallelism ",
             cfg_.parallelism, " must be 1 to 256");
  MX_REQUIRE(cfg_.retry.max_attempts >= 1, "S3 max attempts must be at least 1");
  custom_endpoint_ = !cfg_.endpoint_url.empty();
  endpoint_ = custom_endpoint_
                  ? parse_endpoint(cfg_.endpoint_url, "the S3 endpoint URL")
                  : parse_endpoint("https://s3." + cfg_.region + ".amazonaws.com", "the S3 endpoint");
  MX_REQUIRE(creds_ != nullptr, "S3 client needs a credentials provider");
}

S3Client S3Client::from_env() {
  return S3Client(S3Config::from_env(), std::make_shared<DefaultCredentialsChain>());
}

bool S3Client::path_style(const std::string& bucket) const {
  switch (cfg_.addressing) {
    case Addressing::kPath: return true;
    case Addressing::kVirtualHost: return false;
    default:  // a dotted bucket breaks the *.s3 TLS certificate as a host name
      return custom_endpoint_ || bucket.find('.') != std::string::npos;
  }
}

std::string S3Client::host_for(const std::string& bucket) const {
  return path_style(bucket) ? endpoint_.authority() : bucket + "." + endpoint_.authority();
}

std::string S3Client::path_for(const std::string& bucket, const std::string& key) const {
  std::string p = path_style(bucket) ? "/" + bucket : "";
  if (!key.empty()) return p + "/" + uri_encode(key, true);
  return p.empty() ? "/" : p;
}

std::string S3Client::object_url(const std::string& bucket, const std::string& key) const {
  return endpoint_.scheme + "://" + host_for(bucket) + path_for(bucket, key);
}

// "s3://bucket/key", or for a listing "s3://bucket/prefix" (an error naming only the bucket
// did not say which of its prefixes failed).
static std::string request_target(const S3Client::Request& req) {
  const std::string& path = req.key.empty() ? req.listed_prefix : req.key;
  return "s3://" + req.bucket + (path.empty() ? "" : "/" + path);
}

std::string S3Client::fail_message(const Request& req, const std::string& what) const {
  return "S3 " + req.op + " " + request_target(req) + " failed: " + what;
}

// A 200 whose body must be one complete `root` document: an answer cut short (a listing ended
// after some </Contents>, with a Content-Length to match) read as a shorter one made a run
// take a committed step for uncommitted and delete its files; a portal's page read as an empty
// listing made resume = auto start afresh. `root` empty: any complete document (S3-compatible
// servers name some answers otherwise: moto's CompleteMultipartUploadResponse).
static void require_document(const std::string& body, const std::string& root,
                             const std::function<std::string(const std::string&)>& fail) {
  const auto got = xml_root_name(body);
  if (got && (root.empty() || *got == root)) return;
  throw StorageError(fail(str(
      "the answer is not a complete ", root.empty() ? "XML" : root, " document (",
      got ? "a " + got->substr(0, 40) + " document"
          : body.find("<" + root) != std::string::npos ? "cut short or malformed"
                                                      : "not XML of that kind",
      ": ", body.size(), " bytes; a proxy or a portal answering for S3? check AWS_ENDPOINT_URL)")));
}

// ------------------------------------------------------------------ the request loop

S3Client::Response S3Client::execute(const Request& req) {
  validate_bucket_name(req.bucket);
  MX_REQUIRE(!req.object_level || !req.key.empty(), "S3 ", req.op, " s3://", req.bucket,
             ": the object key is empty");
  MX_REQUIRE(req.key.size() <= 1024, "S3 key is longer than S3's 1024 bytes: ",
             req.key.substr(0, 64), "...");
  const std::string host = host_for(req.bucket);
  const std::string path = path_for(req.bucket, req.object_level ? req.key : "");
  const std::string query = canonical_query(req.query);
  const std::string url = endpoint_.scheme + "://" + host + path + (query.empty() ? "" : "?" + query);
  const std::string payload_hash =
      req.body_size == 0 ? kEmptyPayloadSha256
      : cfg_.sign_payload ? to_hex(sha256(req.body, req.body_size))
                          : kUnsignedPayload;

  Credentials creds;
  std::string last_problem;
  const int max_attempts = cfg_.retry.max_attempts;
  for (int attempt = 1;; ++attempt) {
    creds = creds_->get();
    SigningInput in;
    in.method = req.method;
    in.encoded_path = path;
    in.query = req.query;
    in.headers = req.headers;
    in.headers.emplace_back("host", host);
    in.payload_sha256_hex = payload_hash;
    const std::string date = amz_date(std::time(nullptr));  // re-signed on every attempt
    add_signing_headers(in, creds, date);
    const Signature sig = sign_v4(in, creds, cfg_.region, "s3", date);

    HttpRequest http;
    http.method = req.method;
    http.url = url;
    http.headers = in.headers;
    http.headers.emplace_back("Authorization", sig.authorization);
    http.body = req.body;
    http.body_size = req.body_size;
    http.sink = req.sink;
    http.timeouts = cfg_.timeouts;
    if (req.before_attempt) req.before_attempt();
    HttpResponse r = http_perform(http);

    bool retryable = false;
    std::string problem;
    bool config_error = false;
    if (!r.transport_ok()) {
      if (r.sink_aborted)
        throw StorageError(redact(fail_message(req, "the response body was longer than requested"), creds));
      if (r.body_too_long)
        throw StorageError(redact(fail_message(req, str("the answer's body is longer than the ",
                                                        http.max_buffered_body, " bytes such an "
                                                        "answer can be")), creds));
      problem = "connection error: " + r.curl_error;
      retryable = is_retryable_transport_error(r.curl_code);
    } else {
      std::optional<S3ErrorBody> err;
      bool ok = r.status >= 200 && r.status < 300;
      // CompleteMultipartUpload can answer 200 and then report an error in the body.
      if (ok && req.op == "CompleteMultipartUpload") err = parse_s3_error(r.body);
      if (ok && !err) return Response{r.status, std::move(r.headers), std::move(r.body)};
      if (r.status == 404 && req.allow_404)
        return Response{r.status, std::move(r.headers), std::move(r.body)};
      if (!err) err = parse_s3_error(r.body);
      std::string code = err ? err->code : status_text(r.status);
      problem = "HTTP " + std::to_string(r.status) + (code.empty() ? "" : " " + code);
      if (err && !err->message.empty()) problem += ": " + err->message;
      if (code == "PermanentRedirect" || code == "AuthorizationHeaderMalformed" || r.status == 301) {
        std::string region = r.header("x-amz-bucket-region");
        if (region.empty() && err) region = xml_first(r.body, "Region").value_or("");
        if (!region.empty()) problem += " (the bucket is in " + region + "; set AWS_REGION=" + region + ")";
      }
      if (err && !err->request_id.empty()) problem += " (request id " + err->request_id + ")";
      if (code == "ExpiredToken" || code == "TokenRefreshRequired") creds_->invalidate();
      retryable = is_retryable_status(r.status) || is_retryable_s3_code(code);
      config_error = is_configuration_error(r.status, code);
    }
    if (retryable && attempt < max_attempts) {
      double delay = backoff_delay_s(cfg_.retry, attempt, rng());
      warn(redact(str("S3 ", req.op, " ", request_target(req), ": ", problem, "; retry ", attempt,
                      "/", max_attempts - 1, " in ", static_cast<int>(delay * 1000), " ms"),
                  creds));
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      continue;
    }
    std::string msg = fail_message(req, problem);
    if (retryable && attempt > 1) msg += str(" (after ", attempt, " attempts)");
    msg = redact(msg, creds);
    if (config_error) throw UserError(msg + " [check the AWS credentials, bucket and region]");
    throw StorageError(msg);
  }
}

// ------------------------------------------------------------------ single requests

void S3Client::create_bucket(const std::string& bucket) {
  Request req("CreateBucket", "PUT", bucket, "", false);
  std::string body;
  if (cfg_.region != "us-east-1") {
    body = "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
           "<LocationConstraint>" + cfg_.region + "</LocationConstraint></CreateBucketConfiguration>";
    req.body = reinterpret_cast<const uint8_t*>(body.data());
    req.body_size = body.size();
  }
  try {
    execute(req);
  } catch (const StorageError& e) {
    if (std::string(e.what()).find("BucketAlreadyOwnedByYou") == std::string::npos) throw;
  }
}

std::string S3Client::put_object(const std::string& bucket, const std::string& key,
                                 const void* data, size_t size) {
  std::string md5_raw = md5(data, size);
  Request req("PutObject", "PUT", bucket, key);
  req.headers.emplace_back("content-md5", base64(md5_raw));
  req.body = static_cast<const uint8_t*>(data);
  req.body_size = size;
  Response r = execute(req);
  std::string etag = unquote(r.header("etag"));
  // S3 answers every stored PUT with the object's ETag: a 200 without one is not S3's answer
  // (a proxy's), and nothing may have been stored (a manifest "committed" that was not there).
  if (etag.empty())
    throw StorageError(fail_message(req, "the answer carries no ETag: the object may not have "
                                         "been stored (a proxy answering for S3?)"));
  if (etag_is_md5(r.headers) && etag != to_hex(md5_raw))
    throw StorageError(fail_message(req, "the returned ETag " + etag +
                                             " is not the MD5 of the bytes sent " + to_hex(md5_raw)));
  return etag;
}

namespace {
// A decimal size from an S3 answer (Content-Length, a listing's <Size>): anything else is the
// server's failure (exit 3), not an internal error (std::stoull threw out of the client).
uint64_t answer_size(const std::string& text, const std::string& context) {
  uint64_t v = 0;
  bool ok = !text.empty() && text.size() <= 20;
  for (const char c : text) {
    ok = ok && c >= '0' && c <= '9' && !__builtin_mul_overflow(v, uint64_t(10), &v) &&
         !__builtin_add_overflow(v, uint64_t(c - '0'), &v);
    if (!ok) break;
  }
  if (!ok)
    throw StorageError(str(context, ": the answer gives the size '",
                           text.substr(0, 40), "', not a number of bytes"));
  return v;
}
}  // namespace

std::string S3Client::get_object(const std::string& bucket, const std::string& key,
                                 uint64_t max_bytes, const std::string& if_match_etag) {
  Request req("GetObject", "GET", bucket, key);
  if (!if_match_etag.empty()) req.headers.emplace_back("if-match", "\"" + if_match_etag + "\"");
  // The body is taken up to max_bytes and no further: a server (or an object replaced since
  // its HEAD) answering 300 MB for a manifest was buffered whole.
  std::string body;
  req.before_attempt = [&] { body.clear(); };
  req.sink = [&](const char* d, size_t n) {
    if (n > max_bytes || body.size() > max_bytes - n) return false;
    body.append(d, n);
    return true;
  };
  Response r;
  try {
    r = execute(req);
  } catch (const StorageError& e) {
    const std::string what = e.what();
    if (!if_match_etag.empty() && what.find("PreconditionFailed") != std::string::npos)
      throw StorageError(fail_message(req, "the object changed since it was looked at (its ETag is "
                                           "no longer " + if_match_etag + ")"));
    if (what.find("longer than requested") != std::string::npos)
      throw StorageError(fail_message(req, str("the answer is longer than the ", max_bytes,
                                               " bytes expected")));
    throw;
  }
  r.body = std::move(body);
  std::string len = r.header("content-length");
  if (!len.empty() && answer_size(len, fail_message(req, "Content-Length")) != r.body.size())
    throw StorageError(fail_message(req, str("got ", r.body.size(), " bytes of ", len)));
  std::string etag = unquote(r.header("etag"));
  // Every object S3 returns carries its ETag: a 200 without one (a proxy's or portal's page)
  // is not the object, and read as one made a good checkpoint's manifest "not valid JSON".
  if (etag.empty())
    throw StorageError(fail_message(req, "the answer carries no ETag: not the object (a proxy "
                                         "answering for S3?)"));
  if (etag.size() == 32 && etag.find('-') == std::string::npos && etag_is_md5(r.headers) &&
      etag != to_hex(md5(r.body.data(), r.body.size())))
    throw StorageError(fail_message(req, "the bytes received do not match the object's ETag " + etag));
  return std::move(r.body);
}

void S3Client::get_range(const std::string& bucket, const std::string& key, uint64_t offset,
                         uint64_t length, void* dst, const std::string& if_match_etag) {
  if (length == 0) return;
  Request req("GetObject", "GET", bucket, key);
  req.headers.emplace_back("range", str("bytes=", offset, "-", offset + length - 1));
  if (!if_match_etag.empty()) req.headers.emplace_back("if-match", "\"" + if_match_etag + "\"");
  uint64_t pos = 0;
  auto* out = static_cast<uint8_t*>(dst);
  req.before_attempt = [&] { pos = 0; };
  req.sink = [&](const char* d, size_t n) {
    if (pos + n > length) return false;
    std::memcpy(out + pos, d, n);
    pos += n;
    return true;
  };
  Response r;
  try {
    r = execute(req);
  } catch (const StorageError& e) {
    if (std::string(e.what()).find("PreconditionFailed") != std::string::npos)
      throw StorageError(fail_message(req, "the object changed while it was being read (ETag is no "
                                           "longer " + if_match_etag + ")"));
    throw;
  }
  // The bytes must be the range asked for: an answer of the right length from elsewhere in the
  // object (a proxy's or cache's mistake) was taken, and export-hf wrote wrong weights, exit 0.
  const std::string want = str("bytes ", offset, "-", offset + length - 1, "/");
  const std::string got_range = r.header("content-range");
  // (A 200 with no Content-Range is the whole object; from offset 0 and exactly `length` bytes
  // long, as the count below requires, that is the range asked for.)
  const bool whole_object = r.status == 200 && got_range.empty() && offset == 0;
  if (!whole_object && got_range.compare(0, want.size(), want) != 0)
    throw StorageError(fail_message(req, str("asked for bytes ", offset, "-", offset + length - 1,
                                             ", the answer's Content-Range is '",
                                             got_range.substr(0, 80), "'")));
  if (pos != length)
    throw StorageError(fail_message(req, str("bytes ", offset, "-", offset + length - 1, ": got ",
                                             pos, " of ", length, " bytes (object too short?)")));
}

std::string S3Client::get_range(const std::string& bucket, const std::string& key,
                                uint64_t offset, uint64_t length) {
  std::string out(length, '\0');
  get_range(bucket, key, offset, length, out.data());
  return out;
}

std::optional<ObjectInfo> S3Client::head_object(const std::string& bucket, const std::string& key) {
  Request req("HeadObject", "HEAD", bucket, key);
  req.allow_404 = true;
  Response r = execute(req);
  if (r.status == 404) return std::nullopt;
  ObjectInfo info;
  info.key = key;
  // S3 answers every HEAD of an object with its size and ETag: an answer without them (a
  // proxy's) read as size 0 and ETag "" failed a good checkpoint's checks, and resume = auto
  // skipped it and uncommitted it. A storage failure, not a verdict on the object.
  const std::string len = r.header("content-length");
  if (len.empty())
    throw StorageError(fail_message(req, "the answer carries no Content-Length (a proxy "
                                         "answering for S3?)"));
  info.size = answer_size(len, fail_message(req, "Content-Length"));
  info.etag = unquote(r.header("etag"));
  if (info.etag.empty())
    throw StorageError(fail_message(req, "the answer carries no ETag (a proxy answering for S3?)"));
  info.last_modified = r.header("last-modified");
  info.etag_is_md5 = etag_is_md5(r.headers);
  return info;
}

void S3Client::delete_object(const std::string& bucket, const std::string& key) {
  Request req("DeleteObject", "DELETE", bucket, key);
  req.allow_404 = true;
  execute(req);
}

ListPage S3Client::list_objects_v2(const std::string& bucket, const std::string& prefix,
                                   const std::string& continuation_token, int max_keys,
                                   const std::string& delimiter) {
  MX_REQUIRE(max_keys >= 1 && max_keys <= 1000, "S3 max-keys ", max_keys, " must be 1 to 1000");
  Request req("ListObjectsV2", "GET", bucket, "", false);
  req.listed_prefix = prefix;
  req.query = {{"list-type", "2"}, {"max-keys", std::to_string(max_keys)}};
  if (!prefix.empty()) req.query.emplace_back("prefix", prefix);
  if (!continuation_token.empty()) req.query.emplace_back("continuation-token", continuation_token);
  if (!delimiter.empty()) req.query.emplace_back("delimiter", delimiter);
  Response r = execute(req);
  auto fail = [&](const std::string& what) { return fail_message(req, what); };
  // A 200 that is not a complete listing (a captive portal's page, a misrouted proxy, an
  // answer cut short) is a storage failure: read as an empty or shorter listing, it made
  // resume = auto start afresh, and a run's start-up delete a committed step's files.
  require_document(r.body, "ListBucketResult", fail);
  ListPage page;
  for (const std::string& c : xml_all_raw(r.body, "Contents")) {
    ObjectInfo o;
    o.key = xml_first(c, "Key").value_or("");
    const auto size = xml_first(c, "Size");
    if (o.key.empty() || !size)
      throw StorageError(fail("a <Contents> without its Key or Size"));
    o.size = answer_size(*size, fail_message(req, "<Size> of " + o.key));
    o.etag = unquote(xml_first(c, "ETag").value_or(""));
    o.last_modified = xml_first(c, "LastModified").value_or("");
    page.objects.push_back(std::move(o));
  }
  for (const std::string& p : xml_all_raw(r.body, "CommonPrefixes"))
    page.common_prefixes.push_back(xml_first(p, "Prefix").value_or(""));
  const std::string truncated = xml_first(r.body, "IsTruncated").value_or("");
  if (truncated != "true" && truncated != "false")
    throw StorageError(fail("the listing says neither that it is complete nor that it is "
                            "truncated (no <IsTruncated>true or false)"));
  if (truncated == "true") {
    page.next_continuation_token = xml_first(r.body, "NextContinuationToken").value_or("");
    if (page.next_continuation_token.empty())
      throw StorageError(fail_message(req, "a truncated listing came without a continuation token"));
  }
  return page;
}

std::vector<ObjectInfo> S3Client::list_all(const std::string& bucket, const std::string& prefix) {
  std::vector<ObjectInfo> all;
  std::string token;
  std::set<std::string> seen;  // a token given twice would list the same pages forever
  auto fail = [&](const std::string& what) {
    return StorageError(str("S3 ListObjectsV2 s3://", bucket, prefix.empty() ? "" : "/", prefix,
                            " failed: ", what, " (the listing would never end)"));
  };
  // Every page must list keys no earlier page listed (S3 lists each key once, in ascending
  // order; directory buckets in no order, so the order is not relied on): a server answering
  // the same keys with ever new tokens was listed forever (678 requests in 30 s, memory
  // growing). Pages of no keys and the number of pages are bounded too.
  std::unordered_set<std::string> keys;
  int empty_pages = 0;
  for (int pages = 1;; ++pages) {
    ListPage p = list_objects_v2(bucket, prefix, token);
    for (auto& o : p.objects) {
      if (!keys.insert(o.key).second)
        throw fail(str("page ", pages, " lists ", shortened(o.key, 200),
                       " again: the keys do not advance"));
      all.push_back(std::move(o));
    }
    token = p.next_continuation_token;
    if (token.empty()) return all;
    empty_pages = p.objects.empty() ? empty_pages + 1 : 0;
    if (empty_pages >= kMaxEmptyListPages)
      throw fail(str(empty_pages, " truncated pages in a row listed no key"));
    if (pages >= kMaxListPages)
      throw fail(str("more than ", kMaxListPages, " pages"));
    if (!seen.insert(token).second)
      throw fail("a truncated listing gave a continuation token it had given before");
  }
}

// ------------------------------------------------------------------ multipart

std::string S3Client::create_multipart_upload(const std::string& bucket, const std::string& key) {
  Request req("CreateMultipartUpload", "POST", bucket, key);
  req.query = {{"uploads", ""}};
  Response r = execute(req);
  require_document(r.body, "", [&](const std::string& what) { return fail_message(req, what); });
  std::string id = xml_first(r.body, "UploadId").value_or("");
  if (id.empty()) throw StorageError(fail_message(req, "the response has no UploadId"));
  return id;
}

std::string S3Client::upload_part(const std::string& bucket, const std::string& key,
                                  const std::string& upload_id, int part_number, const void* data,
                                  size_t size) {
  MX_ASSERT(part_number >= 1 && part_number <= kMaxParts);
  std::string md5_raw = md5(data, size);
  Request req(str("UploadPart ", part_number), "PUT", bucket, key);
  req.query = {{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}};
  req.headers.emplace_back("content-md5", base64(md5_raw));
  req.body = static_cast<const uint8_t*>(data);
  req.body_size = size;
  Response r = execute(req);
  std::string etag = unquote(r.header("etag"));
  if (etag.empty()) throw StorageError(fail_message(req, "the response has no ETag"));
  if (etag_is_md5(r.headers) && etag != to_hex(md5_raw))
    throw StorageError(fail_message(req, "the part's ETag " + etag + " is not the MD5 of the bytes sent"));
  return etag;
}

std::string S3Client::complete_multipart_upload(const std::string& bucket, const std::string& key,
                                                const std::string& upload_id,
                                                const std::vector<CompletedPart>& parts) {
  std::string body = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  for (const auto& p : parts)
    body += str("<Part><PartNumber>", p.part_number, "</PartNumber><ETag>&quot;",
                xml_escape(p.etag), "&quot;</ETag></Part>");
  body += "</CompleteMultipartUpload>";
  Request req("CompleteMultipartUpload", "POST", bucket, key);
  req.query = {{"uploadId", upload_id}};
  req.headers.emplace_back("content-type", "application/xml");
  req.body = reinterpret_cast<const uint8_t*>(body.data());
  req.body_size = body.size();
  Response r = execute(req);
  // (an <Error> in a 200 is handled by execute; the completed object's size and ETag are
  // checked by a HEAD after this)
  require_document(r.body, "", [&](const std::string& what) { return fail_message(req, what); });
  return unquote(xml_first(r.body, "ETag").value_or(unquote(r.header("etag"))));
}

void S3Client::abort_multipart_upload(const std::string& bucket, const std::string& key,
                                      const std::string& upload_id) {
  Request req("AbortMultipartUpload", "DELETE", bucket, key);
  req.allow_404 = true;
  req.query = {{"uploadId", upload_id}};
  execute(req);
}

std::vector<OpenUpload> S3Client::list_multipart_uploads(const std::string& bucket,
                                                         const std::string& prefix) {
  std::vector<OpenUpload> all;
  std::string key_marker, id_marker;
  std::set<std::pair<std::string, std::string>> seen;  // markers given before: a loop
  for (int pages = 1;; ++pages) {
    Request req("ListMultipartUploads", "GET", bucket, "", false);
    req.listed_prefix = prefix;
    req.query = {{"uploads", ""}};
    if (!prefix.empty()) req.query.emplace_back("prefix", prefix);
    if (!key_marker.empty()) req.query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) req.query.emplace_back("upload-id-marker", id_marker);
    Response r = execute(req);
    require_document(r.body, "ListMultipartUploadsResult",
                     [&](const std::string& what) { return fail_message(req, what); });
    for (const std::string& u : xml_all_raw(r.body, "Upload")) {
      OpenUpload o{xml_first(u, "Key").value_or(""), xml_first(u, "UploadId").value_or("")};
      if (o.key.empty() || o.upload_id.empty())
        throw StorageError(fail_message(req, "an <Upload> without its Key or UploadId"));
      all.push_back(std::move(o));
    }
    const std::string truncated = xml_first(r.body, "IsTruncated").value_or("");
    if (truncated != "true" && truncated != "false")
      throw StorageError(fail_message(req, "the listing says neither that it is complete nor "
                                           "that it is truncated (no <IsTruncated>true or false)"));
    if (truncated == "false") return all;
    std::string next_key = xml_first(r.body, "NextKeyMarker").value_or("");
    std::string next_id = xml_first(r.body, "NextUploadIdMarker").value_or("");
    // A truncated page must move the markers on to ones not given before, or the listing
    // would never end.
    if (next_key.empty() || (next_key == key_marker && next_id == id_marker) ||
        !seen.emplace(next_key, next_id).second)
      throw StorageError(fail_message(req, "a truncated listing came without new markers"));
    if (pages >= kMaxListPages)
      throw StorageError(fail_message(req, str("more than ", kMaxListPages, " pages (the listing "
                                               "would never end)")));
    key_marker = std::move(next_key);
    id_marker = std::move(next_id);
  }
}

// Runs work(i) for i in [0, n) on up to `threads` threads; the first exception stops the
// others from taking new items and is rethrown.
static void parallel_for(int n, int threads, const std::function<void(int, std::vector<uint8_t>&)>& work) {
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first;
  std::mutex mu;
  auto worker = [&] {
    std::vector<uint8_t> scratch;
    while (!failed.load()) {
      int i = next.fetch_add(1);
      if (i >= n) break;
      try {
        work(i, scratch);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
        failed = true;
      }
    }
  };
  int t = std::max(1, std::min(threads, n));
  if (t == 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    for (int i = 0; i < t; ++i) pool.emplace_back(worker);
    for (auto& th : pool) th.join();
  }
  if (first) std::rethrow_exception(first);
}

std::string S3Client::upload_parts(const std::string& bucket, const std::string& key,
                                   uint64_t size, const PartSource& source) {
  uint64_t part = cfg_.part_size;
  if ((size + part - 1) / part > static_cast<uint64_t>(kMaxParts)) {
    part = (size + kMaxParts - 1) / kMaxParts;
    part = (part + (1 << 20) - 1) / (1 << 20) * (1 << 20);  // whole MiB
  }
  const int nparts = static_cast<int>(std::max<uint64_t>(1, (size + part - 1) / part));
  const std::string upload_id = create_multipart_upload(bucket, key);
  std::vector<std::string> etags(nparts), md5s(nparts);
  auto abort_quietly = [&] {
    try {
      abort_multipart_upload(bucket, key, upload_id);
    } catch (const std::exception& e) {
      warn(str("could not abort multipart upload of s3://", bucket, "/", key, ": ", e.what(),
               " (a bucket lifecycle rule for incomplete uploads cleans it up)"));
    }
  };
  std::string etag;
  try {
    parallel_for(nparts, cfg_.parallelism, [&](int i, std::vector<uint8_t>& scratch) {
      uint64_t off = static_cast<uint64_t>(i) * part;
      size_t len = static_cast<size_t>(std::min<uint64_t>(part, size - off));
      const uint8_t* p = source(off, len, scratch);
      md5s[i] = md5(p, len);
      etags[i] = upload_part(bucket, key, upload_id, i + 1, p, len);
    });
    std::vector<CompletedPart> parts;
    for (int i = 0; i < nparts; ++i) parts.push_back({i + 1, etags[i]});
    etag = complete_multipart_upload(bucket, key, upload_id, parts);
    // The checks of the completed object are inside: an answer to Complete that was not S3's
    // (a proxy's 200) left the upload open with its parts, one per whole-file attempt.
    std::string target = "s3://" + bucket + "/" + key;
    auto info = head_object(bucket, key);
    if (!info || info->size != size) {
      throw StorageError(str("S3 multipart upload ", target, " failed: the completed object has ",
                             info ? std::to_string(info->size) : std::string("no"),
                             " bytes, expected ", size));
    }
    std::string expected = multipart_etag(md5s);
    // (SSE-KMS / SSE-C: the ETag is not the MD5s' and is not compared, as for single PUTs)
    if (info->etag_is_md5 && !etag.empty() && etag.find('-') != std::string::npos &&
        etag != expected) {
      throw StorageError(str("S3 multipart upload ", target, " failed: its ETag ", etag,
                             " is not the one computed from the parts sent, ", expected));
    }
  } catch (...) {
    abort_quietly();
    throw;
  }
  return etag;
}

std::string S3Client::upload(const std::string& bucket, const std::string& key, const void* data,
                             uint64_t size) {
  if (size <= cfg_.multipart_threshold) return put_object(bucket, key, data, size);
  const auto* base = static_cast<const uint8_t*>(data);
  return upload_parts(bucket, key, size,
                      [base](uint64_t off, size_t, std::vector<uint8_t>&) { return base + off; });
}

namespace {
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void pread_all(int fd, uint8_t* dst, size_t len, uint64_t off, const std::string& path) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, dst + done, len - done, static_cast<off_t>(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw StorageError(str("reading ", path, ": ", n < 0 ? std::strerror(errno) : "file shrank"));
    done += static_cast<size_t>(n);
  }
}

void pwrite_all(int fd, const uint8_t* src, size_t len, uint64_t off, const std::string& path) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pwrite(fd, src + done, len - done, static_cast<off_t>(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw StorageError(str("writing ", path, ": ", std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
}
}  // namespace

std::string S3Client::upload_file(const std::string& bucket, const std::string& key,
                                  const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MX_REQUIRE(f.fd >= 0, "cannot open ", path, " for upload: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw StorageError(str("stat ", path, ": ", std::strerror(errno)));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size <= cfg_.multipart_threshold) {
    std::vector<uint8_t> all(size);
    pread_all(f.fd, all.data(), size, 0, path);
    return put_object(bucket, key, all.data(), size);
  }
  const int fd = f.fd;
  return upload_parts(bucket, key, size,
                      [fd, &path](uint64_t off, size_t len, std::vector<uint8_t>& scratch) {
                        scratch.resize(len);
                        pread_all(fd, scratch.data(), len, off, path);
                        return static_cast<const uint8_t*>(scratch.data());
                      });
}

// ------------------------------------------------------------------ downloads

uint64_t S3Client::download(const std::string& bucket, const std::string& key,
                            const std::function<void(const uint8_t*, size_t)>& sink) {
  auto info = head_object(bucket, key);
  if (!info) throw StorageError(str("S3 GetObject s3://", bucket, "/", key, " failed: no such object"));
  std::vector<uint8_t> buf;
  for (uint64_t off = 0; off < info->size; off += cfg_.download_chunk) {
    uint64_t len = std::min<uint64_t>(cfg_.download_chunk, info->size - off);
    buf.resize(len);
    get_range(bucket, key, off, len, buf.data(), info->etag);
    sink(buf.data(), len);
  }
  return info->size;
}

uint64_t S3Client::download_file(const std::string& bucket, const std::string& key,
                                 const std::string& path) {
  auto info = head_object(bucket, key);
  if (!info) throw StorageError(str("S3 GetObject s3://", bucket, "/", key, " failed: no such object"));
  const std::string partial = path + ".partial";
  Fd f;
  f.fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd < 0) throw StorageError(str("cannot create ", partial, ": ", std::strerror(errno)));
  const uint64_t size = info->size;
  const uint64_t chunk = cfg_.download_chunk;
  const int nchunks = static_cast<int>((size + chunk - 1) / chunk);
  try {
    if (::ftruncate(f.fd, static_cast<off_t>(size)) != 0)
      throw StorageError(str("cannot size ", partial, ": ", std::strerror(errno)));
    const int fd = f.fd;
    parallel_for(nchunks, cfg_.parallelism, [&](int i, std::vector<uint8_t>& buf) {
      uint64_t off = static_cast<uint64_t>(i) * chunk;
      uint64_t len = std::min<uint64_t>(chunk, size - off);
      buf.resize(len);
      get_range(bucket, key, off, len, buf.data(), info->etag);
      pwrite_all(fd, buf.data(), len, off, partial);
    });
    if (::fsync(f.fd) != 0) throw StorageError(str("fsync ", partial, ": ", std::strerror(errno)));
  } catch (...) {
    ::unlink(partial.c_str());
    throw;
  }
  ::close(f.fd);
  f.fd = -1;
  if (::rename(partial.c_str(), path.c_str()) != 0) {
    ::unlink(partial.c_str());
    throw StorageError(str("cannot rename ", partial, " to ", path, ": ", std::strerror(errno)));
  }
  return size;
}

}  // namespace mx::s3
