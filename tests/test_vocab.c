/* Vocabulary loading, byte decoding, added tokens and the trigger set, on
 * the real Qwen3 vocabulary (tests/fixtures/qwen3-tokenizer) and on small
 * hand-written vocabularies, including malformed files. */
#include <config.h>

#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sfi_test_util.h"
#include "sfi_vocab.h"

static char qwen_dir[2048];

static sfi_vocab *load_ok(const char *dir)
{
    sfi_error err;
    sfi_error_clear(&err);
    sfi_vocab *v = NULL;
    sfi_status s = sfi_vocab_load(dir, &v, &err);
    ck_assert_msg(s == SFI_OK, "load %s: %s", dir, err.msg);
    return v;
}

/* Writes files into a fresh directory; returns it (caller removes). */
static char *make_dir(const char *vocab, const char *config)
{
    char *d = sfi_test_tmpdir();
    char p[4096];
    if (vocab) {
        snprintf(p, sizeof p, "%s/vocab.json", d);
        ck_assert_int_eq(sfi_test_write_file(p, vocab, strlen(vocab)), 0);
    }
    if (config) {
        snprintf(p, sizeof p, "%s/tokenizer_config.json", d);
        ck_assert_int_eq(sfi_test_write_file(p, config, strlen(config)), 0);
    }
    return d;
}

/* Loads a directory that must fail with code; the message must contain
 * both needles. */
static void expect_fail(const char *vocab, const char *config, sfi_status code, const char *n1,
                        const char *n2)
{
    char *d = make_dir(vocab, config);
    sfi_error err;
    sfi_error_clear(&err);
    sfi_vocab *v = (sfi_vocab *)1;
    sfi_status s = sfi_vocab_load(d, &v, &err);
    ck_assert_msg(s == code, "status %d (%s), wanted %d: %s", s, err.msg, code, vocab);
    ck_assert_ptr_null(v);
    ck_assert_msg(strstr(err.msg, n1) && strstr(err.msg, n2), "message '%s' lacks '%s'/'%s'",
                  err.msg, n1, n2);
    sfi_test_rmtree(d);
    free(d);
}

START_TEST(real_vocab_loads_and_decodes)
{
    sfi_vocab *v = load_ok(qwen_dir);
    /* 151643 vocab.json entries (ids 0..151642) + 26 added tokens. */
    ck_assert_int_eq(sfi_vocab_size(v), 151669);
    ck_assert_int_eq(sfi_vocab_added_count(v), 26);
    ck_assert_int_eq(sfi_vocab_lookup(v, "."), 13);
    ck_assert_int_eq(sfi_vocab_lookup(v, "\xC4\x8A"), 198);    /* "Ċ" */
    ck_assert_int_eq(sfi_vocab_lookup(v, "\xC4\xA0the"), 279); /* "Ġthe" */
    ck_assert_int_eq(sfi_vocab_lookup(v, "<|im_start|>"), 151644);
    ck_assert_int_eq(sfi_vocab_lookup(v, "no such token at all"), -1);
    size_t n;
    const uint8_t *b = sfi_vocab_token_bytes(v, 198, &n);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(b[0], '\n');
    b = sfi_vocab_token_bytes(v, 279, &n);
    ck_assert_uint_eq(n, 4);
    ck_assert(memcmp(b, " the", 4) == 0);
    /* "ãĢĤ" is the three UTF-8 bytes of U+3002 IDEOGRAPHIC FULL STOP. */
    b = sfi_vocab_token_bytes(v, 1773, &n);
    ck_assert_uint_eq(n, 3);
    ck_assert(memcmp(b, "\xE3\x80\x82", 3) == 0);
    /* Byte tokens: "Ā" (U+0100) is byte 0. */
    int32_t id0 = sfi_vocab_lookup(v, "\xC4\x80");
    ck_assert_int_ge(id0, 0);
    b = sfi_vocab_token_bytes(v, id0, &n);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(b[0], 0);
    b = sfi_vocab_token_bytes(v, 151645, &n);
    ck_assert_uint_eq(n, 10);
    ck_assert(memcmp(b, "<|im_end|>", 10) == 0);
    ck_assert_str_eq(sfi_vocab_token_text(v, 151645), "<|im_end|>");
    ck_assert(sfi_vocab_is_special(v, 151645));
    ck_assert(sfi_vocab_is_added(v, 151667)); /* <think>: added, not special */
    ck_assert(!sfi_vocab_is_special(v, 151667));
    ck_assert(!sfi_vocab_is_added(v, 13));
    ck_assert_ptr_null(sfi_vocab_token_bytes(v, 151669, &n));
    ck_assert_ptr_null(sfi_vocab_token_bytes(v, -1, &n));
    sfi_vocab_free(v);
}
END_TEST

