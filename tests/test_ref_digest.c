/* src/sfi_digest (SHA-256 test vectors, little-endian float hashing, files)
 * and the reference core's golden digests: the seeded suite of
 * ref/sfi_golden.c must reproduce tests/golden/ref_core.sha256 bit for bit
 * (CI reruns this under gcc and clang at -O0 and -O3), in-process and
 * through `sfi-ref digest --suite`. */
#include <config.h>

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_digest.h"
#include "sfi_golden.h"
#include "sfi_test_util.h"

#define GOLDEN "tests/golden/ref_core.sha256"

START_TEST(sha256_vectors)
{
    char hex[SFI_DIGEST_HEX_LEN + 1];
    /* FIPS 180-2 examples. */
    ck_assert_int_eq(sfi_digest_buffer_hex("", 0, hex, NULL), SFI_OK);
    ck_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    ck_assert_int_eq(sfi_digest_buffer_hex("abc", 3, hex, NULL), SFI_OK);
    ck_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    /* Incremental in pieces equals one shot. */
    sfi_hasher h;
    uint8_t raw[SFI_DIGEST_LEN];
    ck_assert_int_eq(sfi_hasher_init(&h, NULL), SFI_OK);
    sfi_hasher_update(&h, "a", 1);
    sfi_hasher_update(&h, "bc", 2);
    ck_assert_int_eq(sfi_hasher_final_hex(&h, hex, raw, NULL), SFI_OK);
    ck_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    ck_assert_uint_eq(raw[0], 0xba);
    ck_assert_ptr_null(h.ctx);
    /* Floats hash as little-endian IEEE bytes: 1.0f = 00 00 80 3f,
     * -0.0f = 00 00 00 80 (distinct from +0.0f). */
    const float f[2] = {1.0f, -0.0f};
    const uint8_t le[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x80};
    char a[SFI_DIGEST_HEX_LEN + 1], b[SFI_DIGEST_HEX_LEN + 1];
    ck_assert_int_eq(sfi_digest_f32_hex(f, 2, a, NULL), SFI_OK);
    ck_assert_int_eq(sfi_digest_buffer_hex(le, 8, b, NULL), SFI_OK);
    ck_assert_str_eq(a, b);
    /* More than one internal chunk (256 values). */
    float big[1000];
    uint8_t bigb[4000];
    for (int i = 0; i < 1000; i++) {
        big[i] = (float)i * 0.5f;
        uint32_t u;
        memcpy(&u, &big[i], 4);
        for (int k = 0; k < 4; k++)
            bigb[4 * i + k] = (uint8_t)(u >> (8 * k));
    }
    ck_assert_int_eq(sfi_digest_f32_hex(big, 1000, a, NULL), SFI_OK);
    ck_assert_int_eq(sfi_digest_buffer_hex(bigb, 4000, b, NULL), SFI_OK);
    ck_assert_str_eq(a, b);
    const int32_t m1 = -1;
    const int64_t m2 = 258;
    const uint8_t lei[12] = {0xff, 0xff, 0xff, 0xff, 2, 1, 0, 0, 0, 0, 0, 0};
    ck_assert_int_eq(sfi_hasher_init(&h, NULL), SFI_OK);
    sfi_hasher_update_i32(&h, &m1, 1);
    sfi_hasher_update_i64(&h, &m2, 1);
    ck_assert_int_eq(sfi_hasher_final_hex(&h, a, NULL, NULL), SFI_OK);
    ck_assert_int_eq(sfi_digest_buffer_hex(lei, 12, b, NULL), SFI_OK);
    ck_assert_str_eq(a, b);
    /* Strings carry their terminator: ("ab","c") != ("a","bc"). */
    ck_assert_int_eq(sfi_hasher_init(&h, NULL), SFI_OK);
    sfi_hasher_update_str(&h, "ab");
    sfi_hasher_update_str(&h, "c");
    ck_assert_int_eq(sfi_hasher_final_hex(&h, a, NULL, NULL), SFI_OK);
    ck_assert_int_eq(sfi_hasher_init(&h, NULL), SFI_OK);
    sfi_hasher_update_str(&h, "a");
    sfi_hasher_update_str(&h, "bc");
    ck_assert_int_eq(sfi_hasher_final_hex(&h, b, NULL, NULL), SFI_OK);
    ck_assert_str_ne(a, b);
    /* A hasher never initialised (zeroed) reports an error at final. */
    sfi_hasher z = {NULL, 0};
    sfi_error e;
    sfi_hasher_update(&z, "x", 1);
    ck_assert_int_eq(sfi_hasher_final_hex(&z, a, NULL, &e), SFI_EINVAL);
    ck_assert_str_eq(a, "");
    sfi_hasher_free(&z);
}
END_TEST

