#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_input.h"

// The format is little-endian and so are all our targets (x86-64, aarch64): bytes are copied,
// never swapped.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

namespace mx {

namespace {

// The reference implementation's limit on the JSON header (MAX_HEADER_SIZE in safetensors).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

struct DtypeSize {
  const char* name;
  size_t bytes;
};
constexpr DtypeSize kDtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},     {"I32", 4},
    {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
};

// numel of a shape, or false when a dimension is negative or the product overflows int64.
bool checked_numel(const std::vector<int64_t>& shape, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  }
  *out = n;
  return true;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A JSON integer as a non-negative int64, or false (float, string, negative, > INT64_MAX).
bool json_nonneg_int64(const nlohmann::json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    uint64_t u = j.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    *out = int64_t(u);
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = v;
    return true;
  }
  return false;
}

std::string errno_text() { return std::strerror(errno); }

// Parses one tensor's header entry; every defect is a UserError naming file and tensor.
TensorEntry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& j,
                        uint64_t buffer_bytes) {
  auto fail = [&](const std::string& why) {
    return UserError(str("safetensors file '", path, "': tensor '", name, "': ", why));
  };
  if (!j.is_object()) throw fail("header entry is not a JSON object");
  TensorEntry e;
  e.name = name;

  auto dtype_it = j.find("dtype");
  if (dtype_it == j.end()) throw fail("missing \"dtype\"");
  if (!dtype_it->is_string()) throw fail("\"dtype\" is not a string");
  e.dtype = dtype_it->get<std::string>();
  size_t elem_bytes = safetensors_dtype_size(e.dtype);
  if (elem_bytes == 0) throw fail(str("unknown dtype '", e.dtype, "'"));

  auto shape_it = j.find("shape");
  if (shape_it == j.end()) throw fail("missing \"shape\"");
  if (!shape_it->is_array()) throw fail("\"shape\" is not an array");
  for (const auto& d : *shape_it) {
    int64_t dim = 0;
    if (!json_nonneg_int64(d, &dim))
      throw fail(str("\"shape\" has a dimension that is not a non-negative integer: ",
                     json_excerpt(d)));
    e.shape.push_back(dim);
  }

  auto off_it = j.find("data_offsets");
  if (off_it == j.end()) throw fail("missing \"data_offsets\"");
  int64_t begin = 0, end = 0;
  if (!off_it->is_array() || off_it->size() != 2 || !json_nonneg_int64((*off_it)[0], &begin) ||
      !json_nonneg_int64((*off_it)[1], &end))
    throw fail("\"data_offsets\" is not an array of two non-negative integers");
  if (begin > end) throw fail(str("data_offsets [", begin, ", ", end, "] run backwards"));
  e.begin = uint64_t(begin);
  e.end = uint64_t(end);
  if (e.end > buffer_bytes)
    throw fail(str("data_offsets [", begin, ", ", end, "] lie outside the data buffer of ",
                   buffer_bytes, " bytes"));

  int64_t numel = 0, bytes = 0;
  if (!checked_numel(e.shape, &numel) ||
      __builtin_mul_overflow(numel, int64_t(elem_bytes), &bytes))
    throw fail(str("shape ", shape_string(e.shape), " overflows"));
  if (uint64_t(bytes) != e.end - e.begin)
    throw fail(str("shape ", shape_string(e.shape), " of ", e.dtype, " needs ", bytes,
                   " bytes but data_offsets [", begin, ", ", end, "] hold ", end - begin));
  return e;
}

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // entries are validated: no overflow, no negative dims
  return n;
}

size_t safetensors_dtype_size(const std::string& dtype) {
  for (const auto& d : kDtypes)
    if (dtype == d.name) return d.bytes;
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Scalar conversions

float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }

uint16_t f32_to_bf16_rne(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  // Rounding a NaN could carry into the exponent and make it an infinity; keep the sign and the
  // high payload bits and force the quiet bit so the result is still a NaN.
  if (std::isnan(value)) return uint16_t((bits >> 16) | 0x0040);
  // Add just under half an ulp, plus one more when the kept lsb is odd: ties go to even.
  // Overflow carries into the exponent and yields infinity, as IEEE rounding does.
  uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return uint16_t((bits + rounding) >> 16);
}

