#include "checkpoint/storage.h"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>

#include "checkpoint/s3/client.h"
#include "checkpoint/s3/uri.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/output_dirs.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace mx {

constexpr const char* kManifestName = "manifest.json";

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

int64_t parse_step_dir_name(const std::string& name) {
  static const std::regex re("step_([0-9]{8})");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return -1;
  return std::stoll(m[1].str());
}

bool is_step_dir_name(const std::string& name) {
  const bool hidden = name.size() > 14 && name[0] == '.' && name[14] == '.' &&
                      parse_step_dir_name(name.substr(1, 13)) >= 0;
  return hidden || parse_step_dir_name(name) >= 0;
}

namespace {
bool is_hidden_step_dir_name(const std::string& name) {
  return is_step_dir_name(name) && name[0] == '.';
}

// A directory that holds a step's files: its manifest, or a rank file (a step a writer has
// renamed into place before its manifest).
bool holds_step_files(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "manifest.json", ec)) return true;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("rank_", 0) == 0 && n.size() > 12 && n.substr(n.size() - 12) == ".safetensors")
      return true;
  }
  return false;
}

// A checkpoint root: a directory holding a writer's hidden step directory or a step directory
// with a step's files.
bool is_checkpoint_root(const fs::path& dir, const fs::path& except = {}) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path() == except) continue;
    const std::string n = e.path().filename().string();
    if (is_hidden_step_dir_name(n) || (is_step_dir_name(n) && holds_step_files(e.path())))
      return true;
  }
  return false;
}
}  // namespace

std::string enclosing_step_dir(const std::string& path) {
  std::error_code ec;
  // A name alone is not a checkpoint (exports/step_00000030 is a common name for an export):
  // a hidden writer's name is; a step_NNNNNNNN is when it holds a step's files or sits in a
  // checkpoint root (the step a running writer has not made yet).
  for (fs::path p = fs::weakly_canonical(path, ec); !p.empty() && p != p.root_path();
       p = p.parent_path()) {
    const std::string name = p.filename().string();
    if (is_hidden_step_dir_name(name)) return p.string();
    if (is_step_dir_name(name) && (holds_step_files(p) || is_checkpoint_root(p.parent_path(), p)))
      return p.string();
  }
  return "";
}

bool holds_checkpoint_steps(const std::string& dir) {
  std::error_code ec;
  return is_checkpoint_root(fs::weakly_canonical(dir, ec));
}

std::string CheckpointStore::step_location(int64_t step) const {
  std::string r = root();
  if (r.empty() || r.back() != '/') r += '/';
  return r + step_dir_name(step);
}

CheckpointLocation parse_checkpoint_location(const std::string& location) {
  std::string loc = location;
  while (loc.size() > 1 && loc.back() == '/' && loc != "s3://") loc.pop_back();
  size_t slash = loc.find_last_of('/');
  std::string last = slash == std::string::npos ? loc : loc.substr(slash + 1);
  int64_t step = parse_step_dir_name(last);
  if (step < 0) return {loc, -1};
  std::string root = slash == std::string::npos ? "." : loc.substr(0, slash);
  if (root.empty()) root = "/";
  return {root, step};
}

namespace {

// Swaps two directories atomically (renameat2 RENAME_EXCHANGE); false where the file system or
// kernel cannot, with nothing changed.
bool exchange_dirs(const fs::path& a, const fs::path& b) {
#ifdef RENAME_EXCHANGE
  return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0;
#else
  (void)a, (void)b;
  return false;
#endif
}

void fsync_dir(const fs::path& dir) {
  if (!fsync_directory(dir.string()))
    throw StorageError(str("cannot open ", dir.string(), " to fsync"));
}

// ---------------------------------------------------------------------------------------------
class LocalStore final : public CheckpointStore {
 public:
  explicit LocalStore(std::string root) : root_(std::move(root)) {}
  bool is_s3() const override { return false; }
  std::string root() const override { return root_; }

