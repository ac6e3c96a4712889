#include "data/token_dataset.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <glob.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory_limit.h"
#include "core/stop.h"
#include "data/splitmix64.h"
#include "parallel/communicator.h"

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

// Text bytes held by every dataset of this process together (training and validation data):
// they share one budget (open_file's check).
std::atomic<int64_t> g_text_bytes{0};

// The memory this process may fill: the machine's, or its cgroup's limit where that is lower
// (a container's, a job scheduler's: core/memory_limit.h). `what` names it.
// MXTRAIN_TEST_MEMORY_BYTES stands for it in tests.
int64_t usable_memory(std::string* what) {
  if (const char* t = std::getenv("MXTRAIN_TEST_MEMORY_BYTES"); t && *t) {
    *what = "MXTRAIN_TEST_MEMORY_BYTES";
    return std::atoll(t);
  }
  int64_t mem = int64_t(::sysconf(_SC_PHYS_PAGES)) * int64_t(::sysconf(_SC_PAGE_SIZE));
  *what = "this machine's memory";
  // (it read /sys/fs/cgroup's own files only: a process in a nested cgroup, as a systemd
  // unit's or a scheduler's without a cgroup namespace, had its limit missed)
  if (const int64_t limit = this_cgroup_memory_limit(); limit > 0 && (mem <= 0 || limit < mem)) {
    mem = limit;
    *what = "this container's memory limit";
  }
  return mem;
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
// *crc takes every byte read (CRC32C); *crc_complete is cleared when nothing is read.
template <typename T>
int64_t first_out_of_vocab(int fd, int64_t offset, int64_t n, int64_t vocab_size,
                           const std::string& path, const std::function<void(int64_t)>& read,
                           uint32_t* crc, bool* crc_complete) {
  if (static_cast<uint64_t>(vocab_size) > std::numeric_limits<T>::max()) {
    *crc_complete = false;
    return n;
  }
  constexpr int64_t kPiece = (int64_t{16} << 20) / int64_t(sizeof(T));
  std::vector<T> piece(static_cast<size_t>(std::min(n, kPiece)));
  for (int64_t begin = 0; begin < n; begin += kPiece) {
    const int64_t count = std::min(kPiece, n - begin);
    pread_exact(fd, piece.data(), static_cast<size_t>(count) * sizeof(T),
                static_cast<off_t>(offset + begin * int64_t(sizeof(T))), path);
    if (read) read(count * int64_t(sizeof(T)) + (begin == 0 ? offset : 0));  // with the header
    *crc = crc32c_update(*crc, piece.data(), static_cast<size_t>(count) * sizeof(T));
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

namespace {

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

}  // namespace

std::vector<std::string> data_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(fs::status(path, ec))) {
    std::vector<std::string> files;
    fs::recursive_directory_iterator it(path, ec), end;
    if (ec) throw_read_error(path, "cannot list the directory", ec.value());
    // (a failed increment(ec) ends the walk, so ec is checked after the loop as well: an
    // unreadable subdirectory left out its shards, exit 0)
    for (; !ec && it != end; it.increment(ec)) {
      const fs::path& p = it->path();
      const std::string name = p.filename().string();
      if (!name.empty() && name[0] == '.') {  // hidden: .cache/, .DS_Store, editors' files
        if (it->is_directory(ec)) it.disable_recursion_pending();
        ec.clear();
        continue;
      }
      std::error_code st_ec;
      const fs::file_status st = fs::status(p, st_ec);
      if (fs::is_regular_file(st)) {
        files.push_back(p.string());
      } else if (fs::is_symlink(fs::symlink_status(p, st_ec)) && !fs::exists(st)) {
        // a shard's link to nothing (a moved or unmounted file): less data, silently, before
        throw UserError(str("data directory '", path, "': '", p.string(), "' is a symbolic link to ",
                            "nothing (a missing shard?)"));
      }
    }
    if (ec) throw_read_error(path, "cannot list the directory", ec.value());
    MX_REQUIRE(!files.empty(), "data directory '", path, "' holds no data files (hidden ones ",
               "are skipped)");
    std::sort(files.begin(), files.end());
    return files;
  }
  if (fs::exists(fs::symlink_status(path, ec)) || !has_glob_chars(path)) return {path};
  // A directory of the pattern that is missing (a typo) is "matches no file"; one that cannot
  // be read is that error, with its path.
  static thread_local std::pair<std::string, int> glob_failure;
  glob_failure = {"", 0};
  auto on_error = [](const char* epath, int err) {
    if (err != ENOENT && err != ENOTDIR) {
      glob_failure = {epath, err};
      return 1;
    }
    return 0;
  };
  glob_t g{};
  const int rc = ::glob(path.c_str(), GLOB_ERR, on_error, &g);
  std::vector<std::string> files(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
  ::globfree(&g);
  if (rc == GLOB_ABORTED && glob_failure.second != 0)
    throw_read_error(glob_failure.first, "cannot list the directory", glob_failure.second);
  MX_REQUIRE(rc == 0 || rc == GLOB_NOMATCH || rc == GLOB_ABORTED, "data path '", path,
             "': cannot expand the pattern (glob error ", rc, ")");
  MX_REQUIRE(rc == 0, "data path '", path, "' is not a file or directory, and as a pattern it ",
             "matches no file");
  std::sort(files.begin(), files.end());
  for (const auto& f : files)
    MX_REQUIRE(!fs::is_directory(fs::status(f, ec)), "data path '", path, "' matches the ",
               "directory '", f, "': a pattern must match data files only");
  return files;
}

namespace {

// Every binary shard stays open (its windows are read as the sampler asks). A shard whose
// descriptor lands near the soft open-file limit raises it toward the hard one, keeping a
// quarter of the limit (at most 64) for what the run opens later (MPI, checkpoints, logs: an
// exhausted limit would fail the first checkpoint hours in); if it cannot, an error says so
// before any training.
// Binary shards held open by every TokenDataset of the process (data.path and data.val_path
// together: what the open-file limit has to hold).
std::atomic<int64_t> g_open_shards{0};

void keep_room_for_more_files(int fd, const std::string& path, int64_t shards) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return;
  auto spare = [](rlim_t limit) { return std::min<rlim_t>(64, limit / 4); };
  if (rlim_t(fd) + spare(rl.rlim_cur) < rl.rlim_cur) return;
  const rlim_t want = std::max<rlim_t>(2 * rl.rlim_cur, rlim_t(fd) + 1 + 64);
  rlimit raised = rl;
  raised.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &raised);
  ::getrlimit(RLIMIT_NOFILE, &rl);
  MX_REQUIRE(rlim_t(fd) + spare(rl.rlim_cur) < rl.rlim_cur, "data file '", path, "': the ",
             shards, " data files kept open so far leave too few of the ", rl.rlim_cur,
             " this process may open (ulimit -n; the hard limit is ", rl.rlim_max,
             "): raise it, or merge the shards into fewer files");
}

}  // namespace

