// Token data on disk (or generated): one flat sequence of token ids that the sampler cuts into
// training windows. Raw and llm.c shards are memory-mapped so a multi-GB corpus costs no RAM up
// front and is shared by every rank on a node through the page cache.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mx {

enum class TokenFormat { kAuto, kU16, kU32, kLlmc, kText, kRandom };

// "auto", "u16", "u32", "llmc", "text", "random"; UserError (listing those) otherwise.
TokenFormat parse_token_format(const std::string& s);
const char* token_format_name(TokenFormat format);

class TokenDataset {
 public:
  // Opens and validates (see DESIGN.md, data/): every token is checked against vocab_size at
  // start-up, so a bad shard fails with its path, not hours later inside an embedding lookup.
  // Binary formats stay on disk and are read with pread as windows are asked for, each id
  // checked again (a file rewritten or cut short during the run is an error naming it).
  // kRandom ignores `path` and generates `random_tokens` ids from a fixed seed (benchmarks).
  static TokenDataset open(const std::string& path, TokenFormat format, int64_t vocab_size,
                           int64_t random_tokens = 1 << 22);

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
  // A hash of 64 windows of up to 1024 ids spread evenly over the data (its first and last ids
  // included), each id hashed with its position: what ranks compare to tell two copies of a
  // file apart when their sizes agree. Constant cost at any size (64 reads); copies that differ
  // only between the sampled windows are not told apart.
  uint64_t fingerprint() const;

 private:
  TokenDataset() = default;
  void release();

  std::string path_;
  TokenFormat format_ = TokenFormat::kAuto;
  const uint8_t* tokens_ = nullptr;  // little-endian ids of token_width_ bytes each
  int token_width_ = 0;              // 1 (text), 2 (u16) or 4 (u32, random)
  int64_t num_tokens_ = 0;
  int fd_ = -1;               // the open binary file (u16, u32, llmc); -1 when owned_ holds it
  int64_t data_offset_ = 0;   // bytes before the first id (the llm.c header)
  int64_t vocab_size_ = 0;
  std::vector<uint8_t> owned_;  // text bytes or generated ids
};

}  // namespace mx
