/*
 * insn_count: a minimal QEMU TCG plugin that counts executed guest instructions, in total and,
 * optionally, inside one address range of the guest program. Used by tools/arm_instruction_count.sh
 * to measure instructions per token of the aarch64 build under qemu-user (qemu's timing means
 * nothing; its instruction counts are exact up to TBs left early by an exception).
 *
 *   gcc -O2 -shared -fPIC -fvisibility=hidden -o insn_count.so insn_count.c
 *   qemu-aarch64 -plugin ./insn_count.so,out=counts.txt,lo=0x1000,hi=0x2000,rel=0x0 prog args
 *
 * Arguments (all optional, key=value):
 *   out=PATH   write the counts there (default: stderr)
 *   lo=ADDR    start of a range to count as well (hex or decimal)
 *   hi=ADDR    end of that range (exclusive); up to 256 lo=/hi= pairs, counted together (e.g. the
 *              .text of each kernel object file)
 *   rel=ADDR   lo/hi are link-time addresses of the main executable: rel is the link-time address of
 *              its lowest executable segment (readelf -l), and the load bias is
 *              qemu_plugin_start_code() - rel (qemu-user loads a PIE wherever it likes)
 * Output, one line: "insns TOTAL range IN_RANGES ranges N bias 0x..".
 *
 * Counting is inline (no helper call per block): each translated block adds its instruction count
 * to a 64-bit counter when it starts executing, and, when a range is given, a second inline add of
 * the number of its instructions inside the range. The counters are plain (non-atomic) words, exact
 * for one guest thread; several guest threads may lose a few increments.
 *
 * No QEMU header is installed here (Debian ships qemu-user without qemu-plugin.h), so the few types
 * and functions used are declared by hand below. They match include/qemu/qemu-plugin.h of QEMU 7.2
 * (QEMU_PLUGIN_VERSION 1, plugin API of QEMU 4.2..8.1: inline ops as enum qemu_plugin_op with a
 * plain pointer; QEMU 8.2+/9.x replaced these with scoreboards and raised the version).
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- declarations matching QEMU 7.2 include/qemu/qemu-plugin.h (API version 1) ---- */
typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t {
  const char* target_name;
  struct {
    int min;
    int cur;
  } version;
  bool system_emulation;
  union {
    struct {
      int smp_vcpus;
      int max_vcpus;
    } system;
  };
} qemu_info_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb* tb);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void* userdata);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb* tb, enum qemu_plugin_op op, void* ptr,
                                              uint64_t imm);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void* userdata);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb* tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb* tb);
struct qemu_plugin_insn* qemu_plugin_tb_get_insn(const struct qemu_plugin_tb* tb, size_t idx);
uint64_t qemu_plugin_insn_vaddr(const struct qemu_plugin_insn* insn);
uint64_t qemu_plugin_start_code(void); /* user mode: lowest address of the executable's text */
/* ---- end of QEMU declarations ---- */

EXPORT int qemu_plugin_version = 1; /* QEMU_PLUGIN_VERSION of 7.2 */

#define MAX_RANGES 256
static uint64_t total_insns, range_insns;
static uint64_t range_lo[MAX_RANGES], range_hi[MAX_RANGES], rel_base, bias;
static int n_ranges;
static bool have_rel, bias_known;
static const char* out_path;

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb* tb) {
  (void)id;
  const size_t n = qemu_plugin_tb_n_insns(tb);
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &total_insns, n);
  if (!n_ranges) return;
  if (!bias_known) {  // the executable is mapped by now (the first block is translated after loading)
    bias = have_rel ? qemu_plugin_start_code() - rel_base : 0;
    bias_known = true;
  }
  size_t in = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t a = qemu_plugin_insn_vaddr(qemu_plugin_tb_get_insn(tb, i)) - bias;
    for (int r = 0; r < n_ranges; ++r)
      if (a >= range_lo[r] && a < range_hi[r]) {
        ++in;
        break;
      }
  }
  if (in) qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &range_insns, in);
}

static void at_exit(qemu_plugin_id_t id, void* userdata) {
  (void)id;
  (void)userdata;
  FILE* f = out_path ? fopen(out_path, "w") : stderr;
  if (!f) {
    fprintf(stderr, "insn_count: cannot write %s\n", out_path);
    f = stderr;
  }
  fprintf(f, "insns %" PRIu64 " range %" PRIu64 " ranges %d bias 0x%" PRIx64 "\n", total_insns, range_insns,
          n_ranges, bias);
  if (f != stderr) fclose(f);
}

static bool parse_u64(const char* s, uint64_t* v) {
  char* end = NULL;
  *v = strtoull(s, &end, 0);
  return end != s && *end == '\0';
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t* info, int argc, char** argv) {
  bool open = false;  // a lo= waiting for its hi=
  for (int i = 0; i < argc; ++i) {
    const char* a = argv[i];
    if (strncmp(a, "arg=", 4) == 0) a += 4;  // the pre-7.0 "-plugin x.so,arg=k=v" spelling
    if (strncmp(a, "out=", 4) == 0) {
      out_path = a + 4;
    } else if (strncmp(a, "lo=", 3) == 0 && !open && n_ranges < MAX_RANGES && parse_u64(a + 3, &range_lo[n_ranges])) {
      open = true;
    } else if (strncmp(a, "hi=", 3) == 0 && open && parse_u64(a + 3, &range_hi[n_ranges]) &&
               range_hi[n_ranges] > range_lo[n_ranges]) {
      open = false;
      ++n_ranges;
    } else if (strncmp(a, "rel=", 4) == 0 && parse_u64(a + 4, &rel_base)) {
      have_rel = true;
    } else {
      fprintf(stderr,
              "insn_count: bad argument '%s' (out=PATH rel=ADDR and up to %d pairs lo=ADDR,hi=ADDR in order, "
              "lo < hi)\n",
              argv[i], MAX_RANGES);
      return 1;
    }
  }
  if (open) {
    fprintf(stderr, "insn_count: lo= without hi=\n");
    return 1;
  }
  if (info->system_emulation && have_rel) {
    fprintf(stderr, "insn_count: rel= needs user-mode emulation\n");
    return 1;
  }
  qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
  qemu_plugin_register_atexit_cb(id, at_exit, NULL);
  return 0;
}