float f16_to_f32(uint16_t bits) {
  uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1Fu;
  uint32_t mant = bits & 0x3FFu;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in fp32.
    float mag = std::ldexp(float(mant), -24);
    return sign ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

// ---------------------------------------------------------------------------------------------
// Header

SafeTensorsIndex parse_safetensors_header(const std::string& label, const char* header,
                                          uint64_t available, uint64_t header_bytes,
                                          uint64_t file_bytes) {
  auto fail = [&](const std::string& why) {
    return UserError(str("safetensors file '", label, "': ", why));
  };
  if (file_bytes < 8)
    throw fail(str("file is ", file_bytes, " bytes, shorter than the 8-byte header length"));
  if (header_bytes > file_bytes - 8)
    throw fail(str("header length ", header_bytes, " exceeds the ", file_bytes - 8,
                   " bytes after the length field"));
  if (header_bytes > kMaxHeaderBytes)
    throw fail(str("header length ", header_bytes, " exceeds the limit of ", kMaxHeaderBytes,
                   " bytes"));
  if (available < header_bytes)
    throw fail(str("only ", available, " of the header's ", header_bytes, " bytes were read"));
  std::string why;
  const nlohmann::json j = parse_json_input(std::string_view(header, header_bytes), &why);
  if (j.is_discarded()) throw fail(str("header ", why));
  if (!j.is_object()) throw fail("header is not a JSON object");

  SafeTensorsIndex idx;
  idx.data_start = 8 + header_bytes;
  const uint64_t buffer_bytes = file_bytes - 8 - header_bytes;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (it->is_null()) continue;
      if (!it->is_object()) throw fail("\"__metadata__\" is not a JSON object");
      for (auto m_it = it->begin(); m_it != it->end(); ++m_it) {
        if (!m_it->is_string())
          throw fail(str("\"__metadata__\" value for '", m_it.key(), "' is not a string"));
        idx.metadata[m_it.key()] = m_it->get<std::string>();
      }
      continue;
    }
    idx.tensors.push_back(parse_entry(label, it.key(), *it, buffer_bytes));
  }
  // File order is data order; with entries sorted by begin, any overlap shows between
  // neighbours. Empty tensors occupy no bytes and overlap nothing.
  std::stable_sort(idx.tensors.begin(), idx.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const TensorEntry* prev = nullptr;
  for (const auto& e : idx.tensors) {
    if (e.begin == e.end) continue;
    if (prev && e.begin < prev->end)
      throw fail(str("tensors '", prev->name, "' [", prev->begin, ", ", prev->end, ") and '",
                     e.name, "' [", e.begin, ", ", e.end, ") overlap"));
    prev = &e;
  }
  return idx;
}

// ---------------------------------------------------------------------------------------------
// Reader

SafeTensorsReader::SafeTensorsReader(const std::string& path) : path_(path) {
  auto fail = [&](const std::string& why) {
    return UserError(str("safetensors file '", path_, "': ", why));
  };
  // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw fail(str("cannot open: ", errno_text()));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string why = errno_text();
    ::close(fd);
    throw StorageError(str("safetensors file '", path_, "': cannot stat: ", why));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw fail("not a regular file");
  }
  uint64_t file_bytes = uint64_t(st.st_size);
  if (file_bytes < 8) {
    ::close(fd);
    throw fail(str("file is ", file_bytes, " bytes, shorter than the 8-byte header length"));
  }
  void* m = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int mmap_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (m == MAP_FAILED)
    throw StorageError(
        str("safetensors file '", path_, "': cannot mmap: ", std::strerror(mmap_errno)));
  map_ = static_cast<const unsigned char*>(m);
  map_size_ = file_bytes;

  try {
    uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, map_, 8);
    SafeTensorsIndex idx = parse_safetensors_header(
        path_, reinterpret_cast<const char*>(map_ + 8),
        std::min<uint64_t>(header_bytes, file_bytes - 8), header_bytes, file_bytes);
    buffer_ = map_ + idx.data_start;
    tensors_ = std::move(idx.tensors);
    metadata_ = std::move(idx.metadata);
    for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  } catch (...) {
    release();
    throw;
  }
}

SafeTensorsReader::~SafeTensorsReader() { release(); }

void SafeTensorsReader::release() noexcept {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), map_size_);
  map_ = nullptr;
  buffer_ = nullptr;
  map_size_ = 0;
}

