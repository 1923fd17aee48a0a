/* Check suite of src/sfi_params.c: defaults, every key, bad keys and
 * values, parameter files, escapes, JSON. */
#include <config.h>

#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_params.h"
#include "sfi_test_util.h"

/* man/sfi.7 text with the roff escapes this page uses undone. */
static char *man_text(const char *rel)
{
    size_t n;
    char *raw = sfi_test_read_file(sfi_test_src(rel), &n);
    ck_assert_msg(raw != NULL, "cannot read %s", rel);
    char *o = raw;
    for (const char *c = raw; *c; c++) {
        if (c[0] == '\\' && (c[1] == '-' || c[1] == 'e' || c[1] == '\\')) {
            *o++ = c[1] == '-' ? '-' : '\\';
            c++;
        } else {
            *o++ = *c;
        }
    }
    *o = 0;
    return raw;
}

START_TEST(every_key_documented_in_sfi7)
{
    /* PARAMETERS of sfi(7) lists every key with the default its --help
     * text gives ("... default 4)"), so the page cannot fall behind. */
    char *man = man_text("man/sfi.7");
    const char *sec = strstr(man, ".SH PARAMETERS");
    ck_assert_ptr_nonnull(sec);
    const char *end = strstr(sec + 1, "\n.SH ");
    ck_assert_ptr_nonnull(end);
    ck_assert_uint_ge(sfi_params_key_count(), 18);
    for (size_t i = 0; i < sfi_params_key_count(); i++) {
        const char *key = sfi_params_key_name(i), *help = sfi_params_key_help(i);
        const char *d = strstr(help, "default ");
        ck_assert_msg(d != NULL, "%s: help without a default: %s", key, help);
        d += 8;
        size_t dl = strlen(d);
        if (dl && d[dl - 1] == ')')
            dl--;
        char want[128];
        snprintf(want, sizeof want, "\n.B %s\nDefault %.*s;", key, (int)dl, d);
        const char *hit = strstr(sec, want);
        ck_assert_msg(hit != NULL && hit < end,
                      "sfi.7 PARAMETERS: no '.B %s' entry with "
                      "'Default %.*s;'",
                      key, (int)dl, d);
    }
    free(man);
}
END_TEST

START_TEST(defaults_match_sfi7)
{
    sfi_params p;
    sfi_params_default(&p);
    ck_assert_int_eq(p.n_sink, 4);
    ck_assert_int_eq(p.n_recent, 256);
    ck_assert_int_eq(p.K, 2048);
    ck_assert_int_eq(p.T_max, 64);
    ck_assert_int_eq(p.W_decode, 1);
    ck_assert_int_eq(p.W_prefill, 16);
    ck_assert(p.alpha == 0.5f);
    ck_assert(p.gamma == 1.0f);
    ck_assert(p.beta == 1.0f);
    ck_assert(p.p == 2.0f);
    ck_assert(p.eta == 0.5f);
    ck_assert(p.lambda_clip == 0.02f);
    ck_assert_int_eq(p.nms_radius, 2);
    ck_assert(p.alpha_soft == 0.5f);
    ck_assert(p.T == 1.0f);
    ck_assert(p.alpha_cross == 0.35f);
    ck_assert(p.eps == 1e-8f);
    ck_assert_int_eq(p.refresh_delay, 0);
    ck_assert_str_eq(p.trigger_chars, ".?!;\n");
    sfi_error e;
    ck_assert_int_eq(sfi_params_validate(&p, &e), SFI_OK);
}
END_TEST

/* Every key of the table can be set, lands in its own field and nowhere
 * else. */