START_TEST(byte_alphabet_is_a_bijection)
{
    int seen[324] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t cp = sfi_unicode_of_byte((uint8_t)b);
        ck_assert_uint_lt(cp, 324);
        ck_assert_int_eq(sfi_byte_of_unicode(cp), b);
        ck_assert_int_eq(seen[cp]++, 0);
    }
    ck_assert_uint_eq(sfi_unicode_of_byte(' '), 0x120);  /* Ġ */
    ck_assert_uint_eq(sfi_unicode_of_byte('\n'), 0x10A); /* Ċ */
    ck_assert_uint_eq(sfi_unicode_of_byte('A'), 'A');
    ck_assert_uint_eq(sfi_unicode_of_byte(127), 0x121); /* ġ */
    ck_assert_uint_eq(sfi_unicode_of_byte(160), 0x142); /* ł */
    ck_assert_uint_eq(sfi_unicode_of_byte(173), 0x143); /* Ń */
    ck_assert_uint_eq(sfi_unicode_of_byte(161), 161);
    ck_assert_int_eq(sfi_byte_of_unicode(0x144), -1);
    ck_assert_int_eq(sfi_byte_of_unicode(0x3002), -1);
}
END_TEST

START_TEST(real_trigger_set)
{
    sfi_vocab *v = load_ok(qwen_dir);
    sfi_error err;
    sfi_trigger_set t;
    ck_assert_int_eq(sfi_trigger_set_build(v, NULL, &t, &err), SFI_OK);
    ck_assert_int_eq(t.n_vocab, 151669);
    ck_assert(t.is_trigger[13]);      /* "." */
    ck_assert(t.is_trigger[198]);     /* "\n" */
    ck_assert(t.is_trigger[659]);     /* " ." */
    ck_assert(t.is_trigger[382]);     /* ".\n\n" */
    ck_assert(t.is_trigger[271]);     /* "\n\n" */
    ck_assert(t.is_trigger[0]);       /* "!" */
    ck_assert(t.is_trigger[30]);      /* "?" */
    ck_assert(t.is_trigger[26]);      /* ";" */
    ck_assert(!t.is_trigger[279]);    /* " the" */
    ck_assert(!t.is_trigger[1782]);   /* "the" */
    ck_assert(!t.is_trigger[23811]);  /* " hello" */
    ck_assert(!t.is_trigger[11]);     /* "," */
    ck_assert(!t.is_trigger[1773]);   /* "。" is not a default character */
    ck_assert(!t.is_trigger[151645]); /* "<|im_end|>" ends with '>' */
    /* ids sorted, consistent with the flags, and every member qualifies. */
    int32_t count = 0;
    for (int32_t id = 0; id < t.n_vocab; id++)
        count += t.is_trigger[id];
    ck_assert_int_eq(count, t.n_ids);
    for (int32_t i = 0; i < t.n_ids; i++) {
        if (i)
            ck_assert_int_lt(t.ids[i - 1], t.ids[i]);
        size_t n;
        const uint8_t *b = sfi_vocab_token_bytes(v, t.ids[i], &n);
        while (n && b[n - 1] == ' ')
            n--;
        ck_assert(memchr(b, '\n', n) || (n && strchr(".?!;", b[n - 1]) && b[n - 1]));
    }
    ck_assert_int_gt(t.n_ids, 1000);
    ck_assert_int_lt(t.n_ids, 20000);
    sfi_trigger_set_free(&t);

    /* A multi-byte character matches as a whole; "." no longer does. */
    ck_assert_int_eq(sfi_trigger_set_build(v, "\xE3\x80\x82", &t, &err), SFI_OK);
    ck_assert(t.is_trigger[1773]);
    ck_assert(!t.is_trigger[13]);
    ck_assert(t.is_trigger[198]); /* newline tokens are always members */
    sfi_trigger_set_free(&t);
    ck_assert_int_eq(sfi_trigger_set_build(v, "\xE3\x80", &t, &err), SFI_EINVAL);
    sfi_vocab_free(v);
}
END_TEST

