// save_lock.h: one run at a time per --save directory. Two runs saving into one directory overwrite each
// other's iterations and tracker; the second is refused at start-up, with the holder named.
#pragma once

#include <string>

#include "comm/communicator.h"

namespace mt {

class SaveDirectoryLock {
 public:
  // Rank 0 of `comm` takes an advisory lock (flock) on DIR/.megatrain-save.lock, creating DIR, and writes its
  // holder there (pid, host, start time); the lock goes with the process, however it ends, so a killed run
  // leaves none behind. Every rank learns the outcome: when another process holds it, each throws DataError
  // naming the holder.
  SaveDirectoryLock(const std::string& dir, Communicator& comm);
  ~SaveDirectoryLock();
  SaveDirectoryLock(const SaveDirectoryLock&) = delete;
  SaveDirectoryLock& operator=(const SaveDirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace mt
