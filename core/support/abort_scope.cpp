#include "base/options.h"
#include "core/support/abort_scope.h"

#include <cstdlib>

namespace moelite {

namespace {
thread_local moelite_abort_fn t_fn = nullptr;
thread_local void* t_user = nullptr;
}  // namespace

AbortScope::AbortScope(moelite_abort_fn fn, void* user) : prev_fn_(t_fn), prev_user_(t_user) {
  t_fn = fn;
  t_user = user;
}

AbortScope::~AbortScope() {
  t_fn = prev_fn_;
  t_user = prev_user_;
}

bool abort_requested() { return t_fn && t_fn(t_user) != 0; }

// Read at every wait (waits are rare and already slow), so a test or host can change it.
double io_timeout_seconds() {
  double v = 120.0;
  option_number(Option::IoTimeout, &v);
  return v;
}

}  // namespace moelite
