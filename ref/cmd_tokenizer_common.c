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
#include "sfi_vocab.h"

int sfi_ref_tokenizer_cli(const char *cmd, int argc, char **argv, void (*usage)(FILE *),
                          sfi_tokenizer **out)
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

/* Whitespace-separated decimal ids. */
sfi_status sfi_ref_parse_ids(const char *path, const char *s, size_t len, int32_t **ids, int *n,
                             sfi_error *err)
{
    /* The one parser of id lists (sfi-ref decode's too). */
    size_t k = 0;
    int32_t *v = NULL;
    sfi_status st = sfi_token_ids_parse(s, len, path, &v, &k, err);
    if (st)
        return st;
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

sfi_status sfi_ref_tokenizer_fits(const sfi_tokenizer *tk, const char *tok_dir,
                                  const sfi_model_config *cfg, sfi_error *err)
{
    int32_t n = sfi_vocab_size(sfi_tokenizer_vocab(tk));
    if (n > cfg->vocab_size)
        return sfi_error_set(err, SFI_EINVAL,
                             "%s: the tokenizer's ids reach %d, past the "
                             "model's vocab_size %d: not this model's tokenizer",
                             tok_dir, n - 1, cfg->vocab_size);
    return SFI_OK;
}
