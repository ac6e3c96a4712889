// The safetensors file format (https://github.com/huggingface/safetensors): how Hugging Face
// weights come in and go out, and the shard format of our own checkpoints. No pickle, no code.
//
// Layout: u64 little-endian header length N, N bytes of UTF-8 JSON
//   {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the byte buffer; offsets are relative to the start of that buffer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace mx {

struct TensorEntry {
  std::string name;
  std::string dtype;           // safetensors spelling: "F32", "BF16", ...
  std::vector<int64_t> shape;  // [] is a scalar (numel 1)
  uint64_t begin = 0, end = 0; // byte range within the data buffer
  int64_t numel() const;
};

// Bytes per element of a safetensors dtype; 0 for a dtype this format does not know.
size_t safetensors_dtype_size(const std::string& dtype);

// A safetensors file mapped read-only. Every malformation of the file is a UserError naming
// the file: the header is checked in full before anything is sized from it.
class SafeTensorsReader {
 public:
  explicit SafeTensorsReader(const std::string& path);
  ~SafeTensorsReader();
  SafeTensorsReader(SafeTensorsReader&& other) noexcept;
  SafeTensorsReader& operator=(SafeTensorsReader&& other) noexcept;
  SafeTensorsReader(const SafeTensorsReader&) = delete;
  SafeTensorsReader& operator=(const SafeTensorsReader&) = delete;

  const std::vector<TensorEntry>& tensors() const { return tensors_; }  // by data offset
  bool has(const std::string& name) const;
  const TensorEntry& entry(const std::string& name) const;  // UserError if absent

  // Converts F32, BF16, F16 and F64 to fp32. UserError if count != numel or for another dtype.
  void read_f32(const std::string& name, float* dst, int64_t count) const;
  std::vector<float> read_f32(const std::string& name) const;
  // Pointer into the mapping at the tensor's first byte. It is only as aligned as the file
  // made it (the format packs tensors back to back), so read multi-byte values with memcpy.
  const void* raw(const std::string& name) const;

  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  void release() noexcept;

  std::string path_;
  const unsigned char* map_ = nullptr;
  size_t map_size_ = 0;
  const unsigned char* buffer_ = nullptr;  // start of the data buffer within the mapping
  std::vector<TensorEntry> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// Collects tensors (copied in) and writes one safetensors file atomically.
// Tensors are laid out back to back in the order added, after a header padded with spaces to a
// multiple of 8 bytes, as the reference implementation does; the format forbids gaps, so a
// tensor is naturally aligned only if every tensor before it has a size that keeps it so
// (add wider dtypes first when that matters).
class SafeTensorsWriter {
 public:
  // dtype "F32" (stored as is) or "BF16" (round-to-nearest-even from fp32).
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, const float* data,
               const std::string& dtype = "F32");
  // Bytes already in `dtype` (e.g. "I32", "U8"); bytes must equal numel * dtype size.
  void add_raw(const std::string& name, const std::string& dtype,
               const std::vector<int64_t>& shape, const void* data, size_t bytes);
  void set_metadata(const std::string& key, const std::string& value);
  // Writes path + ".tmp.<pid>", fsyncs it, renames it over `path` and fsyncs the directory:
  // a failed write never leaves a partial file at `path`. I/O failure -> StorageError, with the
  // temporary file removed.
  void write(const std::string& path) const;
  // write's first half (core/atomic_file.h, stage_file): the file written and fsynced under its
  // temporary name, which is returned, for commit_staged_file(s).
  std::string stage(const std::string& path) const;

 private:
  struct Pending {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::vector<unsigned char> bytes;
    size_t size() const { return bytes.size(); }
  };
  void check_new_name(const std::string& name) const;

  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The parsed header of a safetensors file, checked as SafeTensorsReader checks it; for files
// read in pieces (an S3 object: the first 8 bytes, then the header). `header` holds `available`
// bytes of the header_bytes the length field announces; file_bytes is the whole file's size.
// data_start: the byte offset of the data buffer in the file (8 + header_bytes).
struct SafeTensorsIndex {
  std::vector<TensorEntry> tensors;  // by data offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;
};
SafeTensorsIndex parse_safetensors_header(const std::string& label, const char* header,
                                          uint64_t available, uint64_t header_bytes,
                                          uint64_t file_bytes);

// A tensor to serialize, by pointer (not copied until build_safetensors runs).
struct TensorBytes {
  std::string name, dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
  size_t size() const { return bytes; }
};
// Host bytes that are not zeroed when they grow (a checkpoint staging image is overwritten
// whole) and keep their capacity: only the first use pays for allocation and page faults.
class HostBuffer {
 public:
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  void resize(size_t n);   // contents undefined after growing
  void reserve(size_t n);  // allocates and touches every page now (in parallel)

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0, capacity_ = 0;
};

// One whole safetensors file image in `out`: the same bytes SafeTensorsWriter::write would put
// in a file. Tensor bytes are copied by all OpenMP threads. For checkpoints that are written or
// uploaded from memory by a background thread.
void build_safetensors(const std::vector<TensorBytes>& tensors,
                       const std::map<std::string, std::string>& metadata, HostBuffer& out);

// Scalar conversions between fp32 and the 16-bit float formats.
float bf16_to_f32(uint16_t bits);       // exact: the bf16 bits are the fp32 high half
uint16_t f32_to_bf16_rne(float value);  // round to nearest, ties to even; NaN stays NaN
float f16_to_f32(uint16_t bits);        // IEEE binary16, subnormals included; exact

}  // namespace mx
