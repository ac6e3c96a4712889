// When and how long to wait before trying an S3 request again: exponential backoff with full
// jitter (AWS Architecture Blog, "Exponential Backoff And Jitter"): the n-th retry waits a
// uniform random time in [0, min(max_delay, base_delay * 2^(n-1))].
#pragma once
#include <cstdint>
#include <random>
#include <string>

namespace mx::s3 {

struct RetryPolicy {
  int max_attempts = 8;        // tries in all, the first included
  double base_delay_s = 0.1;   // the cap of the first retry's wait
  double max_delay_s = 20.0;   // no wait is longer than this
};

// The upper bound of the wait before retry number `retry` (1 for the first retry).
double backoff_cap_s(const RetryPolicy& p, int retry);

// A random wait in [0, backoff_cap_s(p, retry)].
double backoff_delay_s(const RetryPolicy& p, int retry, std::mt19937_64& rng);

// HTTP statuses worth another try: 5xx (InternalError, SlowDown, ...) and 429. Every other 4xx
// is final (the request itself is wrong), except the S3 error codes below.
bool is_retryable_status(long status);
// 400 RequestTimeout / ExpiredToken-style codes that another try can cure.
bool is_retryable_s3_code(const std::string& code);

}  // namespace mx::s3
