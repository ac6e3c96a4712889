// mxemu's stand-in for CUB's DeviceRadixSort::SortPairs (see ../../../emu.h): a stable sort of
// (key, value) pairs by the key's bits [begin_bit, end_bit), in the order CUB's radix sort
// gives (signed keys with the sign bit flipped, so negative before positive); the same first
// call that only asks for the temporary storage's size.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "tests/cuda_emu/include/cuda_runtime.h"

namespace cub {

struct DeviceRadixSort {
  template <class K, class V>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out,
                               const V* values_in, V* values_out, int n, int begin_bit = 0,
                               int end_bit = int(sizeof(K) * 8), cudaStream_t stream = nullptr) {
    static_assert(std::is_integral_v<K>, "integer keys only");
    if (!temp) {
      temp_bytes = size_t(n) * (sizeof(K) + sizeof(V)) + 1;  // what this sort needs, roughly
      return cudaSuccess;
    }
    if (n < 0 || begin_bit < 0 || end_bit > int(sizeof(K) * 8) || begin_bit >= end_bit ||
        temp_bytes < size_t(n) * (sizeof(K) + sizeof(V)) + 1 || !mxemu::is_device_pointer(temp) ||
        !mxemu::is_device_pointer(keys_in) || !mxemu::is_device_pointer(keys_out) ||
        !mxemu::is_device_pointer(values_in) || !mxemu::is_device_pointer(values_out) ||
        static_cast<const void*>(keys_in) == static_cast<const void*>(keys_out) ||
        static_cast<const void*>(values_in) == static_cast<const void*>(values_out))
      return cudaErrorInvalidValue;  // as CUB: the size it asked for, device buffers, out of place
    // The sort is an operation of the stream (emu.h, "Streams").
    mxemu::enqueue(stream, "cub::DeviceRadixSort::SortPairs", [=] {
      if (!mxemu::device_failed())
        sort(temp, temp_bytes, keys_in, keys_out, values_in, values_out, n, begin_bit, end_bit);
    });
    return cudaSuccess;
  }

 private:
  template <class K, class V>
  static void sort(void* temp, size_t temp_bytes, const K* keys_in, K* keys_out, const V* values_in,
                   V* values_out, int n, int begin_bit, int end_bit) {
    using U = std::make_unsigned_t<K>;
    const U flip = std::is_signed_v<K> ? U(U(1) << (sizeof(K) * 8 - 1)) : U(0);
    const int width = end_bit - begin_bit;
    const U mask = width >= int(sizeof(U) * 8) ? U(~U(0)) : U((U(1) << width) - 1);
    mxemu::DeviceAccess access;
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    auto digit = [&](int64_t i) { return U((U(keys_in[i]) ^ flip) >> begin_bit) & mask; };
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return digit(a) < digit(b); });
    std::vector<K> k(static_cast<size_t>(n));
    std::vector<V> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      k[size_t(i)] = keys_in[order[size_t(i)]];
      v[size_t(i)] = values_in[order[size_t(i)]];
    }
    std::copy(k.begin(), k.end(), keys_out);
    std::copy(v.begin(), v.end(), values_out);
    std::memset(temp, 0xFF, temp_bytes);  // scratch: whatever was there is gone
  }
};

}  // namespace cub
