/* The CHECK macro of the C API tests: counts checks and failures, prints a failed condition with
 * the library's last error, and lets the test go on (a summary line and the exit status come from
 * the test's main). One per test program. */
#ifndef MOELITE_TESTS_C_CHECK_H
#define MOELITE_TESTS_C_CHECK_H
#include <stdio.h>

#include "moelite.h"

static int g_failures = 0;
static int g_checks = 0;

#define CHECK(cond)                                                                                                 \
  do {                                                                                                              \
    ++g_checks;                                                                                                     \
    if (!(cond)) {                                                                                                  \
      ++g_failures;                                                                                                 \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, moelite_last_error()); \
    }                                                                                                               \
  } while (0)

#endif
