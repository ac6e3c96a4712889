// Files written whole or not at all: the rule behind "never a partial write over good data".
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace mx {

struct ByteSpan {
  const void* data;
  size_t size;
};

// Writes the pieces, in order, to path + ".tmp.<pid>" (a name that would pass NAME_MAX so:
// .mxtrain.tmp.<random> beside it), fsyncs it, renames it over `path` and
// fsyncs the directory (a filesystem that cannot fsync a directory is tolerated). On failure
// the temporary file is removed, `path` keeps what it had, and a StorageError names `path`.
// A `path` that exists as something other than a regular file (after symlinks: a directory, a
// device, a FIFO) is a UserError, and nothing is written.
void write_file_atomic(const std::string& path, const std::vector<ByteSpan>& pieces);
void write_file_atomic(const std::string& path, const std::string& text);

// write_file_atomic in two halves, for files that must change together: stage_file writes and
// fsyncs the temporary file and returns its name (on failure: removed, StorageError naming
// `path`); commit_staged_file renames it over `path` and fsyncs the directory (a failed rename
// removes it). Staging every file first leaves only renames, which need no space, to the end.
std::string stage_file(const std::string& path, const std::vector<ByteSpan>& pieces);
void commit_staged_file(const std::string& staged, const std::string& path);

// Commits staged files that must change together (files[i] = {staged, path}): all of them or,
// should a rename fail, none. Each existing `path` is first kept under a short hidden name
// beside it (a hard link, so `path` never goes missing; a rename where the file system has no
// links); a failed rename puts back every file already replaced (and removes those that did not
// exist before), removes the staged files left, and throws StorageError naming the path. Then
// the kept copies are removed and each directory fsynced once (a failure there leaves the new
// set complete and is reported). A kill during the renames can still leave a mixed set.
struct StagedFile {
  std::string staged, path;
};
void commit_staged_files(const std::vector<StagedFile>& files);

// Writes texts (path, text) that must change together: each staged (a failure removes those
// staged so far, every path unchanged), then commit_staged_files.
void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files);

// fsyncs a directory so that renames into it are durable. Returns false (and does nothing) if
// the directory cannot be opened; an fsync failure throws StorageError, except EINVAL: a
// filesystem that cannot fsync a directory is tolerated.
bool fsync_directory(const std::string& dir);

}  // namespace mx
