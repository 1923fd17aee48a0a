/* What sfi-ref's commands share: the --tokenizer option and reading all of
 * standard input (encode, decode), parsing token ids (run, eval), so they
 * accept and refuse the same things with the same messages. */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_ref_cli.h"

int sfi_ref_tokenizer_cli(const char *cmd, int argc, char **argv,
                          void (*usage)(FILE *), sfi_tokenizer **out)
{
    static const struct option opts[] = {
        {"tokenizer", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *dir = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 't': dir = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "sfi-ref %s: unexpected argument '%s'\n", cmd, argv[optind]);
        return 2;
    }
    if (!dir) {
        fprintf(stderr, "sfi-ref %s: --tokenizer DIR is required\n", cmd);
        usage(stderr);
        return 2;
    }
    sfi_error err;
    sfi_error_clear(&err);
    if (sfi_tokenizer_load(dir, out, &err)) {
        fprintf(stderr, "sfi-ref %s: %s\n", cmd, err.msg);
        return 1;
    }
    return -1;
}

char *sfi_ref_read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) {
            if (ferror(f)) {
                free(buf);
                return NULL;
            }
            break;
        }
        char *nb = realloc(buf, cap * 2);
        if (!nb)
            free(buf);
        buf = nb;
        cap *= 2;
    }
    *len = n;
    return buf;
}

/* Whitespace-separated decimal ids. */
sfi_status sfi_ref_parse_ids(const char *path, const char *s, int32_t **ids, int *n,
                            sfi_error *err)
{
    size_t cap = 64, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX ||
            (*end && *end != ' ' && *end != '\n' && *end != '\t' && *end != '\r')) {
            free(v);
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: byte %ld: expected a non-negative decimal token id",
                                 path, (long)(p - s));
        }
        if (k == cap) {
            int32_t *nv = realloc(v, cap * 2 * sizeof *v);
            if (!nv) {
                free(v);
                return sfi_error_set(err, SFI_ENOMEM, "out of memory");
            }
            v = nv;
            cap *= 2;
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    if (k == 0) {
        free(v);
        return sfi_error_set(err, SFI_EFORMAT, "%s: no token ids", path);
    }
    if (k > INT_MAX / 2) {
        free(v);
        return sfi_error_set(err, SFI_ERANGE, "%s: too many ids", path);
    }
    *ids = v;
    *n = (int)k;
    return SFI_OK;
}
