// The MOELITE_* options table (base/options.h): every variable's malformed values are refused by a
// model load with a message naming it, valid ones load, and the accessors give the value or nothing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "base/options.h"
#include "moelite.h"
#include "platforms/fault_inject.h"

using namespace moelite;

namespace {

std::string model_path() { return std::string(MOELITE_SOURCE_DIR) + "/models/moelite-tiny-qwen3moe-Q8_0.gguf"; }

// moelite_model_load's status with `name`=`value` in the environment (vocabulary only: quick).
moelite_status load_with(const char* name, const char* value, std::string* message) {
  setenv(name, value, 1);
  moelite_model_params* p = moelite_model_params_create();
  moelite_model_params_set_vocab_only(p, 1);
  moelite_model* m = nullptr;
  const moelite_status st = moelite_model_load(model_path().c_str(), p, &m);
  *message = moelite_last_error();
  moelite_model_params_free(p);
  moelite_model_free(m);
  unsetenv(name);
  return st;
}

struct Values {
  Option option;
  const char* good;
  const char* bad[4];
};

const Values kValues[] = {
    {Option::Isa, "scalar", {"bogus", "AVX2", "avx2 ", "1"}},
    {Option::PrefetchRows, "2", {"-1", "65", "two", "2.5"}},
    {Option::DecodeTiles, "0", {"2", "yes", "-0", "on"}},
    {Option::MatrixMinTokens, "4", {"0", "-3", "x", "1e3"}},
    {Option::GroupedRows, "1", {"true", "01x", "3", "no"}},
    {Option::WeightCopies, "0", {"false", "1 ", "-1", "yes"}},
    {Option::HugePages, "0", {"2", "off", " 1", "1.0"}},
    {Option::Io, "pread", {"uring", "PREAD", "mmap", "pread,"}},
    {Option::IoTimeout, "0.5", {"nan", "inf", "0", "-1"}},
    {Option::IoThreads, "4", {"0", "65", "99999999999999999999", "4x"}},
    {Option::PrefillLookahead, "0", {"off", "false", "2", " 1"}},
    {Option::FaultInject, "read:3", {"read", "read:0", "bogus:1", "read:x"}},
    {Option::VkDevice, "0", {"-1", "256", "gpu", "0.0"}},
    {Option::VkValidation, "1", {"yes", "2", "-1", "x"}},
    {Option::VkPortable, "0", {"2", "y", "1.0", "z"}},
    {Option::VkAsDiscrete, "1", {"true", "9", "a", "00x"}},
    {Option::VkMaxBuffer, "65536", {"4095", "0", "-4096", "big"}},
    {Option::CudaEmulator, "discrete", {"2", "yes", "DISCRETE", "gpu"}},
};

}  // namespace

TEST(Options, EveryRowIsNamedAndDocumented) {
  int n = 0;
  const OptionInfo* table = options_table(&n);
  ASSERT_EQ(n, static_cast<int>(Option::kCount));
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(static_cast<int>(table[i].id), i) << table[i].name;
    EXPECT_EQ(std::string(table[i].name).rfind("MOELITE_", 0), 0u);
    EXPECT_GT(std::string(table[i].meaning).size(), 20u) << table[i].name;
  }
}

TEST(Options, MalformedValuesAreRefusedByALoadNamingTheVariable) {
  for (const Values& v : kValues) {
    const char* name = option_info(v.option).name;
    SCOPED_TRACE(name);
    std::string message;
    for (const char* bad : v.bad) {
      EXPECT_EQ(load_with(name, bad, &message), MOELITE_ERR_INVALID_ARGUMENT) << bad;
      EXPECT_NE(message.find(name), std::string::npos) << message;
      EXPECT_NE(message.find("expected"), std::string::npos) << message;
    }
    if (v.option != Option::FaultInject)  // arming a fault would fail the load on purpose
      EXPECT_EQ(load_with(name, v.good, &message), MOELITE_OK) << message;
    EXPECT_EQ(load_with(name, "", &message), MOELITE_OK) << "empty is unset: " << message;
  }
}

TEST(Options, AccessorsGiveTheValueOrNothing) {
  int64_t i = -7;
  setenv("MOELITE_IO_THREADS", "5", 1);
  EXPECT_TRUE(option_int(Option::IoThreads, &i));
  EXPECT_EQ(i, 5);
  setenv("MOELITE_IO_THREADS", "500", 1);  // out of range: the caller's default applies
  i = -7;
  EXPECT_FALSE(option_int(Option::IoThreads, &i));
  EXPECT_EQ(i, -7);
  unsetenv("MOELITE_IO_THREADS");
  EXPECT_FALSE(option_int(Option::IoThreads, &i));
  double d = 0;
  setenv("MOELITE_IO_TIMEOUT", "2.5", 1);
  EXPECT_TRUE(option_number(Option::IoTimeout, &d));
  EXPECT_DOUBLE_EQ(d, 2.5);
  unsetenv("MOELITE_IO_TIMEOUT");
  bool f = true;
  setenv("MOELITE_PREFILL_LOOKAHEAD", "0", 1);
  EXPECT_TRUE(option_flag(Option::PrefillLookahead, &f));
  EXPECT_FALSE(f);
  unsetenv("MOELITE_PREFILL_LOOKAHEAD");
  setenv("MOELITE_ISA", "avx9000", 1);
  EXPECT_EQ(option_text(Option::Isa), nullptr);
  unsetenv("MOELITE_ISA");
}

// MOELITE_FAULT_INJECT's kinds are spelled in the table (base/ is below platforms/): the same as
// the platform layer's.
TEST(Options, FaultKindsAreThePlatformLayers) {
  std::string why;
  for (int k = 0; k < platform::fault::kKindCount; ++k) {
    const std::string spec = std::string(platform::fault::kind_name(static_cast<platform::fault::Kind>(k))) + ":1";
    EXPECT_TRUE(option_value_valid(Option::FaultInject, spec.c_str(), &why)) << spec << ": " << why;
  }
}