START_TEST(every_key_sets_its_field)
{
    static const struct {
        const char *kv;
        size_t off;
        int is_int;
        double want;
    } cases[] = {
        {"n_sink=7", offsetof(sfi_params, n_sink), 1, 7},
        {"n_recent=300", offsetof(sfi_params, n_recent), 1, 300},
        {"K=3836", offsetof(sfi_params, K), 1, 3836},
        {"T_max=32", offsetof(sfi_params, T_max), 1, 32},
        {"W_decode=2", offsetof(sfi_params, W_decode), 1, 2},
        {"W_prefill=8", offsetof(sfi_params, W_prefill), 1, 8},
        {"alpha=1", offsetof(sfi_params, alpha), 0, 1.0f},
        {"gamma=0", offsetof(sfi_params, gamma), 0, 0.0f},
        {"beta=2.5", offsetof(sfi_params, beta), 0, 2.5f},
        {"p=3", offsetof(sfi_params, p), 0, 3.0f},
        {"eta=0.25", offsetof(sfi_params, eta), 0, 0.25f},
        {"lambda_clip=0.1", offsetof(sfi_params, lambda_clip), 0, 0.1f},
        {"nms_radius=0", offsetof(sfi_params, nms_radius), 1, 0},
        {"alpha_soft=0.75", offsetof(sfi_params, alpha_soft), 0, 0.75f},
        {"T=0.5", offsetof(sfi_params, T), 0, 0.5f},
        {"alpha_cross=0", offsetof(sfi_params, alpha_cross), 0, 0.0f},
        {"eps=1e-6", offsetof(sfi_params, eps), 0, 1e-6f},
        {"refresh_delay=3", offsetof(sfi_params, refresh_delay), 1, 3},
    };
    size_t n = sizeof cases / sizeof cases[0];
    /* The table and this test list the same keys (trigger_chars aside). */
    ck_assert_uint_eq(sfi_params_key_count(), n + 1);
    for (size_t i = 0; i < n; i++) {
        sfi_params p, ref;
        sfi_params_default(&p);
        sfi_params_default(&ref);
        sfi_error e;
        ck_assert_msg(sfi_params_set(&p, cases[i].kv, "--param", &e) == SFI_OK, "%s: %s",
                      cases[i].kv, e.msg);
        char *f = (char *)&p + cases[i].off;
        if (cases[i].is_int) {
            ck_assert_int_eq(*(int *)f, (int)cases[i].want);
            *(int *)f = *(int *)((char *)&ref + cases[i].off);
        } else {
            ck_assert_msg(*(float *)f == (float)cases[i].want, "%s", cases[i].kv);
            *(float *)f = *(float *)((char *)&ref + cases[i].off);
        }
        ck_assert_msg(!memcmp(&p, &ref, sizeof p), "%s changed another field", cases[i].kv);
        ck_assert_int_eq(sfi_params_validate(&p, &e), SFI_OK);
    }
    for (size_t i = 0; i < sfi_params_key_count(); i++) {
        ck_assert_ptr_nonnull(sfi_params_key_name(i));
        ck_assert_uint_gt(strlen(sfi_params_key_help(i)), 10);
    }
    ck_assert_ptr_null(sfi_params_key_name(sfi_params_key_count()));
}
END_TEST

START_TEST(blanks_around_key_and_value)
{
    sfi_params p;
    sfi_params_default(&p);
    sfi_error e;
    ck_assert_int_eq(sfi_params_set(&p, "  K = 100 ", NULL, &e), SFI_OK);
    ck_assert_int_eq(p.K, 100);
}
END_TEST

/* Each bad input: its status, a message naming origin and key, and *p
 * untouched. */
static void expect_error(const char *kv, sfi_status code, const char *needle)
{
    sfi_params p, ref;
    sfi_params_default(&p);
    sfi_params_default(&ref);
    sfi_error e;
    sfi_error_clear(&e);
    sfi_status st = sfi_params_set(&p, kv, "--param", &e);
    ck_assert_msg(st == code, "'%s': status %s, want %s (%s)", kv, sfi_status_name(st),
                  sfi_status_name(code), e.msg);
    ck_assert_msg(strstr(e.msg, needle) != NULL, "'%s': message '%s' lacks '%s'", kv, e.msg,
                  needle);
    ck_assert_msg(!strncmp(e.msg, "--param: ", 9), "'%s': message '%s' lacks origin", kv, e.msg);
    ck_assert_msg(!memcmp(&p, &ref, sizeof p), "'%s' changed the parameters", kv);
}

