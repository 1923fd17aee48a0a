/* Tokenizer: conformance with Hugging Face transformers on every string of
 * tests/fixtures/tokenizer-conformance.json (written by
 * tests/make_tokenizer_fixtures.py), for the Qwen3 tokenizer and the
 * sfi-small-qwen3 model's own; NFC; bad input; the encode/decode CLIs. */
#include <config.h>

#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_nfc.h"
#include "sfi_test_util.h"
#include "sfi_tokenizer.h"

static char qwen_dir[2048], small_dir[2048], fixture[2048];

static sfi_tokenizer *load_ok(const char *dir)
{
    sfi_error err;
    sfi_error_clear(&err);
    sfi_tokenizer *t = NULL;
    ck_assert_msg(sfi_tokenizer_load(dir, &t, &err) == SFI_OK, "%s: %s", dir, err.msg);
    return t;
}

/* Checks every case of one tokenizer and prints how many match. */
static void conformance(const char *name, const char *dir)
{
    json_error_t je;
    json_t *root = json_load_file(fixture, JSON_ALLOW_NUL, &je);
    ck_assert_msg(root != NULL, "%s: line %d: %s", fixture, je.line, je.text);
    json_t *cases =
        json_object_get(json_object_get(json_object_get(root, "tokenizers"), name), "cases");
    ck_assert_msg(json_is_array(cases), "%s: no cases for %s", fixture, name);
    sfi_tokenizer *t = load_ok(dir);
    size_t total = json_array_size(cases), ids_ok = 0, text_ok = 0;
    for (size_t i = 0; i < total; i++) {
        json_t *c = json_array_get(cases, i);
        json_t *text = json_object_get(c, "text"), *want = json_object_get(c, "ids");
        json_t *decoded = json_object_get(c, "decoded");
        int32_t *ids;
        size_t n;
        sfi_error err;
        ck_assert_int_eq(sfi_tokenizer_encode(t, json_string_value(text), json_string_length(text),
                                              &ids, &n, &err),
                         SFI_OK);
        int same = n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++)
            same = ids[k] == json_integer_value(json_array_get(want, k));
        if (same) {
            ids_ok++;
        } else {
            char *dump = json_dumps(c, JSON_ENSURE_ASCII);
            fprintf(stderr, "MISMATCH %s case %zu: %s\n  ours:", name, i, dump ? dump : "");
            free(dump);
            for (size_t k = 0; k < n; k++)
                fprintf(stderr, " %d", (int)ids[k]);
            fprintf(stderr, "\n");
        }
        /* Decoding transformers' ids must give transformers' text. */
        size_t nw = json_array_size(want);
        int32_t *wids = malloc((nw + 1) * sizeof *wids);
        for (size_t k = 0; k < nw; k++)
            wids[k] = (int32_t)json_integer_value(json_array_get(want, k));
        char *out;
        size_t olen;
        ck_assert_int_eq(sfi_tokenizer_decode(t, wids, nw, &out, &olen, &err), SFI_OK);
        if (olen == json_string_length(decoded) && !memcmp(out, json_string_value(decoded), olen))
            text_ok++;
        else
            fprintf(stderr, "DECODE MISMATCH %s case %zu\n", name, i);
        free(out);
        free(wids);
        free(ids);
    }
    printf("conformance %s: %zu/%zu strings give transformers' ids, %zu/%zu decode to its "
           "text\n",
           name, ids_ok, total, text_ok, total);
    ck_assert_uint_ge(total, 200);
    ck_assert_uint_eq(ids_ok, total);
    ck_assert_uint_eq(text_ok, total);
    sfi_tokenizer_free(t);
    json_decref(root);
}

START_TEST(conformance_qwen3)
{
    conformance("qwen3-tokenizer", qwen_dir);
}
END_TEST

START_TEST(conformance_small_model)
{
    conformance("sfi-small-qwen3-tokenizer", small_dir);
}
END_TEST

