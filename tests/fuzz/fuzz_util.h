/* Helpers of the file-based fuzz harnesses: a private temporary directory
 * per process (removed at exit) and writing an input's parts into it. */
#ifndef SFI_FUZZ_UTIL_H
#define SFI_FUZZ_UTIL_H

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_dir[512];

static inline int fuzz_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

static inline void fuzz_cleanup(void)
{
    if (fuzz_dir[0])
        nftw(fuzz_dir, fuzz_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* The directory, created on first use. Aborts when it cannot be made: a
 * harness that silently tests nothing would be worse. */
static inline const char *fuzz_tmpdir(void)
{
    if (!fuzz_dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(fuzz_dir, sizeof fuzz_dir, "%s/sfi-fuzz-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(fuzz_dir))
            abort();
        atexit(fuzz_cleanup);
    }
    return fuzz_dir;
}

/* Writes data to DIR/name and returns the path (static buffer), or
 * removes DIR/name when data is NULL. */
static inline const char *fuzz_file(const char *name, const void *data, size_t len)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", fuzz_tmpdir(), name);
    if (!data) {
        unlink(path);
        return path;
    }
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    if (len && fwrite(data, 1, len, f) != len)
        abort();
    if (fclose(f))
        abort();
    return path;
}

/* Splits data at each occurrence of sep into at most max parts; returns
 * the number of parts (>= 1). */
static inline size_t fuzz_split(const uint8_t *data, size_t size, const char *sep,
                         const uint8_t **part, size_t *len, size_t max)
{
    size_t n = 0, sl = strlen(sep), start = 0;
    for (size_t i = 0; i + sl <= size && n + 1 < max; i++) {
        if (!memcmp(data + i, sep, sl)) {
            part[n] = data + start;
            len[n++] = i - start;
            start = i + sl;
            i = start - 1;
        }
    }
    part[n] = data + start;
    len[n++] = size - start;
    return n;
}

#endif