START_TEST(unknown_key)
{
    expect_error("bogus=1", SFI_ENOTFOUND, "unknown parameter 'bogus'");
    expect_error("k=1", SFI_ENOTFOUND, "did you mean 'K'");
    expect_error("t_max=3", SFI_ENOTFOUND, "did you mean 'T_max'");
    expect_error("n_sink", SFI_EINVAL, "not of the form key=value");
    expect_error("=3", SFI_EINVAL, "missing key");
    expect_error("", SFI_EINVAL, "not of the form key=value");
}
END_TEST

START_TEST(out_of_range)
{
    expect_error("alpha=0", SFI_ERANGE, "alpha: 0 is out of range (expected a number in (0, 1])");
    expect_error("alpha=1.0001", SFI_ERANGE, "alpha: 1.0001 is out of range");
    expect_error("K=0", SFI_ERANGE, "K: 0 is out of range (expected an integer in [1, ");
    expect_error("n_sink=-1", SFI_ERANGE, "n_sink: -1 is out of range");
    expect_error("n_recent=0", SFI_ERANGE, "n_recent");
    expect_error("T_max=0", SFI_ERANGE, "T_max");
    expect_error("W_decode=0", SFI_ERANGE, "W_decode");
    expect_error("W_prefill=100000000", SFI_ERANGE, "W_prefill");
    expect_error("K=99999999999999999999", SFI_ERANGE, "K: 99999999999999999999 is out of range");
    expect_error("K=2147483648", SFI_ERANGE, "K");
    expect_error("gamma=-0.5", SFI_ERANGE,
                 "gamma: -0.5 is out of range (expected a finite "
                 "number >= 0)");
    expect_error("beta=-1", SFI_ERANGE, "beta");
    expect_error("p=0", SFI_ERANGE, "p: 0 is out of range (expected a finite number > 0)");
    expect_error("eta=-1e-9", SFI_ERANGE, "eta");
    expect_error("lambda_clip=1.5", SFI_ERANGE, "lambda_clip");
    expect_error("nms_radius=-2", SFI_ERANGE, "nms_radius");
    expect_error("alpha_soft=-1", SFI_ERANGE, "alpha_soft");
    expect_error("T=0", SFI_ERANGE, "T: 0");
    expect_error("alpha_cross=-0.1", SFI_ERANGE, "alpha_cross");
    expect_error("eps=0", SFI_ERANGE, "eps");
    expect_error("eps=1", SFI_ERANGE, "eps");
    /* 0 or 2..4: 1 would be 0 in disguise */
    expect_error("refresh_delay=1", SFI_ERANGE, "refresh_delay: 1 is not allowed (0 = off");
    expect_error("refresh_delay=5", SFI_ERANGE,
                 "refresh_delay: 5 is out of range (expected an "
                 "integer in [0, 4])");
    expect_error("refresh_delay=-1", SFI_ERANGE, "refresh_delay");
    /* Not representable as a float: overflow and flush to zero. */
    expect_error("gamma=1e39", SFI_ERANGE, "gamma");
    expect_error("eps=1e-50", SFI_ERANGE, "eps");
    expect_error("gamma=inf", SFI_ERANGE, "gamma");
    expect_error("gamma=nan", SFI_ERANGE, "gamma");
}
END_TEST

START_TEST(bad_numbers)
{
    expect_error("K=abc", SFI_EINVAL, "K: 'abc' is not an integer");
    expect_error("K=12x", SFI_EINVAL, "'12x' is not an integer");
    expect_error("K=2048.0", SFI_EINVAL, "not an integer");
    expect_error("K=1e3", SFI_EINVAL, "not an integer");
    expect_error("K=", SFI_EINVAL, "K: empty value");
    expect_error("alpha=half", SFI_EINVAL, "alpha: 'half' is not a number");
    expect_error("alpha=0.5.", SFI_EINVAL, "not a number");
    expect_error("alpha=", SFI_EINVAL, "alpha: empty value");
    /* Control bytes in a value are escaped in the message. */
    expect_error("K=\x1b[2J", SFI_EINVAL, "'\\x1b[2J'");
}
END_TEST

