/* sfi-ref encode: standard input's text -> token ids. */
#include <config.h>

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_ref_cli.h"
#include "sfi_tokenizer.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sfi-ref encode --tokenizer DIR < TEXT\n\n"
            "Prints the token ids of standard input's text (UTF-8, read whole, no\n"
            "newline added or removed) on one line, separated by spaces, as Hugging\n"
            "Face's Qwen2Tokenizer gives them (no BOS/EOS added; added tokens such as\n"
            "<|im_start|> in the text are recognized).\n\n"
            "  --tokenizer DIR  directory with vocab.json, merges.txt (and\n"
            "                   tokenizer_config.json), e.g. a checkpoint directory\n"
            "  --help           this text\n");
}

/* Reads all of f; NULL when reading fails or memory runs out. */
static char *slurp(FILE *f, size_t *len)
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

int sfi_ref_cmd_encode(int argc, char **argv)
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
        fprintf(stderr, "sfi-ref encode: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!dir) {
        fprintf(stderr, "sfi-ref encode: --tokenizer DIR is required\n");
        usage(stderr);
        return 2;
    }
    sfi_error err;
    sfi_error_clear(&err);
    sfi_tokenizer *t;
    if (sfi_tokenizer_load(dir, &t, &err)) {
        fprintf(stderr, "sfi-ref encode: %s\n", err.msg);
        return 1;
    }
    size_t len;
    char *text = slurp(stdin, &len);
    if (!text) {
        fprintf(stderr, "sfi-ref encode: reading standard input failed\n");
        sfi_tokenizer_free(t);
        return 1;
    }
    int32_t *ids;
    size_t n;
    int rc = 0;
    if (sfi_tokenizer_encode(t, text, len, &ids, &n, &err)) {
        fprintf(stderr, "sfi-ref encode: standard input: %s\n", err.msg);
        rc = 1;
    } else {
        for (size_t i = 0; i < n; i++)
            printf(i ? " %d" : "%d", (int)ids[i]);
        printf("\n");
        if (fflush(stdout) != 0 || ferror(stdout)) {
            fprintf(stderr, "sfi-ref encode: writing standard output failed\n");
            rc = 1;
        }
        free(ids);
    }
    free(text);
    sfi_tokenizer_free(t);
    return rc;
}
