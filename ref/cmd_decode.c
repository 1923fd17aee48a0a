/* sfi-ref decode: token ids on standard input -> text. */
#include <config.h>

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_ref_cli.h"
#include "sfi_tokenizer.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sfi-ref decode --tokenizer DIR < IDS\n\n"
            "Reads whitespace-separated decimal token ids from standard input and\n"
            "writes the bytes they stand for to standard output (added tokens such\n"
            "as <|im_end|> included; nothing added at the end). A character split\n"
            "across ids comes out as its raw bytes.\n\n"
            "  --tokenizer DIR  directory with vocab.json, merges.txt (and\n"
            "                   tokenizer_config.json)\n"
            "  --help           this text\n");
}

int sfi_ref_cmd_decode(int argc, char **argv)
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
        fprintf(stderr, "sfi-ref decode: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!dir) {
        fprintf(stderr, "sfi-ref decode: --tokenizer DIR is required\n");
        usage(stderr);
        return 2;
    }
    sfi_error err;
    sfi_error_clear(&err);
    sfi_tokenizer *t;
    if (sfi_tokenizer_load(dir, &t, &err)) {
        fprintf(stderr, "sfi-ref decode: %s\n", err.msg);
        return 1;
    }
    /* Read all of standard input, then parse: nothing is written unless
     * every id is valid. */
    size_t cap = 1 << 16, got = 0;
    char *in = malloc(cap);
    int rc = 0;
    while (in) {
        got += fread(in + got, 1, cap - got, stdin);
        if (got < cap)
            break;
        char *nb = realloc(in, cap * 2);
        if (!nb)
            free(in);
        in = nb;
        cap *= 2;
    }
    if (!in || ferror(stdin)) {
        fprintf(stderr, "sfi-ref decode: reading standard input failed\n");
        free(in);
        sfi_tokenizer_free(t);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (sfi_token_ids_parse(in, got, "standard input", &ids, &n, &err)) {
        fprintf(stderr, "sfi-ref decode: %s\n", err.msg);
        rc = 1;
    }
    free(in);
    char *text = NULL;
    size_t len = 0;
    if (!rc && sfi_tokenizer_decode(t, ids, n, &text, &len, &err)) {
        fprintf(stderr, "sfi-ref decode: standard input: %s\n", err.msg);
        rc = 1;
    }
    if (!rc && (fwrite(text, 1, len, stdout) != len || fflush(stdout) != 0)) {
        fprintf(stderr, "sfi-ref decode: writing standard output failed\n");
        rc = 1;
    }
    free(text);
    free(ids);
    sfi_tokenizer_free(t);
    return rc;
}