bool data_path_covers(const std::string& data_path, const std::string& file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(fs::status(data_path, ec))) {
    const fs::path dir = fs::weakly_canonical(data_path, ec);
    const fs::path rel = fs::weakly_canonical(file, ec).lexically_relative(dir);
    bool under = !rel.empty() && *rel.begin() != "..";
    for (const auto& part : rel) {
      const std::string name = part.string();
      if (name == "." || (!name.empty() && name[0] == '.')) under = false;  // hidden: skipped
    }
    if (under) return true;
  } else if (!fs::exists(fs::symlink_status(data_path, ec)) && has_glob_chars(data_path)) {
    // Where the paths really lead: the pattern's leading components without * ? [ resolved
    // (symbolic links, .., the working directory, whose name may hold [ or *), the file
    // resolved as far as it exists, then the pattern's rest matched against the file's path
    // below that directory.
    fs::path literal, rest;
    bool in_rest = false;
    for (const auto& part : fs::path(data_path)) {
      in_rest = in_rest || has_glob_chars(part.string());
      (in_rest ? rest : literal) /= part;
    }
    const fs::path base = fs::weakly_canonical(literal.empty() ? fs::path(".") : literal, ec);
    const fs::path rel = fs::weakly_canonical(file, ec).lexically_relative(base);
    if (!rel.empty() && *rel.begin() != ".." &&
        ::fnmatch(rest.lexically_normal().c_str(), rel.c_str(), FNM_PATHNAME | FNM_PERIOD) == 0)
      return true;
  }
  return false;
}

