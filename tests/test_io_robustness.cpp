// What the storage and the caller can do to a running evaluation, and what moelite answers:
//  - the model file shrinks under a budgeted (unmapped) model: MOELITE_ERR_IO, no SIGBUS;
//  - a read stalls: the abort callback still stops the evaluation at once (MOELITE_ERR_ABORTED),
//    and without an abort the I/O timeout does (MOELITE_ERR_IO);
//  - another context of the model holds the evaluation lock: the abort callback still works;
//  - a loader reads several experts in one batch and a later one stalls: the first is handed out
//    whole (down included) as soon as its own reads land;
//  - the io_uring reader fails a submission: it returns an error instead of waiting for reads
//    that were never submitted, and its next batch reads the right bytes.
// After each, the context's next evaluation gives bitwise the logits of an undisturbed run.
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/exec/runtime.h"
#include "core/experts/expert_store.h"
#include "core/model/model.h"
#include "moelite.h"
#include "platforms/batch_read.h"
#include "platforms/fault_inject.h"
#include "platforms/platform.h"

namespace fault = moelite::platform::fault;

namespace {

std::string model_path() { return std::string(MOELITE_SOURCE_DIR) + "/models/moelite-tiny-qwen3moe-Q8_0.gguf"; }
std::string tmp_dir() { return std::string(MOELITE_BINARY_DIR) + "/test-tmp"; }
double now() { return moelite::platform::now_seconds(); }

moelite_model* load(uint64_t budget, int32_t use_mmap, const std::string& path = model_path(),
                    const char* predictor = nullptr) {
  moelite_model_params* p = moelite_model_params_create();
  moelite_model_params_set_threads(p, 2);
  moelite_model_params_set_backend(p, MOELITE_BACKEND_CPU);
  if (budget) moelite_model_params_set_expert_budget(p, budget);
  if (predictor) moelite_model_params_set_predictor(p, predictor);
  moelite_model_params_set_use_mmap(p, use_mmap);
  moelite_model* m = nullptr;
  EXPECT_EQ(moelite_model_load(path.c_str(), p, &m), MOELITE_OK) << moelite_last_error();
  moelite_model_params_free(p);
  return m;
}

moelite_context* context(moelite_model* m, moelite_abort_fn abort = nullptr, void* user = nullptr) {
  moelite_context_params* cp = moelite_context_params_create();
  moelite_context_params_set_n_ctx(cp, 1024);
  moelite_context_params_set_abort_callback(cp, abort, user);
  moelite_context* c = nullptr;
  EXPECT_EQ(moelite_context_create(m, cp, &c), MOELITE_OK) << moelite_last_error();
  moelite_context_params_free(cp);
  return c;
}

std::vector<int32_t> tokens(int32_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = 1 + (i * 37) % 200;
  return t;
}

std::vector<float> logits_of(moelite_context* c, moelite_model* m) {
  const float* l = moelite_get_logits(c, -1);
  return std::vector<float>(l, l + moelite_model_get(m, MOELITE_MODEL_N_VOCAB));
}

// The logits of `toks` on a resident, mapped model: the independent reference.
std::vector<float> reference(const std::vector<int32_t>& toks) {
  moelite_model* m = load(0, 1);
  moelite_context* c = context(m);
  EXPECT_EQ(moelite_eval(c, toks.data(), static_cast<int32_t>(toks.size()), 0), MOELITE_OK);
  std::vector<float> l = logits_of(c, m);
  moelite_context_free(c);
  moelite_model_free(m);
  return l;
}

uint64_t quarter_of_experts() {
  moelite_model* m = load(0, 1);
  const uint64_t b = static_cast<uint64_t>(moelite_model_get(m, MOELITE_MODEL_EXPERT_BYTES)) / 4;
  moelite_model_free(m);
  return b;
}

int abort_when_set(void* user) { return static_cast<std::atomic<bool>*>(user)->load() ? 1 : 0; }

}  // namespace

