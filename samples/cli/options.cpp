#include "options.h"

#include "moelite.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace cli {

const std::vector<OptionFamily>& option_families() {
  static const std::vector<OptionFamily> families = {
      {"model and compute", "every command that loads a model",
       {
           {{"-m", "--model"}, "MODEL", "the GGUF model file (required)"},
           {{"-t", "--threads"}, "N", "compute threads (default: physical cores)"},
           {{"--backend"}, "NAME", "auto, cpu, vulkan or cuda (default auto)"},
           {{"--no-mmap"}, "", "read the weights into memory instead of mapping the file"},
           {{"--verbose"}, "", "log what loads"},
           {{"--trace-events"}, "FILE",
            "write a timeline of the run (routing, expert reads, computation, waits, prefetches) as Chrome trace "
            "JSON that Perfetto opens (tools/plot_report.py draws it)"},
       }},
      {"expert memory", "every command that loads a model",
       {
           {{"--budget"}, "SIZE",
            "memory for routed experts: 2GiB, 512MiB, 1.5G, 123456 (bytes), 25% of the experts, or auto (what "
            "memory is free at load, less the dense weights, KV cache and --budget-headroom)"},
           {{"--budget-headroom"}, "SIZE",
            "with --budget auto: memory left for everything else (default: 10% of the available memory, at least "
            "64 MiB)"},
           {{"--policy"}, "NAME", "expert cache policy: cyclic (default), lru, lfu, decay, static or belady"},
           {{"--per-layer"}, "", "per-layer expert pools instead of one global pool"},
           {{"--allocation"}, "NAME", "cache allocation across layers: auto, global, uniform or dp"},
       }},
      {"prediction", "every command that loads a model",
       {
           {{"--predictor"}, "NAME", "none, next-gate, first-layer, learned, correlation or pregate"},
           {{"--predict-depth"}, "D", "layers ahead the predictor looks"},
           {{"--profile"}, "FILE", "calibration profile (moelite calibrate)"},
       }},
      {"gating (lossy unless exact)", "every command that loads a model",
       {
           {{"--gating"}, "MODE", "exact, sensitivity, cache-aware or score"},
           {{"--threshold"}, "T", "gating threshold"},
           {{"--gating-penalty"}, "P",
            "cache-aware gating: threshold factor for experts not resident in the store (>= 1, default 4; "
            "bench suggests 1 + DRAM / storage bandwidth)"},
           {{"--gating-substitutes"}, "N",
            "cache-aware gating: replace a non-resident expert by a resident one among the router's next N "
            "(default 0: off)"},
       }},
      {"sampling", "run, chat, batch and trace record",
       {
           {{"-n"}, "N", "tokens to generate at most (default 256)"},
           {{"--temp"}, "T", "temperature, 0 = greedy (default 0.8)"},
           {{"--top-k"}, "K", "keep the K most likely tokens, 0 = all (default 40)"},
           {{"--top-p"}, "P", "nucleus sampling mass (default 0.95)"},
           {{"--min-p"}, "P", "drop tokens below P x the most likely one (default 0.05)"},
           {{"--repeat-penalty"}, "R", "penalty for repeated tokens, 1 = off (default 1)"},
           {{"--repeat-last-n"}, "N", "tokens the penalty looks back, -1 = all (default 64)"},
           {{"--seed"}, "S", "sampling seed (default 24301)"},
           {{"--stop"}, "STR", "stop when the text contains STR (repeatable)"},
       }},
      {"quality meter and governor (with lossy --gating)", "run, chat, bench and perplexity",
       {
           {{"--quality-sample"}, "R",
            "compare a share R in [0, 1] of the decode steps with exact routing and print what gating cost "
            "(KL, top-1 agreement, the sensitivity model's prediction; default 0: off, 0.125 with a target)"},
           {{"--quality-target"}, "T",
            "hold gating's cost at T by moving the threshold: a perplexity rise (1%, 0.5%) or kl:X nats per token; "
            "with --gating sensitivity or cache-aware, a profile optional"},
       }},
  };
  return families;
}

