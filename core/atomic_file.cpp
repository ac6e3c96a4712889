#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/output_dirs.h"
#include "core/random_id.h"

namespace mx {

namespace {
std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= size_t(n);
  }
  return true;
}
}  // namespace

std::string stage_file(const std::string& path, const std::vector<ByteSpan>& pieces) {
  // The rename would put a regular file in place of whatever `path` is: a device (as root,
  // `--out /dev/null` replaced /dev/null), a FIFO, a socket. Those are refused, untouched.
  if (path.empty()) throw UserError("an output file path is empty");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw UserError(str("'", path, "' exists and is not a regular file; mxtrain writes a new file "
                        "there only in place of a regular one"));
  std::string tmp = str(path, ".tmp.", ::getpid());
  // A name that fits the file system with its ".tmp.<pid>" past the directory's NAME_MAX: a
  // short temporary name beside it instead, random (another host's process of the same pid
  // writing into a shared directory), (a valid --out of 250 characters was refused).
  const size_t slash = path.rfind('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const long name_max = ::pathconf(dir.empty() ? "." : dir.c_str(), _PC_NAME_MAX);
  const size_t limit = name_max > 0 ? size_t(name_max) : 255;
  if (base.size() <= limit && tmp.size() - dir.size() > limit) {
    tmp = str(dir, ".mxtrain.tmp.", random_hex_id(2));
  }
  auto fail = [&](const std::string& what, int err) {
    ::unlink(tmp.c_str());
    return StorageError(str("cannot write '", path, "': ", what, ": ", std::strerror(err)));
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    // (a name too long, a component that is a file: the path's fault, exit 2)
    throw_path_error(err, str("cannot write '", path, "': create ", tmp, ": ", std::strerror(err)));
  }
  bool ok = true;
  for (size_t i = 0; ok && i < pieces.size(); ++i) ok = write_all(fd, pieces[i].data, pieces[i].size);
  if (!ok) {
    int err = errno;
    ::close(fd);
    throw fail("write", err);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    throw fail("fsync", err);
  }
  if (::close(fd) != 0) throw fail("close", errno);
  return tmp;
}

void commit_staged_file(const std::string& staged, const std::string& path) {
  if (::rename(staged.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(staged.c_str());
    throw StorageError(str("cannot write '", path, "': rename: ", std::strerror(err)));
  }
  // The rename is durable only once the directory entry is. A failure here leaves a complete
  // file at `path`, so it is reported but nothing is removed.
  fsync_directory(parent_dir(path));
}

void commit_staged_files(const std::vector<StagedFile>& files) {
  struct Kept {
    std::string backup;   // where the file `path` had is kept; "" if it had none
    bool linked = false;  // the backup is a hard link (path still there), else a rename of it
  };
  const size_t n = files.size();
  std::vector<Kept> kept(n);
  auto unlink_staged_from = [&](size_t first) {
    for (size_t j = first; j < n; ++j) ::unlink(files[j].staged.c_str());
  };
  auto unlink_links = [&](size_t first, size_t end) {
    for (size_t j = first; j < end; ++j)
      if (kept[j].linked) ::unlink(kept[j].backup.c_str());
  };
  // Keep each existing file.
  for (size_t i = 0; i < n; ++i) {
    struct stat st {};
    // (nothing to keep; what is not a file, say a directory, no rename can replace either)
    if (::lstat(files[i].path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    kept[i].backup = str(parent_dir(files[i].path), "/.mxtrain.old.", random_hex_id(2));
    if (::link(files[i].path.c_str(), kept[i].backup.c_str()) == 0) {
      kept[i].linked = true;
    } else if (errno != EPERM && errno != EOPNOTSUPP && errno != EXDEV && errno != EMLINK) {
      const int err = errno;
      unlink_links(0, i);
      unlink_staged_from(0);
      throw StorageError(str("cannot write '", files[i].path, "': keep the file it replaces: ",
                             std::strerror(err)));
    }  // else: no hard links here; the file is renamed away just before its replacement
  }
  for (size_t i = 0; i < n; ++i) {
    const std::string& path = files[i].path;
    bool moved_away = false;
    int err = 0;
    if (!kept[i].backup.empty() && !kept[i].linked) {
      if (::rename(path.c_str(), kept[i].backup.c_str()) == 0) moved_away = true;
      else err = errno;
    }
    if (err == 0 && ::rename(files[i].staged.c_str(), path.c_str()) != 0) err = errno;
    if (err == 0) continue;
    // Put the set back as it was: this file if moved away, then each one already replaced
    // (a backup that cannot be renamed back stays, under its hidden name).
    if (moved_away) ::rename(kept[i].backup.c_str(), path.c_str());
    for (size_t j = i; j-- > 0;) {
      if (!kept[j].backup.empty()) ::rename(kept[j].backup.c_str(), files[j].path.c_str());
      else ::unlink(files[j].path.c_str());
    }
    unlink_links(i, n);
    unlink_staged_from(i);
    throw StorageError(str("cannot write '", path, "': rename: ", std::strerror(err)));
  }
  for (const Kept& k : kept)
    if (!k.backup.empty()) ::unlink(k.backup.c_str());
  std::vector<std::string> dirs;
  for (const StagedFile& f : files) {
    const std::string d = parent_dir(f.path);
    if (std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(d);
  }
  for (const std::string& d : dirs) fsync_directory(d);
}

void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<StagedFile> staged;
  try {
    for (const auto& [path, text] : files)
      staged.push_back({stage_file(path, {ByteSpan{text.data(), text.size()}}), path});
  } catch (...) {
    for (const StagedFile& f : staged) ::unlink(f.staged.c_str());
    throw;
  }
  commit_staged_files(staged);
}

bool fsync_directory(const std::string& dir) {
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return false;
  int rc = ::fsync(dir_fd);
  int err = errno;
  ::close(dir_fd);
  if (rc != 0 && err != EINVAL)
    throw StorageError(str("fsync of directory '", dir, "' failed: ", std::strerror(err)));
  return true;
}

void write_file_atomic(const std::string& path, const std::vector<ByteSpan>& pieces) {
  commit_staged_file(stage_file(path, pieces), path);
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, {ByteSpan{text.data(), text.size()}});
}

}  // namespace mx
