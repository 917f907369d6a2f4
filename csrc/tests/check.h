// A tiny assertion harness for the torch-free C++ tests: CHECK keeps going and
// counts failures; main() returns the count so ctest sees a non-zero exit.
#pragma once

#include <cstdio>

namespace dsfast_test {
inline int& failures() { static int n = 0; return n; }
}  // namespace dsfast_test

#define CHECK(cond, ...)                                                  \
  do {                                                                    \
    if (!(cond)) {                                                        \
      if (++dsfast_test::failures() <= 20) {                              \
        std::fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
        std::fprintf(stderr, __VA_ARGS__);                                \
        std::fprintf(stderr, "\n");                                       \
      }                                                                   \
    }                                                                     \
  } while (0)

#define TEST_MAIN_END()                                                   \
  do {                                                                    \
    int n = dsfast_test::failures();                                      \
    std::printf(n ? "FAILED: %d check(s)\n" : "all checks passed\n", n); \
    return n ? 1 : 0;                                                     \
  } while (0)