static void nfc_is(const char *in, const char *want)
{
    sfi_nfc_buf b = {0};
    const uint8_t *out;
    size_t n;
    ck_assert_int_eq(sfi_nfc((const uint8_t *)in, strlen(in), &b, &out, &n), 0);
    ck_assert_msg(n == strlen(want) && !memcmp(out, want, n), "NFC of '%s'", in);
    sfi_nfc_buf_free(&b);
}

START_TEST(nfc)
{
    nfc_is("plain ascii", "plain ascii");
    nfc_is("e\xCC\x81", "\xC3\xA9");             /* e + acute -> é */
    nfc_is("\xE2\x84\xAB", "\xC3\x85");          /* ANGSTROM SIGN -> Å */
    nfc_is("e\xCC\xA3\xCC\x82", "\xE1\xBB\x87"); /* e + dot below + circumflex */
    nfc_is("e\xCC\x82\xCC\xA3", "\xE1\xBB\x87"); /* other order: reordered first */
    nfc_is("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"); /* jamo -> 각 */
    nfc_is("\xEA\xB0\x81", "\xEA\xB0\x81");
    nfc_is("\xEF\xAC\x81", "\xEF\xAC\x81"); /* ﬁ: compatibility only, kept */
    nfc_is("\xCC\x81"
           "a",
           "\xCC\x81"
           "a");                                     /* leading mark stays */
    nfc_is("a\xCC\x96\xCC\x81", "\xC3\xA1\xCC\x96"); /* a + grave below + acute */
    ck_assert_str_eq(sfi_nfc_unicode_version(), "14.0.0");
    /* A long run of marks (counting sort): a + (acute, grave below) x 40 ->
     * á, 40 grave below, 39 acute. */
    char in[1 + 160 + 1], want[2 + 80 + 78 + 1];
    in[0] = 'a';
    for (int i = 0; i < 40; i++)
        memcpy(in + 1 + 4 * i, "\xCC\x81\xCC\x96", 4);
    in[161] = '\0';
    memcpy(want, "\xC3\xA1", 2);
    for (int i = 0; i < 40; i++)
        memcpy(want + 2 + 2 * i, "\xCC\x96", 2);
    for (int i = 0; i < 39; i++)
        memcpy(want + 82 + 2 * i, "\xCC\x81", 2);
    want[160] = '\0';
    nfc_is(in, want);
}
END_TEST

