// Test helper: pre-tokenizes lines of hex-encoded UTF-8 from stdin with the pre-tokenizer named on
// the command line, and prints each line's pieces as hex separated by spaces, so a Python test can
// compare them with a reference implementation (tests/reference/test_pretokenize_gpt4o.py).
#include <cstdio>
#include <iostream>
#include <string>

#include "core/text/pretokenize.h"

namespace {

std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

std::string to_hex(const std::string& s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  moelite::PreTokenizer pre;
  if (argc != 2 || !moelite::pre_tokenizer_from_name(argv[1], &pre)) {
    std::fprintf(stderr, "usage: pretokenize_dump PRE_NAME < hex lines\n");
    return 2;
  }
  for (std::string line; std::getline(std::cin, line);) {
    bool first = true;
    for (const std::string& piece : moelite::pretokenize_utf8(from_hex(line), pre)) {
      std::cout << (first ? "" : " ") << to_hex(piece);
      first = false;
    }
    std::cout << '\n';
  }
  return 0;
}
