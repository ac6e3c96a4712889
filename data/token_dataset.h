// Token data on disk (or generated): one flat sequence of token ids that the sampler cuts into
// training windows. It may be one file or several shards (a directory, or a glob such as
// "fineweb_train_*.bin"), read as their concatenation in sorted path order. Binary shards stay
// on disk and are read with pread as windows are asked for, so a multi-GB corpus costs no RAM
// up front and is shared by every rank on a node through the page cache.
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mx {

enum class TokenFormat { kAuto, kU16, kU32, kLlmc, kText, kRandom };

// "auto", "u16", "u32", "llmc", "text", "random"; UserError (listing those) otherwise.
TokenFormat parse_token_format(const std::string& s);
const char* token_format_name(TokenFormat format);

// The files data path `path` names, in the order they are read: itself; a directory's regular
// files (recursively, hidden names and what is under them skipped; UserError if none), sorted;
// or, when no such file exists and it holds * ? or [, a glob's matches, sorted (UserError if
// none, or if one is a directory).
std::vector<std::string> data_files(const std::string& path);

// True when `file` is, or once written would be, one of the files data path `data_path` reads,
// by its name: the file itself, a non-hidden path under the directory, a match of the pattern
// (both made absolute and normal, so ./d/*.bin covers /abs/d/x.bin). What the trainer must not
// write its metrics or checkpoints to; DataFileIds adds the files it reads under other names.
bool data_path_covers(const std::string& data_path, const std::string& file);

// The files of a data path's listing (data_files), by device and inode: whether an existing
// path is one of them under another name (a symbolic link to a shard, a hard link).
class DataFileIds {
 public:
  explicit DataFileIds(const std::vector<std::string>& files);
  bool contains(const std::string& file) const;

 private:
  std::set<std::pair<uint64_t, uint64_t>> ids_;
};

class TokenDataset {
 public:
  // Opens and validates (see DESIGN.md, data/): every token is checked against vocab_size at
  // start-up, so a bad shard fails with its path, not hours later inside an embedding lookup.
  // Binary formats stay on disk and are read with pread as windows are asked for, each id
  // checked again (a file rewritten or cut short during the run is an error naming it).
  // kRandom ignores `path` and generates `random_tokens` ids from a fixed seed (benchmarks).
  // `path`: a file; a directory (every regular file under it, hidden ones skipped, in sorted
  // path order); or, when no such file exists, a glob pattern (its matches, sorted). Every
  // shard must have the same format (llm.c version 1 and 2 shards may mix).
  static TokenDataset open(const std::string& path, TokenFormat format, int64_t vocab_size,
                           int64_t random_tokens = 1 << 22);
  // The same with data_files(path) already listed (the trainer lists each data path once: a
  // directory may hold 100k shards).
  static TokenDataset open_listed(const std::string& path, std::vector<std::string> files,
                                  TokenFormat format, int64_t vocab_size);

  TokenDataset(TokenDataset&& other) noexcept;
  TokenDataset& operator=(TokenDataset&& other) noexcept;
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;
  ~TokenDataset();

  int64_t size() const { return num_tokens_; }
  int32_t at(int64_t i) const;
  void copy(int64_t start, int64_t count, int32_t* dst) const;  // tokens [start, start+count)
  const std::string& path() const { return path_; }
  TokenFormat format() const { return format_; }
  int64_t num_files() const { return int64_t(files_.size()); }  // 1 for one file; 0 random
  const std::vector<std::string>& files() const { return files_; }  // data_files(path())
  // A hash of 64 windows of up to 1024 ids spread evenly over the data (its first and last ids
  // included), each id hashed with its position: what ranks compare to tell two copies of a
  // file apart when their sizes agree. Constant cost at any size (64 reads); copies that differ
  // only between the sampled windows are not told apart.
  uint64_t fingerprint() const;
  // CRC32C of every id's bytes, file after file (headers left out), computed by the vocabulary
  // check's one read of the data; none for random data, or for u16 data under a vocabulary
  // above 65535 (nothing to check, so nothing read). What ranks and resumes compare when the
  // fingerprint agrees: copies differing only between its sampled windows.
  std::optional<uint32_t> content_crc32c() const {
    return content_crc_complete_ && !files_.empty() ? std::optional<uint32_t>(content_crc_)
                                                    : std::nullopt;
  }

 private:
  TokenDataset() = default;
  void release();

  // A binary shard: ids [first, first + num_tokens) of the whole, read from fd with pread.
  struct Shard {
    std::string path;
    int fd = -1;
    int64_t data_offset = 0;  // bytes before the first id (the llm.c header)
    int token_width = 0;      // 2 or 4
    int64_t first = 0;
    int64_t num_tokens = 0;
  };
  void copy_from_shard(const Shard& shard, int64_t start, int64_t count, int32_t* dst) const;
  // Opens one file (format kAuto: detected) and appends its ids: text bytes to owned_, a
  // binary file as a shard (its ids checked against vocab_size). Returns its format; one that
  // differs from format_ is left unread for the caller to refuse.
  // `read` is told the bytes of each piece the check reads (progress).
  TokenFormat open_file(const std::string& path, TokenFormat format, int64_t vocab_size,
                        const std::function<void(int64_t)>& read);

  std::string path_;
  TokenFormat format_ = TokenFormat::kAuto;
  const uint8_t* tokens_ = nullptr;  // in memory: text bytes (width 1) or generated ids (4)
  int token_width_ = 0;              // in memory: 1 (text) or 4 (random); 0 for shards
  int64_t num_tokens_ = 0;
  std::vector<std::string> files_;  // the files read, in order (empty for random data)
  std::vector<Shard> shards_;  // binary files (u16, u32, llmc); empty when owned_ holds the data
  int64_t vocab_size_ = 0;
  uint32_t content_crc_ = 0;          // content_crc32c()
  bool content_crc_complete_ = true;  // every id went into it
  std::vector<uint8_t> owned_;  // text bytes or generated ids
  int64_t text_held_ = 0;       // of owned_, text bytes: counted in the process's text budget
};

}  // namespace mx