const std::vector<Option>& model_options() {
  static const std::vector<Option> options = [] {
    std::vector<Option> all;
    for (const OptionFamily& f : option_families())
      if (f.taken_by == "every command that loads a model") all.insert(all.end(), f.options.begin(), f.options.end());
    return all;
  }();
  return options;
}

const std::vector<Option>& generate_options() {
  for (const OptionFamily& f : option_families())
    if (f.name == "sampling") return f.options;
  static const std::vector<Option> none;
  return none;
}

const std::vector<Option>& quality_options() {
  for (const OptionFamily& f : option_families())
    if (f.taken_by == "run, chat, bench and perplexity") return f.options;
  static const std::vector<Option> none;
  return none;
}

std::string families_text() {
  std::string out;
  for (const OptionFamily& f : option_families()) {
    out += "  " + f.name + ", taken by " + f.taken_by + ":\n     ";
    size_t column = 5;
    for (size_t i = 0; i < f.options.size(); ++i) {
      const Option& o = f.options[i];
      std::string names;
      for (const std::string& n : o.names) names += (names.empty() ? "" : "/") + n;
      std::string item = names + (o.value.empty() ? "" : " " + o.value) + (i + 1 < f.options.size() ? "," : "");
      if (column + 1 + item.size() > 100) out += "\n     ", column = 5;
      out += " " + item;
      column += 1 + item.size();
    }
    out += "\n";
  }
  return out;
}

std::vector<Option> with_groups(std::vector<Option> own, const std::vector<const std::vector<Option>*>& groups) {
  for (const auto* g : groups) own.insert(own.end(), g->begin(), g->end());
  return own;
}

namespace {

const Option* find_option(const Command& cmd, const std::string& name) {
  for (const auto& o : cmd.options)
    for (const auto& n : o.names)
      if (n == name) return &o;
  return nullptr;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min(std::min(row[j] + 1, row[j - 1] + 1), diagonal + (a[i - 1] == b[j - 1] ? 0 : 1));
      diagonal = up;
    }
  }
  return row[b.size()];
}

// " (did you mean --budget?)" for a name within two edits of a known long option, else "".
std::string suggestion(const Command& cmd, const std::string& name) {
  if (name.size() > 64) return "";  // the distance is quadratic; nobody misspells that much
  std::string best;
  size_t best_distance = 3;
  for (const auto& o : cmd.options)
    for (const auto& n : o.names) {
      if (n.size() < 3) continue;  // short options are too close to everything
      // "--temperature" for "--temp": one name starts the other.
      const bool prefix = name.size() > 3 && (n.rfind(name, 0) == 0 || name.rfind(n, 0) == 0);
      const size_t d = prefix ? 1 : edit_distance(name, n);
      if (d < best_distance) best_distance = d, best = n;
    }
  return best.empty() ? "" : " (did you mean " + best + "?)";
}

// A value that begins with '-' is an option name unless it reads as a number ("-1", "-.5").
bool looks_like_option(const std::string& s) {
  if (s.size() < 2 || s[0] != '-') return false;
  return !(isdigit(static_cast<unsigned char>(s[1])) || s[1] == '.');
}

}  // namespace

ParseResult Args::parse(int argc, const char* const* argv, const Command& cmd, std::string* error) {
  values_.clear();
  bool help = false;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i] ? argv[i] : "";
    if (arg == "-h" || arg == "--help") {
      help = true;
      continue;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      *error = "unexpected argument '" + arg + "' for 'moelite " + cmd.name + "'";
      if (i > 0 && find_option(cmd, argv[i - 1]) && find_option(cmd, argv[i - 1])->value.empty())
        *error += std::string(" (") + argv[i - 1] + " takes no value)";
      return ParseResult::Error;
    }
    std::string name = arg, value;
    bool inline_value = false;
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      inline_value = true;
    }
    const Option* opt = find_option(cmd, name);
    if (!opt) {
      *error = "unknown option '" + name + "' for 'moelite " + cmd.name + "'" + suggestion(cmd, name);
      return ParseResult::Error;
    }
    if (opt->value.empty()) {
      if (inline_value) {
        *error = "option '" + name + "' takes no value";
        return ParseResult::Error;
      }
      value = "1";
    } else if (!inline_value) {
      if (i + 1 >= argc || !argv[i + 1] || looks_like_option(argv[i + 1])) {
        *error = "option '" + name + "' needs a value (" + opt->value + ")";
        if (i + 1 < argc && argv[i + 1]) *error += std::string(", got option '") + argv[i + 1] + "'";
        return ParseResult::Error;
      }
      value = argv[++i];
    }
    for (const auto& alias : opt->names) values_[alias].push_back(value);
  }
  return help ? ParseResult::Help : ParseResult::Ok;
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.back();
}

