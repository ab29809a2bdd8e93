#include "connection.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <memory>

namespace {

// The peer of socket `fd` as cpp-httplib writes Request::remote_addr/remote_port, or false.
bool peer_of(int fd, std::string* addr, int* port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  *addr = host;
  *port = std::atoi(serv);
  return true;
}

}  // namespace

ConnectionWatch::ConnectionWatch(const std::string& remote_addr, int remote_port) {
  if (remote_addr.empty() || remote_port <= 0) return;
  // Closed on every way out (the strings below may throw).
  std::unique_ptr<DIR, int (*)(DIR*)> handle(opendir("/proc/self/fd"), closedir);
  DIR* dir = handle.get();
  if (!dir) return;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != 0 || fd == dirfd(dir)) continue;
    std::string addr;
    int port = 0;
    if (peer_of(static_cast<int>(fd), &addr, &port) && port == remote_port && addr == remote_addr) {
      fd_ = static_cast<int>(fd);
      break;
    }
  }
}

bool ConnectionWatch::closed() {
  if (fd_ < 0) return false;
  pollfd p{fd_, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  char byte;
  return (p.revents & POLLIN) && recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}