DataFileIds::DataFileIds(const std::vector<std::string>& files) {
  struct stat st{};
  for (const std::string& f : files)
    if (::stat(f.c_str(), &st) == 0) ids_.insert({uint64_t(st.st_dev), uint64_t(st.st_ino)});
}

bool DataFileIds::contains(const std::string& file) const {
  struct stat st{};
  return ::stat(file.c_str(), &st) == 0 && ids_.count({uint64_t(st.st_dev), uint64_t(st.st_ino)});
}

namespace {
// Ids are int32 downstream, so the largest usable vocabulary is 2^31.
void require_usable_vocab(int64_t vocab_size, const std::string& path) {
  MX_REQUIRE(vocab_size > 0 && vocab_size <= (int64_t{1} << 31), "vocab_size must be in [1, 2^31], got ",
             vocab_size, " (data '", path, "')");
}
}  // namespace

TokenDataset TokenDataset::open(const std::string& path, TokenFormat format, int64_t vocab_size,
                                int64_t random_tokens) {
  if (format == TokenFormat::kRandom) {
    require_usable_vocab(vocab_size, path);
    TokenDataset ds;
    ds.vocab_size_ = vocab_size;
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

  return open_listed(path, data_files(path), format, vocab_size);
}

TokenDataset TokenDataset::open_listed(const std::string& path, std::vector<std::string> files,
                                       TokenFormat format, int64_t vocab_size) {
  require_usable_vocab(vocab_size, path);
  MX_REQUIRE(format != TokenFormat::kRandom && !files.empty(), "data path '", path,
             "': no files listed");
  TokenDataset ds;
  ds.path_ = path;
  ds.vocab_size_ = vocab_size;
  ds.files_ = std::move(files);
  const std::vector<std::string>& listed = ds.files_;
  // Every id of a binary data set is read once here (the vocabulary check): terabytes of shards
  // take minutes, so a line every 10 s says how far it is (MXTRAIN_TEST_PROGRESS_S: the period).
  int64_t total = 0, done = 0;
  std::error_code ec;
  for (const std::string& file : listed) total += int64_t(std::filesystem::file_size(file, ec));
  const char* period_env = std::getenv("MXTRAIN_TEST_PROGRESS_S");
  const double period = period_env ? std::atof(period_env) : 10.0;
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  size_t file_index = 0;
  // (tests: a scan slowed down per piece read, to stop it in the middle)
  const char* slow_env = std::getenv("MXTRAIN_TEST_SLOW_SCAN_MS");
  const int slow_ms = slow_env ? std::atoi(slow_env) : 0;
  auto read = [&](int64_t bytes) {
    // A stop (SIGTERM, Ctrl-C) ends the scan: minutes of it for terabytes of shards, before a
    // first step that would then have taken the stop.
    if (g_stop_request.load()) throw StopRequested{};
    if (slow_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
    done += bytes;
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last).count() < period) return;
    last = now;
    info("data: checking ids: ", format_bytes(double(done)), " of ", format_bytes(double(total)),
         " (", int(100.0 * double(done) / double(std::max<int64_t>(total, 1))), "%), file ",
         file_index + 1, " of ", listed.size(), ", ",
         format_duration(std::chrono::duration<double>(now - start).count()));
  };
  for (const std::string& file : listed) {
    const int64_t before = done;
    const TokenFormat got = ds.open_file(file, format, vocab_size, read);
    done = before + int64_t(std::filesystem::file_size(file, ec));  // headers, unscanned files
    ++file_index;
    if (ds.format_ == TokenFormat::kAuto) ds.format_ = got;
    MX_REQUIRE(got == ds.format_, "data shard '", file, "' is ", token_format_name(got), " but '",
               listed[0], "' is ", token_format_name(ds.format_), ": every file of data path '",
               path, "' must have one format");
  }
  if (ds.format_ == TokenFormat::kText) ds.tokens_ = ds.owned_.data();
  return ds;
}

