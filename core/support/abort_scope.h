// The abort callback of the evaluation running on this thread. Context::eval installs it for the
// duration of the call, so waits far below the forward pass (the evaluation lock, the expert
// store's loads) honour it without every interface in between carrying it.
#pragma once
#include "moelite.h"

namespace moelite {

class AbortScope {
 public:
  AbortScope(moelite_abort_fn fn, void* user);
  ~AbortScope();
  AbortScope(const AbortScope&) = delete;
  AbortScope& operator=(const AbortScope&) = delete;

 private:
  moelite_abort_fn prev_fn_;
  void* prev_user_;
};

// True when this thread's evaluation has an abort callback and it asks to stop.
bool abort_requested();

// Longest a wait for storage may take before it is reported as MOELITE_ERR_IO: seconds from
// MOELITE_IO_TIMEOUT (default 120), generous because a cold, busy disk may be slow; a hung
// device or NFS server must still not hang the caller forever.
double io_timeout_seconds();

// How often a blocked wait wakes to poll the abort callback.
constexpr double kAbortPollSeconds = 0.01;

}  // namespace moelite
