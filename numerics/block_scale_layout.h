// Where cuBLASLt's block-scaled GEMMs (Blackwell: MXFP8 with CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0,
// NVFP4 with VEC16_UE4M3) expect each block scale: the "swizzled" 128x4 tile layout of the cuBLAS
// documentation (1D block scaling factors layout).
//
// The scales of one operand form a [rows, scale_cols] matrix: rows = the operand's outer
// dimension (M for A, N for B), scale_cols = its K / block size (one scale per block of 16 or 32
// elements along K). That matrix is padded to a multiple of 128 rows and 4 columns (padding
// bytes are read by the GEMM and must be finite: zero) and cut into 128 x 4 tiles, stored one
// after another, row tile major (tile (rt, ct) is number rt * ceil(scale_cols / 4) + ct), 512
// bytes each. Inside a tile, row i = 32 * s + l (s = 0..3, l = 0..31) and column j go to byte
// 16 * l + 4 * s + j: the 32 x 16 arrangement in which one 16-byte line holds the 4 x 4 scales
// of rows l, l + 32, l + 64, l + 96.
//
// Host and device (MX_HOST_DEVICE): the quantize kernels write straight into this layout; the
// CPU test (tests/cpp/numerics/test_block_scale_layout.cpp) checks it against an independent
// construction from the documentation's description.
#pragma once
#include <cstdint>

#include "numerics/formats.h"

namespace mx::numerics {

// Bytes of the swizzled scale buffer of a [rows, scale_cols] scale matrix (padding included).
MX_HOST_DEVICE inline int64_t swizzled_scale_bytes(int64_t rows, int64_t scale_cols) {
  return ((rows + 127) / 128 * 128) * ((scale_cols + 3) / 4 * 4);
}

// Byte offset of scale (row, scale_col) in the swizzled buffer.
MX_HOST_DEVICE inline int64_t swizzled_scale_offset(int64_t row, int64_t scale_col,
                                                     int64_t scale_cols) {
  const int64_t col_tiles = (scale_cols + 3) / 4;
  const int64_t tile = (row / 128) * col_tiles + scale_col / 4;
  const int64_t i = row % 128, j = scale_col % 4;
  return tile * 512 + (i % 32) * 16 + (i / 32) * 4 + j;
}

// The inverse: which (row, scale_col) of the padded [round_up(rows, 128), round_up(scale_cols, 4)]
// scale matrix byte `offset` of the swizzled buffer holds (row >= rows or scale_col >=
// scale_cols: padding). Kernels that walk the buffer byte by byte (coalesced writes, padding
// included) use it.
MX_HOST_DEVICE inline void swizzled_scale_position(int64_t offset, int64_t scale_cols,
                                                   int64_t* row, int64_t* scale_col) {
  const int64_t col_tiles = (scale_cols + 3) / 4;
  const int64_t tile = offset / 512, in_tile = offset % 512;
  const int64_t l = in_tile / 16, s = in_tile % 16 / 4, j = in_tile % 4;
  *row = (tile / col_tiles) * 128 + 32 * s + l;
  *scale_col = (tile % col_tiles) * 4 + j;
}

}  // namespace mx::numerics
