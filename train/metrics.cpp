#include "train/metrics.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "core/output_dirs.h"

namespace mx {
namespace {

// The length of `fd`'s content up to and including its last newline: a line a failed or killed
// run left half-written (a full disk, SIGKILL) ends there.
off_t complete_lines_length(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  char buf[4096];
  for (off_t end = st.st_size; end > 0;) {
    const off_t begin = end > off_t(sizeof buf) ? end - off_t(sizeof buf) : 0;
    const ssize_t n = ::pread(fd, buf, size_t(end - begin), begin);
    if (n != ssize_t(end - begin))
      throw StorageError(str("cannot read metrics file ", path, ": ",
                             n < 0 ? std::strerror(errno) : "short read"));
    for (ssize_t i = n; i > 0; --i)
      if (buf[i - 1] == '\n') return begin + i;
    end = begin;
  }
  return 0;
}

// The file `path` writes into, when that is an ordinary file reached through symbolic links
// (m.jsonl -> /data/kept.jsonl: a link to a run's earlier metrics was emptied without a copy);
// `path` itself when it is not a link, or when a link on the way leads into /dev or /proc
// (/dev/stdout, /proc/self/fd/1: a stream written through as it is, neither kept nor locked).
std::string metrics_file_of(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p = path;
  for (int hop = 0; hop < 40; ++hop) {
    const std::string text = p.string();
    if (text.rfind("/dev/", 0) == 0 || text.rfind("/proc/", 0) == 0) return path;
    std::error_code ec;
    if (!fs::is_symlink(p, ec)) {
      if (hop == 0) return path;
      const fs::path resolved = fs::weakly_canonical(fs::absolute(p, ec), ec);
      return ec ? path : resolved.string();
    }
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) return path;
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  return path;  // (a loop of links: the open says so)
}

// A fresh run into a metrics file an earlier run wrote (checkpoint.resume = none, checkpoints
// kept elsewhere) truncated the earlier lines without a word: they are moved aside to the
// first free PATH.N (N = 1, 2, ...) instead, and a warning says where. Only a path that is
// itself a regular file holding something (lstat): a FIFO, or a link such as /dev/stdout or
// /proc/self/fd/1, is written as it is (rename moves the link, not its target: /dev/stdout
// itself was moved aside when stdout was a non-empty log file).
void keep_earlier_metrics(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return;
  for (int n = 1;; ++n) {
    const std::string kept = str(path, ".", n);
    struct stat taken {};
    if (::lstat(kept.c_str(), &taken) == 0) continue;  // (a dangling link holds its name too)
    if (::rename(path.c_str(), kept.c_str()) != 0) {
      const int err = errno;
      throw StorageError(str("cannot keep the earlier metrics file ", path, " as ", kept, ": ",
                             std::strerror(err)));
    }
    warn(str("metrics file ", path, " held an earlier run's lines: kept as ", kept,
             " (this run starts a new file)"));
    return;
  }
}

// Two runs with one run.metrics outside their out_dirs (whose locks do not cover it) wrote
// into one file: interleaved lines, two summaries, the second run's start moving the first's
// file aside while it wrote on. The writer holds an exclusive flock on a metrics file that is
// itself a regular file (lstat: a link such as /dev/stdout is written through, unlocked), and
// a second writer is refused, exit 2, before it moves or truncates anything. `fd` < 0: only
// test the path's file (opened read-only for that), else lock `fd`, kept for the run.
void lock_metrics(const std::string& path, int fd) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
  // (opened for writing, without O_CREAT or O_TRUNC: NFS and CIFS emulate flock with fcntl
  // locks, which take an exclusive lock only on a file open for writing; read-only, the test
  // failed with EBADF and read as "not busy")
  const int probe = fd >= 0 ? fd : ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
  if (probe < 0) return;  // (the open for writing says why, if it matters)
  const bool busy = ::flock(probe, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  if (fd < 0) ::close(probe);  // (releases the test lock)
  if (busy) {
    if (fd >= 0) ::close(fd);
    throw UserError(str("run.metrics ", path, " is being written by another run now (it holds ",
                        "the file's lock): give each run its own run.metrics"));
  }
}

// `file` (open as `fd`, locked) copied to a new file of its own that takes its name, for
// appending: its other hard-linked names keep the lines as they are. Returns the new file's
// descriptor, locked; closes `fd`.
int own_copy(const std::string& file, int fd) {
  const std::string tmp = str(file, ".copy.", ::getpid());
  auto fail = [&](const char* what, int err) {
    ::unlink(tmp.c_str());
    ::close(fd);
    throw StorageError(str("cannot copy metrics file ", file, " (it has other names, hard ",
                           "links, which appending would change too): ", what, ": ",
                           std::strerror(err)));
  };
  std::error_code ec;  // (copy_options::none: a file already at `tmp` is an error, not replaced)
  if (!std::filesystem::copy_file(file, tmp, std::filesystem::copy_options::none, ec))
    fail("copy", ec ? ec.value() : EIO);
  const int out = ::open(tmp.c_str(), O_WRONLY | O_CLOEXEC);
  const bool synced = out >= 0 && ::fsync(out) == 0;
  const int err = errno;
  if (out >= 0) ::close(out);
  if (!synced) fail("write", err);
  if (::rename(tmp.c_str(), file.c_str()) != 0) fail("rename", errno);
  ::close(fd);
  warn(str("metrics file ", file, " has other names (hard links): its lines were copied into a ",
           "file of its own, which this run appends to (the other names keep theirs)"));
  const int locked = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  // (a file system without flock, ENOLCK or EOPNOTSUPP: the copy unlocked, as lock_metrics
  // leaves the file it opens there)
  if (locked < 0 || (::flock(locked, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK)) {
    const int err = errno;
    if (locked >= 0) ::close(locked);
    throw StorageError(str("cannot open metrics file ", file, ": ", std::strerror(err)));
  }
  return locked;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  auto parent = std::filesystem::path(path).parent_path();
  // (its reason, a read-only file system say, not the open's ENOENT after it)
  if (!parent.empty()) create_output_dirs(parent.string(), "cannot create the metrics directory");
  const std::string file = metrics_file_of(path);  // (through links to an ordinary file)
  lock_metrics(file, -1);  // (another run's file: refused before it is moved aside)
  if (!append) keep_earlier_metrics(file);
  // O_NONBLOCK: a FIFO nobody reads fails (ENXIO) instead of blocking the run for good; cleared
  // once open, so a pipe that is read (/dev/stdout into a collector) is written as a file is.
  int fd = ::open(path.c_str(),
                  O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | (append ? O_APPEND : 0), 0644);
  if (fd < 0) {  // (a path under a file or too long a name: the configuration's, exit 2)
    const int err = errno;
    throw_path_error(err, str("cannot open metrics file ", path, ": ",
                              err == ENXIO ? "a FIFO nobody reads" : std::strerror(err)));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  lock_metrics(file, fd);  // held until the run ends (the fd's close)
  // Appending to a file with other names (hard links: a backup made with cp -al or rsnapshot,
  // or a checkpoint's state.json named as run.metrics) changed it under those names too: the
  // lines are copied into a file of their own first, which this run appends to; a fresh run
  // moves its name aside instead.
  struct stat links {};
  if (append && ::fstat(fd, &links) == 0 && S_ISREG(links.st_mode) && links.st_nlink > 1)
    fd = own_copy(file, fd);
  // (emptied once locked, not by O_TRUNC: a file another run had just made and locked would
  // have been truncated by the open)
  struct stat opened {};
  if (!append && ::fstat(fd, &opened) == 0 && S_ISREG(opened.st_mode) && opened.st_size > 0 &&
      ::ftruncate(fd, 0) != 0) {
    const int err = errno;
    ::close(fd);
    throw StorageError(str("cannot empty metrics file ", path, ": ", std::strerror(err)));
  }
  if (append) {  // drop a torn last line, so that this run's first line starts a line
    const int rfd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    const off_t keep = rfd < 0 ? -1 : complete_lines_length(rfd, path);
    struct stat st {};
    const bool tail = keep >= 0 && ::fstat(fd, &st) == 0 && keep < st.st_size;
    // A last line that is whole but for its newline (a kill between the line and its '\n', a
    // file edited by hand) is a line: it gets its newline, not dropped (its step is not redone)
    bool whole = false;
    if (tail && st.st_size - keep <= (1 << 20)) {
      std::string last(size_t(st.st_size - keep), '\0');
      whole = ::pread(rfd, last.data(), last.size(), keep) == ssize_t(last.size()) &&
              last.front() == '{' && nlohmann::json::accept(last);  // (an object, as ours)
      if (whole && ::write(fd, "\n", 1) != 1) {
        const int err = errno;
        ::close(rfd);
        ::close(fd);
        throw StorageError(str("cannot end the last line of metrics file ", path, ": ",
                               std::strerror(err)));
      }
    }
    if (rfd >= 0) ::close(rfd);
    if (tail && !whole && ::ftruncate(fd, keep) != 0) {
      const int err = errno;
      ::close(fd);
      throw StorageError(str("cannot truncate the torn last line of metrics file ", path, ": ",
                             std::strerror(err)));
    }
  }
  file_ = ::fdopen(fd, append ? "a" : "w");
  if (!file_) {
    const int err = errno;
    ::close(fd);
    throw StorageError(str("cannot open metrics file ", path, ": ", std::strerror(err)));
  }
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  std::string line = record.dump() + "\n";
  errno = 0;
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    throw StorageError(str("cannot write metrics file ", path_, ": ",
                           errno ? std::strerror(errno) : "write error"));
}

}  // namespace mx
