// What /proc/self/smaps says of this process's memory (Linux): for tests of memory advice.
#pragma once
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace moelite::test {

// The VmFlags of the mapping that holds `addr` (" rd wr ... hg " where the range was advised for
// huge pages), with a space at each end; "?" when no mapping lists it.
inline std::string vm_flags_at(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  const uint64_t a = reinterpret_cast<uint64_t>(addr);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long lo = 0, hi = 0;
    if (sscanf(line.c_str(), "%llx-%llx ", &lo, &hi) == 2 && line.find(' ') > line.find('-'))
      inside = lo <= a && a < hi;
    else if (inside && line.rfind("VmFlags:", 0) == 0)
      return line.substr(8) + " ";
  }
  return "?";
}

inline bool advised_huge(const void* addr) { return vm_flags_at(addr).find(" hg ") != std::string::npos; }

}  // namespace moelite::test
