#include "core/support/timeline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>

#include "platforms/platform.h"

namespace moelite {

namespace {

// A small id per thread for the trace's tid (the OS's ids are long and reused).
int32_t thread_id() {
  static std::atomic<int32_t> next{1};
  thread_local int32_t id = next.fetch_add(1);
  return id;
}

void json_string(std::string* out, const char* s) {
  out->push_back('"');
  for (; *s; ++s) {
    const unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      char buf[8];
      snprintf(buf, sizeof buf, "\\u%04x", c);
      out->append(buf);
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
  out->push_back('"');
}

}  // namespace

double TimelineRecorder::now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

void TimelineRecorder::add(Event e, const char* thread, std::initializer_list<Arg> args) {
  e.tid = thread_id();
  e.n_args = 0;
  for (const Arg& a : args) {
    if (e.n_args == sizeof e.args / sizeof e.args[0]) break;
    e.args[e.n_args++] = a;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= kMaxEvents) {
    ++dropped_;
    return;
  }
  try {
    if (thread && std::none_of(threads_.begin(), threads_.end(), [&](const auto& t) { return t.first == e.tid; }))
      threads_.emplace_back(e.tid, thread);
    events_.push_back(e);
  } catch (...) {  // out of memory: the trace loses this event, the run goes on
    ++dropped_;
  }
}

void TimelineRecorder::complete(const char* name, const char* category, const char* thread, double start_us,
                             double end_us, std::initializer_list<Arg> args) {
  add(Event{name, category, 'X', start_us, std::max(0.0, end_us - start_us), 0, 0, {}}, thread, args);
}

void TimelineRecorder::instant(const char* name, const char* category, const char* thread,
                            std::initializer_list<Arg> args) {
  add(Event{name, category, 'i', now_us(), 0.0, 0, 0, {}}, thread, args);
}

size_t TimelineRecorder::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

Status TimelineRecorder::write(const std::string& path) const {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.reserve(events_.size() * 120 + 256);
    out += "{\"traceEvents\": [\n";
    bool first = true;
    char buf[160];
    for (const auto& t : threads_) {
      snprintf(buf, sizeof buf, "%s{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": 1, \"tid\": %d, \"args\": {\"name\": ",
               first ? "" : ",\n", t.first);
      out += buf;
      json_string(&out, t.second);
      out += "}}";
      first = false;
    }
    for (const Event& e : events_) {
      out += first ? "" : ",\n";
      first = false;
      out += "{\"name\": ";
      json_string(&out, e.name);
      out += ", \"cat\": ";
      json_string(&out, e.category);
      snprintf(buf, sizeof buf, ", \"ph\": \"%c\", \"pid\": 1, \"tid\": %d, \"ts\": %.3f", e.phase, e.tid,
               e.ts - origin_us_);
      out += buf;
      if (e.phase == 'X') {
        snprintf(buf, sizeof buf, ", \"dur\": %.3f", e.dur);
        out += buf;
      } else {
        out += ", \"s\": \"t\"";
      }
      out += ", \"args\": {";
      for (uint8_t i = 0; i < e.n_args; ++i) {
        out += i ? ", " : "";
        json_string(&out, e.args[i].key);
        snprintf(buf, sizeof buf, ": %" PRId64, e.args[i].value);
        out += buf;
      }
      out += "}}";
    }
    snprintf(buf, sizeof buf, "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {\"producer\": \"moelite\", \"dropped_events\": %" PRIu64 "}}\n",
             dropped_);
    out += buf;
  }
  const platform::WritePiece piece{out.data(), out.size()};
  return platform::write_file_atomic(path, &piece, 1);
}

}  // namespace moelite