START_TEST(trigger_chars_escapes)
{
    sfi_params p;
    sfi_params_default(&p);
    sfi_error e;
    ck_assert_int_eq(sfi_params_set(&p, "trigger_chars=.\\n\\t\\\\\\r", NULL, &e), SFI_OK);
    ck_assert_str_eq(p.trigger_chars, ".\n\t\\\r");
    ck_assert_int_eq(sfi_params_set(&p, "trigger_chars=:", NULL, &e), SFI_OK);
    ck_assert_str_eq(p.trigger_chars, ":");
    expect_error("trigger_chars=.\\q", SFI_EINVAL, "unknown escape '\\q'");
    expect_error("trigger_chars=.\\", SFI_EINVAL, "lone backslash");
    expect_error("trigger_chars=", SFI_EINVAL, "at least one character");
    /* Multi-byte characters are whole UTF-8 characters; stray bytes are
     * refused. */
    ck_assert_int_eq(sfi_params_set(&p, "trigger_chars=.\xe3\x80\x82\\n", NULL, &e), SFI_OK);
    ck_assert_str_eq(p.trigger_chars, ".\xe3\x80\x82\n");
    expect_error("trigger_chars=.\xe3\x80", SFI_EINVAL, "not valid UTF-8 at byte 1");
    expect_error("trigger_chars=\xff", SFI_EINVAL, "not valid UTF-8 at byte 0");
    expect_error("trigger_chars=\xc0\xae", SFI_EINVAL, "not valid UTF-8"); /* overlong '.' */
    expect_error("trigger_chars=0123456789012345678901234567890123", SFI_ERANGE,
                 "longer than 31 bytes");
    /* Exactly 31 fit. */
    ck_assert_int_eq(sfi_params_set(&p, "trigger_chars=0123456789012345678901234567890", NULL, &e),
                     SFI_OK);
    ck_assert_uint_eq(strlen(p.trigger_chars), 31);
}
END_TEST

static char *write_tmp(const char *dir, const char *name, const char *text)
{
    char *path = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(path, "%s/%s", dir, name);
    ck_assert_int_eq(sfi_test_write_file(path, text, strlen(text)), 0);
    return path;
}