SafeTensorsReader::SafeTensorsReader(SafeTensorsReader&& o) noexcept
    : path_(std::move(o.path_)),
      map_(o.map_),
      map_size_(o.map_size_),
      buffer_(o.buffer_),
      tensors_(std::move(o.tensors_)),
      index_(std::move(o.index_)),
      metadata_(std::move(o.metadata_)) {
  o.map_ = nullptr;
  o.buffer_ = nullptr;
  o.map_size_ = 0;
}

SafeTensorsReader& SafeTensorsReader::operator=(SafeTensorsReader&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_size_ = o.map_size_;
    buffer_ = o.buffer_;
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
    o.map_ = nullptr;
    o.buffer_ = nullptr;
    o.map_size_ = 0;
  }
  return *this;
}

bool SafeTensorsReader::has(const std::string& name) const { return index_.count(name) != 0; }

const TensorEntry& SafeTensorsReader::entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    throw UserError(str("safetensors file '", path_, "' has no tensor '", name, "'"));
  return tensors_[it->second];
}

const void* SafeTensorsReader::raw(const std::string& name) const {
  return buffer_ + entry(name).begin;
}

void SafeTensorsReader::read_f32(const std::string& name, float* dst, int64_t count) const {
  const TensorEntry& e = entry(name);
  MX_REQUIRE(count == e.numel(), "safetensors file '", path_, "': tensor '", name, "' has ",
             e.numel(), " elements (shape ", shape_string(e.shape), ") but ", count,
             " were asked for");
  const unsigned char* src = buffer_ + e.begin;
  // The buffer is packed, so elements may be misaligned: copy them out with memcpy.
  if (e.dtype == "F32") {
    if (count > 0) std::memcpy(dst, src, size_t(count) * 4);
  } else if (e.dtype == "BF16") {
    for (int64_t i = 0; i < count; ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      dst[i] = bf16_to_f32(b);
    }
  } else if (e.dtype == "F16") {
    for (int64_t i = 0; i < count; ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      dst[i] = f16_to_f32(b);
    }
  } else if (e.dtype == "F64") {
    for (int64_t i = 0; i < count; ++i) {
      double d;
      std::memcpy(&d, src + 8 * i, 8);
      dst[i] = float(d);
    }
  } else {
    throw UserError(str("safetensors file '", path_, "': tensor '", name, "' has dtype ", e.dtype,
                        ", which cannot be read as fp32 (F32, BF16, F16 or F64 expected)"));
  }
}

