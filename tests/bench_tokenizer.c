/* Tokenizer benchmark (make bench): load time of the Qwen3 tokenizer, and
 * encode/decode throughput on (1) English prose and code (the repository's
 * own text files) and (2) the multilingual strings of the conformance
 * fixture, each repeated to about 8 MB. Optional argument: a text file to
 * encode instead of (1). */
#include <config.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_clock.h"
#include "sfi_test_util.h"
#include "sfi_tokenizer.h"

#define TARGET_BYTES (8u << 20)

typedef struct {
    char *p;
    size_t n, cap;
} buf;

static void append(buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) {
            fprintf(stderr, "bench_tokenizer: out of memory\n");
            exit(1);
        }
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void repeat_to_target(buf *b)
{
    size_t one = b->n;
    char *copy = malloc(one + 1);
    if (!copy)
        return;
    memcpy(copy, b->p, one);
    while (one && b->n < TARGET_BYTES)
        append(b, copy, one); /* not b->p: append may move it */
    free(copy);
}

static int run(const sfi_tokenizer *t, const char *name, const buf *text)
{
    sfi_error err;
    int32_t *ids;
    size_t n;
    double t0 = sfi_clock_wall(), c0 = sfi_clock_cpu();
    if (sfi_tokenizer_encode(t, text->p, text->n, &ids, &n, &err)) {
        fprintf(stderr, "bench_tokenizer: %s: %s\n", name, err.msg);
        return 1;
    }
    double t1 = sfi_clock_wall(), c1 = sfi_clock_cpu();
    char *out;
    size_t len;
    if (sfi_tokenizer_decode(t, ids, n, &out, &len, &err)) {
        fprintf(stderr, "bench_tokenizer: %s: %s\n", name, err.msg);
        free(ids);
        return 1;
    }
    double t2 = sfi_clock_wall();
    printf("%-12s %5.2f MB %8zu ids %4.2f bytes/id  encode %6.2f MB/s (CPU %6.2f)  decode "
           "%6.1f MB/s\n",
           name, (double)text->n / 1e6, n, (double)text->n / (double)n,
           (double)text->n / 1e6 / (t1 - t0), (double)text->n / 1e6 / (c1 - c0),
           (double)len / 1e6 / (t2 - t1));
    free(ids);
    free(out);
    return 0;
}

int main(int argc, char **argv)
{
    char dir[2048];
    snprintf(dir, sizeof dir, "%s", sfi_test_src("tests/fixtures/qwen3-tokenizer"));
    sfi_error err;
    sfi_tokenizer *t = NULL;
    double best = 1e30, best_cpu = 1e30;
    for (int i = 0; i < 5; i++) {
        double t0 = sfi_clock_wall(), c0 = sfi_clock_cpu();
        sfi_tokenizer *x;
        if (sfi_tokenizer_load(dir, &x, &err)) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        double dt = sfi_clock_wall() - t0, dc = sfi_clock_cpu() - c0;
        best = dt < best ? dt : best;
        best_cpu = dc < best_cpu ? dc : best_cpu;
        if (t)
            sfi_tokenizer_free(t);
        t = x;
    }
    printf("load %s: %.1f ms wall, %.1f ms CPU (best of 5; %d tokens)\n", dir, best * 1e3,
           best_cpu * 1e3, (int)sfi_vocab_size(sfi_tokenizer_vocab(t)));

    buf prose = {0};
    if (argc > 1) {
        size_t n;
        char *s = sfi_test_read_file(argv[1], &n);
        if (!s) {
            fprintf(stderr, "bench_tokenizer: %s: cannot read\n", argv[1]);
            return 1;
        }
        append(&prose, s, n);
        free(s);
    } else {
        static const char *const files[] = {"LICENSE",
                                            "README.md",
                                            "src/sfi_tokenizer.c",
                                            "src/sfi_vocab.c",
                                            "tests/test_tokenizer.c",
                                            "man/sfi-ref-trigger-set.1"};
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
            size_t n;
            char *s = sfi_test_read_file(sfi_test_src(files[i]), &n);
            if (s)
                append(&prose, s, n);
            free(s);
        }
        repeat_to_target(&prose);
    }
    buf multi = {0};
    json_error_t je;
    json_t *root = json_load_file(sfi_test_src("tests/fixtures/tokenizer-conformance.json"),
                                  JSON_ALLOW_NUL, &je);
    json_t *cases = json_object_get(
        json_object_get(json_object_get(root, "tokenizers"), "qwen3-tokenizer"), "cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *s = json_object_get(json_array_get(cases, i), "text");
        append(&multi, json_string_value(s), json_string_length(s));
    }
    json_decref(root);
    repeat_to_target(&multi);
    int rc = 0;
    if (!prose.n || !multi.n) {
        fprintf(stderr, "bench_tokenizer: no text found (run from the source tree)\n");
        rc = 1;
    }
    if (!rc)
        rc = run(t, argc > 1 ? argv[1] : "prose+code", &prose) || run(t, "multilingual", &multi);
    free(prose.p);
    free(multi.p);
    sfi_tokenizer_free(t);
    return rc;
}