START_TEST(trailing_spaces_and_holes)
{
    /* Byte-level strings: "Ġ" is a space, "Ċ" a newline, "ĉ" a tab. */
    char *d = make_dir("{\"a.\\u0120\\u0120\": 0, \"b\": 1, \"\\u0120\": 2, \"x\\u010ay\": 3,"
                       " \"c.\\u0109\": 4, \"end?\": 7}",
                       "{\"added_tokens_decoder\": {\"9\": {\"content\": \"<|x|>\","
                       " \"special\": true}, \"8\": {\"content\": \"S;\"}}}");
    sfi_vocab *v = load_ok(d);
    ck_assert_int_eq(sfi_vocab_size(v), 10);
    size_t n;
    ck_assert_ptr_null(sfi_vocab_token_bytes(v, 5, &n)); /* hole */
    ck_assert_ptr_null(sfi_vocab_token_text(v, 6));
    sfi_trigger_set t;
    sfi_error err;
    ck_assert_int_eq(sfi_trigger_set_build(v, NULL, &t, &err), SFI_OK);
    ck_assert(t.is_trigger[0]); /* "a.  ": trailing spaces removed */
    ck_assert(!t.is_trigger[1]);
    ck_assert(!t.is_trigger[2]); /* " ": nothing left */
    ck_assert(t.is_trigger[3]);  /* contains a newline */
    ck_assert(!t.is_trigger[4]); /* only spaces are removed, not tabs */
    ck_assert(!t.is_trigger[5]);
    ck_assert(t.is_trigger[7]);
    ck_assert(t.is_trigger[8]); /* added token "S;" */
    ck_assert(!t.is_trigger[9]);
    ck_assert_int_eq(t.n_ids, 4);
    ck_assert(sfi_vocab_is_special(v, 9));
    ck_assert(sfi_vocab_is_added(v, 8) && !sfi_vocab_is_special(v, 8));
    sfi_trigger_set_free(&t);
    sfi_vocab_free(v);
    sfi_test_rmtree(d);
    free(d);
}
END_TEST

START_TEST(malformed_vocab)
{
    /* Truncated real vocab.json: a JSON syntax error with a position. */
    char p[4096];
    snprintf(p, sizeof p, "%s/vocab.json", qwen_dir);
    size_t len;
    char *whole = sfi_test_read_file(p, &len);
    ck_assert_ptr_nonnull(whole);
    whole[len / 2] = '\0';
    expect_fail(whole, NULL, SFI_EFORMAT, "vocab.json: line 1 column", "");
    free(whole);
    expect_fail("", NULL, SFI_EFORMAT, "vocab.json", "line");
    expect_fail("[1, 2]", NULL, SFI_EFORMAT, "vocab.json", "not a JSON object");
    expect_fail("{}", NULL, SFI_EFORMAT, "vocab.json", "no tokens");
    expect_fail("{\"a\": \"1\"}", NULL, SFI_EFORMAT, "vocab.json", "token \"a\": id is not");
    expect_fail("{\"a\": -1}", NULL, SFI_EFORMAT, "vocab.json", "token \"a\"");
    expect_fail("{\"a\": 1.5}", NULL, SFI_EFORMAT, "vocab.json", "token \"a\"");
    expect_fail("{\"a\": 99999999999}", NULL, SFI_EFORMAT, "vocab.json", "token \"a\"");
    expect_fail("{\"a\": 0, \"b\": 0}", NULL, SFI_EFORMAT, "vocab.json", "id 0 is used by");
    expect_fail("{\"a\": 0, \"a\": 1}", NULL, SFI_EFORMAT, "vocab.json", "duplicate");
    expect_fail("{\"a b\": 0}", NULL, SFI_EFORMAT, "vocab.json", "not in the byte-level");
    expect_fail("{\"\": 0}", NULL, SFI_EFORMAT, "vocab.json", "empty token");
    expect_fail(NULL, NULL, SFI_ENOTFOUND, "vocab.json", "No such file");
}
END_TEST