START_TEST(file_good)
{
    char *dir = sfi_test_tmpdir();
    char *path = write_tmp(dir, "good.conf",
                           "# SFI settings\n"
                           "\n"
                           "K = 3836   # the paper's quality runs\n"
                           "  alpha=0.25\r\n"
                           "trigger_chars=.#\\n\n"
                           "T_max=16"); /* no final newline */
    sfi_params p;
    sfi_params_default(&p);
    sfi_error e;
    ck_assert_msg(sfi_params_load_file(&p, path, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(p.K, 3836);
    ck_assert(p.alpha == 0.25f);
    ck_assert_str_eq(p.trigger_chars, ".#\n");
    ck_assert_int_eq(p.T_max, 16);
    ck_assert_int_eq(p.n_sink, 4);
    free(path);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

static void expect_file_error(const char *text, size_t len, sfi_status code, const char *needle)
{
    char *dir = sfi_test_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/bad.conf", dir);
    ck_assert_int_eq(sfi_test_write_file(path, text, len), 0);
    sfi_params p, ref;
    sfi_params_default(&p);
    sfi_params_default(&ref);
    sfi_error e;
    sfi_error_clear(&e);
    sfi_status st = sfi_params_load_file(&p, path, &e);
    ck_assert_msg(st == code, "status %s want %s (%s)", sfi_status_name(st), sfi_status_name(code),
                  e.msg);
    char want[8192];
    snprintf(want, sizeof want, "%s/bad.conf%s", dir, needle);
    ck_assert_msg(strstr(e.msg, want) != NULL, "message '%s' lacks '%s'", e.msg, want);
    /* A file is applied all or nothing. */
    ck_assert(!memcmp(&p, &ref, sizeof p));
    sfi_test_rmtree(dir);
    free(dir);
}

START_TEST(file_errors_name_the_line)
{
    const char *t1 = "K=100\n# c\n\nalpha=2\n";
    expect_file_error(t1, strlen(t1), SFI_ERANGE, ":4: alpha: 2 is out of range");
    const char *t2 = "K=100\nbogus = 3\n";
    expect_file_error(t2, strlen(t2), SFI_ENOTFOUND, ":2: unknown parameter 'bogus'");
    const char *t3 = "K=100\nn_sink\n";
    expect_file_error(t3, strlen(t3), SFI_EINVAL, ":2: 'n_sink' is not of the form");
    const char *t4 = "K=100\nT=1\nK=200\n";
    expect_file_error(t4, strlen(t4), SFI_EINVAL, ":3: K set twice (first on line 1)");
    const char t5[] = "K=100\nT=1\0junk\n";
    expect_file_error(t5, sizeof t5 - 1, SFI_EFORMAT, ":2: line contains a NUL byte");
    char *big = malloc(5000);
    memset(big, 'x', 4999);
    memcpy(big, "K=", 2);
    big[4999] = '\0';
    expect_file_error(big, strlen(big), SFI_ERANGE, ":1: line longer than 4096 bytes");
    free(big);
}
END_TEST

START_TEST(file_missing_or_huge)
{
    sfi_params p;
    sfi_params_default(&p);
    sfi_error e;
    ck_assert_int_eq(sfi_params_load_file(&p, "/nonexistent/sfi.conf", &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, "/nonexistent/sfi.conf: cannot open"));
    char *dir = sfi_test_tmpdir();
    ck_assert_int_eq(sfi_params_load_file(&p, dir, &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, "is a directory"));
    /* A sparse 2 GiB file is refused from its size, before reading it. */
    char path[4096];
    snprintf(path, sizeof path, "%s/huge.conf", dir);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, 2L << 30, SEEK_SET), 0);
    fputc('\n', f);
    fclose(f);
    ck_assert_int_eq(sfi_params_load_file(&p, path, &e), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "too large for a parameter file"));
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(validate_catches_bad_structs)
{
    sfi_params p;
    sfi_error e;
    sfi_params_default(&p);
    p.K = 0;
    ck_assert_int_eq(sfi_params_validate(&p, &e), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "K: 0 is out of range"));
    sfi_params_default(&p);
    p.alpha = 0.0f / 0.0f;
    ck_assert_int_eq(sfi_params_validate(&p, &e), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "alpha"));
    sfi_params_default(&p);
    p.trigger_chars[0] = '\0';
    ck_assert_int_eq(sfi_params_validate(&p, &e), SFI_EINVAL);
    sfi_params_default(&p);
    memset(p.trigger_chars, '.', sizeof p.trigger_chars);
    ck_assert_int_eq(sfi_params_validate(&p, &e), SFI_EFORMAT);
    sfi_params_default(&p);
    p.refresh_delay = 1;
    ck_assert_int_eq(sfi_params_validate(&p, &e), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "refresh_delay: 1 is not allowed"));
    for (int d = 2; d <= 4; d++) {
        p.refresh_delay = d;
        ck_assert_int_eq(sfi_params_validate(&p, &e), SFI_OK);
    }
}
END_TEST

START_TEST(json_has_every_key_with_short_numbers)
{
    sfi_params p;
    sfi_params_default(&p);
    char *s = sfi_params_to_json(&p);
    ck_assert_ptr_nonnull(s);
    /* Floats print as their shortest decimal, not the float's expansion. */
    ck_assert_ptr_nonnull(strstr(s, "\"lambda_clip\": 0.02"));
    ck_assert_ptr_nonnull(strstr(s, "\"alpha_cross\": 0.35,"));
    ck_assert_ptr_nonnull(strstr(s, "\"eps\": 1e-8"));
    ck_assert_ptr_nonnull(strstr(s, "\"K\": 2048,"));
    ck_assert_ptr_nonnull(strstr(s, "\"trigger_chars\": \".?!;\\n\""));
    json_error_t je;
    json_t *o = json_loads(s, 0, &je);
    ck_assert_ptr_nonnull(o);
    ck_assert_uint_eq(json_object_size(o), sfi_params_key_count());
    /* Every value reads back into the same parameters. */
    sfi_params q;
    sfi_params_default(&q);
    q.K = 1;
    q.alpha = 0.9f;
    q.trigger_chars[0] = 'x';
    for (size_t i = 0; i < sfi_params_key_count(); i++) {
        const char *k = sfi_params_key_name(i);
        json_t *v = json_object_get(o, k);
        ck_assert_ptr_nonnull(v);
        char kv[256];
        if (json_is_integer(v))
            snprintf(kv, sizeof kv, "%s=%lld", k, (long long)json_integer_value(v));
        else if (json_is_real(v))
            snprintf(kv, sizeof kv, "%s=%.17g", k, json_real_value(v));
        else
            snprintf(kv, sizeof kv, "%s=%s", k,
                     strcmp(json_string_value(v), ".?!;\n") ? "?" : ".?!;\\n");
        sfi_error e;
        ck_assert_msg(sfi_params_set(&q, kv, "json", &e) == SFI_OK, "%s", e.msg);
    }
    ck_assert(!memcmp(&p, &q, sizeof p));
    json_decref(o);
    free(s);
}
END_TEST