  std::vector<int64_t> committed_steps() override {
    std::vector<int64_t> steps;
    std::error_code ec;
    if (!fs::is_directory(root_, ec)) return steps;
    for (auto& e : fs::directory_iterator(root_, ec)) {
      int64_t s = parse_step_dir_name(e.path().filename().string());
      if (s >= 0 && fs::is_directory(e.path(), ec) &&
          fs::is_regular_file(e.path() / kManifestName, ec))
        steps.push_back(s);
    }
    std::sort(steps.begin(), steps.end());
    return steps;
  }

  StoredFile write_file(int64_t step, const std::string& name, const void* data,
                        size_t size) override {
    fs::path dir = partial_dir(step);
    create_output_dirs(dir.string(), "cannot create checkpoint directory");
    write_file_atomic((dir / name).string(), {{data, size}});
    return {name, uint64_t(size), ""};
  }

  void commit(int64_t step, const std::string& manifest) override {
    fs::path dir = partial_dir(step);
    write_file_atomic((dir / kManifestName).string(), manifest);
    fsync_dir(dir);
    fs::path final_dir = step_dir(step);
    std::error_code ec;
    if (fs::exists(final_dir, ec) && exchange_dirs(dir, final_dir)) {
      // A rerun of the same step, swapped in atomically: the earlier step now sits at the
      // partial name (remove_uncommitted deletes it there too, should this stop first).
      std::error_code ec2;
      fs::remove_all(dir, ec2);
    } else if (fs::exists(final_dir, ec)) {  // no atomic exchange here: two renames
      fs::path old = fs::path(root_) / str(".", step_dir_name(step), ".old");
      fs::remove_all(old, ec);
      fs::rename(final_dir, old, ec);
      if (ec) throw StorageError(str("cannot replace ", final_dir.string(), ": ", ec.message()));
      fs::rename(dir, final_dir, ec);
      std::error_code ec2;
      if (ec) fs::rename(old, final_dir, ec2);  // the earlier step stays committed
      else fs::remove_all(old, ec2);
    } else {
      fs::rename(dir, final_dir, ec);
    }
    if (ec)
      throw StorageError(str("cannot commit checkpoint ", final_dir.string(), ": ", ec.message()));
    fsync_dir(root_);
  }

  void remove_step(int64_t step) override {
    // Uncommit first (rename to a hidden name), then delete: a kill in the middle of deleting
    // never leaves a step directory with a manifest but missing files.
    std::error_code ec;
    fs::path dir = step_dir(step);
    if (!fs::exists(dir, ec)) return;
    fs::path hidden = fs::path(root_) / str(".", step_dir_name(step), ".del");
    fs::remove_all(hidden, ec);
    fs::rename(dir, hidden, ec);
    if (ec) throw StorageError(str("cannot remove checkpoint ", dir.string(), ": ", ec.message()));
    fs::remove_all(hidden, ec);
  }

