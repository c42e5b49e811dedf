/* pkv_test.h - the in-house assertion header: each CHECK counts, the closing line says
 * "N passed, M failed", and the exit code tells the truth. */
#ifndef PKV_TEST_H
#define PKV_TEST_H

#include "persistentkv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pkv_test_passed = 0;
static int pkv_test_failed = 0;

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (cond) {                                                                      \
            pkv_test_passed++;                                                           \
        } else {                                                                         \
            pkv_test_failed++;                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);     \
        }                                                                                \
    } while (0)

#define CHECK_MSG(cond, ...)                                                             \
    do {                                                                                 \
        if (cond) {                                                                      \
            pkv_test_passed++;                                                           \
        } else {                                                                         \
            pkv_test_failed++;                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                                \
            fputc('\n', stderr);                                                         \
        }                                                                                \
    } while (0)

#define CHECK_STATUS(expr, expected)                                                     \
    do {                                                                                 \
        pkv_status st_ = (expr);                                                         \
        CHECK_MSG(st_ == (expected), "%s returned %d (%s), expected %d (%s)", #expr,     \
                  (int)st_, pkv_status_string(st_), (int)(expected),                    \
                  pkv_status_string(expected));                                          \
    } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, PKV_OK)

/* The expected failure, with a last-error message that starts with its status string. */
#define CHECK_FAILS(expr, expected)                                                                       \
    do {                                                                                                  \
        pkv_status st__ = (expr);                                                                         \
        const char *msg__ = pkv_last_error();                                                             \
        CHECK_MSG(st__ == (expected), "%s returned %d (%s), expected %d (%s)", #expr, (int)st__,          \
                  pkv_status_string(st__), (int)(expected), pkv_status_string(expected));                \
        CHECK_MSG(strncmp(msg__, pkv_status_string(expected), strlen(pkv_status_string(expected))) == 0, \
                  "%s: message '%s' does not start with '%s'", #expr, msg__, pkv_status_string(expected)); \
    } while (0)

/* Exit code 77 tells CTest the test was skipped (SKIP_RETURN_CODE 77). */
#define PKV_TEST_SKIP(...)                                                               \
    do {                                                                                 \
        printf("SKIP: ");                                                                \
        printf(__VA_ARGS__);                                                             \
        printf("\n");                                                                    \
        return 77;                                                                       \
    } while (0)

/* pkv_plan_validate with its message: *why is "" when the plan is valid, else the violation (the thread's
 * pkv_last_error, valid until its next failing call). */
#define pkv_test_validate(plan, lens, why) pkv_test_validate_((plan), (lens), (why))
static inline pkv_status pkv_test_validate_(const pkv_plan *plan, const int32_t *lens, const char **why) {
    const pkv_status st = pkv_plan_validate(plan, lens);
    if (why) *why = st == PKV_OK ? "" : pkv_last_error();
    return st;
}

static inline int pkv_test_finish(const char *name) {
    printf("%s: %d passed, %d failed\n", name, pkv_test_passed, pkv_test_failed);
    return (pkv_test_failed == 0 && pkv_test_passed > 0) ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