/* sfi_params_from_json: the inverse of _to_json, with --param's ranges
 * (what a trace's meta params is checked with). */
START_TEST(json_reads_back)
{
    sfi_params p, q;
    sfi_params_default(&p);
    sfi_error e;
    ck_assert_int_eq(sfi_params_set(&p, "K=77", "t", &e), SFI_OK);
    ck_assert_int_eq(sfi_params_set(&p, "alpha=0.25", "t", &e), SFI_OK);
    ck_assert_int_eq(sfi_params_set(&p, "trigger_chars=.\\n\\\\", "t", &e), SFI_OK);
    char *j = sfi_params_to_json(&p);
    ck_assert_ptr_nonnull(j);
    sfi_params_default(&q);
    ck_assert_msg(sfi_params_from_json(&q, j, "meta params", &e) == SFI_OK, "%s", e.msg);
    free(j);
    ck_assert_int_eq(q.K, 77);
    ck_assert_float_eq(q.alpha, 0.25f);
    ck_assert_str_eq(q.trigger_chars, ".\n\\");
    ck_assert_int_eq(memcmp(&p, &q, sizeof p), 0);
    /* Other producers' keys are ignored; ours are checked. */
    ck_assert_int_eq(sfi_params_from_json(&q, "{\"note\": [1], \"K\": 5}", "x", &e), SFI_OK);
    ck_assert_int_eq(q.K, 5);
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"junk", "x: invalid JSON"},
        {"[1]", "x: not a JSON object"},
        {"{\"K\": -5}", "K"},
        {"{\"K\": 2.5}", "K: expected an integer"},
        {"{\"alpha\": \"half\"}", "alpha: expected a number, found a string"},
        {"{\"eps\": null}", "found null"},
        {"{\"trigger_chars\": 7}", "trigger_chars: not a string"},
        {"{\"trigger_chars\": \"0123456789012345678901234567890123\"}", "trigger_chars"},
        {"{\"K\": 1, \"K\": 2}", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        q = p;
        ck_assert_int_ne(sfi_params_from_json(&q, bad[i].json, "x", &e), SFI_OK);
        ck_assert_msg(strstr(e.msg, bad[i].needle), "%s: %s", bad[i].json, e.msg);
        ck_assert_int_eq(memcmp(&p, &q, sizeof p), 0);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("params");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, defaults_match_sfi7);
    tcase_add_test(tc, every_key_documented_in_sfi7);
    tcase_add_test(tc, every_key_sets_its_field);
    tcase_add_test(tc, blanks_around_key_and_value);
    tcase_add_test(tc, unknown_key);
    tcase_add_test(tc, out_of_range);
    tcase_add_test(tc, bad_numbers);
    tcase_add_test(tc, trigger_chars_escapes);
    tcase_add_test(tc, file_good);
    tcase_add_test(tc, file_errors_name_the_line);
    tcase_add_test(tc, file_missing_or_huge);
    tcase_add_test(tc, validate_catches_bad_structs);
    tcase_add_test(tc, json_has_every_key_with_short_numbers);
    tcase_add_test(tc, json_reads_back);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
