// Whether the client of a request is still there, for a request answered in one piece: a client
// that gives up on a long non-streaming generation should stop it, as a streaming client's failed
// write does. The packaged cpp-httplib (Debian 12's 0.11) has no Request::is_connection_closed, so
// the request's socket is found once among the process's sockets by its peer address and then
// polled: a peer that has closed its end makes the socket readable with nothing to read.
#pragma once
#include <string>

class ConnectionWatch {
 public:
  ConnectionWatch(const std::string& remote_addr, int remote_port);
  ConnectionWatch(const ConnectionWatch&) = delete;
  ConnectionWatch& operator=(const ConnectionWatch&) = delete;
  // True once the client has closed (or reset) the connection. False while it is open, and when
  // the socket could not be found (nothing is cancelled on a guess).
  bool closed();

 private:
  int fd_ = -1;
};
