// Where checkpoints live: a local directory or an S3 prefix, behind one small interface so the
// format, the writer and the tools never care which.
//
//   <root>/step_00000100/manifest.json   the commit (written last)
//                        config.json, state.json, rank_00000-of-00002.safetensors, ...
//
// Local: files of a step being written go into <root>/.step_00000100.partial/ (each one written
// whole: temporary name, fsync, rename); commit writes the manifest there and renames the
// directory into place, so a step directory either holds a manifest or does not exist.
// S3: objects go straight to <prefix>/step_00000100/<name>; the manifest is uploaded last and
// a step is committed exactly when its manifest object exists. Uncommit (retention, replacing a
// step) deletes the manifest first, then the rest, so a reader never sees a committed step with
// missing files.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mx {

namespace s3 {
class S3Client;
}

struct StoredFile {
  std::string name;
  uint64_t size = 0;
  std::string etag;  // S3 only (the object's ETag, without quotes); "" for local files
};

class CheckpointStore {
 public:
  virtual ~CheckpointStore() = default;
  virtual bool is_s3() const = 0;
  // The root as users write it: "/path/ckpt" or "s3://bucket/prefix".
  virtual std::string root() const = 0;
  // The step's location as users write it: "<root>/step_00000100".
  std::string step_location(int64_t step) const;

  // Steps whose manifest exists (committed; not verified), oldest first.
  virtual std::vector<int64_t> committed_steps() = 0;

  // One file of a step not yet committed; written whole or not at all, may replace an earlier
  // attempt. StorageError on failure (after the S3 client's retries).
  virtual StoredFile write_file(int64_t step, const std::string& name, const void* data,
                                size_t size) = 0;
  // Commits `step`: the manifest goes last. A committed step of that number is replaced.
  virtual void commit(int64_t step, const std::string& manifest) = 0;
  // Uncommits and deletes a step (a missing one is fine).
  virtual void remove_step(int64_t step) = 0;
  // Removes what writers that died left behind (partial steps). Only while nothing writes.
  virtual void remove_uncommitted() = 0;

  // One writer per root. S3: before anything else this run writes under the prefix, it names
  // itself in `<prefix>/.mxtrain.writer` (`claim`, a text unique to the run), and before each
  // commit check_writer makes sure the object still holds that text: a later run on the same
  // prefix (a resubmitted job while the first still runs, another config naming the same
  // checkpoint.s3_uri) has taken over, and this one stops with a StorageError instead of
  // replacing and deleting steps among the other's. A role that may not read the object back
  // gets a warning and no checks. The trainer claims before it picks a step to resume from. Local roots: nothing (the directory's lock, train/run_lock.h,
  // keeps a second run out).
  // claim_writer returns whether check_writer can read the claim back (false: the warning
  // was given, do not check).
  virtual bool claim_writer(const std::string& claim) { (void)claim; return true; }
  virtual void check_writer(const std::string& claim) { (void)claim; }

  // Reading a committed step. size_of: nullopt when the file does not exist.
  virtual std::optional<StoredFile> stat(int64_t step, const std::string& name) = 0;
  // Exactly `length` bytes from `offset` (StorageError if the file is shorter).
  virtual void read_range(int64_t step, const std::string& name, uint64_t offset,
                          uint64_t length, void* dst) = 0;
  // A whole small file (manifest, config, state); UserError above max_bytes, checked before
  // anything is read.
  virtual std::string read_small(int64_t step, const std::string& name, uint64_t max_bytes) = 0;
  // Streams a whole file in order (for checksums).
  virtual void read_stream(int64_t step, const std::string& name,
                           const std::function<void(const uint8_t*, size_t)>& sink) = 0;
};

// "s3://bucket/prefix" (trailing '/' ignored) or a local directory. S3 uses the environment's
// credentials chain, region and endpoint (see checkpoint/s3/client.h); MXTRAIN_S3_PART_SIZE
// (bytes, at least 5 MiB) sets the multipart part size, MXTRAIN_S3_MAX_ATTEMPTS (default 8)
// the tries per request.
std::unique_ptr<CheckpointStore> open_checkpoint_store(const std::string& root);
// For tests: an S3 store over a given client.
std::unique_ptr<CheckpointStore> open_s3_checkpoint_store(std::shared_ptr<s3::S3Client> client,
                                                          const std::string& uri);

// "step_00000100"; and the step of such a name, or -1.
std::string step_dir_name(int64_t step);
int64_t parse_step_dir_name(const std::string& name);
// The checkpoint step directory that a local `path` is or lies inside, symbolic links and ".."
// resolved; "" if none. Outputs there would change a checkpoint's files. A step directory is a
// writer's hidden one (.step_NNNNNNNN.partial and kin), or a step_NNNNNNNN that holds a step's
// files (manifest.json, a rank file) or lies in a checkpoint root: by name alone,
// exports/step_00000030 (an export named after its step) was refused.
std::string enclosing_step_dir(const std::string& path);
// True when the local directory `dir` is a checkpoint root: it holds a step directory with a
// step's files, or a writer's hidden one.
bool holds_checkpoint_steps(const std::string& dir);
// True for a step directory's name (step_NNNNNNNN) or a writer's hidden one
// (.step_NNNNNNNN.partial, .old, .del, ...): what enclosing_step_dir looks for.
bool is_step_dir_name(const std::string& name);

// A location users give (CHECKPOINT arguments, checkpoint.resume): "<root>/step_NNNNNNNN" is
// that step of that root; anything else is a root (step = -1: its newest committed step).
struct CheckpointLocation {
  std::string root;
  int64_t step = -1;
};
CheckpointLocation parse_checkpoint_location(const std::string& location);

}  // namespace mx