// Before: a budget still mapped the file for the dense weights, so the first matmul after the
// truncation raised SIGBUS.
TEST(IoRobustness, TruncatedFileGivesIoErrorWithBudgetAndNoMmap) {
  const std::vector<int32_t> toks = tokens(8);
  const std::vector<float> ref = reference(toks);
  for (const int32_t use_mmap : {1, 0}) {
    SCOPED_TRACE(use_mmap ? "budget" : "budget, no mmap");
    const std::string copy = tmp_dir() + "/truncated-" + std::to_string(getpid()) + ".gguf";
    std::filesystem::copy_file(model_path(), copy, std::filesystem::copy_options::overwrite_existing);
    moelite_model* m = load(quarter_of_experts(), use_mmap, copy);
    moelite_context* c = context(m);
    ASSERT_EQ(moelite_eval(c, toks.data(), 8, 0), MOELITE_OK) << moelite_last_error();
    EXPECT_EQ(logits_of(c, m), ref);
    std::filesystem::resize_file(copy, 4096);  // the header survives, every tensor is gone
    moelite_context_kv_reset(c);
    for (int i = 0; i < 2; ++i) {  // and again: the failed slots are retried, and fail again
      EXPECT_EQ(moelite_eval(c, toks.data(), 8, 0), MOELITE_ERR_IO);
      EXPECT_NE(strstr(moelite_last_error(), copy.c_str()), nullptr) << moelite_last_error();
      EXPECT_EQ(moelite_context_kv_length(c), 0);
    }
    // The file is whole again: the same context is exact.
    std::filesystem::copy_file(model_path(), copy, std::filesystem::copy_options::overwrite_existing);
    ASSERT_EQ(moelite_eval(c, toks.data(), 8, 0), MOELITE_OK) << moelite_last_error();
    EXPECT_EQ(logits_of(c, m), ref);
    moelite_context_free(c);
    moelite_model_free(m);
    std::filesystem::remove(copy);
  }
}

// Without a mapping and without a budget nothing is read after loading: a truncation is harmless.
TEST(IoRobustness, TruncatedFileIsHarmlessWhenEverythingWasRead) {
  const std::vector<int32_t> toks = tokens(8);
  const std::vector<float> ref = reference(toks);
  const std::string copy = tmp_dir() + "/truncated-nommap-" + std::to_string(getpid()) + ".gguf";
  std::filesystem::copy_file(model_path(), copy, std::filesystem::copy_options::overwrite_existing);
  moelite_model* m = load(0, 0, copy);
  moelite_context* c = context(m);
  std::filesystem::resize_file(copy, 4096);
  ASSERT_EQ(moelite_eval(c, toks.data(), 8, 0), MOELITE_OK) << moelite_last_error();
  EXPECT_EQ(logits_of(c, m), ref);
  moelite_context_free(c);
  moelite_model_free(m);
  std::filesystem::remove(copy);
}

// A read that stalls (a device that stops answering): the abort callback ends the wait for the
// expert at once. Before: the wait ignored the callback until the read came back.
TEST(IoRobustness, AbortEndsAWaitForAStalledRead) {
  const std::vector<int32_t> toks = tokens(8);
  const std::vector<float> ref = reference(toks);
  for (const char* io : {"pread", "io_uring"}) {
    SCOPED_TRACE(io);
    setenv("MOELITE_IO", io, 1);  // read by each loader thread as it starts
    moelite_model* m = load(quarter_of_experts(), 1);
    std::atomic<bool> stop{false};
    moelite_context* c = context(m, abort_when_set, &stop);
    constexpr double kStall = 3.0;
    fault::arm_stall(std::string(io) == "pread" ? fault::Kind::kRead : fault::Kind::kUringComplete, 1, kStall);
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      stop = true;
    });
    const double t0 = now();
    const moelite_status st = moelite_eval(c, toks.data(), 8, 0);
    const double took = now() - t0;
    aborter.join();
    EXPECT_TRUE(fault::fired());
    EXPECT_EQ(st, MOELITE_ERR_ABORTED) << moelite_last_error();
    EXPECT_NE(strstr(moelite_last_error(), "waiting for expert"), nullptr) << moelite_last_error();
    EXPECT_LT(took, kStall / 2) << "the abort waited for the stalled read";
    EXPECT_EQ(moelite_context_kv_length(c), 0);
    fault::disarm();
    unsetenv("MOELITE_IO");
    stop = false;
    moelite_context_kv_reset(c);
    // The stalled read completes in the background; the next evaluation waits for it and is exact.
    ASSERT_EQ(moelite_eval(c, toks.data(), 8, 0), MOELITE_OK) << moelite_last_error();
    EXPECT_EQ(logits_of(c, m), ref);
    moelite_context_free(c);
    moelite_model_free(m);
  }
}

