// Which malloc this process runs on: the CLI links mimalloc where the build found it (see
// MOELITE_MIMALLOC in CMakeLists.txt), and benchmarks should say so next to their numbers.
#include <dlfcn.h>

#include <string>

#include "cli.h"

namespace cli {

std::string process_allocator() {
  // mi_version() is exported by libmimalloc; with it loaded into the process, its malloc
  // interposes on libc's (it is linked into the executable, ahead of libc).
  using VersionFn = int (*)();
  if (void* sym = dlsym(RTLD_DEFAULT, "mi_version")) {
    const int v = reinterpret_cast<VersionFn>(sym)();  // e.g. 209 for 2.0.9
    return "mimalloc " + std::to_string(v / 100) + "." + std::to_string(v / 10 % 10) + "." + std::to_string(v % 10);
  }
  return "libc";
}

}  // namespace cli
