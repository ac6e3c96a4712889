// An S3 client for checkpoints: objects in and out, byte ranges, listings, and large objects
// as parallel multipart uploads and chunked downloads. Every request is signed (SigV4),
// retried with backoff and full jitter on 5xx/429/timeouts/connection failures, and checked
// for integrity (Content-MD5 + signed SHA-256 payloads on the way up, ETag and size at the end;
// Content-Length/Content-Range and ETag on the way down).
//
// Errors: UserError (exit 2) when the configuration is wrong: bad URI or bucket name, refused
// credentials (InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied), a bucket that does not
// exist or lives in another region. StorageError (exit 3) for everything else that fails,
// after the retries. Messages name the operation, bucket, key and S3's error code and message;
// they never contain credentials.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/s3/credentials.h"
#include "checkpoint/s3/http.h"
#include "checkpoint/s3/retry.h"
#include "checkpoint/s3/uri.h"

namespace mx::s3 {

enum class Addressing { kAuto, kPath, kVirtualHost };

struct S3Config {
  std::string region = "us-east-1";
  // Empty: AWS (https://s3.<region>.amazonaws.com). Set: that endpoint, path-style in kAuto.
  std::string endpoint_url;
  Addressing addressing = Addressing::kAuto;
  uint64_t part_size = 16ull << 20;            // multipart part size; >= 5 MiB
  uint64_t multipart_threshold = 16ull << 20;  // objects above this go up in parts
  uint64_t download_chunk = 16ull << 20;       // ranged GET size for chunked downloads
  int parallelism = 8;                         // threads for parts and chunks
  RetryPolicy retry;
  HttpTimeouts timeouts;
  bool sign_payload = true;  // false: UNSIGNED-PAYLOAD (integrity then rests on Content-MD5)

  // Region from AWS_REGION, then AWS_DEFAULT_REGION; endpoint from AWS_ENDPOINT_URL_S3, then
  // AWS_ENDPOINT_URL; MXTRAIN_S3_ADDRESSING = auto | path | virtual.
  static S3Config from_env(const EnvLookup& env = process_env());
};

inline constexpr uint64_t kMinPartSize = 5ull << 20;
// A listing longer than this many pages (of up to 1,000 keys) is refused as one that would
// never end; and so is one whose truncated pages list no key this many times in a row.
inline constexpr int kMaxListPages = 100000;
inline constexpr int kMaxEmptyListPages = 100;
inline constexpr int kMaxParts = 10000;

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // without quotes
  std::string last_modified;
  // HEAD only: false for SSE-KMS / SSE-C objects, whose ETag is not computed from MD5s.
  bool etag_is_md5 = true;
};

struct ListPage {
  std::vector<ObjectInfo> objects;
  std::vector<std::string> common_prefixes;  // with a delimiter
  std::string next_continuation_token;       // empty on the last page
};

struct OpenUpload {  // a multipart upload started and neither completed nor aborted
  std::string key;
  std::string upload_id;
};

struct CompletedPart {
  int part_number = 0;
  std::string etag;  // without quotes
};

// Part `index` of a multipart upload: returns a pointer to `len` bytes at `offset`, either into
// the caller's memory or into `scratch` (resized by the reader).
using PartSource =
    std::function<const uint8_t*(uint64_t offset, size_t len, std::vector<uint8_t>& scratch)>;

class S3Client {
 public:
  S3Client(S3Config config, std::shared_ptr<CredentialsProvider> credentials);
  // from_env config and the default credentials chain.
  static S3Client from_env();

  const S3Config& config() const { return cfg_; }

  // --- single requests
  void create_bucket(const std::string& bucket);  // tests and tooling; ok if it exists and is ours
  std::string put_object(const std::string& bucket, const std::string& key, const void* data,
                         size_t size);  // returns the ETag
  // The whole object, at most max_bytes of it (a longer answer is a StorageError, found before
  // more is buffered); if_match_etag pins it to that ETag (an object replaced since is an error).
  std::string get_object(const std::string& bucket, const std::string& key,
                         uint64_t max_bytes = UINT64_MAX, const std::string& if_match_etag = "");
  // Exactly `length` bytes from `offset` into `dst` (StorageError if the object is shorter).
  void get_range(const std::string& bucket, const std::string& key, uint64_t offset,
                 uint64_t length, void* dst, const std::string& if_match_etag = "");
  std::string get_range(const std::string& bucket, const std::string& key, uint64_t offset,
                        uint64_t length);
  // nullopt for a 404; an answer without Content-Length or ETag is a StorageError.
  std::optional<ObjectInfo> head_object(const std::string& bucket, const std::string& key);
  void delete_object(const std::string& bucket, const std::string& key);  // missing key: fine
  ListPage list_objects_v2(const std::string& bucket, const std::string& prefix,
                           const std::string& continuation_token = "", int max_keys = 1000,
                           const std::string& delimiter = "");
  std::vector<ObjectInfo> list_all(const std::string& bucket, const std::string& prefix);

  // --- multipart building blocks
  std::string create_multipart_upload(const std::string& bucket, const std::string& key);
  std::string upload_part(const std::string& bucket, const std::string& key,
                          const std::string& upload_id, int part_number, const void* data,
                          size_t size);  // returns the part's ETag (checked against its MD5)
  std::string complete_multipart_upload(const std::string& bucket, const std::string& key,
                                        const std::string& upload_id,
                                        const std::vector<CompletedPart>& parts);
  void abort_multipart_upload(const std::string& bucket, const std::string& key,
                              const std::string& upload_id);
  // Every open multipart upload whose key starts with `prefix` (ListMultipartUploads, all pages).
  std::vector<OpenUpload> list_multipart_uploads(const std::string& bucket,
                                                 const std::string& prefix);

  // --- whole objects, any size
  // One PUT up to multipart_threshold, else a parallel multipart upload (aborted on failure)
  // whose final ETag and size are checked. Returns the ETag.
  std::string upload(const std::string& bucket, const std::string& key, const void* data,
                     uint64_t size);
  std::string upload_file(const std::string& bucket, const std::string& key,
                          const std::string& path);
  std::string upload_parts(const std::string& bucket, const std::string& key, uint64_t size,
                           const PartSource& source);
  // Streams the object to `sink` in order, download_chunk bytes per ranged GET (each retried on
  // its own, all pinned to the first ETag so a concurrent overwrite is an error). Returns size.
  uint64_t download(const std::string& bucket, const std::string& key,
                    const std::function<void(const uint8_t*, size_t)>& sink);
  // Parallel ranged GETs into `path` + ".partial", renamed to `path` when complete.
  uint64_t download_file(const std::string& bucket, const std::string& key,
                         const std::string& path);

  // For tests: the URL and Host a request for (bucket, key) goes to.
  std::string object_url(const std::string& bucket, const std::string& key) const;

  struct Request;   // internal
  struct Response;  // internal

 private:
  Response execute(const Request& req);
  std::string host_for(const std::string& bucket) const;
  std::string path_for(const std::string& bucket, const std::string& key) const;
  bool path_style(const std::string& bucket) const;
  std::string fail_message(const Request& req, const std::string& what) const;

  S3Config cfg_;
  Endpoint endpoint_;
  bool custom_endpoint_ = false;
  std::shared_ptr<CredentialsProvider> creds_;
};

// The ETag S3 gives a multipart object: hex(md5(md5(part1) || ... || md5(partN))) + "-N".
std::string multipart_etag(const std::vector<std::string>& part_md5_raw);

// Removes the access key, secret and token from `text` (defence in depth for error messages).
std::string redact(std::string text, const Credentials& creds);

}  // namespace mx::s3