// Without an abort callback, a stalled read ends in MOELITE_ERR_IO after the I/O timeout.
TEST(IoRobustness, StalledReadTimesOut) {
  const std::vector<int32_t> toks = tokens(8);
  const std::vector<float> ref = reference(toks);
  setenv("MOELITE_IO", "pread", 1);  // read by each loader thread as it starts
  moelite_model* m = load(quarter_of_experts(), 1);
  moelite_context* c = context(m);
  setenv("MOELITE_IO_TIMEOUT", "0.3", 1);
  fault::arm_stall(fault::Kind::kRead, 1, 2.0);
  const double t0 = now();
  const moelite_status st = moelite_eval(c, toks.data(), 8, 0);
  const double took = now() - t0;
  unsetenv("MOELITE_IO_TIMEOUT");
  EXPECT_TRUE(fault::fired());
  EXPECT_EQ(st, MOELITE_ERR_IO) << moelite_last_error();
  EXPECT_NE(strstr(moelite_last_error(), "I/O timeout"), nullptr) << moelite_last_error();
  EXPECT_LT(took, 1.5);
  fault::disarm();
  unsetenv("MOELITE_IO");
  moelite_context_kv_reset(c);
  ASSERT_EQ(moelite_eval(c, toks.data(), 8, 0), MOELITE_OK) << moelite_last_error();
  EXPECT_EQ(logits_of(c, m), ref);
  moelite_context_free(c);
  moelite_model_free(m);
}

