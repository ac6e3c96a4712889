#include "checkpoint/s3/crypto.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <stdexcept>

namespace mx::s3 {

static std::string digest(const EVP_MD* md, const void* data, size_t size) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  if (EVP_Digest(data, size, out, &out_len, md, nullptr) != 1)
    throw std::runtime_error("OpenSSL EVP_Digest failed");
  return std::string(reinterpret_cast<const char*>(out), out_len);
}

std::string sha256(std::string_view data) { return digest(EVP_sha256(), data.data(), data.size()); }
std::string sha256(const void* data, size_t size) { return digest(EVP_sha256(), data, size); }
std::string md5(const void* data, size_t size) { return digest(EVP_md5(), data, size); }

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &out_len))
    throw std::runtime_error("OpenSSL HMAC failed");
  return std::string(reinterpret_cast<const char*>(out), out_len);
}

std::string to_hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out(bytes.size() * 2, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    unsigned char b = static_cast<unsigned char>(bytes[i]);
    out[2 * i] = digits[b >> 4];
    out[2 * i + 1] = digits[b & 15];
  }
  return out;
}

std::string base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace mx::s3
