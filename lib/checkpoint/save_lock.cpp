// save_lock.cpp: the --save directory's lock file.
#include "checkpoint/save_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "config/errors.h"

namespace mt {

SaveDirectoryLock::SaveDirectoryLock(const std::string& dir, Communicator& comm) {
  const std::string path = (std::filesystem::path(dir) / ".megatrain-save.lock").string();
  std::string why;
  if (comm.rank() == 0) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      why = "cannot create " + path + " (" + std::strerror(errno) + "): check --save";
    } else if (const int rc = ::flock(fd_, LOCK_EX | LOCK_NB), err = errno; rc != 0 && err != EWOULDBLOCK) {
      // A filesystem without locks (some NFS set-ups): saving still works, only unguarded.
      std::fprintf(stderr, "megatrain: warning: cannot lock %s (%s): one run at a time per --save directory is not enforced there\n", path.c_str(),
                   std::strerror(err));
    } else if (rc != 0) {
      char holder[256] = {0};
      const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
      std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "another process";
      while (!who.empty() && (who.back() == '\n' || who.back() == '\r')) who.pop_back();
      why = "another run (" + who + ") is saving into " + dir + ": give this run another --save, or stop that one";
      ::close(fd_);
      fd_ = -1;
    } else {
      char host[128] = {0};
      ::gethostname(host, sizeof(host) - 1);
      const std::time_t now = std::time(nullptr);
      char when[32] = {0};
      std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", std::localtime(&now));
      const std::string text = "pid " + std::to_string(::getpid()) + " on " + host + ", since " + when + "\n";
      if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) < 0) {
        // The lock holds without its note; the message to a second run is then less specific.
      }
    }
  }
  double failed = why.empty() ? 0.0 : 1.0;
  if (comm.size() > 1) comm.all_reduce(&failed, 1, ReduceOp::kMax);
  if (failed > 0) {
    throw DataError(why.empty() ? "rank 0 could not lock --save " + dir + ": another run is saving there (see rank 0's message)" : why);
  }
}

SaveDirectoryLock::~SaveDirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (a later run reuses it)
}

}  // namespace mt