START_TEST(encode_edges_and_errors)
{
    sfi_tokenizer *t = load_ok(qwen_dir);
    int32_t *ids;
    size_t n;
    sfi_error err;
    ck_assert_int_eq(sfi_tokenizer_encode(t, "", 0, &ids, &n, &err), SFI_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_ptr_nonnull(ids);
    free(ids);
    /* Length, not NUL, ends the text. */
    ck_assert_int_eq(sfi_tokenizer_encode(t, "Hello world", 5, &ids, &n, &err), SFI_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(ids[0], 9707);
    free(ids);
    ck_assert_int_eq(sfi_tokenizer_encode(t, "ok \xC3\x28 bad", 8, &ids, &n, &err), SFI_EINVAL);
    ck_assert_str_eq(err.msg, "text: byte 3: not valid UTF-8");
    ck_assert_ptr_null(ids);
    ck_assert_int_eq(sfi_tokenizer_encode(t, "\xED\xA0\x80", 3, &ids, &n, &err), SFI_EINVAL);
    ck_assert_int_eq(sfi_tokenizer_encode(t, "\xC0\xAF", 2, &ids, &n, &err), SFI_EINVAL);
    int32_t bad[] = {9707, 151669};
    char *text;
    size_t len;
    ck_assert_int_eq(sfi_tokenizer_decode(t, bad, 2, &text, &len, &err), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "ids: 1: 151669 is not a token"));
    ck_assert_ptr_null(text);
    bad[1] = -5;
    ck_assert_int_eq(sfi_tokenizer_decode(t, bad, 2, &text, &len, &err), SFI_EINVAL);
    ck_assert_int_eq(sfi_tokenizer_decode(t, bad, 1, &text, &len, &err), SFI_OK);
    ck_assert_str_eq(text, "Hello");
    free(text);
    /* A character split across ids decodes to its raw bytes. */
    ck_assert_int_eq(sfi_tokenizer_encode(t, " \xF0\x9F\x8E\x89", 5, &ids, &n, &err), SFI_OK);
    ck_assert_uint_eq(n, 3); /* " 🎉": 11162 236 231, as transformers */
    ck_assert_int_eq(ids[0], 11162);
    ck_assert_int_eq(sfi_tokenizer_decode(t, ids, 1, &text, &len, &err), SFI_OK);
    ck_assert_uint_eq(len, 3);
    ck_assert(!memcmp(text, " \xF0\x9F", 3));
    free(text);
    free(ids);
    /* Round trip on bytes of every kind (NFC-stable text). */
    char s[4096];
    unsigned seed = 12345;
    for (int iter = 0; iter < 50; iter++) {
        size_t k = 0;
        while (k < 200) {
            seed = seed * 1103515245u + 12345u;
            unsigned r = (seed >> 16) % 8;
            static const char *const bits[] = {
                " ", "a", "Z9", "\n", "\t", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", ".,;"};
            size_t bl = strlen(bits[r]);
            memcpy(s + k, bits[r], bl);
            k += bl;
        }
        ck_assert_int_eq(sfi_tokenizer_encode(t, s, k, &ids, &n, &err), SFI_OK);
        ck_assert_int_eq(sfi_tokenizer_decode(t, ids, n, &text, &len, &err), SFI_OK);
        ck_assert_uint_eq(len, k);
        ck_assert(!memcmp(text, s, k));
        free(ids);
        free(text);
    }
    sfi_tokenizer_free(t);
}
END_TEST

/* More distinct pieces than the per-call cache holds (it starts over):
 * ids must equal those of each piece encoded on its own. */
START_TEST(piece_cache_overflow)
{
    sfi_tokenizer *t = load_ok(qwen_dir);
    enum { WORDS = 40000 };
    char *text = malloc(WORDS * 8 + 1);
    size_t len = 0;
    int32_t *want = malloc(WORDS * 8 * sizeof *want);
    size_t nwant = 0;
    sfi_error err;
    for (int i = 0; i < WORDS; i++) {
        char w[8];
        size_t wl = 0;
        w[wl++] = ' ';
        for (int x = i + 1; x > 0; x /= 26)
            w[wl++] = (char)('a' + x % 26);
        memcpy(text + len, w, wl);
        len += wl;
        int32_t *ids;
        size_t n;
        ck_assert_int_eq(sfi_tokenizer_encode(t, w, wl, &ids, &n, &err), SFI_OK);
        memcpy(want + nwant, ids, n * sizeof *ids);
        nwant += n;
        free(ids);
    }
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(sfi_tokenizer_encode(t, text, len, &ids, &n, &err), SFI_OK);
    ck_assert_uint_eq(n, nwant);
    ck_assert(!memcmp(ids, want, n * sizeof *ids));
    free(ids);
    free(want);
    free(text);
    sfi_tokenizer_free(t);
}
END_TEST

START_TEST(ids_parse)
{
    int32_t *ids;
    size_t n;
    sfi_error err;
    ck_assert_int_eq(sfi_token_ids_parse(" 1\t22\n333 \r\n", 12, "f", &ids, &n, &err), SFI_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(ids[0], 1);
    ck_assert_int_eq(ids[1], 22);
    ck_assert_int_eq(ids[2], 333);
    free(ids);
    ck_assert_int_eq(sfi_token_ids_parse("", 0, "f", &ids, &n, &err), SFI_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_ptr_nonnull(ids);
    free(ids);
    ck_assert_int_eq(sfi_token_ids_parse("999999999", 9, "f", &ids, &n, &err), SFI_OK);
    ck_assert_int_eq(ids[0], 999999999);
    free(ids);
    ck_assert_int_eq(sfi_token_ids_parse("5 12a", 5, "p.ids", &ids, &n, &err), SFI_EFORMAT);
    ck_assert_str_eq(err.msg, "p.ids: id 2: '12a' is not a decimal token id");
    ck_assert_ptr_null(ids);
    ck_assert_int_eq(sfi_token_ids_parse("1234567890", 10, "f", &ids, &n, &err), SFI_EFORMAT);
    ck_assert_str_eq(err.msg,
                     "f: id 1: '1234567890' is too large for a token id (at most 9 digits)");
    /* A NUL byte is named, not taken for the end of the list. */
    ck_assert_int_eq(sfi_token_ids_parse("5 6\0 7", 6, "f", &ids, &n, &err), SFI_EFORMAT);
    ck_assert_str_eq(err.msg, "f: byte 3 is a NUL byte, not part of a decimal token id");
    ck_assert_int_eq(sfi_token_ids_parse("-1", 2, "f", &ids, &n, &err), SFI_EFORMAT);
    ck_assert_int_eq(sfi_token_ids_parse("1,2", 3, "f", &ids, &n, &err), SFI_EFORMAT);
    /* Length, not NUL, ends the text. */
    ck_assert_int_eq(sfi_token_ids_parse("7 8x", 2, "f", &ids, &n, &err), SFI_OK);
    ck_assert_uint_eq(n, 1);
    free(ids);
}
END_TEST

/* A directory with the real vocabulary and a given merges.txt. */
static void expect_merges_fail(const char *merges, const char *needle)
{
    char *d = sfi_test_tmpdir();
    char p[4096], cmd[8192];
    snprintf(cmd, sizeof cmd, "cp '%s/vocab.json' '%s/'", small_dir, d);
    ck_assert_int_eq(sfi_test_run(cmd, NULL, NULL), 0);
    if (merges) {
        snprintf(p, sizeof p, "%s/merges.txt", d);
        ck_assert_int_eq(sfi_test_write_file(p, merges, strlen(merges)), 0);
    }
    sfi_tokenizer *t = (sfi_tokenizer *)1;
    sfi_error err;
    sfi_error_clear(&err);
    ck_assert_int_ne(sfi_tokenizer_load(d, &t, &err), SFI_OK);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err.msg, "merges.txt") && strstr(err.msg, needle), "'%s' lacks '%s'",
                  err.msg, needle);
    sfi_test_rmtree(d);
    free(d);
}

START_TEST(malformed_merges)
{
    expect_merges_fail(NULL, "No such file");
    expect_merges_fail("#version: 0.2\n\xC4\xA0 \xC4\xA0\nab\n", "line 3: expected two tokens");
    expect_merges_fail("a b c\n", "line 1: expected two tokens");
    expect_merges_fail(" a\n", "line 1: expected two tokens");
    expect_merges_fail("#version: 0.2\nqqqqqqqq zzzzzzzzz\n", "line 2: token \"qqqqqqqq\" is not");
    /* A vocabulary that is not byte-level (no token for every byte). */
    char *d = sfi_test_tmpdir();
    char p[4096];
    snprintf(p, sizeof p, "%s/vocab.json", d);
    ck_assert_int_eq(sfi_test_write_file(p, "{\"a\": 0}", 8), 0);
    snprintf(p, sizeof p, "%s/merges.txt", d);
    ck_assert_int_eq(sfi_test_write_file(p, "", 0), 0);
    sfi_tokenizer *t;
    sfi_error err;
    ck_assert_int_eq(sfi_tokenizer_load(d, &t, &err), SFI_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "vocab.json: no token for byte 0x00"));
    sfi_test_rmtree(d);
    free(d);
}
END_TEST

START_TEST(cli_encode_decode)
{
    char cmd[16384], *out = NULL, *errs = NULL;
    const char *ref = sfi_test_build("sfi-ref");
    char refp[2048];
    snprintf(refp, sizeof refp, "%s", ref);
    snprintf(cmd, sizeof cmd,
             "printf 'Hello world! This is a test.\\n' | '%s' encode --tokenizer '%s'", refp,
             qwen_dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 0);
    ck_assert_str_eq(out, "9707 1879 0 1096 374 264 1273 624\n");
    free(out);
    free(errs);
    snprintf(cmd, sizeof cmd,
             "printf ' 9707 1879\\n0\\t1096 374 264 1273 624 ' | '%s' decode --tokenizer '%s'",
             refp, qwen_dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 0);
    ck_assert_str_eq(out, "Hello world! This is a test.\n");
    free(out);
    free(errs);
    snprintf(cmd, sizeof cmd,
             "printf '<|im_start|>user\\n' | '%s' encode --tokenizer '%s' | '%s' decode "
             "--tokenizer '%s'",
             refp, qwen_dir, refp, qwen_dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 0);
    ck_assert_str_eq(out, "<|im_start|>user\n");
    free(out);
    free(errs);
    /* Bad input: message, status 1, nothing on standard output. */
    snprintf(cmd, sizeof cmd, "printf '9707 x12 5' | '%s' decode --tokenizer '%s'", refp, qwen_dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 1);
    ck_assert_str_eq(out, "");
    ck_assert_ptr_nonnull(strstr(errs, "id 2: 'x12' is not a decimal token id"));
    free(out);
    free(errs);
    snprintf(cmd, sizeof cmd, "printf '9707 999999' | '%s' decode --tokenizer '%s'", refp,
             qwen_dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 1);
    ck_assert_str_eq(out, "");
    ck_assert_ptr_nonnull(strstr(errs, "999999 is not a token"));
    free(out);
    free(errs);
    snprintf(cmd, sizeof cmd, "printf 'ab\\377' | '%s' encode --tokenizer '%s'", refp, qwen_dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 1);
    ck_assert_str_eq(out, "");
    ck_assert_ptr_nonnull(strstr(errs, "standard input: text: byte 2: not valid UTF-8"));
    free(out);
    free(errs);
    snprintf(cmd, sizeof cmd, "'%s' encode --tokenizer /nonexistent < /dev/null", refp);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 1);
    ck_assert_ptr_nonnull(strstr(errs, "/nonexistent/vocab.json"));
    free(out);
    free(errs);
    snprintf(cmd, sizeof cmd, "'%s' decode", refp);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 2);
    ck_assert_ptr_nonnull(strstr(errs, "--tokenizer"));
    free(out);
    free(errs);
    snprintf(cmd, sizeof cmd, "'%s' encode --help && '%s' decode --help", refp, refp);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: sfi-ref encode"));
    ck_assert_ptr_nonnull(strstr(out, "usage: sfi-ref decode"));
    free(out);
    free(errs);
}
END_TEST

int main(void)
{
    snprintf(qwen_dir, sizeof qwen_dir, "%s", sfi_test_src("tests/fixtures/qwen3-tokenizer"));
    snprintf(small_dir, sizeof small_dir, "%s",
             sfi_test_src("tests/fixtures/sfi-small-qwen3-tokenizer"));
    snprintf(fixture, sizeof fixture, "%s",
             sfi_test_src("tests/fixtures/tokenizer-conformance.json"));
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, conformance_qwen3);
    tcase_add_test(tc, conformance_small_model);
    tcase_add_test(tc, nfc);
    tcase_add_test(tc, encode_edges_and_errors);
    tcase_add_test(tc, malformed_merges);
    tcase_add_test(tc, ids_parse);
    tcase_add_test(tc, piece_cache_overflow);
    tcase_add_test(tc, cli_encode_decode);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
