#include "data/token_dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/splitmix64.h"

namespace mx {

// Token ids are stored little-endian and read with memcpy; every host we target is little-endian.
static_assert(std::endian::native == std::endian::little, "token shards are little-endian");

namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int64_t kLlmcHeaderInts = 256;
constexpr int64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;
constexpr uint64_t kRandomSeed = 0x6d78747261696e31ull;  // "mxtrain1": fixed so benchmarks repeat

// An OS error on a file that exists and was opened is a storage failure (exit 3), not bad input.
[[noreturn]] void throw_read_error(const std::string& path, const char* what, int err) {
  std::string msg = str("data file '", path, "': ", what, ": ", std::strerror(err));
  if (err == EIO) throw StorageError(msg);
  throw UserError(msg);
}

struct FileDescriptor {
  int fd = -1;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly `bytes` at `offset`; the caller has checked the file is that long, so a short
// read means it shrank (`shrank` says when).
void pread_exact(int fd, void* dst, size_t bytes, off_t offset, const std::string& path,
                 const char* shrank = "file shrank while being read") {
  auto* out = static_cast<uint8_t*>(dst);
  while (bytes > 0) {
    ssize_t got = ::pread(fd, out, bytes, offset);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw_read_error(path, "read failed", errno);
    MX_REQUIRE(got > 0, "data file '", path, "': ", shrank, " (nothing at byte ", offset, ")");
    out += got;
    bytes -= static_cast<size_t>(got);
    offset += got;
  }
}

std::string lower_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

TokenFormat detect_format(int fd, int64_t file_bytes, const std::string& path) {
  if (file_bytes >= 4) {
    int32_t magic = 0;
    pread_exact(fd, &magic, 4, 0, path);
    if (magic == kLlmcMagic) return TokenFormat::kLlmc;
  }
  std::string ext = lower_extension(path);
  if (ext == ".txt" || ext == ".md" || ext == ".text") return TokenFormat::kText;
  if (ext == ".u16") return TokenFormat::kU16;
  if (ext == ".u32") return TokenFormat::kU32;
  throw UserError(str("data file '", path, "': cannot tell its format (no llm.c header, extension '",
                      ext, "' is not .txt/.md/.text/.u16/.u32); set data.format to one of ",
                      "u16, u32, llmc, text"));
}

template <typename T>
T load(const uint8_t* tokens, int64_t i) {
  T v;
  std::memcpy(&v, tokens + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

// Index of the first id >= vocab_size in n ids of T at byte `offset` of the file, or n if there is
// none: read in 16 MiB pieces (the file is not mapped: a mapping cut short under the reader
// ends the process with SIGBUS), each scanned in parallel.
template <typename T>
int64_t first_out_of_vocab(int fd, int64_t offset, int64_t n, int64_t vocab_size,
                           const std::string& path) {
  if (static_cast<uint64_t>(vocab_size) > std::numeric_limits<T>::max()) return n;
  constexpr int64_t kPiece = (int64_t{16} << 20) / int64_t(sizeof(T));
  std::vector<T> piece(static_cast<size_t>(std::min(n, kPiece)));
  for (int64_t begin = 0; begin < n; begin += kPiece) {
    const int64_t count = std::min(kPiece, n - begin);
    pread_exact(fd, piece.data(), static_cast<size_t>(count) * sizeof(T),
                static_cast<off_t>(offset + begin * int64_t(sizeof(T))), path);
    int64_t first_bad = count;
#pragma omp parallel for reduction(min : first_bad) schedule(static)
    for (int64_t i = 0; i < count; ++i)
      if (static_cast<int64_t>(piece[size_t(i)]) >= vocab_size) first_bad = std::min(first_bad, i);
    if (first_bad < count) return begin + first_bad;
  }
  return n;
}

}  // namespace

TokenFormat parse_token_format(const std::string& s) {
  if (s == "auto") return TokenFormat::kAuto;
  if (s == "u16") return TokenFormat::kU16;
  if (s == "u32") return TokenFormat::kU32;
  if (s == "llmc") return TokenFormat::kLlmc;
  if (s == "text") return TokenFormat::kText;
  if (s == "random") return TokenFormat::kRandom;
  throw UserError(str("unknown data format '", s, "' (valid: auto, u16, u32, llmc, text, random)"));
}

const char* token_format_name(TokenFormat format) {
  switch (format) {
    case TokenFormat::kAuto: return "auto";
    case TokenFormat::kU16: return "u16";
    case TokenFormat::kU32: return "u32";
    case TokenFormat::kLlmc: return "llmc";
    case TokenFormat::kText: return "text";
    case TokenFormat::kRandom: return "random";
  }
  return "?";
}

TokenDataset TokenDataset::open(const std::string& path, TokenFormat format, int64_t vocab_size,
                                int64_t random_tokens) {
  // Ids are int32 downstream, so the largest usable vocabulary is 2^31.
  MX_REQUIRE(vocab_size > 0 && vocab_size <= (int64_t{1} << 31), "vocab_size must be in [1, 2^31], got ",
             vocab_size, " (data '", path, "')");
  TokenDataset ds;
  ds.path_ = path;

  if (format == TokenFormat::kRandom) {
    MX_REQUIRE(random_tokens > 0, "random data needs a positive token count, got ", random_tokens);
    ds.path_ = "<random>";
    ds.format_ = format;
    ds.token_width_ = 4;
    ds.num_tokens_ = random_tokens;
    ds.owned_.resize(static_cast<size_t>(random_tokens) * 4);
    uint8_t* out = ds.owned_.data();
    // Counter-based (hash of the index), so the data is the same for any thread count.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < random_tokens; ++i) {
      uint64_t h = splitmix64(kRandomSeed ^ static_cast<uint64_t>(i));
      // Multiply-shift maps 32 random bits onto [0, vocab) without a division.
      uint32_t id = static_cast<uint32_t>(((h >> 32) * static_cast<uint64_t>(vocab_size)) >> 32);
      std::memcpy(out + i * 4, &id, 4);
    }
    ds.tokens_ = ds.owned_.data();
    return ds;
  }

  FileDescriptor file;
  // O_NONBLOCK: a FIFO opens at once (and is then refused below) instead of blocking until a
  // writer appears; regular files ignore it.
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (file.fd < 0) throw_read_error(path, "cannot open", errno);
  struct stat st{};
  if (::fstat(file.fd, &st) != 0) throw_read_error(path, "cannot stat", errno);
  MX_REQUIRE(S_ISREG(st.st_mode), "data file '", path, "': not a regular file");
  const int64_t file_bytes = st.st_size;

  if (format == TokenFormat::kAuto) format = detect_format(file.fd, file_bytes, path);
  ds.format_ = format;

  int64_t data_offset = 0;
  switch (format) {
    case TokenFormat::kText: {
      MX_REQUIRE(vocab_size >= 256, "data file '", path, "': text data uses the byte-level tokenizer ",
                 "(ids 0..255), which needs vocab_size >= 256, got ", vocab_size);
      MX_REQUIRE(file_bytes > 0, "data file '", path, "': empty (0 tokens)");
      ds.owned_.resize(static_cast<size_t>(file_bytes));
      pread_exact(file.fd, ds.owned_.data(), ds.owned_.size(), 0, path);
      ds.tokens_ = ds.owned_.data();
      ds.token_width_ = 1;
      ds.num_tokens_ = file_bytes;
      return ds;  // every byte is < 256 <= vocab_size: nothing to scan
    }
    case TokenFormat::kU16:
    case TokenFormat::kU32: {
      ds.token_width_ = format == TokenFormat::kU16 ? 2 : 4;
      MX_REQUIRE(file_bytes > 0, "data file '", path, "': empty (0 tokens)");
      MX_REQUIRE(file_bytes % ds.token_width_ == 0, "data file '", path, "': size ", file_bytes,
                 " bytes is not a multiple of the ", ds.token_width_,
                 "-byte token width (truncated, or the wrong format?)");
      ds.num_tokens_ = file_bytes / ds.token_width_;
      break;
    }
    case TokenFormat::kLlmc: {
      MX_REQUIRE(file_bytes >= kLlmcHeaderBytes, "data file '", path, "': truncated llm.c header (",
                 file_bytes, " bytes, the header alone is ", kLlmcHeaderBytes, ")");
      int32_t header[kLlmcHeaderInts];
      pread_exact(file.fd, header, kLlmcHeaderBytes, 0, path);
      MX_REQUIRE(header[0] == kLlmcMagic, "data file '", path, "': bad llm.c magic ", header[0],
                 " (expected ", kLlmcMagic, ")");
      MX_REQUIRE(header[1] == 1 || header[1] == 2, "data file '", path, "': unsupported llm.c version ",
                 header[1], " (1 = uint16 tokens, 2 = uint32 tokens)");
      ds.token_width_ = header[1] == 1 ? 2 : 4;
      const int64_t count = header[2];
      MX_REQUIRE(count >= 0, "data file '", path, "': llm.c header has a negative token count ", count);
      MX_REQUIRE(count > 0, "data file '", path, "': empty (0 tokens)");
      const int64_t expected = kLlmcHeaderBytes + count * ds.token_width_;
      MX_REQUIRE(file_bytes >= expected, "data file '", path, "': truncated: header says ", count,
                 " tokens (", expected, " bytes) but the file has ", file_bytes, " bytes");
      MX_REQUIRE(file_bytes == expected, "data file '", path, "': header says ", count, " tokens (",
                 expected, " bytes) but the file has ", file_bytes, " bytes");
      ds.num_tokens_ = count;
      data_offset = kLlmcHeaderBytes;
      break;
    }
    default:
      MX_ASSERT(false, "unhandled token format");
  }

  const int64_t bad =
      ds.token_width_ == 2
          ? first_out_of_vocab<uint16_t>(file.fd, data_offset, ds.num_tokens_, vocab_size, path)
          : first_out_of_vocab<uint32_t>(file.fd, data_offset, ds.num_tokens_, vocab_size, path);
  if (bad < ds.num_tokens_) {
    uint32_t id = 0;
    pread_exact(file.fd, &id, size_t(ds.token_width_), off_t(data_offset + bad * ds.token_width_),
                path);
    throw UserError(str("data file '", path, "': token ", bad, " has id ", id,
                        ", which is >= vocab_size ", vocab_size, " (first such token)"));
  }
  // Windows are read with pread as the sampler asks for them (TokenDataset::copy), each id
  // checked again: the file may change under a run that lasts weeks.
  ds.fd_ = std::exchange(file.fd, -1);
  ds.data_offset_ = data_offset;
  ds.vocab_size_ = vocab_size;
  return ds;
}

TokenDataset::TokenDataset(TokenDataset&& other) noexcept { *this = std::move(other); }

TokenDataset& TokenDataset::operator=(TokenDataset&& other) noexcept {
  if (this == &other) return *this;
  release();
  path_ = std::move(other.path_);
  format_ = other.format_;
  token_width_ = other.token_width_;
  num_tokens_ = std::exchange(other.num_tokens_, 0);
  fd_ = std::exchange(other.fd_, -1);
  data_offset_ = other.data_offset_;
  vocab_size_ = other.vocab_size_;
  owned_ = std::move(other.owned_);
  tokens_ = std::exchange(other.tokens_, nullptr);  // a moved vector keeps its buffer
  return *this;
}

TokenDataset::~TokenDataset() { release(); }

void TokenDataset::release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  owned_.clear();
  tokens_ = nullptr;
  num_tokens_ = 0;
}

int32_t TokenDataset::at(int64_t i) const {
  int32_t id = 0;
  copy(i, 1, &id);
  return id;
}

uint64_t TokenDataset::fingerprint() const {
  constexpr int64_t kWindows = 64, kWindow = 1024;
  const int64_t len = std::min(kWindow, num_tokens_);
  std::vector<int32_t> ids(static_cast<size_t>(len));
  uint64_t h = splitmix64(static_cast<uint64_t>(num_tokens_));
  for (int64_t w = 0; w < kWindows; ++w) {
    // Evenly from 0 to the last window's start (128-bit: num_tokens x 63 may pass 2^63).
    const auto start = static_cast<int64_t>(static_cast<__int128>(num_tokens_ - len) * w /
                                            (kWindows - 1));
    copy(start, len, ids.data());
    for (int64_t k = 0; k < len; ++k)
      h = splitmix64(h ^ (static_cast<uint64_t>(start + k) << 32) ^
                     static_cast<uint32_t>(ids[size_t(k)]));
  }
  return h;
}

void TokenDataset::copy(int64_t start, int64_t count, int32_t* dst) const {
  MX_ASSERT(start >= 0 && count >= 0 && start + count <= num_tokens_, "token range [", start, ", ",
            start + count, ") of ", num_tokens_);
  if (fd_ < 0) {  // text bytes or generated ids, in memory
    if (token_width_ == 1) {
      for (int64_t k = 0; k < count; ++k) dst[k] = tokens_[start + k];
    } else {
      std::memcpy(dst, tokens_ + start * 4, static_cast<size_t>(count) * 4);
    }
    return;
  }
  // From the file: u32 ids straight into dst; u16 ids into dst's upper half, then widened front
  // to back (id k's 4 bytes end at 4k + 4 <= 2 count + 2k, where id k's 2 bytes begin, for
  // every k < count, so no id is overwritten before it is read).
  const size_t bytes = static_cast<size_t>(count) * size_t(token_width_);
  auto* raw = reinterpret_cast<uint8_t*>(dst) + (token_width_ == 2 ? 2 * count : 0);
  pread_exact(fd_, raw, bytes, static_cast<off_t>(data_offset_ + start * token_width_), path_,
              "shrank during the run (the tokens it had at start-up are not all there)");
  if (token_width_ == 2)
    for (int64_t k = 0; k < count; ++k) dst[k] = load<uint16_t>(raw, k);
  for (int64_t k = 0; k < count; ++k) {
    const uint32_t id = static_cast<uint32_t>(dst[k]);
    MX_REQUIRE(id < static_cast<uint64_t>(vocab_size_), "data file '", path_,
               "' changed during the run: token ", start + k, " has id ", id,
               ", which is >= vocab_size ", vocab_size_);
  }
}

}  // namespace mx
