// The emulated CUDA device (MOELITE_CUDA_EMULATOR): device memory is host memory, kernels run
// through the SIMT emulator, and streams are queues drained only when something waits for them
// (see gpu_runtime.h), so missing synchronisation shows up as wrong results in tests.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backends/cuda/emu_launch.h"
#include "backends/cuda/gpu_runtime.h"

namespace moelite::cuda {
namespace {

constexpr uint64_t kEmulatedMemory = uint64_t(16) << 30;  // what the emulated device reports
constexpr size_t kAlign = 256;                            // cudaMalloc's alignment

std::atomic<int64_t> g_fail_countdown{0};  // emu_fail_nth_operation_for_testing
bool injected_fault() {
  int64_t left = g_fail_countdown.load();
  while (left > 0 && !g_fail_countdown.compare_exchange_weak(left, left - 1)) {
  }
  return left == 1;
}

class EmuRuntime;

struct EmuStream {
  EmuRuntime* owner = nullptr;
  uint64_t id = 0;  // never reused, unlike the address once the stream is destroyed
  std::deque<std::function<Status()>> queue;
  uint64_t enqueued = 0, executed = 0;
  Status error = MOELITE_OK;  // first failure since the last synchronisation reported it
  std::string message;
  uint64_t skip_through = 0;  // operations up to this position were queued behind a failure
};

struct EmuEvent {
  uint64_t stream = 0;    // the id of the stream it was recorded on (0: never recorded)
  uint64_t position = 0;  // the stream's work up to here precedes the event
};

class EmuRuntime final : public GpuRuntime {
 public:
  explicit EmuRuntime(bool integrated) {
    info_.name = integrated ? "SIMT emulator (integrated, unified memory)" : "SIMT emulator (discrete)";
    info_.cc_major = 8;
    info_.cc_minor = 7;
    info_.integrated = integrated;
    info_.emulated = true;
    info_.total_memory = kEmulatedMemory;
    info_.multiprocessors = 1;
  }
  ~EmuRuntime() override {
    for (EmuStream* s : streams_) delete s;
    for (void* p : allocations_) std::free(p);
  }

  const DeviceInfo& info() const override { return info_; }
  const KernelTable& kernels() const override { return emulator_kernels(); }

