/* Replays a harness's inputs without libFuzzer, so that `make check`
 * (any compiler, sanitizers or not) runs every seed and every regression
 * input through the same entry point the fuzzer drives.
 *
 * With no arguments: every file in $SFI_SRCDIR/tests/fuzz/corpus/NAME and
 * $SFI_SRCDIR/tests/fuzz/regressions/NAME (NAME = SFI_FUZZ_NAME). With
 * arguments: those files (to reproduce one crash by hand). */
#include <config.h>

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: cannot open\n", path);
        return -1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "replay: %s: out of memory\n", path);
        return -1;
    }
    /* An exact-size copy, so that ASan sees reads past the input's end. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int replay_dir(const char *dir, int *count)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0; /* an absent regressions directory is fine */
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "README.md"))
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (replay_file(path))
            rc = -1;
        else
            ++*count;
    }
    closedir(d);
    return rc;
}

int main(int argc, char **argv)
{
    int count = 0, rc = 0;
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            rc |= replay_file(argv[i]) ? 1 : 0, count++;
        printf("replayed %d input(s)\n", count);
        return rc;
    }
    const char *src = getenv("SFI_SRCDIR");
    if (!src || !*src)
        src = ".";
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", src, SFI_FUZZ_NAME);
    int seeds = 0, regs = 0;
    if (replay_dir(dir, &seeds))
        rc = 1;
    snprintf(dir, sizeof dir, "%s/tests/fuzz/regressions/%s", src, SFI_FUZZ_NAME);
    if (replay_dir(dir, &regs))
        rc = 1;
    printf("%s: replayed %d seed(s) and %d regression input(s)\n", SFI_FUZZ_NAME, seeds, regs);
    /* No seeds means the corpus went missing: that is a failure, not a
     * pass over nothing. */
    if (seeds == 0) {
        fprintf(stderr, "%s: no seed inputs under %s/tests/fuzz/corpus/%s\n", SFI_FUZZ_NAME,
                src, SFI_FUZZ_NAME);
        return 1;
    }
    return rc;
}
