#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#if MOELITE_SIMT_ASAN
#include <sanitizer/asan_interface.h>
#endif

// ---- the context switch -------------------------------------------------------------------------
// moelite_simt_switch(void** save_sp, void* resume_sp): pushes the callee-saved state, stores the stack
// pointer in *save_sp, loads resume_sp and pops the state saved there. A new fiber's stack is laid out
// by prepare() as if it had been suspended by this function.
#if MOELITE_SIMT_ASM_SWITCH && defined(__x86_64__)
// SysV x86-64: rbx, rbp, r12-r15 and the stack pointer, plus the floating-point control state that the
// ABI also makes callee-saved (MXCSR control bits, x87 control word), in an 8-byte slot on top. Storing and
// loading that state is most of a switch's cost (measured: loading it only when it differs saved
// nothing, the stores and the reload after them stall as much).
asm(R"(
  .pushsection .text
  .globl moelite_simt_switch
  .hidden moelite_simt_switch
  .type moelite_simt_switch, @function
  .p2align 4
moelite_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size moelite_simt_switch, .-moelite_simt_switch
  .popsection
)");
#elif MOELITE_SIMT_ASM_SWITCH && defined(__aarch64__)
// AAPCS64: x19-x28, the frame pointer x29, the link register x30 (where `ret` goes), d8-d15 and sp.
// A new fiber "returns" into moelite_simt_fiber_start, which clears fp and lr (so unwinders and
// backtraces stop there) and jumps to the entry function kept in x19. x16 is the register a BTI
// landing pad ("bti c") accepts for an indirect branch.
asm(R"(
  .pushsection .text
  .globl moelite_simt_switch
  .hidden moelite_simt_switch
  .type moelite_simt_switch, %function
  .p2align 4
moelite_simt_switch:
  sub sp, sp, #160
  stp x19, x20, [sp, #0]
  stp x21, x22, [sp, #16]
  stp x23, x24, [sp, #32]
  stp x25, x26, [sp, #48]
  stp x27, x28, [sp, #64]
  stp x29, x30, [sp, #80]
  stp d8, d9, [sp, #96]
  stp d10, d11, [sp, #112]
  stp d12, d13, [sp, #128]
  stp d14, d15, [sp, #144]
  mov x9, sp
  str x9, [x0]
  mov sp, x1
  ldp x19, x20, [sp, #0]
  ldp x21, x22, [sp, #16]
  ldp x23, x24, [sp, #32]
  ldp x25, x26, [sp, #48]
  ldp x27, x28, [sp, #64]
  ldp x29, x30, [sp, #80]
  ldp d8, d9, [sp, #96]
  ldp d10, d11, [sp, #112]
  ldp d12, d13, [sp, #128]
  ldp d14, d15, [sp, #144]
  add sp, sp, #160
  ret
  .size moelite_simt_switch, .-moelite_simt_switch

  .globl moelite_simt_fiber_start
  .hidden moelite_simt_fiber_start
  .type moelite_simt_fiber_start, %function
  .p2align 2
moelite_simt_fiber_start:
  mov x16, x19
  mov x29, xzr
  mov x30, xzr
  br x16
  .size moelite_simt_fiber_start, .-moelite_simt_fiber_start
  .popsection
)");
extern "C" void moelite_simt_fiber_start();
#endif

namespace moelite::simt::fiber {

namespace {
size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}
}  // namespace

bool allocate_stack(size_t usable, Stack* out) {
  const size_t page = page_size();
  const size_t rounded = (usable + page - 1) / page * page;
  const size_t total = rounded + page;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_NORESERVE
  flags |= MAP_NORESERVE;  // pages are committed only when a fiber touches them
#endif
#ifdef MAP_STACK
  flags |= MAP_STACK;
#endif
  void* mapping = mmap(nullptr, total, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (mapping == MAP_FAILED) return false;
  // Stacks grow down: the guard page is the lowest page of the mapping.
  if (mprotect(mapping, page, PROT_NONE) != 0) {
    munmap(mapping, total);
    return false;
  }
  out->mapping = mapping;
  out->mapping_size = total;
  out->lo = static_cast<char*>(mapping) + page;
  out->size = rounded;
  return true;
}

void free_stack(Stack* stack) {
  if (stack->mapping) munmap(stack->mapping, stack->mapping_size);
  *stack = Stack{};
}

void forget_abandoned_frames(const Stack& stack) {
#if MOELITE_SIMT_ASAN
  __asan_unpoison_memory_region(stack.lo, stack.size);
#else
  (void)stack;
#endif
}

void forget_entry_frame(const Stack& stack) {
#if MOELITE_SIMT_ASAN
  // This function's frame lies below the entry's: everything from a little below it to the top of the
  // stack covers the entry's frame and this one.
  char* here = static_cast<char*>(__builtin_frame_address(0));
  char* from = here - stack.lo > 4096 ? here - 4096 : stack.lo;
  __asan_unpoison_memory_region(from, static_cast<size_t>(stack.lo + stack.size - from));
#else
  (void)stack;
#endif
}

#if MOELITE_SIMT_ASM_SWITCH && defined(__x86_64__)
void prepare(Context* ctx, const Stack& stack, void (*entry)()) {
  // The new fiber starts with the caller's floating-point control state (rounding mode, exception masks).
  uint32_t mxcsr;
  uint16_t x87_control;
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(x87_control));
  auto* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack.lo + stack.size) & ~uintptr_t{15});
  // From the top: a null return address for `entry` (it never returns, and unwinders stop at it), the
  // address the switch's `ret` jumps to, six zeroed callee-saved registers, the control-state slot.
  // After the `ret`, rsp = top - 8, so rsp % 16 == 8 at entry as after a call.
  top[-1] = 0;
  top[-2] = reinterpret_cast<uint64_t>(entry);
  for (int i = 3; i <= 8; ++i) top[-i] = 0;  // rbp, rbx, r12, r13, r14, r15
  top[-9] = uint64_t{mxcsr} | (uint64_t{x87_control} << 32);
  ctx->sp = top - 9;
#if MOELITE_SIMT_ASAN
  ctx->fake_stack = nullptr;
  ctx->stack_bottom = stack.lo;
  ctx->stack_size = stack.size;
#endif
}
#elif MOELITE_SIMT_ASM_SWITCH && defined(__aarch64__)
void prepare(Context* ctx, const Stack& stack, void (*entry)()) {
  auto* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack.lo + stack.size) & ~uintptr_t{15});
  uint64_t* frame = top - 20;  // the 160-byte frame moelite_simt_switch pops; sp ends 16-aligned at `top`
  for (int i = 0; i < 20; ++i) frame[i] = 0;
  frame[0] = reinterpret_cast<uint64_t>(entry);                       // x19
  frame[11] = reinterpret_cast<uint64_t>(&moelite_simt_fiber_start);  // x30: where `ret` goes
  ctx->sp = frame;
#if MOELITE_SIMT_ASAN
  ctx->fake_stack = nullptr;
  ctx->stack_bottom = stack.lo;
  ctx->stack_size = stack.size;
#endif
}
#else
void prepare(Context* ctx, const Stack& stack, void (*entry)()) {
  getcontext(&ctx->uc);
  ctx->uc.uc_stack.ss_sp = stack.lo;
  ctx->uc.uc_stack.ss_size = stack.size;
  ctx->uc.uc_link = nullptr;  // entry never returns
  makecontext(&ctx->uc, entry, 0);
#if MOELITE_SIMT_ASAN
  ctx->fake_stack = nullptr;
  ctx->stack_bottom = stack.lo;
  ctx->stack_size = stack.size;
#endif
}
#endif

}  // namespace moelite::simt::fiber