  void remove_uncommitted() override {
    static const std::regex re("\\.step_[0-9]{8}\\.(partial|old|del)|\\.step_[0-9]{8}\\.(tmp|old|del)-[0-9]+");
    std::error_code ec;
    if (!fs::is_directory(root_, ec)) return;
    std::vector<fs::path> stale;
    for (auto& e : fs::directory_iterator(root_, ec))
      if (std::regex_match(e.path().filename().string(), re)) stale.push_back(e.path());
    for (auto& p : stale) {
      // ".step_N.old" without step_N: a replacing commit (above) stopped between its two
      // renames, and this is the committed step it was replacing: put it back.
      const std::string name = p.filename().string();
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".old") == 0) {
        const fs::path committed = fs::path(root_) / name.substr(1, name.size() - 5);
        std::error_code ec2;
        if (!fs::exists(committed, ec2) && fs::is_regular_file(p / kManifestName, ec2)) {
          fs::rename(p, committed, ec2);
          if (!ec2) continue;
        }
      }
      fs::remove_all(p, ec);
    }
  }

  std::optional<StoredFile> stat(int64_t step, const std::string& name) override {
    std::error_code ec;
    fs::path p = step_dir(step) / name;
    if (!fs::is_regular_file(p, ec)) return std::nullopt;
    uintmax_t size = fs::file_size(p, ec);
    if (ec) throw StorageError(str("cannot stat ", p.string(), ": ", ec.message()));
    return StoredFile{name, uint64_t(size), ""};
  }

  void read_range(int64_t step, const std::string& name, uint64_t offset, uint64_t length,
                  void* dst) override {
    fs::path p = step_dir(step) / name;
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw StorageError(str("cannot open ", p.string(), ": ", std::strerror(errno)));
    uint8_t* out = static_cast<uint8_t*>(dst);
    uint64_t done = 0;
    while (done < length) {
      ssize_t n = ::pread(fd, out + done, size_t(std::min<uint64_t>(length - done, 1u << 30)),
                          off_t(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        std::string why = n < 0 ? std::strerror(errno) : "file is shorter than expected";
        ::close(fd);
        throw StorageError(str("cannot read ", p.string(), " at byte ", offset + done, ": ", why));
      }
      done += uint64_t(n);
    }
    ::close(fd);
  }

  std::string read_small(int64_t step, const std::string& name, uint64_t max_bytes) override {
    fs::path p = step_dir(step) / name;
    std::error_code ec;
    uintmax_t size = fs::file_size(p, ec);
    MX_REQUIRE(!ec, "cannot read ", p.string());
    MX_REQUIRE(size <= max_bytes, p.string(), " is ", size, " bytes, more than the ", max_bytes,
               " such a file can be");
    std::string data(size_t(size), '\0');
    if (size) read_range(step, name, 0, size, data.data());
    return data;
  }

  void read_stream(int64_t step, const std::string& name,
                   const std::function<void(const uint8_t*, size_t)>& sink) override {
    fs::path p = step_dir(step) / name;
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw StorageError(str("cannot open ", p.string(), ": ", std::strerror(errno)));
    std::vector<uint8_t> buf(4 << 20);
    try {
      for (;;) {
        ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)  // (the reason: an I/O error said only "cannot read")
          throw StorageError(str("cannot read ", p.string(), ": ", std::strerror(errno)));
        if (n == 0) break;
        sink(buf.data(), size_t(n));
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  }

 private:
  fs::path step_dir(int64_t step) const { return fs::path(root_) / step_dir_name(step); }
  fs::path partial_dir(int64_t step) const {
    return fs::path(root_) / str(".", step_dir_name(step), ".partial");
  }
  std::string root_;
};

// ---------------------------------------------------------------------------------------------
class S3Store final : public CheckpointStore {
 public:
  S3Store(std::shared_ptr<s3::S3Client> client, s3::S3Uri uri)
      : client_(std::move(client)), uri_(std::move(uri)) {
    while (!uri_.key.empty() && uri_.key.back() == '/') uri_.key.pop_back();
  }
  bool is_s3() const override { return true; }
  std::string root() const override { return uri_.str(); }

  std::vector<int64_t> committed_steps() override {
    std::set<int64_t> steps;
    for (const auto& o : client_->list_all(uri_.bucket, list_prefix())) {
      auto [step, name] = split(o.key);
      if (step >= 0 && name == kManifestName) steps.insert(step);
    }
    return {steps.begin(), steps.end()};
  }

  StoredFile write_file(int64_t step, const std::string& name, const void* data,
                        size_t size) override {
    // Replacing a committed step (a run with resume = none over an older run's steps): S3 has
    // no rename to swap it whole as the local store does, so it is uncommitted before its
    // first file is overwritten. Writing over the files of a step whose manifest still stood
    // left a step that looked committed but failed its ETag checks, and a kill then lost it
    // anyway; now a reader sees it uncommitted (and a rerun removes its rest).
    bool checked = false;
    {
      std::lock_guard<std::mutex> lock(uncommit_mu_);
      checked = uncommitted_.count(step) != 0;
    }
    if (!checked) {
      // Only a step that is committed is uncommitted: a DELETE before every step's first
      // file stopped a role without s3:DeleteObject at its first checkpoint. The step counts
      // as uncommitted only once the DELETE succeeded: marked before, a failed DELETE's
      // retry wrote over the committed step's files with its manifest still standing.
      if (client_->head_object(uri_.bucket, key(step, kManifestName)))
        client_->delete_object(uri_.bucket, key(step, kManifestName));
      std::lock_guard<std::mutex> lock(uncommit_mu_);
      uncommitted_.insert(step);
    }
    std::string etag = client_->upload(uri_.bucket, key(step, name), data, size);
    return {name, uint64_t(size), etag};
  }

  void commit(int64_t step, const std::string& manifest) override {
    client_->put_object(uri_.bucket, key(step, kManifestName), manifest.data(), manifest.size());
  }

  void remove_step(int64_t step) override {
    client_->delete_object(uri_.bucket, key(step, kManifestName));  // uncommit first
    for (const auto& o : client_->list_all(uri_.bucket, list_prefix()))
      if (split(o.key).first == step) client_->delete_object(uri_.bucket, o.key);
  }

  void remove_uncommitted() override {
    std::map<int64_t, std::vector<std::string>> keys;
    std::set<int64_t> committed;
    for (const auto& o : client_->list_all(uri_.bucket, list_prefix())) {
      auto [step, name] = split(o.key);
      if (step < 0) continue;
      if (name == kManifestName) committed.insert(step);
      keys[step].push_back(o.key);
    }
    for (const auto& [step, ks] : keys) {
      if (committed.count(step)) continue;
      // A role that may not delete (no s3:DeleteObject, Object Lock) could not resume after a
      // stop mid-checkpoint: every restart ended here. Files of an uncommitted step are never
      // read (a reader opens the files its manifest names, verify checks those alone); a new
      // write of the step replaces those of the same names, and remove_step takes them all.
      size_t removed = 0;
      try {
        for (const auto& k : ks) {
          client_->delete_object(uri_.bucket, k);
          ++removed;
        }
      } catch (const std::exception& e) {
        warn(str("could not remove the ", ks.size() - removed, " file",
                 ks.size() - removed == 1 ? "" : "s", " an interrupted checkpoint left in ",
                 location(step, ""), " (", e.what(), "); they are never read (a step's files ",
                 "are those its manifest lists) and stay until the step is removed"));
      }
    }
    abort_open_uploads();
  }

  bool claim_writer(const std::string& claim) override {
    client_->put_object(uri_.bucket, writer_key(), claim.data(), claim.size());
    try {
      client_->get_object(uri_.bucket, writer_key(), kMaxWriterBytes);
      return true;
    } catch (const UserError& e) {  // (403: a role without s3:GetObject)
      warn(str("cannot read back ", writer_uri(), " (", e.what(), "): this run cannot tell ",
               "whether another run writes checkpoints under ", root(), " too"));
      return false;
    }
  }

  void check_writer(const std::string& claim) override {
    if (claim.empty()) return;
    const auto info = client_->head_object(uri_.bucket, writer_key());
    if (!info) {  // removed by hand: no other run named itself since (it would be there)
      warn(str(writer_uri(), " was removed while this run writes under ", root(),
               "; it names itself there again"));
      client_->put_object(uri_.bucket, writer_key(), claim.data(), claim.size());
      return;
    }
    // (no If-Match: a claim replaced since the HEAD is read as it now is)
    const std::string now =
        info->size <= kMaxWriterBytes
            ? client_->get_object(uri_.bucket, writer_key(), kMaxWriterBytes)
            : std::string("(") + std::to_string(info->size) + " bytes)";
    if (now == claim) return;
    throw StorageError(str(
        "another run has taken over ", root(), " since this run began writing there: ",
        writer_uri(), " now names ", describe_claim(now), "; this run stops here (two runs on ",
        "one checkpoint.s3_uri would replace and delete each other's steps: give each run its ",
        "own prefix)"));
  }

  std::optional<StoredFile> stat(int64_t step, const std::string& name) override {
    auto info = client_->head_object(uri_.bucket, key(step, name));
    if (!info) {
      // A HEAD's 404 has no body, so a missing bucket read as a missing file ("not committed"):
      // one listing, of the prefix committed_steps() lists too, tells them apart (a missing
      // bucket is S3's NoSuchBucket error, exit 2).
      client_->list_objects_v2(uri_.bucket, list_prefix(), "", 1);
      return std::nullopt;
    }
    return StoredFile{name, info->size, info->etag};
  }

  void read_range(int64_t step, const std::string& name, uint64_t offset, uint64_t length,
                  void* dst) override {
    if (length == 0) return;
    client_->get_range(uri_.bucket, key(step, name), offset, length, dst);
  }

  std::string read_small(int64_t step, const std::string& name, uint64_t max_bytes) override {
    auto info = client_->head_object(uri_.bucket, key(step, name));
    if (!info) throw StorageError(str(location(step, name), ": no such object"));
    MX_REQUIRE(info->size <= max_bytes, location(step, name), " is ", info->size,
               " bytes, more than the ", max_bytes, " such a file can be");
    // The GET takes no more than the HEAD's size, of the object the HEAD saw: a server or an
    // object replaced since answering 300 MB was buffered whole.
    return client_->get_object(uri_.bucket, key(step, name), info->size, info->etag);
  }

  void read_stream(int64_t step, const std::string& name,
                   const std::function<void(const uint8_t*, size_t)>& sink) override {
    client_->download(uri_.bucket, key(step, name), sink);
  }

 private:
  // Multipart uploads a stopped writer left open (a kill mid-file) keep their parts, billed,
  // until aborted; nothing else of this prefix is being written when remove_uncommitted runs
  // (the start of a run), so every open upload of a step file here is a dead writer's. It is a
  // clean-up, not the run's job: a role without s3:ListBucketMultipartUploads or
  // s3:AbortMultipartUpload, or an S3 that fails it, gets a warning and the run goes on.
  void abort_open_uploads() {
    size_t aborted = 0;
    try {
      for (const auto& u : client_->list_multipart_uploads(uri_.bucket, list_prefix())) {
        if (split(u.key).first < 0) continue;  // not a step file of this prefix
        client_->abort_multipart_upload(uri_.bucket, u.key, u.upload_id);
        ++aborted;
      }
    } catch (const std::exception& e) {
      warn(str("could not abort the multipart uploads stopped runs left open under ", root(),
               " (", aborted, " aborted): ", e.what(),
               "; a bucket lifecycle rule for incomplete uploads removes their parts"));
      return;
    }
    if (aborted > 0)
      info("aborted ", aborted, " multipart upload", aborted == 1 ? "" : "s",
           " a stopped run left open under ", root());
  }

  static constexpr uint64_t kMaxWriterBytes = 4096;
  std::string writer_key() const { return prefix() + ".mxtrain.writer"; }
  std::string writer_uri() const { return "s3://" + uri_.bucket + "/" + writer_key(); }
  // "run R on host H (pid P), started T" from a claim's JSON; its text if it is not one.
  static std::string describe_claim(const std::string& text) {
    try {
      const auto j = nlohmann::json::parse(text);
      return str("run ", j.at("run").get<std::string>(), " on host ",
                 j.at("host").get<std::string>(), " (pid ", j.at("pid").get<int64_t>(),
                 "), started ", j.at("started").get<std::string>());
    } catch (const std::exception&) {
      return "'" + shortened(one_line(text), 200) + "'";
    }
  }

  std::mutex uncommit_mu_;
  // Steps this store has made sure are not committed (manifest found absent, or deleted)
  // before writing their files.
  std::set<int64_t> uncommitted_;
  std::string prefix() const { return uri_.key.empty() ? "" : uri_.key + "/"; }
  // Listings ask for the prefix without its trailing '/' and filter here (split() checks the
  // '/'): the same keys on AWS, and it keeps moto's signature check (which mishandles an
  // encoded '/' in a query, for boto3 too) usable for single-level prefixes in tests.
  std::string list_prefix() const { return uri_.key; }
  std::string key(int64_t step, const std::string& name) const {
    return prefix() + step_dir_name(step) + "/" + name;
  }
  std::string location(int64_t step, const std::string& name) const {
    return "s3://" + uri_.bucket + "/" + key(step, name);
  }
  // "<prefix>step_00000100/name" -> (100, "name"); (-1, "") for anything else.
  std::pair<int64_t, std::string> split(const std::string& k) const {
    std::string p = prefix();
    if (k.compare(0, p.size(), p) != 0) return {-1, ""};
    std::string rest = k.substr(p.size());
    size_t slash = rest.find('/');
    if (slash == std::string::npos) return {-1, ""};
    int64_t step = parse_step_dir_name(rest.substr(0, slash));
    std::string name = rest.substr(slash + 1);
    if (step < 0 || name.empty() || name.find('/') != std::string::npos) return {-1, ""};
    return {step, name};
  }

  std::shared_ptr<s3::S3Client> client_;
  s3::S3Uri uri_;
};

}  // namespace

