// Hashes and encodings that S3 requests need: SHA-256 (payload hash, SigV4), HMAC-SHA256 (the
// SigV4 key chain), MD5 (Content-MD5 and ETags), hex and base64. Thin wrappers over OpenSSL's
// libcrypto; byte strings are std::string (any bytes, not text).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mx::s3 {

std::string sha256(std::string_view data);                          // 32 raw bytes
std::string sha256(const void* data, size_t size);                  // 32 raw bytes
std::string hmac_sha256(std::string_view key, std::string_view data);  // 32 raw bytes
std::string md5(const void* data, size_t size);                     // 16 raw bytes

std::string to_hex(std::string_view bytes);  // lowercase
std::string base64(std::string_view bytes);  // standard alphabet, padded

inline std::string sha256_hex(std::string_view data) { return to_hex(sha256(data)); }

}  // namespace mx::s3