TokenFormat TokenDataset::open_file(const std::string& path, TokenFormat format,
                                    int64_t vocab_size, const std::function<void(int64_t)>& read) {
  FileDescriptor file;
  // O_NONBLOCK: a FIFO opens at once (and is then refused below) instead of blocking until a
  // writer appears; regular files ignore it.
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (file.fd < 0) throw_read_error(path, "cannot open", errno);
  if (const int64_t open_now = g_open_shards.load(); open_now > 0)
    keep_room_for_more_files(file.fd, path, open_now);
  struct stat st{};
  if (::fstat(file.fd, &st) != 0) throw_read_error(path, "cannot stat", errno);
  MX_REQUIRE(S_ISREG(st.st_mode), "data file '", path, "': not a regular file");
  const int64_t file_bytes = st.st_size;

  if (format == TokenFormat::kAuto) format = detect_format(file.fd, file_bytes, path);
  if (format == TokenFormat::kText) {
    MX_REQUIRE(vocab_size >= 256, "data file '", path, "': text data uses the byte-level tokenizer ",
               "(ids 0..255), which needs vocab_size >= 256, got ", vocab_size);
    MX_REQUIRE(file_bytes > 0, "data file '", path, "': empty (0 tokens)");
    if (format_ != TokenFormat::kText && format_ != TokenFormat::kAuto) return format;  // refused
    // Text is read into memory whole (binary shards stay on disk): at most half the memory the
    // process may use (the machine's or its container's), shared by the ranks on this host
    // (each holds a copy), all text files of training and validation data together (a 1 TB
    // file said "out of memory" and advised a smaller micro_batch).
    const size_t at = owned_.size();
    std::string memory_is;
    const int64_t memory = usable_memory(&memory_is);
    const int64_t local = launcher_ranks_on_this_host();  // each holds its own copy
    const int64_t held = g_text_bytes.load() + file_bytes;
    MX_REQUIRE(memory <= 0 || held <= memory / 2 / local, "data file '", path, "': ",
               format_bytes(double(held)), " of text data", held > int64_t(at) + file_bytes
                   ? " (training and validation data together)" : "",
               local > 1 ? str(" in each of the ", local, " processes on this host") : "",
               ", more than half ", memory_is, " (", format_bytes(double(memory)), ")",
               local > 1 ? " among them" : "", ": text is read into memory whole; convert it ",
               "to u16 / u32 token shards, which are read from disk");
    owned_.resize(at + static_cast<size_t>(file_bytes));
    g_text_bytes += file_bytes;
    text_held_ += file_bytes;
    pread_exact(file.fd, owned_.data() + at, static_cast<size_t>(file_bytes), 0, path);
    content_crc_ = crc32c_update(content_crc_, owned_.data() + at, static_cast<size_t>(file_bytes));
    token_width_ = 1;
    num_tokens_ += file_bytes;
    return format;  // every byte is < 256 <= vocab_size: nothing to scan
  }

  Shard shard;
  shard.path = path;
  switch (format) {
    case TokenFormat::kU16:
    case TokenFormat::kU32: {
      shard.token_width = format == TokenFormat::kU16 ? 2 : 4;
      MX_REQUIRE(file_bytes > 0, "data file '", path, "': empty (0 tokens)");
      MX_REQUIRE(file_bytes % shard.token_width == 0, "data file '", path, "': size ", file_bytes,
                 " bytes is not a multiple of the ", shard.token_width,
                 "-byte token width (truncated, or the wrong format?)");
      shard.num_tokens = file_bytes / shard.token_width;
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
      shard.token_width = header[1] == 1 ? 2 : 4;
      const int64_t count = header[2];
      MX_REQUIRE(count >= 0, "data file '", path, "': llm.c header has a negative token count ", count);
      MX_REQUIRE(count > 0, "data file '", path, "': empty (0 tokens)");
      const int64_t expected = kLlmcHeaderBytes + count * shard.token_width;
      MX_REQUIRE(file_bytes >= expected, "data file '", path, "': truncated: header says ", count,
                 " tokens (", expected, " bytes) but the file has ", file_bytes, " bytes");
      MX_REQUIRE(file_bytes == expected, "data file '", path, "': header says ", count, " tokens (",
                 expected, " bytes) but the file has ", file_bytes, " bytes");
      shard.num_tokens = count;
      shard.data_offset = kLlmcHeaderBytes;
      break;
    }
    default:
      MX_ASSERT(false, "unhandled token format");
  }
  if (format_ == TokenFormat::kText) return format;  // refused by the caller, unread

  const int64_t bad =
      shard.token_width == 2
          ? first_out_of_vocab<uint16_t>(file.fd, shard.data_offset, shard.num_tokens, vocab_size,
                                         path, read, &content_crc_, &content_crc_complete_)
          : first_out_of_vocab<uint32_t>(file.fd, shard.data_offset, shard.num_tokens, vocab_size,
                                         path, read, &content_crc_, &content_crc_complete_);
  if (bad < shard.num_tokens) {
    uint32_t id = 0;
    pread_exact(file.fd, &id, size_t(shard.token_width),
                off_t(shard.data_offset + bad * shard.token_width), path);
    throw UserError(str("data file '", path, "': token ", bad, " has id ", id,
                        ", which is >= vocab_size ", vocab_size, " (first such token)"));
  }
  // Windows are read with pread as the sampler asks for them (TokenDataset::copy), each id
  // checked again: the file may change under a run that lasts weeks.
  shard.first = num_tokens_;
  shard.fd = std::exchange(file.fd, -1);
  num_tokens_ += shard.num_tokens;
  shards_.push_back(std::move(shard));
  ++g_open_shards;
  return format;
}

