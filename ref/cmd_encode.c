/* sfi-ref encode: standard input's text -> token ids. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_io.h"
#include "sfi_ref_cli.h"
#include "sfi_tokenizer.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: sfi-ref encode --tokenizer DIR < TEXT\n\n"
                 "Prints the token ids of standard input's text (UTF-8, read whole, no\n"
                 "newline added or removed) on one line, separated by spaces, as Hugging\n"
                 "Face's Qwen2Tokenizer gives them (no BOS/EOS added; added tokens such as\n"
                 "<|im_start|> in the text are recognized).\n\n"
                 "  --tokenizer DIR  directory with vocab.json, merges.txt (and\n"
                 "                   tokenizer_config.json), e.g. a checkpoint directory\n"
                 "  --help           this text\n");
}

int sfi_ref_cmd_encode(int argc, char **argv)
{
    sfi_tokenizer *t;
    int rc0 = sfi_ref_tokenizer_cli("encode", argc, argv, usage, &t);
    if (rc0 >= 0)
        return rc0;
    sfi_error err;
    sfi_error_clear(&err);
    size_t len;
    char *text = NULL;
    if (sfi_io_read_stream(stdin, "standard input", SFI_REF_PROMPT_FILE_MAX, "an input", &text,
                           &len, &err) != SFI_OK)
        text = NULL;
    if (!text) {
        fprintf(stderr, "sfi-ref encode: %s\n", err.msg);
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
