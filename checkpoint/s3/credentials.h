// Where S3 credentials come from, in the order the AWS SDKs use for a training container:
//   1. environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN;
//   2. the container credentials endpoint (ECS, SageMaker, EKS Pod Identity):
//      AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (on http://169.254.170.2) or
//      AWS_CONTAINER_CREDENTIALS_FULL_URI, with AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE);
//   3. EC2 instance metadata, IMDSv2 (PUT a token, then GET the role and its credentials),
//      unless AWS_EC2_METADATA_DISABLED=true; AWS_EC2_METADATA_SERVICE_ENDPOINT moves it.
// Temporary credentials are cached and fetched again `refresh_before_s` before Expiration.
// Secrets never appear in a log line or an error message.
#pragma once
#include <ctime>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "checkpoint/s3/sigv4.h"

namespace mx::s3 {

// Reads an environment variable; injectable so tests need not touch the process environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_env();

struct CredentialSources {
  EnvLookup env = process_env();
  std::string container_host = "http://169.254.170.2";  // for the RELATIVE_URI
  std::string imds_endpoint = "http://169.254.169.254";  // AWS_EC2_METADATA_SERVICE_ENDPOINT wins
  long metadata_timeout_ms = 1000;  // per request; a machine without IMDS must fail fast
  int metadata_attempts = 2;
  double refresh_before_s = 300;  // fetch new temporary credentials this long before expiry
  std::function<std::time_t()> now = [] { return std::time(nullptr); };
};

class CredentialsProvider {
 public:
  virtual ~CredentialsProvider() = default;
  // Credentials valid for at least a few more minutes. Throws UserError when no source has
  // any (naming the sources tried), StorageError when a source that is configured fails.
  virtual Credentials get() = 0;
  // Forget cached credentials (after the server said they expired).
  virtual void invalidate() {}
};

// Fixed credentials (tests, or keys from a config file).
class StaticCredentials : public CredentialsProvider {
 public:
  explicit StaticCredentials(Credentials c) : creds_(std::move(c)) {}
  Credentials get() override { return creds_; }

 private:
  Credentials creds_;
};

// The chain above, with caching and refresh.
class DefaultCredentialsChain : public CredentialsProvider {
 public:
  explicit DefaultCredentialsChain(CredentialSources sources = {});
  Credentials get() override;
  void invalidate() override;
  // Which source produced the cached credentials: "environment", "container", "imds", or "".
  std::string source() const;

 private:
  Credentials fetch(std::string& source);
  CredentialSources src_;
  mutable std::mutex mu_;
  std::optional<Credentials> cached_;
  std::string source_;
};

// Pieces of the chain, for tests.
std::optional<Credentials> credentials_from_env(const EnvLookup& env);
// Parses the JSON both endpoints return: AccessKeyId, SecretAccessKey, Token, Expiration.
// `what` names the source in errors.
Credentials parse_credentials_json(const std::string& body, const std::string& what);
// "2024-05-01T12:00:00Z" (fractional seconds allowed) -> seconds since the epoch.
std::time_t parse_iso8601_utc(const std::string& s);

}  // namespace mx::s3
