/* replay_main.c - the fuzz targets without libFuzzer: runs LLVMFuzzerTestOneInput on each file named
 * on the command line, and on each file of each directory named (in name order), then prints how many.
 * CTest replays every target's corpus this way (fuzz/CMakeLists.txt: test fuzz_<name> over
 * fuzz/corpus/<name>), so the seed inputs and every crash turned regression run in each build, the
 * sanitizer builds included.  No input at all is a failure (a corpus that went missing). */
#define _POSIX_C_SOURCE 200809L
#include "fuzz_util.h"

#include <dirent.h>
#include <sys/stat.h>

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return 0;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            uint8_t *grown = realloc(buf, cap *= 2);
            if (!grown) free(buf);
            buf = grown;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "out of memory reading %s\n", path);
        return 0;
    }
    /* a copy of exactly n bytes, so ASan sees a read past the input */
    uint8_t *exact = malloc(n ? n : 1);
    if (exact) memcpy(exact, buf, n);
    free(buf);
    if (!exact) return 0;
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
    long inputs = 0;
    for (int a = 1; a < argc; a++) {
        struct stat sb;
        if (stat(argv[a], &sb) != 0) {
            fprintf(stderr, "%s: no such file or directory\n", argv[a]);
            return 1;
        }
        if (!S_ISDIR(sb.st_mode)) {
            if (!replay_file(argv[a])) return 1;
            inputs++;
            continue;
        }
        DIR *d = opendir(argv[a]);
        if (!d) return 1;
        char **names = NULL;
        size_t count = 0, cap = 0;
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            if (e->d_name[0] == '.') continue;
            if (count == cap) {
                char **grown = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
                if (!grown) return 1;
                names = grown;
            }
            const size_t len = strlen(argv[a]) + strlen(e->d_name) + 2;
            if (!(names[count] = malloc(len))) return 1;
            snprintf(names[count++], len, "%s/%s", argv[a], e->d_name);
        }
        closedir(d);
        if (count > 1) qsort(names, count, sizeof *names, cmp_str);
        for (size_t k = 0; k < count; k++) {
            if (stat(names[k], &sb) == 0 && S_ISREG(sb.st_mode)) {
                if (!replay_file(names[k])) return 1;
                inputs++;
            }
            free(names[k]);
        }
        free(names);
    }
    printf("%s: %ld inputs replayed, every property held\n", argc > 0 ? argv[0] : "replay", inputs);
    return inputs > 0 ? 0 : 1;
}
