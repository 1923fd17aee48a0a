/* sfi-ref decode: token ids on standard input -> text. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_io.h"
#include "sfi_ref_cli.h"
#include "sfi_tokenizer.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: sfi-ref decode --tokenizer DIR < IDS\n\n"
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
    sfi_tokenizer *t;
    int rc0 = sfi_ref_tokenizer_cli("decode", argc, argv, usage, &t);
    if (rc0 >= 0)
        return rc0;
    sfi_error err;
    sfi_error_clear(&err);
    /* Read all of standard input, then parse: nothing is written unless
     * every id is valid. */
    size_t got = 0;
    char *in = NULL;
    if (sfi_io_read_stream(stdin, "standard input", SFI_REF_PROMPT_FILE_MAX, "an input", &in, &got,
                           &err) != SFI_OK)
        in = NULL;
    int rc = 0;
    if (!in) {
        fprintf(stderr, "sfi-ref decode: %s\n", err.msg);
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
