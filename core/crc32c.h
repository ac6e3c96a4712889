// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every file a checkpoint
// manifest lists and of the training data's ids. Chosen over CRC32 (zlib) because it is what
// storage systems use (iSCSI, ext4, S3's x-amz-checksum-crc32c), so a manifest's value can be
// compared with S3's own later. SSE4.2's crc32 instruction where the CPU has it (about 9 GB/s
// here), else slicing-by-8 in portable C++ (about 2.4 GB/s). In core/ (it was in checkpoint/)
// because data/, below checkpoint/, checks its ids with it too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mx {

// Extends `crc` (the value returned for the bytes before) over `size` more bytes; start at 0.
// crc32c_update(crc32c_update(0, a), b) == crc32c(a + b).
uint32_t crc32c_update(uint32_t crc, const void* data, size_t size);
inline uint32_t crc32c(const void* data, size_t size) { return crc32c_update(0, data, size); }

// CRC32C of a whole file, read in chunks. StorageError if it cannot be read; `bytes_read`
// (optional) receives how many bytes were checksummed.
uint32_t crc32c_file(const std::string& path, uint64_t* bytes_read = nullptr);

// "e3069283": 8 lowercase hex digits, the spelling a manifest stores.
std::string crc32c_hex(uint32_t crc);

}  // namespace mx
