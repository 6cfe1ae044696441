// tcp_rendezvous.cpp: a minimal length-prefixed broadcast over TCP sockets.
#include "comm/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace mt {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& what, const std::string& addr, int port) {
  throw std::runtime_error("rendezvous at " + addr + ":" + std::to_string(port) + ": " + what +
                           " (check MASTER_ADDR / MASTER_PORT and that rank 0 is running)");
}

void send_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) throw std::runtime_error(std::string("send failed: ") + std::strerror(errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
}

bool recv_all(int fd, void* data, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || ::poll(&pfd, 1, static_cast<int>(left)) <= 0) return false;
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

}  // namespace

std::string tcp_rendezvous_broadcast(const std::string& blob, const std::string& addr, int port, int64_t rank, int64_t world,
                                     int timeout_seconds) {
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_seconds);
  if (world <= 1) return blob;
  if (rank == 0) {
    const int srv = ::socket(AF_INET, SOCK_STREAM, 0);
    if (srv < 0) fail("cannot create a socket", addr, port);
    const int one = 1;
    ::setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (::bind(srv, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(srv, 128) != 0) {
      ::close(srv);
      fail(std::string("rank 0 cannot listen: ") + std::strerror(errno), addr, port);
    }
    const uint64_t len = blob.size();
    for (int64_t served = 0; served < world - 1;) {
      pollfd pfd{srv, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0 || ::poll(&pfd, 1, static_cast<int>(left)) <= 0) {
        ::close(srv);
        fail("only " + std::to_string(served) + " of " + std::to_string(world - 1) + " ranks connected in " +
                 std::to_string(timeout_seconds) + " s",
             addr, port);
      }
      const int c = ::accept(srv, nullptr, nullptr);
      if (c < 0) continue;
      try {
        send_all(c, &len, sizeof(len));
        send_all(c, blob.data(), blob.size());
        ++served;
      } catch (...) {
      }
      ::close(c);
    }
    ::close(srv);
    return blob;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  while (Clock::now() < deadline) {
    addrinfo* res = nullptr;
    if (::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res) == 0 && res) {
      const int fd = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
      if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        ::freeaddrinfo(res);
        uint64_t len = 0;
        std::string out;
        bool ok = recv_all(fd, &len, sizeof(len), deadline) && len < (1u << 20);
        if (ok) {
          out.resize(len);
          ok = recv_all(fd, out.data(), len, deadline);
        }
        ::close(fd);
        if (ok) return out;
        fail("rank 0 closed the connection early", addr, port);
      }
      if (fd >= 0) ::close(fd);
      ::freeaddrinfo(res);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  fail("rank " + std::to_string(rank) + " could not reach rank 0 in " + std::to_string(timeout_seconds) + " s", addr, port);
}

}  // namespace mt
