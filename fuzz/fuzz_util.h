/* fuzz_util.h - what the fuzz targets share: a reader that turns the fuzzer's bytes into values (zeros once
 * they run out, so every input is a complete case), a scratch file for the parsers that read a path, and
 * the failure report.  Each target is one file fuzz_<name>.c defining LLVMFuzzerTestOneInput; it builds
 * with libFuzzer (clang, scripts/fuzz.sh) and without it (replay_main.c: the corpus as a CTest test). */
#ifndef PKV_FUZZ_UTIL_H
#define PKV_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input as a stream of little-endian values. */
typedef struct fuzz_bytes {
    const uint8_t *data;
    size_t size, at;
} fuzz_bytes;

static inline uint64_t fuzz_take(fuzz_bytes *b, int nbytes) {
    uint64_t v = 0;
    for (int k = 0; k < nbytes; k++) v |= (uint64_t)(b->at < b->size ? b->data[b->at++] : 0) << (8 * k);
    return v;
}
static inline uint8_t fuzz_u8(fuzz_bytes *b) { return (uint8_t)fuzz_take(b, 1); }
static inline uint16_t fuzz_u16(fuzz_bytes *b) { return (uint16_t)fuzz_take(b, 2); }
static inline uint32_t fuzz_u32(fuzz_bytes *b) { return (uint32_t)fuzz_take(b, 4); }
static inline uint64_t fuzz_u64(fuzz_bytes *b) { return fuzz_take(b, 8); }
static inline int32_t fuzz_i32(fuzz_bytes *b) { return (int32_t)fuzz_u32(b); }
/* lo + a value in [0, hi - lo] (hi >= lo, the range below 2^32). */
static inline int64_t fuzz_range(fuzz_bytes *b, int64_t lo, int64_t hi) {
    const uint64_t span = (uint64_t)(hi - lo) + 1;
    const uint64_t v = span <= 256 ? fuzz_u8(b) : span <= 65536 ? fuzz_u16(b) : fuzz_u32(b);
    return lo + (int64_t)(v % span);
}

/* A failed property: print it and abort (libFuzzer saves the input; the replay test fails). */
#define FUZZ_CHECK(cond, ...)                                                                                       \
    do {                                                                                                            \
        if (!(cond)) {                                                                                              \
            fprintf(stderr, "%s:%d: fuzz property failed: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                                           \
            fputc('\n', stderr);                                                                                    \
            abort();                                                                                                \
        }                                                                                                           \
    } while (0)

/* A scratch file of this process holding the input ($TMPDIR or /tmp); NULL if it cannot be written.
 * The name carries an address of this process's stack so parallel fuzzers do not share it; removed at exit. */
static char fuzz_temp_path[512];
static inline void fuzz_remove_temp(void) { remove(fuzz_temp_path); }
static inline const char *fuzz_write_temp(const char *tag, const uint8_t *data, size_t size) {
    char *path = fuzz_temp_path;
    if (!path[0]) {
        atexit(fuzz_remove_temp);
        const char *dir = getenv("TMPDIR");
        int local = 0;
        snprintf(path, sizeof fuzz_temp_path, "%s/pkv_fuzz_%s_%llx", dir && *dir ? dir : "/tmp", tag,
                 (unsigned long long)(uintptr_t)&local);
    }
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    const int ok = fwrite(data, 1, size, f) == size;
    if (fclose(f) != 0 || !ok) return NULL;
    return path;
}

#endif /* PKV_FUZZ_UTIL_H */
