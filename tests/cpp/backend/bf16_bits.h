// The bf16 bit formulas the backend tests check against, written from the format's definition
// (the float's top 16 bits, rounded to nearest even), not taken from numerics/: the rounded
// float, its code, and a code's value. For finite inputs.
#pragma once
#include <cstdint>
#include <cstring>

namespace mxtest {

inline float bf16_ref(double x) {
  const float f = float(x);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

inline uint16_t bf16_code(double x) {
  const float r = bf16_ref(x);
  uint32_t u;
  std::memcpy(&u, &r, 4);
  return uint16_t(u >> 16);
}

inline float bf16_value(uint16_t c) {
  const uint32_t u = uint32_t(c) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace mxtest