START_TEST(malformed_config)
{
    const char *vocab = "{\"a\": 0, \"b\": 1}";
    expect_fail(vocab, "{\"added_tokens_decoder\": ", SFI_EFORMAT, "tokenizer_config.json", "line");
    expect_fail(vocab, "{\"added_tokens_decoder\": []}", SFI_EFORMAT, "tokenizer_config.json",
                "added_tokens_decoder: not an object");
    expect_fail(vocab, "{\"added_tokens_decoder\": {\"x\": {\"content\": \"<a>\"}}}", SFI_EFORMAT,
                "tokenizer_config.json", "key \"x\" is not an id");
    expect_fail(vocab, "{\"added_tokens_decoder\": {\"5\": {\"content\": 3}}}", SFI_EFORMAT,
                "tokenizer_config.json", "5: content");
    expect_fail(vocab, "{\"added_tokens_decoder\": {\"5\": {\"content\": \"\"}}}", SFI_EFORMAT,
                "tokenizer_config.json", "5: content");
    expect_fail(vocab, "{\"added_tokens_decoder\": {\"1\": {\"content\": \"zz\"}}}", SFI_EFORMAT,
                "tokenizer_config.json", "differs from vocab.json");
    expect_fail(vocab,
                "{\"added_tokens_decoder\": {\"5\": {\"content\": \"<a>\", \"lstrip\": true}}}",
                SFI_EUNSUPPORTED, "tokenizer_config.json", "lstrip=true");
    expect_fail(vocab, "{\"added_tokens_decoder\": {\"5\": {\"content\": \"a\"}}}", SFI_EFORMAT,
                "token \"a\"", "two ids");
}
END_TEST

START_TEST(oversized_vocab_is_refused_before_reading)
{
    char *d = sfi_test_tmpdir();
    char p[4096];
    snprintf(p, sizeof p, "%s/vocab.json", d);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    /* Sparse: no disk is used, only the size is large. */
    ck_assert_int_eq(ftruncate(fileno(f), (off_t)65 << 20), 0);
    fclose(f);
    sfi_error err;
    sfi_vocab *v;
    ck_assert_int_eq(sfi_vocab_load(d, &v, &err), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "vocab.json: 68157440 bytes is too large"));
    sfi_test_rmtree(d);
    free(d);
}
END_TEST

START_TEST(escape)
{
    char *e = sfi_escape_bytes((const uint8_t *)"a\n\t\"\\\x01\xE3\x80\x82\xE3\x80 .", 13);
    ck_assert_str_eq(e, "a\\n\\t\\\"\\\\\\x01\xE3\x80\x82\\xE3\\x80 .");
    free(e);
}
END_TEST

/* Text for JSON: valid characters (NUL and 4-byte ones included) stay,
 * each byte that starts none becomes U+FFFD: a lone continuation byte, a
 * truncated sequence, an overlong, a surrogate, a code point past
 * U+10FFFF, 0xFF. */
START_TEST(utf8_clean)
{
    static const char in[] = "a\0\xC3\xA9\xF0\x9F\x98\x80|\x80|\xE3\x80|\xC0\x80|\xED\xA0\x80|"
                             "\xF4\x90\x80\x80|\xFF|\xE3\x80";
    size_t n;
    char *o = sfi_utf8_clean(in, sizeof in - 1, &n);
    ck_assert_ptr_nonnull(o);
    static const char want[] = "a\0\xC3\xA9\xF0\x9F\x98\x80|\xEF\xBF\xBD|"
                               "\xEF\xBF\xBD\xEF\xBF\xBD|\xEF\xBF\xBD\xEF\xBF\xBD|"
                               "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD|"
                               "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD|\xEF\xBF\xBD|"
                               "\xEF\xBF\xBD\xEF\xBF\xBD";
    ck_assert_uint_eq(n, sizeof want - 1);
    ck_assert_mem_eq(o, want, n);
    ck_assert_int_eq(o[n], 0);
    free(o);
    o = sfi_utf8_clean("", 0, &n);
    ck_assert_ptr_nonnull(o);
    ck_assert_uint_eq(n, 0);
    free(o);
}
END_TEST

