// Fibers for the SIMT emulator: a stack per emulated CUDA thread and a minimal context switch.
// On x86-64 and aarch64 (ELF) the switch is a few lines of assembly in fiber.cpp that save only
// what the calling convention says a callee must preserve; glibc's swapcontext would also make a
// sigprocmask system call per switch, and the emulator switches millions of times per test.
// Elsewhere (or with -DMOELITE_SIMT_FORCE_UCONTEXT, to test it) the switch falls back to ucontext.
//
// Under AddressSanitizer every switch is announced with __sanitizer_start_switch_fiber /
// __sanitizer_finish_switch_fiber, so ASan knows which stack is live (no false stack-overflow or
// stack-use-after-return reports).
#pragma once
#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)
#define MOELITE_SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOELITE_SIMT_ASAN 1
#endif
#endif
#ifndef MOELITE_SIMT_ASAN
#define MOELITE_SIMT_ASAN 0
#endif

#if (defined(__x86_64__) || defined(__aarch64__)) && defined(__ELF__) && !defined(MOELITE_SIMT_FORCE_UCONTEXT)
#define MOELITE_SIMT_ASM_SWITCH 1
#else
#define MOELITE_SIMT_ASM_SWITCH 0
#include <ucontext.h>
#endif

#if MOELITE_SIMT_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#if MOELITE_SIMT_ASM_SWITCH
// Saves the callee-saved registers on the current stack, stores the stack pointer in *save_sp,
// then resumes the context whose stack pointer is `resume_sp` (fiber.cpp).
extern "C" void moelite_simt_switch(void** save_sp, void* resume_sp);
#endif

namespace moelite::simt::fiber {

// One fiber's stack: [lo, lo + size) usable, with an inaccessible guard page just below `lo` so an
// overflow faults instead of silently overwriting the neighbouring stack.
struct Stack {
  void* mapping = nullptr;
  size_t mapping_size = 0;
  char* lo = nullptr;
  size_t size = 0;
};

// Maps a stack of `usable` bytes (rounded up to pages) plus its guard page; false when out of memory.
bool allocate_stack(size_t usable, Stack* out);
void free_stack(Stack* stack);
// Before a stack whose fiber was abandoned mid-run is reused: under ASan the abandoned frames' redzones
// are still poisoned and would be reported as errors in the next fiber; elsewhere nothing to do.
void forget_abandoned_frames(const Stack& stack);

// Just before a fiber's entry function leaves for good: under ASan, clears the redzones of the
// entry's frame, which stay poisoned because the entry never returns and would otherwise be reported
// in the next fiber that runs on this stack; elsewhere nothing to do.
void forget_entry_frame(const Stack& stack);

// A suspended execution: a fiber, or the launching code's own stack.
struct Context {
#if MOELITE_SIMT_ASM_SWITCH
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
#if MOELITE_SIMT_ASAN
  void* fake_stack = nullptr;  // ASan's stack-use-after-return frames of this context
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
#endif
};

// Makes `ctx` start `entry` on `stack` when first switched to. `entry` must never return: it ends by
// leaving for another context with exit_to(). It must call on_entry() first.
void prepare(Context* ctx, const Stack& stack, void (*entry)());

#if MOELITE_SIMT_ASAN
// The context that switched to the one now running (ASan must be told the stack it came from).
inline thread_local Context* t_switched_from = nullptr;

inline void finish_switch(Context* now_running) {
  Context* from = t_switched_from;
  __sanitizer_finish_switch_fiber(now_running->fake_stack, &from->stack_bottom, &from->stack_size);
}
#endif

// First call of a fiber's entry function.
inline void on_entry() {
#if MOELITE_SIMT_ASAN
  Context* from = t_switched_from;
  __sanitizer_finish_switch_fiber(nullptr, &from->stack_bottom, &from->stack_size);
#endif
}

// Suspends the running code into `from` and resumes `to`; returns when something switches back to `from`.
inline void switch_to(Context* from, Context* to) {
#if MOELITE_SIMT_ASAN
  __sanitizer_start_switch_fiber(&from->fake_stack, to->stack_bottom, to->stack_size);
  t_switched_from = from;
#endif
#if MOELITE_SIMT_ASM_SWITCH
  moelite_simt_switch(&from->sp, to->sp);
#else
  swapcontext(&from->uc, &to->uc);
#endif
#if MOELITE_SIMT_ASAN
  finish_switch(from);
#endif
}

// Like switch_to, for a fiber that is finished: nothing will switch back to `from` (under ASan its
// fake stack is released).
inline void exit_to(Context* from, Context* to) {
#if MOELITE_SIMT_ASAN
  __sanitizer_start_switch_fiber(nullptr, to->stack_bottom, to->stack_size);
  t_switched_from = from;
#endif
#if MOELITE_SIMT_ASM_SWITCH
  moelite_simt_switch(&from->sp, to->sp);
#else
  swapcontext(&from->uc, &to->uc);
#endif
}

}  // namespace moelite::simt::fiber
