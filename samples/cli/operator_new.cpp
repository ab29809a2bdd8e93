// The executables' global operator new and delete, compiled in only where they link mimalloc.
//
// Why: mimalloc's own operator new (Debian's libmimalloc 2.0.9, built as C) looks for a
// new-handler through a hidden weak symbol that is always null, so it calls abort() when memory
// runs out (measured: SIGABRT under `ulimit -v 64M` on the shipped model), even with
// std::set_new_handler. A replacement defined in the executable takes precedence over
// libmimalloc's and libstdc++'s for the whole process (the library included); it allocates through
// malloc, which is mimalloc's, and throws std::bad_alloc as the standard allocator does, so the
// library's catch blocks turn exhaustion into MOELITE_ERR_OUT_OF_MEMORY.
#include <cstdlib>
#include <new>

namespace {

void* allocate(std::size_t size) {
  for (;;) {
    if (void* p = std::malloc(size != 0 ? size : 1)) return p;
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

void* allocate_aligned(std::size_t size, std::align_val_t alignment) {
  const std::size_t align = static_cast<std::size_t>(alignment) < sizeof(void*) ? sizeof(void*)
                                                                                 : static_cast<std::size_t>(alignment);
  for (;;) {
    void* p = nullptr;
    if (posix_memalign(&p, align, size != 0 ? size : 1) == 0) return p;
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

template <typename F>
void* or_null(F&& f) noexcept {
  try {
    return f();
  } catch (...) {
    return nullptr;
  }
}

}  // namespace

void* operator new(std::size_t size) { return allocate(size); }
void* operator new[](std::size_t size) { return allocate(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  return or_null([&] { return allocate(size); });
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return or_null([&] { return allocate(size); });
}
void* operator new(std::size_t size, std::align_val_t a) { return allocate_aligned(size, a); }
void* operator new[](std::size_t size, std::align_val_t a) { return allocate_aligned(size, a); }
void* operator new(std::size_t size, std::align_val_t a, const std::nothrow_t&) noexcept {
  return or_null([&] { return allocate_aligned(size, a); });
}
void* operator new[](std::size_t size, std::align_val_t a, const std::nothrow_t&) noexcept {
  return or_null([&] { return allocate_aligned(size, a); });
}

void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
