// Connections as a resource with limits, so that a handful of slow or idle clients cannot stall
// the server. The packaged cpp-httplib (Debian 12's 0.11) gives each connection a pool thread for
// its whole life and bounds only each single read (5 s): 16 clients that sent half a request line
// held /health for 17.8 s, a byte a second on 40 connections for 25 s, and an oversized
// Content-Length held a thread 5 s. Here:
//  - a connection must deliver each request (headers and body) within `request_seconds` of
//    connecting (or of its previous response, on a kept-alive connection); a watchdog shuts down
//    the socket of one that does not;
//  - at most `max_connections` are served at once: one more evicts the connection that has been
//    reading its request the longest (the slow or idle one), or, when every one is being answered,
//    is answered 503 at once;
//  - the pool has a thread for every admitted connection and a few more, so an admitted
//    connection never waits behind others.
// Handling a request (generating for minutes, streaming) is not timed.
//
// cpp-httplib 0.11 tells the code it runs nothing about a connection (its socket is private), so
// this file defines accept(): httplib's accept loop calls it, and the task queue that receives the
// connection's job on the same thread right after takes the descriptor it returned.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <mutex>
#include <thread>

#include <httplib.h>

struct ConnectionLimits {
  int max_connections = 32;
  double request_seconds = 10.0;
};

struct ConnectionCounters {
  uint64_t accepted = 0, evicted = 0, refused = 0, timed_out = 0;
  int open = 0;
};

class ConnectionGuard {
 public:
  explicit ConnectionGuard(const ConnectionLimits& limits);
  ~ConnectionGuard();
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  // For httplib::Server::new_task_queue: runs each connection's job under these limits.
  httplib::TaskQueue* new_task_queue();

  // Called on the thread that serves the connection (handlers, the logger):
  // the request is in; answering it is not timed.
  void request_received();
  // The response is written: a kept-alive connection's next request is timed from now, or the
  // connection ends here if close_after_response() was called for this request.
  void response_sent();
  // This response is the connection's last (its request body was not read: main.cpp's 413).
  void close_after_response();

  ConnectionCounters counters() const;

 private:
  class Queue;
  struct Connection {
    int fd = -1;  // a dup of the socket: shutting it down never reaches a reused descriptor number
    bool reading = true;
    bool closing = false;  // shut down (timed out, evicted or refused); its thread is on its way out
    bool close_after = false;
    std::chrono::steady_clock::time_point since;
  };
  // Admits connection `sock` (a dup kept) or refuses it; null when it could not be tracked.
  Connection* admit(int sock);
  void release(Connection* c);
  void watchdog_main();

  const ConnectionLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<Connection> open_;
  ConnectionCounters counters_;
  bool stop_ = false;
  std::thread watchdog_;
};
