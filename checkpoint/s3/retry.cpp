#include "checkpoint/s3/retry.h"

#include <algorithm>
#include <cmath>

namespace mx::s3 {

double backoff_cap_s(const RetryPolicy& p, int retry) {
  double exp = std::ldexp(p.base_delay_s, std::min(std::max(retry, 1) - 1, 60));
  return std::min(p.max_delay_s, exp);
}

double backoff_delay_s(const RetryPolicy& p, int retry, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  return u(rng) * backoff_cap_s(p, retry);
}

bool is_retryable_status(long status) { return status >= 500 || status == 429; }

bool is_retryable_s3_code(const std::string& code) {
  return code == "RequestTimeout" || code == "RequestTimeTooSkewed" || code == "SlowDown" ||
         code == "InternalError" || code == "ServiceUnavailable" || code == "Throttling" ||
         code == "ThrottlingException" || code == "RequestLimitExceeded" ||
         code == "ExpiredToken" || code == "TokenRefreshRequired";
}

}  // namespace mx::s3
