#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "core/output_dirs.h"

namespace mx {

DirLock::DirLock(const std::string& dir, const std::string& key)
    : path_(dir + "/.mxtrain.lock") {
  create_output_dirs(dir, str("cannot create ", key));
  // The file is removed at the end while still locked: a run that opened it just before
  // would then hold a lock on a file no longer in the directory. So a lock counts only if the
  // file locked is still the one at the path; otherwise open the new one and try again.
  for (int attempt = 0; attempt < 100; ++attempt) {
    // Made here (O_EXCL), or there already: a file this run made is removed again where the
    // file system has no locks.
    int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    const bool created = fd >= 0;
    if (fd < 0 && errno == EEXIST) {
      fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
      // A file another user's killed run left (0644): flock needs no write access, so it is
      // taken read-only (it stopped that directory for everyone else for good).
      if (fd < 0 && errno == EACCES)
        fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0 && errno == ENOENT) continue;  // removed in between (a run ending): again
    }
    if (fd < 0) {
      const int err = errno;
      throw_path_error(err, str("cannot create the lock file ", path_, " in ", key, " ", dir,
                                ": ", std::strerror(err)));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err != EWOULDBLOCK) {  // no flock here (ENOLCK, EOPNOTSUPP): run unguarded
        ::close(fd);
        // (a file that was there stays: where flock fails only now and then, NFS's lock
        // daemon say, another run may hold it)
        if (created) ::unlink(path_.c_str());
        warn(str(key, " ", dir, ": this file system takes no file locks (flock: ",
                 std::strerror(err), "), so nothing stops a second run from writing into it ",
                 "at the same time"));
        return;
      }
      char buf[32] = {};
      const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
      ::close(fd);
      std::string pid = n > 0 ? std::string(buf, size_t(n)) : "";
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      const bool numeric =
          !pid.empty() && pid.find_first_not_of("0123456789") == std::string::npos;
      throw UserError(str(key, " ", dir, " is in use by another mxtrain run",
                          numeric ? " (pid " + pid + ")" : std::string(),
                          ": its metrics and checkpoints would mix with this run's (give this ",
                          "run its own ", key, ", or wait for that run to end)"));
    }
    struct stat held {}, now {};
    if (::fstat(fd, &held) == 0 && ::stat(path_.c_str(), &now) == 0 &&
        held.st_dev == now.st_dev && held.st_ino == now.st_ino) {
      fd_ = fd;
      const std::string pid = std::to_string(::getpid()) + "\n";
      // Only for the message of a run refused: a failure to write it changes nothing.
      if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
      return;
    }
    ::close(fd);
  }
  throw StorageError(str("cannot lock ", path_, ": the file keeps being replaced"));
}

DirLock::~DirLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still locked (see above)
  ::close(fd_);
}

}  // namespace mx