  Status device_alloc(size_t bytes, void** out) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (injected_fault())
      return fail(MOELITE_ERR_OUT_OF_MEMORY, "emulated CUDA device: injected failure of an allocation of %zu bytes",
                  bytes);
    if (bytes > kEmulatedMemory - std::min(used_, kEmulatedMemory))
      return fail(MOELITE_ERR_OUT_OF_MEMORY, "emulated CUDA device: %zu bytes do not fit in its %llu GiB", bytes,
                  (unsigned long long)(kEmulatedMemory >> 30));
    void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    if (!p) return fail(MOELITE_ERR_OUT_OF_MEMORY, "emulated CUDA device: allocation of %zu bytes", bytes);
    allocations_.insert(p);
    sizes_[p] = bytes;
    used_ += bytes;
    *out = p;
    return MOELITE_OK;
  }
  void device_free(void* p) override {
    if (!p) return;
    std::lock_guard<std::recursive_mutex> lock(mu_);
    drain_all();  // as cudaFree: nothing queued may still use it
    used_ -= sizes_[p];
    sizes_.erase(p);
    allocations_.erase(p);
    std::free(p);
  }
  Status host_alloc_mapped(size_t bytes, void** host, void** device) override {
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!p) return fail(MOELITE_ERR_OUT_OF_MEMORY, "emulated CUDA device: pinned host allocation of %zu bytes", bytes);
    *host = *device = p;  // unified addressing: one address for both
    return MOELITE_OK;
  }
  void host_free_mapped(void* host) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    drain_all();
    std::free(host);
  }

  Status stream_create(StreamHandle* out) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto* s = new EmuStream();
    s->owner = this;
    s->id = ++last_stream_id_;
    streams_.insert(s);
    by_id_[s->id] = s;
    *out = s;
    return MOELITE_OK;
  }
  void stream_destroy(StreamHandle h) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto* s = static_cast<EmuStream*>(h);
    run_until(s, s->enqueued);  // queued work completes, as with cudaStreamDestroy
    streams_.erase(s);
    by_id_.erase(s->id);
    delete s;
  }
  Status event_create(EventHandle* out) override {
    *out = new EmuEvent();
    return MOELITE_OK;
  }
  void event_destroy(EventHandle e) override { delete static_cast<EmuEvent*>(e); }

  // A copy from host memory reads its source whenever the device gets to it: on a GPU that may be
  // at once or after the host has moved on, and this emulator runs it only when something waits.
  // So the host must leave the source alone from the call until the copy is known complete. The
  // bytes as they were at the call are kept and compared when the copy runs: a change in between
  // is a fault here, whichever order the host and the queue happened to run in (on a GPU it would
  // copy old bytes, new ones or a mix, silently). That is how a backend that started copying an
  // expert's down matrix before the store's read of it had landed was found (on a GPU first).
  Status copy_async(void* dst, const void* src, size_t bytes, StreamHandle s) override {
    std::shared_ptr<std::vector<uint8_t>> at_call;
    if (!is_device_memory(src)) {
      const auto* from = static_cast<const uint8_t*>(src);
      at_call = std::make_shared<std::vector<uint8_t>>(from, from + bytes);
    }
    return enqueue(s, [dst, src, bytes, at_call] {
      if (at_call && std::memcmp(src, at_call->data(), bytes) != 0)
        return fail(MOELITE_ERR_BACKEND,
                    "emulated CUDA device: the host changed the source of an asynchronous copy (%zu bytes from "
                    "host memory) after the copy was queued and before it ran; on a GPU the copy would have read "
                    "old bytes, new ones or a mix",
                    bytes);
      std::memmove(dst, src, bytes);
      return MOELITE_OK;
    });
  }
  Status event_record(EventHandle e, StreamHandle s) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto* ev = static_cast<EmuEvent*>(e);
    auto* stream = static_cast<EmuStream*>(s);
    ev->stream = stream->id;
    ev->position = stream->enqueued;
    return MOELITE_OK;
  }
  // An event of a stream destroyed since (another backend instance's, freed with its context) is
  // complete: a stream's work runs to its end when it is destroyed, as with cudaStreamDestroy.
  Status stream_wait(StreamHandle s, EventHandle e) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    const EmuEvent ev = *static_cast<EmuEvent*>(e);  // the event as recorded now
    if (!ev.stream) return MOELITE_OK;
    return enqueue(s, [this, ev] {
      if (EmuStream* from = live_stream(ev.stream)) run_until(from, ev.position);
      return MOELITE_OK;
    });
  }
  Status event_sync(EventHandle e) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto* ev = static_cast<EmuEvent*>(e);
    EmuStream* from = live_stream(ev->stream);
    if (!from) return MOELITE_OK;
    run_until(from, ev->position);
    return take_error(from);
  }
  Status stream_sync(StreamHandle h) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto* s = static_cast<EmuStream*>(h);
    run_until(s, s->enqueued);
    return take_error(s);
  }

  Status enqueue(StreamHandle h, std::function<Status()> op) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto* s = static_cast<EmuStream*>(h);
    if (!s || !streams_.count(s)) return fail(MOELITE_ERR_INTERNAL, "emulated CUDA device: unknown stream");
    if (injected_fault())  // the operation does not run, and says so when the stream is drained
      op = [] { return fail(MOELITE_ERR_BACKEND, "emulated CUDA device: injected fault in a queued operation"); };
    s->queue.push_back(std::move(op));
    ++s->enqueued;
    return MOELITE_OK;
  }

 private:
  void run_until(EmuStream* s, uint64_t position) {
    while (s->executed < position && !s->queue.empty()) {
      std::function<Status()> op = std::move(s->queue.front());
      s->queue.pop_front();
      ++s->executed;
      // Work queued behind a failure does not run, as a faulted CUDA context launches nothing: a
      // kernel behind a failed copy of its table would otherwise follow whatever pointers the
      // uncopied memory held. Work queued after the failure ran may run (the host has not seen it).
      if (s->executed <= s->skip_through) continue;
      const Status st = op();
      if (st != MOELITE_OK) {
        if (s->error == MOELITE_OK) {
          s->error = st;
          s->message = last_error_message();
        }
        s->skip_through = s->enqueued;
      }
    }
  }
  bool is_device_memory(const void* p) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto it = sizes_.upper_bound(const_cast<void*>(p));
    if (it == sizes_.begin()) return false;
    --it;
    return static_cast<const uint8_t*>(p) < static_cast<const uint8_t*>(it->first) + it->second;
  }
  void drain_all() {
    for (EmuStream* s : streams_) run_until(s, s->enqueued);
  }
  EmuStream* live_stream(uint64_t id) {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : it->second;
  }
  Status take_error(EmuStream* s) {
    const Status st = s->error;
    if (st == MOELITE_OK) return MOELITE_OK;
    s->error = MOELITE_OK;
    return fail(st, "%s", s->message.c_str());
  }

  DeviceInfo info_;
  std::recursive_mutex mu_;
  std::set<EmuStream*> streams_;
  std::map<uint64_t, EmuStream*> by_id_;
  uint64_t last_stream_id_ = 0;
  std::set<void*> allocations_;
  std::map<void*, size_t> sizes_;
  uint64_t used_ = 0;
};

}  // namespace

Status emu_enqueue_kernel(StreamHandle s, simt::Dim3 grid, simt::Dim3 block, size_t shared_bytes,
                          const char* kernel_name, std::function<void()> body) {
  auto* stream = static_cast<EmuStream*>(s);
  if (!stream) return fail(MOELITE_ERR_INTERNAL, "emulated CUDA device: launch of %s on no stream", kernel_name);
  std::string name(kernel_name);
  return stream->owner->enqueue(s, [grid, block, shared_bytes, name, body = std::move(body)] {
    const Status st = simt::launch(grid, block, shared_bytes, body);
    if (st != MOELITE_OK) return fail(st, "kernel %s: %s", name.c_str(), last_error_message());
    return MOELITE_OK;
  });
}

void emu_fail_nth_operation_for_testing(int64_t n) { g_fail_countdown.store(n); }

Status open_emulated_runtime(bool integrated, std::unique_ptr<GpuRuntime>* out) {
  *out = std::make_unique<EmuRuntime>(integrated);
  return MOELITE_OK;
}

}  // namespace moelite::cuda
