/* The tokenizer files under $SFI_SHARED (../shared): the real Qwen3
 * tokenizer and the sfi-small-qwen3 model's own load, are byte-identical to
 * the repository's copies in tests/fixtures/ (which the other suites test
 * in depth), and sfi-ref trigger-set works on them. Exits 77 (skip) when
 * ../shared is absent. */
#include <config.h>

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_test_util.h"
#include "sfi_tokenizer.h"

static const char *const pairs[][2] = {
    {"data/qwen3-tokenizer", "tests/fixtures/qwen3-tokenizer"},
    {"models/sfi-small-qwen3", "tests/fixtures/sfi-small-qwen3-tokenizer"},
};
static const char *const files[] = {"vocab.json", "merges.txt", "tokenizer_config.json"};

START_TEST(shared_equals_fixture)
{
    for (size_t p = 0; p < 2; p++) {
        char sdir[2048];
        const char *sd = sfi_test_shared(pairs[p][0]);
        ck_assert_msg(sd != NULL, "%s missing under SFI_SHARED", pairs[p][0]);
        snprintf(sdir, sizeof sdir, "%s", sd);
        for (size_t f = 0; f < 3; f++) {
            char a[4096], b[4096];
            snprintf(a, sizeof a, "%s/%s", sdir, files[f]);
            snprintf(b, sizeof b, "%s/%s", pairs[p][1], files[f]);
            snprintf(b, sizeof b, "%s", sfi_test_src(b));
            size_t la, lb;
            char *da = sfi_test_read_file(a, &la), *db = sfi_test_read_file(b, &lb);
            ck_assert_msg(da && db, "cannot read %s or %s", a, b);
            ck_assert_msg(la == lb && !memcmp(da, db, la), "%s differs from %s", a, b);
            free(da);
            free(db);
        }
        sfi_tokenizer *t;
        sfi_error err;
        ck_assert_msg(sfi_tokenizer_load(sdir, &t, &err) == SFI_OK, "%s", err.msg);
        int32_t *ids;
        size_t n;
        ck_assert_int_eq(sfi_tokenizer_encode(t, "Hello world.\n", 13, &ids, &n, &err), SFI_OK);
        ck_assert_uint_ge(n, 3);
        free(ids);
        sfi_tokenizer_free(t);
    }
}
END_TEST

START_TEST(trigger_set_cli_on_shared)
{
    char dir[2048], cmd[8192], *out = NULL, *errs = NULL;
    snprintf(dir, sizeof dir, "%s", sfi_test_shared("data/qwen3-tokenizer"));
    snprintf(cmd, sizeof cmd, "'%s' trigger-set --tokenizer '%s'", sfi_test_build("sfi-ref"), dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &errs), 0);
    ck_assert(!strncmp(out, "size 2570\n", 10));
    ck_assert_ptr_nonnull(strstr(out, "\n13\t\".\"\n"));
    ck_assert_ptr_nonnull(strstr(out, "\n198\t\"\\n\"\n"));
    ck_assert_ptr_null(strstr(out, "\n279\t")); /* " the" */
    free(out);
    free(errs);
}
END_TEST

int main(void)
{
    if (!sfi_test_shared("data/qwen3-tokenizer/vocab.json") ||
        !sfi_test_shared("models/sfi-small-qwen3/vocab.json")) {
        printf("SKIP: no ../shared tokenizer files (set SFI_SHARED)\n");
        return 77;
    }
    Suite *s = suite_create("vocab_shared");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, shared_equals_fixture);
    tcase_add_test(tc, trigger_set_cli_on_shared);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
