// Prints the table of docs/ENVIRONMENT.md's "Read by the library" section from the options table
// (base/options.cpp), the one list of MOELITE_* variables the library reads. tools/gen_environment_doc.sh
// writes it into the docs; the ctest `environment_doc` fails when the docs and this differ.
#include <cstdio>
#include <string>

#include "base/options.h"

namespace {

const char* kind_text(const moelite::OptionInfo& o, char* buf, size_t size) {
  switch (o.kind) {
    case moelite::OptionKind::Integer:
      if (o.hi >= 1e15)
        std::snprintf(buf, size, "integer >= %.0f", o.lo);  // no practical upper bound
      else
        std::snprintf(buf, size, "integer %.0f..%.0f", o.lo, o.hi);
      return buf;
    case moelite::OptionKind::Number: std::snprintf(buf, size, "number %g..%g", o.lo, o.hi); return buf;
    case moelite::OptionKind::Flag: return "`0` or `1`";
    case moelite::OptionKind::Choice: {
      std::string c = std::string("`") + o.choices + "`";
      size_t at;
      while ((at = c.find('|')) != std::string::npos) c.replace(at, 1, "`, `");
      std::snprintf(buf, size, "%s", c.c_str());
      return buf;
    }
    case moelite::OptionKind::Text: return "a file name or path";
    case moelite::OptionKind::Custom: return "`kind:n`";
  }
  return "?";
}

}  // namespace

int main() {
  int n = 0;
  const moelite::OptionInfo* table = moelite::options_table(&n);
  std::printf("| variable | values | default | effect |\n|---|---|---|---|\n");
  for (int i = 0; i < n; ++i) {
    char buf[256];
    std::printf("| `%s` | %s | %s | %s |\n", table[i].name, kind_text(table[i], buf, sizeof buf), table[i].default_text,
                table[i].meaning);
  }
  return 0;
}