START_TEST(file_digest)
{
    char *dir = sfi_test_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/abc", dir);
    ck_assert_int_eq(sfi_test_write_file(path, "abc", 3), 0);
    char hex[SFI_DIGEST_HEX_LEN + 1];
    sfi_error e;
    ck_assert_int_eq(sfi_digest_file_hex(path, hex, &e), SFI_OK);
    ck_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    /* Larger than the read buffer: 200000 bytes of 'a' hashed both ways. */
    char *big = malloc(200000);
    memset(big, 'a', 200000);
    snprintf(path, sizeof path, "%s/big", dir);
    ck_assert_int_eq(sfi_test_write_file(path, big, 200000), 0);
    char h2[SFI_DIGEST_HEX_LEN + 1];
    ck_assert_int_eq(sfi_digest_file_hex(path, hex, &e), SFI_OK);
    ck_assert_int_eq(sfi_digest_buffer_hex(big, 200000, h2, &e), SFI_OK);
    ck_assert_str_eq(hex, h2);
    free(big);
    snprintf(path, sizeof path, "%s/missing", dir);
    ck_assert_int_eq(sfi_digest_file_hex(path, hex, &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, path));
    ck_assert_str_eq(hex, "");
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

typedef struct {
    char *text;
    size_t len, cap;
} sbuf;

static void collect(const char *name, const char *hex, void *ctx)
{
    sbuf *b = ctx;
    size_t need = strlen(name) + strlen(hex) + 4;
    if (b->len + need >= b->cap) {
        b->cap = (b->cap + need) * 2;
        b->text = realloc(b->text, b->cap);
    }
    b->len += (size_t)sprintf(b->text + b->len, "%s  %s\n", hex, name);
}

/* Prints every line of got that differs from want, for the log. */
static int report_diff(const char *got, const char *want)
{
    int bad = 0;
    const char *g = got, *w = want;
    while (*g || *w) {
        const char *ge = strchr(g, '\n'), *we = strchr(w, '\n');
        size_t gl = ge ? (size_t)(ge - g) : strlen(g), wl = we ? (size_t)(we - w) : strlen(w);
        if (gl != wl || memcmp(g, w, gl) != 0) {
            printf("golden mismatch:\n  got  %.*s\n  want %.*s\n", (int)gl, g, (int)wl, w);
            bad++;
        }
        g += gl + (ge ? 1 : 0);
        w += wl + (we ? 1 : 0);
    }
    return bad;
}

START_TEST(golden_suite_in_process)
{
    char *want = sfi_test_read_file(sfi_test_src(GOLDEN), NULL);
    ck_assert_msg(want != NULL, "cannot read %s", GOLDEN);
    sbuf b = {NULL, 0, 0};
    sfi_error e;
    ck_assert_msg(sfi_golden_suite(collect, &b, &e) == SFI_OK, "%s", e.msg);
    int bad = report_diff(b.text, want);
    int lines = 0;
    for (const char *p = want; *p; p++)
        lines += *p == '\n';
    printf("golden suite: %d cases, %d mismatches\n", lines, bad);
    ck_assert_int_ge(lines, 20);
    ck_assert_int_eq(bad, 0);
    ck_assert_str_eq(b.text, want);
    free(b.text);
    free(want);
}
END_TEST

START_TEST(golden_suite_cli)
{
    char cmd[8192], *out = NULL, *err = NULL;
    const char *exe = sfi_test_build("sfi-ref");
    snprintf(cmd, sizeof cmd, "'%s' digest --suite", exe);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    char *want = sfi_test_read_file(sfi_test_src(GOLDEN), NULL);
    ck_assert_ptr_nonnull(want);
    ck_assert_int_eq(report_diff(out, want), 0);
    free(out);
    free(err);
    free(want);
    /* Files: sha256sum format; a missing file is named, exit 1, the
     * others still printed. */
    char *dir = sfi_test_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/abc", dir);
    ck_assert_int_eq(sfi_test_write_file(path, "abc", 3), 0);
    snprintf(cmd, sizeof cmd, "'%s' digest '%s' '%s/nope'", sfi_test_build("sfi-ref"), path, dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    char line[4200];
    snprintf(line, sizeof line,
             "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  %s\n", path);
    ck_assert_str_eq(out, line);
    ck_assert_ptr_nonnull(strstr(err, "nope: cannot open"));
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "printf abc | '%s' digest -", sfi_test_build("sfi-ref"));
    /* stdin is /dev/null for sfi_test_run, but the pipe replaces it. */
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    ck_assert_str_eq(out, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  -\n");
    free(out);
    free(err);
    /* Names with a newline, backslash or CR: escaped exactly as sha256sum
     * does, so every line stays one line (issue 20) and `sha256sum -c`
     * checks the output. */
    char exe2[4096];
    snprintf(exe2, sizeof exe2, "%s", sfi_test_build("sfi-ref"));
    snprintf(cmd, sizeof cmd,
             "cd '%s' && printf x > \"$(printf 'a\\nb')\" && printf y > 'c\\d' && "
             "printf z > \"$(printf 'e\\rf')\" && "
             "'%s' digest \"$(printf 'a\\nb')\" 'c\\d' \"$(printf 'e\\rf')\" abc > ours && "
             "sha256sum \"$(printf 'a\\nb')\" 'c\\d' \"$(printf 'e\\rf')\" abc > theirs && "
             "cmp ours theirs && sha256sum -c --quiet ours && wc -l < ours",
             dir, exe2);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    ck_assert_str_eq(out, "4\n");
    free(out);
    free(err);
    /* Usage errors: nothing, or both files and --suite. */
    snprintf(cmd, sizeof cmd, "'%s' digest", sfi_test_build("sfi-ref"));
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 2);
    ck_assert_str_eq(out, "");
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "'%s' digest --suite '%s'", sfi_test_build("sfi-ref"), path);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 2);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "'%s' digest --bogus", sfi_test_build("sfi-ref"));
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 2);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "'%s' digest --help", sfi_test_build("sfi-ref"));
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: sfi-ref digest FILE..."));
    free(out);
    free(err);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ref_digest");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, sha256_vectors);
    tcase_add_test(tc, file_digest);
    tcase_add_test(tc, golden_suite_in_process);
    tcase_add_test(tc, golden_suite_cli);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