std::vector<std::string> Args::get_all(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

bool Args::get_int(const std::string& name, int64_t fallback, int64_t* out, std::string* error, int64_t min,
                   int64_t max) const {
  if (!has(name)) {
    *out = fallback;
    return true;
  }
  const std::string v = get(name);
  char* end = nullptr;
  errno = 0;
  const long long parsed = strtoll(v.c_str(), &end, 10);
  if (errno || end == v.c_str() || *end != '\0') {
    *error = "option '" + name + "' expects an integer, got '" + v + "'";
    return false;
  }
  // Refuse what would wrap around in the int32_t (or other type) the value ends up in.
  if (parsed < min || parsed > max) {
    *error = "option '" + name + "' is out of range: '" + v + "'";
    return false;
  }
  *out = parsed;
  return true;
}

std::string Args::json_number(const std::string& name, double fallback) const {
  double v = fallback;
  std::string ignored;
  if (!get_double(name, fallback, &v, &ignored)) v = fallback;
  // The shortest of 15 or 17 significant digits that reads back as the same double.
  char text[40];
  snprintf(text, sizeof text, "%.15g", v);
  if (strtod(text, nullptr) != v) snprintf(text, sizeof text, "%.17g", v);
  return text;
}

bool Args::get_double(const std::string& name, double fallback, double* out, std::string* error) const {
  if (!has(name)) {
    *out = fallback;
    return true;
  }
  const std::string v = get(name);
  char* end = nullptr;
  errno = 0;
  const double parsed = strtod(v.c_str(), &end);
  if (errno || end == v.c_str() || *end != '\0' || !std::isfinite(parsed)) {
    *error = "option '" + name + "' expects a number, got '" + v + "'";
    return false;
  }
  *out = parsed;
  return true;
}

bool parse_size(const std::string& option, const std::string& text, uint64_t* out, std::string* error) {
  if (moelite_parse_size(text.c_str(), out) == MOELITE_OK) return true;
  *error = "option '" + option + "': " + moelite_last_error();
  return false;
}

std::string usage_text(const Command& cmd) {
  std::string text = "usage: moelite " + cmd.name + " " + cmd.synopsis + "\n\n" + cmd.summary + "\n\noptions:\n";
  for (const auto& o : cmd.options) {
    std::string left = "  ";
    for (size_t i = 0; i < o.names.size(); ++i) left += (i ? ", " : "") + o.names[i];
    if (!o.value.empty()) left += " " + o.value;
    if (left.size() < 28) left.resize(28, ' ');
    text += left + "  " + o.help + "\n";
  }
  text += "  -h, --help                  this text\n";
  return text;
}

bool parse_command_line(int argc, char** argv, const Command& cmd, Args* args, int* exit_code) {
  std::string error;
  switch (args->parse(argc, argv, cmd, &error)) {
    case ParseResult::Ok: return true;
    case ParseResult::Help:
      fputs(usage_text(cmd).c_str(), stdout);
      *exit_code = 0;
      return false;
    case ParseResult::Error: break;
  }
  fprintf(stderr, "moelite: error: %s (see 'moelite %s --help')\n", error.c_str(), cmd.name.c_str());
  *exit_code = 2;
  return false;
}

}  // namespace cli