// Two contexts of one model: A evaluates (and, through its abort callback, holds the evaluation
// lock until B is done); B waits for the lock and is aborted from a third thread. Before: B
// waited for the lock without looking at its callback, so it returned only after A finished.
TEST(IoRobustness, AbortWhileWaitingForAnotherContext) {
  const std::vector<int32_t> toks = tokens(8);
  const std::vector<float> ref = reference(toks);
  // Cache-aware gating makes contexts of a budgeted model take turns (a result reads what is
  // resident between two layers); without it they would evaluate at the same time and B never
  // wait. At threshold 0 it drops nothing, so results stay exact. It needs a profile.
  std::string profile = "/tmp/moelite-io-robustness-" + std::to_string(getpid()) + ".profile";
  {
    moelite_model* plain = load(0, 1);
    const std::vector<int32_t> corpus = tokens(256);
    moelite_calibrate_params* cal = moelite_calibrate_params_create();
    ASSERT_EQ(moelite_calibrate_params_set_window(cal, 64), MOELITE_OK);
    ASSERT_EQ(moelite_calibrate(plain, corpus.data(), 256, cal, profile.c_str()), MOELITE_OK) << moelite_last_error();
    moelite_calibrate_params_free(cal);
    moelite_model_free(plain);
  }
  moelite_model_params* gp = moelite_model_params_create();
  moelite_model_params_set_threads(gp, 2);
  moelite_model_params_set_backend(gp, MOELITE_BACKEND_CPU);
  moelite_model_params_set_expert_budget(gp, quarter_of_experts());
  moelite_model_params_set_profile(gp, profile.c_str());
  ASSERT_EQ(moelite_model_params_set_gating(gp, "cache-aware", 0.0f), MOELITE_OK);
  moelite_model* m = nullptr;
  ASSERT_EQ(moelite_model_load(model_path().c_str(), gp, &m), MOELITE_OK) << moelite_last_error();
  moelite_model_params_free(gp);
  std::remove(profile.c_str());
  std::remove((profile + ".bin").c_str());
  struct Holder {
    std::atomic<bool> inside{false}, release{false};
  } holder;
  auto hold = [](void* user) -> int {
    auto* h = static_cast<Holder*>(user);
    h->inside = true;
    while (!h->release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return 0;
  };
  std::atomic<bool> stop_b{false};
  moelite_context* a = context(m, hold, &holder);
  moelite_context* b = context(m, abort_when_set, &stop_b);
  const std::vector<int32_t> long_prompt = tokens(512);
  auto a_done = std::async(std::launch::async, [&] { return moelite_eval(a, long_prompt.data(), 512, 0); });
  while (!holder.inside) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto b_done = std::async(std::launch::async, [&] {
    const double t0 = now();
    const moelite_status st = moelite_eval(b, toks.data(), 8, 0);
    return std::make_pair(st, std::make_pair(now() - t0, std::string(moelite_last_error())));
  });
  std::thread third([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stop_b = true;
  });
  const bool b_returned = b_done.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  holder.release = true;  // never leave A (and the test) hanging
  third.join();
  ASSERT_TRUE(b_returned) << "the aborted context kept waiting for the evaluation lock";
  const auto [st, info] = b_done.get();
  EXPECT_EQ(st, MOELITE_ERR_ABORTED) << info.second;
  EXPECT_LT(info.first, 1.0);
  EXPECT_NE(info.second.find("another context"), std::string::npos) << info.second;
  EXPECT_EQ(a_done.get(), MOELITE_OK) << moelite_last_error();
  // B is usable and exact.
  stop_b = false;
  EXPECT_EQ(moelite_context_kv_length(b), 0);
  ASSERT_EQ(moelite_eval(b, toks.data(), 8, 0), MOELITE_OK) << moelite_last_error();
  EXPECT_EQ(logits_of(b, m), ref);
  moelite_context_free(a);
  moelite_context_free(b);
  moelite_model_free(m);
}

// Contexts sharing the store at its minimum budget (no predictor: they evaluate at the same time):
// A's first read stalls for 2 s while A holds every slot but the reserve for its group, so B's
// first layer waits to be admitted; B is aborted from a third thread and returns at once, its
// sequence unchanged, and then evaluates exactly. A finishes unharmed.
TEST(IoRobustness, AbortWhileWaitingForAnotherContextsExperts) {
  const std::vector<int32_t> toks = tokens(8);
  const std::vector<float> ref = reference(toks);
  moelite_model* probe = load(0, 1);
  const uint64_t minimum = static_cast<uint64_t>(moelite_model_get(probe, MOELITE_MODEL_EXPERT_MIN_BUDGET));
  moelite_model_free(probe);
  setenv("MOELITE_IO", "pread", 1);  // the stall hooks pread (read by each loader as it starts)
  moelite_model* m = load(minimum, 1);
  std::atomic<bool> stop_b{false};
  moelite_context* a = context(m);
  moelite_context* b = context(m, abort_when_set, &stop_b);
  fault::arm_stall(fault::Kind::kRead, 1, 2.0);
  auto a_done = std::async(std::launch::async, [&] { return moelite_eval(a, toks.data(), 1, 0); });
  while (!fault::fired()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto b_done = std::async(std::launch::async, [&] {
    const double t0 = now();
    const moelite_status st = moelite_eval(b, toks.data(), 1, 0);
    return std::make_pair(st, std::make_pair(now() - t0, std::string(moelite_last_error())));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  stop_b = true;
  const bool b_returned = b_done.wait_for(std::chrono::seconds(1)) == std::future_status::ready;
  EXPECT_TRUE(b_returned) << "the aborted context kept waiting for another context's experts";
  const auto [st, info] = b_done.get();
  EXPECT_EQ(st, MOELITE_ERR_ABORTED) << info.second;
  EXPECT_NE(info.second.find("other contexts' experts"), std::string::npos) << info.second;
  EXPECT_EQ(a_done.get(), MOELITE_OK) << moelite_last_error();
  fault::disarm();
  unsetenv("MOELITE_IO");
  EXPECT_EQ(moelite_context_kv_length(b), 0);
  stop_b = false;
  moelite_context_kv_reset(a);
  ASSERT_EQ(moelite_eval(b, toks.data(), 8, 0), MOELITE_OK) << moelite_last_error();
  EXPECT_EQ(logits_of(b, m), ref);
  moelite_context_free(a);
  moelite_context_free(b);
  moelite_model_free(m);
}

// A destination the kernel cannot pin for a read (EFAULT): a discrete GPU's memory mapped through
// its PCIe BAR, which the Vulkan backend once gave the store as slots on an H200 (O_DIRECT reads
// into it failed). Each reader, io_uring and pread, goes through a bounce buffer and the bytes
// land all the same.
TEST(IoRobustness, AReadIntoMemoryTheKernelCannotPinGoesThroughABounceBuffer) {
  moelite::platform::File f;
  ASSERT_EQ(moelite::platform::File::open(model_path(), &f), MOELITE_OK);
  std::vector<uint8_t> expect(3 * 4096);
  ASSERT_EQ(f.read_at(0, expect.data(), expect.size()), MOELITE_OK);
  for (const char* io : {"", "pread"}) {
    if (*io) setenv("MOELITE_IO", io, 1);
    auto reader = moelite::platform::BatchReader::create(8);
    unsetenv("MOELITE_IO");
    SCOPED_TRACE(reader->name());
    for (int64_t n : {1, 2, 3}) {
      std::vector<uint8_t> got(expect.size(), 0);
      std::vector<moelite::platform::ReadRange> ranges;
      for (int i = 0; i < 3; ++i)
        ranges.push_back({f.native_handle(), uint64_t(i) * 4096, got.data() + i * 4096, 4096, 4096});
      std::vector<bool> done(3, false);
      uint64_t bytes = 0;
      fault::arm(fault::Kind::kReadEfault, n);
      ASSERT_EQ(reader->read_all(ranges, [&](size_t i) { done[i] = true; }, &bytes), MOELITE_OK)
          << moelite_last_error();
      EXPECT_TRUE(fault::fired()) << "read " << n;
      fault::disarm();
      EXPECT_EQ(got, expect) << "read " << n;
      EXPECT_EQ(done, std::vector<bool>(3, true));
      EXPECT_EQ(bytes, expect.size());
    }
  }
}

// The caps on reads in flight (batch_read.h): reads start in order, each once the earlier ones leave
// room. Each range reads a pipe of its own, which a read in flight empties as soon as data arrives:
// data written to a range's pipe stays there until the reader has started that range.
TEST(IoRobustness, BatchReaderKeepsItsCapOnReadsInFlight) {
  struct Cap {
    unsigned reads;
    uint64_t bytes;
  };
  for (const Cap cap : {Cap{2, UINT64_MAX}, Cap{8, 2 * 4096}, Cap{8, 4096 + 100}}) {
    auto reader = moelite::platform::BatchReader::create(cap.reads);
    if (std::string(reader->name()) != "io_uring") GTEST_SKIP() << "no io_uring in this build or kernel";
    SCOPED_TRACE("cap of " + std::to_string(cap.reads) + " reads, " + std::to_string(cap.bytes) + " bytes");
    const int in_flight = cap.bytes == 4096 + 100 ? 1 : 2;
    int pipes[4][2];
    for (auto& p : pipes) ASSERT_EQ(pipe(p), 0);
    std::vector<uint8_t> got(4 * 4096, 0);
    std::vector<moelite::platform::ReadRange> ranges;
    for (int i = 0; i < 4; ++i) ranges.push_back({pipes[i][0], 0, got.data() + i * 4096, 4096, 4096});
    std::mutex mu;
    std::vector<size_t> order;
    auto fut = std::async(std::launch::async, [&] {
      uint64_t n = 0;
      return reader->read_all(
          ranges,
          [&](size_t i) {
            std::lock_guard<std::mutex> lock(mu);
            order.push_back(i);
          },
          &n, cap.bytes);
    });
    const std::vector<uint8_t> block(4096, 0x5A);
    auto unread = [&](int i) {
      int n = -1;
      EXPECT_EQ(ioctl(pipes[i][0], FIONREAD, &n), 0);
      return n;
    };
    auto wait_read = [&](int i) {
      for (int t = 0; t < 2000 && unread(i) != 0; ++t) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return unread(i) == 0;
    };
    // Ranges from `in_flight` on are beyond the cap: their data waits until an earlier range lands.
    for (int i = in_flight; i < 4; ++i) ASSERT_EQ(write(pipes[i][1], block.data(), 4096), 4096);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int i = in_flight; i < 4; ++i) EXPECT_EQ(unread(i), 4096) << "range " << i << " started beyond the cap";
    // The last one in flight lands: the next starts, lands at once (its data is there), and so on.
    ASSERT_EQ(write(pipes[in_flight - 1][1], block.data(), 4096), 4096);
    for (int i = in_flight - 1; i < 4; ++i)
      EXPECT_TRUE(wait_read(i)) << "range " << i << " did not start when there was room";
    for (int i = 0; i < in_flight - 1; ++i) ASSERT_EQ(write(pipes[i][1], block.data(), 4096), 4096);
    ASSERT_EQ(fut.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "the reader hangs";
    EXPECT_EQ(fut.get(), MOELITE_OK) << moelite_last_error();
    EXPECT_EQ(got, std::vector<uint8_t>(got.size(), 0x5A));
    // In order from the one that landed first; the earlier ones (still in flight) after.
    std::vector<size_t> expect_order;
    for (int i = in_flight - 1; i < 4; ++i) expect_order.push_back(static_cast<size_t>(i));
    for (int i = 0; i < in_flight - 1; ++i) expect_order.push_back(static_cast<size_t>(i));
    EXPECT_EQ(order, expect_order);
    for (auto& p : pipes) close(p[0]), close(p[1]);
  }
}

// A failed io_uring submission: before, the reader ignored it and waited for completions of
// reads that were never submitted (forever); the entries left in the ring would also have been
// submitted by the next call, into buffers that no longer expected them.
TEST(IoRobustness, BatchReaderSurvivesAFailedSubmission) {
  auto reader = moelite::platform::BatchReader::create(8);
  if (std::string(reader->name()) != "io_uring") GTEST_SKIP() << "no io_uring in this build or kernel";
  moelite::platform::File f;
  ASSERT_EQ(moelite::platform::File::open(model_path(), &f), MOELITE_OK);
  std::vector<uint8_t> expect(3 * 4096), got(3 * 4096, 0);
  ASSERT_EQ(f.read_at(0, expect.data(), expect.size()), MOELITE_OK);
  auto ranges_into = [&](uint8_t* dst) {
    std::vector<moelite::platform::ReadRange> r;
    for (int i = 0; i < 3; ++i) r.push_back({f.native_handle(), uint64_t(i) * 4096, dst + i * 4096, 4096, 4096});
    return r;
  };
  for (const fault::Kind k : {fault::Kind::kUringSubmit, fault::Kind::kUringComplete}) {
    SCOPED_TRACE(fault::kind_name(k));
    {
      std::vector<uint8_t> doomed(3 * 4096, 0);
      uint64_t n = 0;
      fault::arm(k, 1);
      std::string msg;  // error messages are per thread
      auto fut = std::async(std::launch::async, [&] {
        const moelite::Status st = reader->read_all(
            ranges_into(doomed.data()), [](size_t) {}, &n);
        msg = moelite_last_error();
        return st;
      });
      ASSERT_EQ(fut.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "the reader hangs";
      EXPECT_EQ(fut.get(), MOELITE_ERR_IO);
      EXPECT_NE(msg.find("injected fault"), std::string::npos) << msg;
      fault::disarm();
      doomed.assign(doomed.size(), 0xAB);  // nothing may land here any more
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      for (uint8_t v : doomed) ASSERT_EQ(v, 0xAB) << "a read landed after read_all returned";
    }
    uint64_t n = 0;
    std::vector<bool> done(3, false);
    fault::arm(fault::Kind::kUringBusy, 1);  // a transient refusal on the way: retried
    ASSERT_EQ(reader->read_all(
                  ranges_into(got.data()), [&](size_t i) { done[i] = true; }, &n),
              MOELITE_OK)
        << moelite_last_error();
    EXPECT_TRUE(fault::fired());
    fault::disarm();
    EXPECT_EQ(got, expect);
    got.assign(got.size(), 0);
    done.assign(3, false);
    ASSERT_EQ(reader->read_all(
                  ranges_into(got.data()), [&](size_t i) { done[i] = true; }, &n),
              MOELITE_OK)
        << moelite_last_error();
    EXPECT_EQ(got, expect);
    EXPECT_EQ(done, std::vector<bool>(3, true));
  }
}

// A routing's misses are read in one batch, and the backend computes each expert as it lands.
// The down projection must not wait for the rest of the batch: with the second expert's first
// read stalled, the first expert is handed out and its down chunk waited for long before the
// stall ends. (Before: an expert became Ready only when its whole batch had landed, so the
// compute of a layer's misses queued up behind its last read.)
TEST(IoRobustness, AnExpertIsWholeWhenItsReadsLandNotWhenItsBatchDoes) {
  setenv("MOELITE_IO", "pread", 1);   // reads in submission order: the 4th is expert 1's gate
  setenv("MOELITE_IO_THREADS", "1", 1);  // one loader takes both misses in one batch
  moelite::LoadOptions o;
  o.stream_experts = true;
  moelite::RuntimeOptions ro;
  ro.n_threads = 1;
  ro.backend = moelite::BackendKind::Cpu;
  ro.expert_budget = moelite::ExpertBudget::of_bytes(quarter_of_experts());
  std::unique_ptr<moelite::Model> model;
  ASSERT_EQ(moelite::Model::load(model_path(), o, &model), MOELITE_OK) << moelite_last_error();
  std::unique_ptr<moelite::Runtime> rt;
  ASSERT_EQ(moelite::Runtime::create(*model, ro, &rt), MOELITE_OK) << moelite_last_error();
  unsetenv("MOELITE_IO_THREADS");
  moelite::ExpertStore& store = *rt->store;
  constexpr double kStall = 2.0;
  fault::arm_stall(fault::Kind::kRead, 4, kStall);
  const double t0 = now();
  ASSERT_EQ(store.prepare(0, {0, 1}), MOELITE_OK) << moelite_last_error();
  std::vector<int32_t> pending = {0, 1};
  int32_t got = -1;
  moelite::ExpertWeights w;
  ASSERT_EQ(store.acquire_next(0, &pending, &got, &w), MOELITE_OK) << moelite_last_error();
  EXPECT_EQ(got, 0);
  ASSERT_EQ(store.wait_down(0, got), MOELITE_OK) << moelite_last_error();
  const double first_whole = now() - t0;
  store.release(0, got);
  ASSERT_EQ(store.acquire_next(0, &pending, &got, &w), MOELITE_OK) << moelite_last_error();
  EXPECT_EQ(got, 1);
  ASSERT_EQ(store.wait_down(0, got), MOELITE_OK) << moelite_last_error();
  const double second_whole = now() - t0;
  store.release(0, got);
  EXPECT_TRUE(fault::fired());
  fault::disarm();
  unsetenv("MOELITE_IO");
  EXPECT_LT(first_whole, kStall / 2) << "the first expert waited for its batch's stalled read";
  EXPECT_GE(second_whole, kStall * 0.9);
  EXPECT_EQ(store.pinned_slots(), 0u);
}
