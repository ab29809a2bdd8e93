#include "connection_limits.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace {

using Clock = std::chrono::steady_clock;

// The descriptor the accept loop's last accept() returned on this thread (see the header).
thread_local int t_accepted = -1;
// The connection the calling thread serves, for the hooks (handlers know no socket in 0.11).
thread_local void* t_connection = nullptr;

// A few more threads than connections: an evicted or refused connection's thread may still be on
// its way out when the one that replaced it starts.
constexpr int kSpareThreads = 8;

void answer_busy(int fd) {
  static const char kBody[] =
      "{\"error\":{\"message\":\"the server is answering as many connections as it allows "
      "(--max-connections); try again shortly\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
  const std::string response = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                               "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
                               std::to_string(sizeof kBody - 1) + "\r\n\r\n" + kBody;
  (void)send(fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  shutdown(fd, SHUT_RDWR);  // httplib's job for it then reads nothing and closes it
}

}  // namespace

// cpp-httplib's accept loop calls this accept (the executable's definition comes first); accept4
// is libc's own entry point, so this is no recursion.
extern "C" int accept(int fd, struct sockaddr* addr, socklen_t* len) {
  const int s = accept4(fd, addr, len, 0);
  t_accepted = s;
  return s;
}

// The task queue httplib hands every accepted connection's job to, on the accept loop's thread.
class ConnectionGuard::Queue : public httplib::TaskQueue {
 public:
  Queue(ConnectionGuard* guard, size_t threads) : guard_(guard), pool_(threads) {}
  void enqueue(std::function<void()> job) override {
    Connection* c = nullptr;
    if (t_accepted >= 0) c = guard_->admit(t_accepted);
    t_accepted = -1;
    pool_.enqueue([guard = guard_, c, job = std::move(job)] {
      t_connection = c;
      job();  // serves the connection until it ends, and closes its socket
      t_connection = nullptr;
      if (c) guard->release(c);
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  ConnectionGuard* guard_;
  httplib::ThreadPool pool_;
};

ConnectionGuard::ConnectionGuard(const ConnectionLimits& limits) : limits_(limits) {
  watchdog_ = std::thread([this] { watchdog_main(); });
}

ConnectionGuard::~ConnectionGuard() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
}

httplib::TaskQueue* ConnectionGuard::new_task_queue() {
  return new Queue(this, static_cast<size_t>(limits_.max_connections + kSpareThreads));
}

ConnectionGuard::Connection* ConnectionGuard::admit(int sock) {
  const int fd = fcntl(sock, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return nullptr;  // out of descriptors: served untracked (its reads stay bounded)
  std::lock_guard<std::mutex> lock(mu_);
  int live = 0;
  for (const Connection& c : open_) live += c.closing ? 0 : 1;
  bool refuse = false;
  if (live >= limits_.max_connections) {
    Connection* oldest = nullptr;
    for (Connection& c : open_)
      if (!c.closing && c.reading && (!oldest || c.since < oldest->since)) oldest = &c;
    if (oldest) {
      oldest->closing = true;
      shutdown(oldest->fd, SHUT_RDWR);  // its thread's read returns and its connection ends
      ++counters_.evicted;
    } else {
      refuse = true;
      ++counters_.refused;
    }
  }
  ++counters_.accepted;
  open_.push_back(Connection{fd, true, refuse, false, Clock::now()});
  if (refuse) answer_busy(fd);
  return &open_.back();
}

void ConnectionGuard::release(Connection* c) {
  int fd;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fd = c->fd;
    for (auto it = open_.begin(); it != open_.end(); ++it)
      if (&*it == c) {
        open_.erase(it);
        break;
      }
  }
  close(fd);  // only now may the descriptor number be reused
}

void ConnectionGuard::request_received() {
  auto* c = static_cast<Connection*>(t_connection);
  if (!c) return;
  std::lock_guard<std::mutex> lock(mu_);
  c->reading = false;
}

void ConnectionGuard::close_after_response() {
  auto* c = static_cast<Connection*>(t_connection);
  if (!c) return;
  std::lock_guard<std::mutex> lock(mu_);
  c->close_after = true;
}

void ConnectionGuard::response_sent() {
  auto* c = static_cast<Connection*>(t_connection);
  if (!c) return;
  std::lock_guard<std::mutex> lock(mu_);
  c->reading = true;
  c->since = Clock::now();
  if (c->close_after && !c->closing) {
    c->closing = true;
    shutdown(c->fd, SHUT_RD);  // the response is out; the unread body is never read as a request
  }
}

ConnectionCounters ConnectionGuard::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  ConnectionCounters c = counters_;
  c.open = 0;
  for (const Connection& x : open_) c.open += x.closing ? 0 : 1;
  return c;
}

void ConnectionGuard::watchdog_main() {
  const auto limit = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limits_.request_seconds));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    const auto now = Clock::now();
    for (Connection& c : open_)
      if (c.reading && !c.closing && now - c.since > limit) {
        c.closing = true;
        shutdown(c.fd, SHUT_RDWR);
        ++counters_.timed_out;
      }
  }
}
