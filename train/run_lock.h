// One training run at a time in a directory: a second run into the same run.out_dir (or
// checkpoint.dir) interleaved its metrics lines with the first's and replaced its checkpoints.
#pragma once
#include <string>

namespace mx {

// Holds an exclusive flock on DIR/.mxtrain.lock for its life (DIR is created), and removes the
// file at the end. The kernel releases a flock when its process ends however it ends (kill -9,
// a spot reclaim), so no lock outlives its run; a file a killed run left is taken over. A
// directory another process holds is a UserError naming it and, from the file, that process's
// pid. A file system without flock (some FUSE mounts) gets no lock: a warning, the lock file
// this run made removed again, and the run goes on.
class DirLock {
 public:
  // `key` names the setting the directory comes from ("run.out_dir").
  DirLock(const std::string& dir, const std::string& key);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace mx
