/* sfi-ref trigger-set: the trigger set of sfi(7) TRIGGERS for a
 * tokenizer directory, as text or JSON. */
#include <config.h>

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_ref_cli.h"
#include "sfi_vocab.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sfi-ref trigger-set --tokenizer DIR [--chars S] [--format text|json]\n\n"
            "Prints the trigger set of sfi(7) TRIGGERS: every token whose decoded\n"
            "text, trailing spaces removed, ends with one of the trigger characters,\n"
            "or contains a newline.\n\n"
            "  --tokenizer DIR  directory with vocab.json (and tokenizer_config.json)\n"
            "  --chars S        trigger characters (default \".?!;\\n\"); escapes \\n \\t \\\\\n"
            "  --format F       text (default): 'size N' then 'ID<TAB>\"TEXT\"' lines;\n"
            "                   json: {\"size\", \"chars\", \"members\": [{\"id\", \"text\", "
            "\"token\"}]}\n"
            "  --help           this text\n");
}

/* Turns the escapes \n \t \\ of a command-line value into their bytes. */
static int unescape(const char *in, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = in; *p; p++) {
        char c = *p;
        if (c == '\\') {
            p++;
            if (*p == 'n')
                c = '\n';
            else if (*p == 't')
                c = '\t';
            else if (*p == '\\')
                c = '\\';
            else
                return -1;
        }
        if (n + 1 >= cap)
            return -1;
        out[n++] = c;
    }
    out[n] = '\0';
    return n ? 0 : -1;
}

int sfi_ref_cmd_trigger_set(int argc, char **argv)
{
    static const struct option opts[] = {
        {"tokenizer", required_argument, NULL, 't'},
        {"chars", required_argument, NULL, 'c'},
        {"format", required_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *dir = NULL, *format = "text";
    char chars[64] = SFI_TRIGGER_CHARS_DEFAULT;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 't': dir = optarg; break;
        case 'c':
            if (unescape(optarg, chars, sizeof chars)) {
                fprintf(stderr,
                        "sfi-ref trigger-set: --chars: '%s' is empty, too long or has "
                        "an escape other than \\n \\t \\\\\n",
                        optarg);
                return 2;
            }
            break;
        case 'f': format = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "sfi-ref trigger-set: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!dir) {
        fprintf(stderr, "sfi-ref trigger-set: --tokenizer DIR is required\n");
        usage(stderr);
        return 2;
    }
    int json = !strcmp(format, "json");
    if (!json && strcmp(format, "text")) {
        fprintf(stderr, "sfi-ref trigger-set: --format: '%s' is neither text nor json\n", format);
        return 2;
    }
    sfi_error err;
    sfi_error_clear(&err);
    sfi_vocab *v;
    if (sfi_vocab_load(dir, &v, &err)) {
        fprintf(stderr, "sfi-ref trigger-set: %s\n", err.msg);
        return 1;
    }
    sfi_trigger_set t;
    if (sfi_trigger_set_build(v, chars, &t, &err)) {
        fprintf(stderr, "sfi-ref trigger-set: %s\n", err.msg);
        sfi_vocab_free(v);
        return 1;
    }
    int rc = 0;
    if (json) {
        json_t *root = json_object(), *members = json_array();
        json_object_set_new(root, "tokenizer", json_string(dir));
        json_object_set_new(root, "chars", json_string(chars));
        json_object_set_new(root, "size", json_integer(t.n_ids));
        for (int32_t i = 0; i < t.n_ids; i++) {
            size_t n;
            const uint8_t *b = sfi_vocab_token_bytes(v, t.ids[i], &n);
            char *esc = sfi_escape_bytes(b, n);
            json_t *m = json_object();
            json_object_set_new(m, "id", json_integer(t.ids[i]));
            json_object_set_new(m, "text", json_string(esc ? esc : ""));
            json_object_set_new(m, "token", json_string(sfi_vocab_token_text(v, t.ids[i])));
            json_array_append_new(members, m);
            free(esc);
        }
        json_object_set_new(root, "members", members);
        char *s = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        if (!s || printf("%s\n", s) < 0)
            rc = 1;
        free(s);
        json_decref(root);
    } else {
        printf("size %d\n", (int)t.n_ids);
        for (int32_t i = 0; i < t.n_ids && !rc; i++) {
            size_t n;
            const uint8_t *b = sfi_vocab_token_bytes(v, t.ids[i], &n);
            char *esc = sfi_escape_bytes(b, n);
            if (!esc || printf("%d\t\"%s\"\n", (int)t.ids[i], esc) < 0)
                rc = 1;
            free(esc);
        }
    }
    if (fflush(stdout) != 0)
        rc = 1;
    if (rc)
        fprintf(stderr, "sfi-ref trigger-set: writing standard output failed\n");
    sfi_trigger_set_free(&t);
    sfi_vocab_free(v);
    return rc;
}