START_TEST(cli_text_and_json)
{
    char cmd[8192], *out = NULL, *errs = NULL;
    snprintf(cmd, sizeof cmd, "'%s' trigger-set --tokenizer '%s'", sfi_test_build("sfi-ref"),
             qwen_dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 0);
    ck_assert_msg(!strncmp(out, "size ", 5), "%s", out);
    int size = atoi(out + 5);
    ck_assert_int_gt(size, 1000);
    ck_assert_ptr_nonnull(strstr(out, "\n13\t\".\"\n"));
    ck_assert_ptr_nonnull(strstr(out, "\n198\t\"\\n\"\n"));
    ck_assert_ptr_null(strstr(out, "\n279\t"));
    int lines = 0;
    for (char *c = out; *c; c++)
        lines += *c == '\n';
    ck_assert_int_eq(lines, size + 1);
    free(out);
    free(errs);

    snprintf(cmd, sizeof cmd, "'%s' trigger-set --tokenizer '%s' --format json --chars '?\\n'",
             sfi_test_build("sfi-ref"), qwen_dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 0);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    ck_assert_msg(j != NULL, "%s", je.text);
    json_t *members = json_object_get(j, "members");
    ck_assert_int_eq(json_array_size(members), json_integer_value(json_object_get(j, "size")));
    ck_assert_int_lt(json_array_size(members), size); /* fewer characters, fewer members */
    ck_assert_str_eq(json_string_value(json_object_get(j, "chars")), "?\n");
    int saw_q = 0, saw_dot = 0;
    for (size_t i = 0; i < json_array_size(members); i++) {
        json_t *m = json_array_get(members, i);
        json_int_t id = json_integer_value(json_object_get(m, "id"));
        saw_q |= id == 30 && !strcmp(json_string_value(json_object_get(m, "text")), "?");
        saw_dot |= id == 13;
    }
    ck_assert(saw_q && !saw_dot);
    json_decref(j);
    free(out);
    free(errs);
}
END_TEST

START_TEST(cli_errors)
{
    char cmd[8192], *out = NULL, *errs = NULL;
    snprintf(cmd, sizeof cmd, "'%s' trigger-set --tokenizer /nonexistent/dir",
             sfi_test_build("sfi-ref"));
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 1);
    ck_assert_str_eq(out, "");
    ck_assert_ptr_nonnull(strstr(errs, "/nonexistent/dir/vocab.json"));
    free(out);
    free(errs);
    snprintf(cmd, sizeof cmd, "'%s' trigger-set --tokenizer '%s' --format xml",
             sfi_test_build("sfi-ref"), qwen_dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 2);
    ck_assert_ptr_nonnull(strstr(errs, "xml"));
    free(out);
    free(errs);
    snprintf(cmd, sizeof cmd, "'%s' trigger-set", sfi_test_build("sfi-ref"));
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 2);
    ck_assert_ptr_nonnull(strstr(errs, "--tokenizer"));
    free(out);
    free(errs);
    snprintf(cmd, sizeof cmd, "'%s' trigger-set --help", sfi_test_build("sfi-ref"));
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: sfi-ref trigger-set"));
    free(out);
    free(errs);
}
END_TEST

int main(void)
{
    snprintf(qwen_dir, sizeof qwen_dir, "%s", sfi_test_src("tests/fixtures/qwen3-tokenizer"));
    Suite *s = suite_create("vocab");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, real_vocab_loads_and_decodes);
    tcase_add_test(tc, byte_alphabet_is_a_bijection);
    tcase_add_test(tc, real_trigger_set);
    tcase_add_test(tc, trailing_spaces_and_holes);
    tcase_add_test(tc, malformed_vocab);
    tcase_add_test(tc, malformed_config);
    tcase_add_test(tc, oversized_vocab_is_refused_before_reading);
    tcase_add_test(tc, escape);
    tcase_add_test(tc, utf8_clean);
    tcase_add_test(tc, cli_text_and_json);
    tcase_add_test(tc, cli_errors);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
