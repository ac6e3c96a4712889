// CPU twin of the fp8-block -> MXFP8 scale conversion (backend/cuda/quantize_kernels.cu,
// fp8_block_scales_to_mx): the same walk over the swizzled buffer, byte by byte, with the same
// inline functions, so the op check can compare the device's bytes with these.
#include "numerics/fp8_block_mx.h"

#include "core/error.h"

namespace mx::numerics {

Fp8BlockMxShape fp8_block_mx_shape(int64_t rows, int64_t cols, int block_rows, int block_cols,
                                   bool transposed) {
  MX_REQUIRE(rows >= 0 && cols >= 0 && block_rows >= 1 && block_cols >= 1,
             "fp8_block_scales_to_mx: bad shape [", rows, ", ", cols, "] or block ", block_rows,
             "x", block_cols);
  const int64_t K = transposed ? rows : cols;
  const int64_t k_extent = transposed ? block_rows : block_cols;
  MX_REQUIRE(K % 32 == 0 && k_extent % 32 == 0, "fp8_block_scales_to_mx: K = ", K,
             " and the blocks' extent along K (", k_extent, ") must be multiples of 32");
  Fp8BlockMxShape z;
  z.R = transposed ? cols : rows;
  z.kb = K / 32;
  z.scale_cols = (cols + block_cols - 1) / block_cols;
  z.bytes = swizzled_scale_bytes(z.R, z.kb);
  return z;
}

int64_t fp8_block_scales_to_mx(const float* block_scales, int64_t rows, int64_t cols,
                               int block_rows, int block_cols, bool transposed, uint8_t* dst) {
  const Fp8BlockMxShape z = fp8_block_mx_shape(rows, cols, block_rows, block_cols, transposed);
  const int64_t R = z.R, kb = z.kb, scale_cols = z.scale_cols, bytes = z.bytes;
  int64_t not_convertible = 0;
  for (int64_t o = 0; o < bytes; ++o) {
    int64_t r, k;
    swizzled_scale_position(o, kb, &r, &k);
    uint8_t code = 0;  // padding
    if (r < R && k < kb) {
      code = fp8_block_mx_code(block_scales, scale_cols, block_rows, block_cols, transposed, r, k);
      not_convertible += code == kE8M0NotConvertible;
    }
    dst[o] = code;
  }
  return not_convertible;
}

}  // namespace mx::numerics
