// A timeline of one run in the Chrome trace-event format (the JSON that Perfetto and
// chrome://tracing open): complete events ("X": a name, a category, a start, a duration, integer
// arguments) and instants ("i"), each on the thread that recorded it, with the threads named
// ("M" metadata). Recorded by the router, the expert executor and the expert store while one is
// being recorded (moelite_model_trace_begin, the CLI's --trace-events); written by write(). Not to
// be confused with a routing trace (core/experts/trace_replay.h), which lists experts, not time.
//
// Thread-safe: any thread records; one lock guards the buffer. Recording costs a clock read and an
// append under that lock, a few hundred nanoseconds, paid only while a timeline is recorded. At most
// kMaxEvents are kept (about 200 MB): later ones are counted as dropped, and the file says so.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace moelite {

class TimelineRecorder {
 public:
  struct Arg {
    const char* key;  // a string literal
    int64_t value;
  };
  static constexpr size_t kMaxEvents = size_t{2} << 20;

  // Microseconds on the steady clock (the trace's time base).
  static double now_us();
  // `thread` names the recording thread in the file the first time it is given ("evaluation",
  // "expert loader"): a string literal, or null where the caller may be any thread.
  void complete(const char* name, const char* category, const char* thread, double start_us, double end_us,
                std::initializer_list<Arg> args = {});
  void instant(const char* name, const char* category, const char* thread, std::initializer_list<Arg> args = {});
  // Writes {"traceEvents": [...], "otherData": {...}} atomically to `path` (MOELITE_ERR_IO with the
  // reason when it cannot).
  Status write(const std::string& path) const;
  size_t size() const;

 private:
  struct Event {
    const char* name;
    const char* category;
    char phase;
    double ts, dur;
    int32_t tid;
    uint8_t n_args;
    Arg args[6];
  };
  void add(Event e, const char* thread, std::initializer_list<Arg> args);

  mutable std::mutex mu_;
  std::vector<Event> events_;
  std::vector<std::pair<int32_t, const char*>> threads_;  // tid -> name, in order of appearance
  uint64_t dropped_ = 0;
  double origin_us_ = now_us();
};

}  // namespace moelite