std::unique_ptr<CheckpointStore> open_s3_checkpoint_store(std::shared_ptr<s3::S3Client> client,
                                                          const std::string& uri) {
  return std::make_unique<S3Store>(std::move(client), s3::parse_s3_uri(uri));
}

std::unique_ptr<CheckpointStore> open_checkpoint_store(const std::string& root) {
  MX_REQUIRE(!root.empty(), "the checkpoint location is empty");
  if (!s3::is_s3_uri(root)) return std::make_unique<LocalStore>(root);
  s3::S3Uri uri = s3::parse_s3_uri(root);
  s3::S3Config cfg = s3::S3Config::from_env();
  if (const char* ps = std::getenv("MXTRAIN_S3_PART_SIZE"); ps && *ps) {
    char* end = nullptr;
    // (digits only: strtoull takes "-1" as 18446744073709551615, and skips leading spaces)
    const bool digits = *ps >= '0' && *ps <= '9';
    errno = 0;
    unsigned long long v = digits ? std::strtoull(ps, &end, 10) : 0;
    MX_REQUIRE(digits && errno == 0 && end && *end == '\0' && v >= s3::kMinPartSize,
               "MXTRAIN_S3_PART_SIZE='", shortened(ps, 40),
               "' must be a byte count of at least 5 MiB (", s3::kMinPartSize, ")");
    cfg.part_size = cfg.multipart_threshold = v;
  }
  if (const char* ma = std::getenv("MXTRAIN_S3_MAX_ATTEMPTS"); ma && *ma) {
    char* end = nullptr;
    long v = std::strtol(ma, &end, 10);
    MX_REQUIRE(end && *end == '\0' && v >= 1 && v <= 100, "MXTRAIN_S3_MAX_ATTEMPTS='",
               shortened(ma, 40),
               "' must be a number of tries from 1 to 100");
    cfg.retry.max_attempts = int(v);
  }
  auto client = std::make_shared<s3::S3Client>(cfg, std::make_shared<s3::DefaultCredentialsChain>());
  return std::make_unique<S3Store>(std::move(client), std::move(uri));
}

}  // namespace mx