TokenDataset::TokenDataset(TokenDataset&& other) noexcept { *this = std::move(other); }

TokenDataset& TokenDataset::operator=(TokenDataset&& other) noexcept {
  if (this == &other) return *this;
  release();
  path_ = std::move(other.path_);
  format_ = other.format_;
  token_width_ = other.token_width_;
  num_tokens_ = std::exchange(other.num_tokens_, 0);
  files_ = std::move(other.files_);
  shards_ = std::exchange(other.shards_, {});
  vocab_size_ = other.vocab_size_;
  content_crc_ = other.content_crc_;
  content_crc_complete_ = other.content_crc_complete_;
  owned_ = std::move(other.owned_);
  text_held_ = std::exchange(other.text_held_, 0);
  tokens_ = std::exchange(other.tokens_, nullptr);  // a moved vector keeps its buffer
  return *this;
}

TokenDataset::~TokenDataset() { release(); }

void TokenDataset::release() {
  for (Shard& shard : shards_)
    if (shard.fd >= 0) {
      ::close(shard.fd);
      --g_open_shards;
    }
  shards_.clear();
  owned_.clear();
  g_text_bytes -= std::exchange(text_held_, 0);
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
  if (shards_.empty()) {  // text bytes or generated ids, in memory
    if (token_width_ == 1) {
      for (int64_t k = 0; k < count; ++k) dst[k] = tokens_[start + k];
    } else {
      std::memcpy(dst, tokens_ + start * 4, static_cast<size_t>(count) * 4);
    }
    return;
  }
  // The shard holding `start` (the last whose first id is at or before it), then on across
  // shard ends: a window may span two files as it may span two documents of one.
  auto it = std::upper_bound(shards_.begin(), shards_.end(), start,
                             [](int64_t s, const Shard& shard) { return s < shard.first; });
  for (--it; count > 0; ++it) {
    const int64_t n = std::min(count, it->first + it->num_tokens - start);
    copy_from_shard(*it, start - it->first, n, dst);
    start += n;
    dst += n;
    count -= n;
  }
}

void TokenDataset::copy_from_shard(const Shard& shard, int64_t start, int64_t count,
                                   int32_t* dst) const {
  // u32 ids straight into dst; u16 ids into dst's upper half, then widened front to back (id
  // k's 4 bytes end at 4k + 4 <= 2 count + 2k, where id k's 2 bytes begin, for every k < count,
  // so no id is overwritten before it is read).
  const size_t bytes = static_cast<size_t>(count) * size_t(shard.token_width);
  auto* raw = reinterpret_cast<uint8_t*>(dst) + (shard.token_width == 2 ? 2 * count : 0);
  pread_exact(shard.fd, raw, bytes, static_cast<off_t>(shard.data_offset + start * shard.token_width),
              shard.path, "shrank during the run (the tokens it had at start-up are not all there)");
  if (shard.token_width == 2)
    for (int64_t k = 0; k < count; ++k) dst[k] = load<uint16_t>(raw, k);
  for (int64_t k = 0; k < count; ++k) {
    const uint32_t id = static_cast<uint32_t>(dst[k]);
    MX_REQUIRE(id < static_cast<uint64_t>(vocab_size_), "data file '", shard.path,
               "' changed during the run: token ", start + k, " has id ", id,
               ", which is >= vocab_size ", vocab_size_);
  }
}

}  // namespace mx
