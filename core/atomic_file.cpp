#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