std::vector<float> SafeTensorsReader::read_f32(const std::string& name) const {
  std::vector<float> out(size_t(entry(name).numel()));
  read_f32(name, out.data(), int64_t(out.size()));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writer

void SafeTensorsWriter::check_new_name(const std::string& name) const {
  MX_REQUIRE(!name.empty(), "safetensors: tensor name must not be empty");
  MX_REQUIRE(name != kMetadataKey, "safetensors: '", kMetadataKey,
             "' is reserved and cannot name a tensor");
  for (const auto& t : tensors_)
    MX_REQUIRE(t.name != name, "safetensors: tensor '", name, "' added twice");
}

void SafeTensorsWriter::add_f32(const std::string& name, const std::vector<int64_t>& shape,
                                const float* data, const std::string& dtype) {
  check_new_name(name);
  int64_t numel = 0;
  MX_REQUIRE(checked_numel(shape, &numel), "safetensors: tensor '", name, "' has invalid shape ",
             shape_string(shape));
  Pending p{name, dtype, shape, {}};
  if (dtype == "F32") {
    p.bytes.resize(size_t(numel) * 4);
    if (numel) std::memcpy(p.bytes.data(), data, p.bytes.size());
  } else if (dtype == "BF16") {
    p.bytes.resize(size_t(numel) * 2);
    for (int64_t i = 0; i < numel; ++i) {
      uint16_t b = f32_to_bf16_rne(data[i]);
      std::memcpy(p.bytes.data() + 2 * i, &b, 2);
    }
  } else {
    throw UserError(str("safetensors: tensor '", name, "': add_f32 stores F32 or BF16, not '",
                        dtype, "'"));
  }
  tensors_.push_back(std::move(p));
}

void SafeTensorsWriter::add_raw(const std::string& name, const std::string& dtype,
                                const std::vector<int64_t>& shape, const void* data,
                                size_t bytes) {
  check_new_name(name);
  size_t elem = safetensors_dtype_size(dtype);
  MX_REQUIRE(elem != 0, "safetensors: tensor '", name, "': unknown dtype '", dtype, "'");
  int64_t numel = 0, need = 0;
  MX_REQUIRE(checked_numel(shape, &numel) && !__builtin_mul_overflow(numel, int64_t(elem), &need),
             "safetensors: tensor '", name, "' has invalid shape ", shape_string(shape));
  MX_REQUIRE(uint64_t(need) == bytes, "safetensors: tensor '", name, "': shape ",
             shape_string(shape), " of ", dtype, " needs ", need, " bytes, got ", bytes);
  Pending p{name, dtype, shape, std::vector<unsigned char>(bytes)};
  if (bytes) std::memcpy(p.bytes.data(), data, bytes);
  tensors_.push_back(std::move(p));
}

void SafeTensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

namespace {
// The header text of a safetensors file holding `tensors` back to back in this order, padded
// with spaces (valid JSON whitespace) so the data buffer starts 8-byte aligned.
template <typename T>
std::string build_header(const std::string& label, const std::vector<T>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps "__metadata__" first and tensors in data order, as the reference writer
  // does; readers must not depend on it, but it makes headers easy to read by eye.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header[kMetadataKey] = std::move(m);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t end = offset + t.size();
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception&) {  // a name or metadata string that is not UTF-8
    throw UserError(str("safetensors: cannot write '", label,
                        "': a tensor name or metadata string is not valid UTF-8"));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}
}  // namespace

std::string SafeTensorsWriter::stage(const std::string& path) const {
  std::string header_text = build_header(path, tensors_, metadata_);
  uint64_t header_len = header_text.size();
  std::vector<ByteSpan> pieces = {{&header_len, 8}, {header_text.data(), header_text.size()}};
  for (const auto& t : tensors_) pieces.push_back({t.bytes.data(), t.bytes.size()});
  return stage_file(path, pieces);
}

void SafeTensorsWriter::write(const std::string& path) const {
  commit_staged_file(stage(path), path);
}

void HostBuffer::reserve(size_t n) {
  if (n <= capacity_) return;
  std::unique_ptr<uint8_t[]> fresh(new uint8_t[n]);  // default-initialized: not zeroed
  if (size_) std::memcpy(fresh.get(), data_.get(), size_);
  // Touch every page now, with every thread, so a later copy into it runs at memory speed.
  uint8_t* p = fresh.get();
  const int64_t pages = int64_t((n + 4095) / 4096);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pages; ++i) p[size_t(i) * 4096] = 0;
  data_ = std::move(fresh);
  capacity_ = n;
}

void HostBuffer::resize(size_t n) {
  reserve(n);
  size_ = n;
}

void build_safetensors(const std::vector<TensorBytes>& tensors,
                       const std::map<std::string, std::string>& metadata, HostBuffer& out) {
  for (const auto& t : tensors) {
    size_t elem = safetensors_dtype_size(t.dtype);
    int64_t numel = 0;
    MX_REQUIRE(elem != 0 && checked_numel(t.shape, &numel) && uint64_t(numel) * elem == t.bytes,
               "safetensors: tensor '", t.name, "': shape ", shape_string(t.shape), " of ",
               t.dtype, " does not match its ", t.bytes, " bytes");
  }
  std::string header_text = build_header("(in memory)", tensors, metadata);
  uint64_t header_len = header_text.size();
  size_t total = 8 + header_text.size();
  std::vector<size_t> at;
  for (const auto& t : tensors) {
    at.push_back(total);
    total += t.bytes;
  }
  out.resize(total);
  uint8_t* p = out.data();
  std::memcpy(p, &header_len, 8);
  std::memcpy(p + 8, header_text.data(), header_text.size());
  // 1 MiB pieces over all threads: the staging copy is the only part of an asynchronous
  // checkpoint the training loop waits for.
  constexpr size_t kPiece = 1 << 20;
  std::vector<std::pair<size_t, size_t>> pieces;  // (tensor, offset in it)
  for (size_t i = 0; i < tensors.size(); ++i)
    for (size_t off = 0; off < tensors[i].bytes; off += kPiece) pieces.emplace_back(i, off);
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t k = 0; k < int64_t(pieces.size()); ++k) {
    auto [i, off] = pieces[size_t(k)];
    const size_t n = std::min(kPiece, tensors[i].bytes - off);
    std::memcpy(p + at[i] + off, static_cast<const uint8_t*>(tensors[i].data) + off, n);
  }
}

}  // namespace mx
