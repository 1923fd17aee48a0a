/* sfi-sim trace check|info on traces written through the API: outputs,
 * exit codes, and messages for bad files. */
#include <config.h>

#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_test_util.h"
#include "sfi_trace.h"

static char *dir;
static char path[4096];

static void setup(void)
{
    dir = sfi_test_tmpdir();
    ck_assert_ptr_nonnull(dir);
    snprintf(path, sizeof path, "%s/cli.db", dir);
}

static void teardown(void)
{
    sfi_test_rmtree(dir);
    free(dir);
}

/* 2 requests x 50 steps, slow at 0 (first), every 10th (trigger), summary
 * level with one selection per slow step x layer x kv head. */
static void write_trace(int finish)
{
    sfi_trace_meta m;
    sfi_trace_meta_init(&m);
    m.tool = "test_trace_cli";
    m.tool_version = "1";
    m.policy = "sfi";
    m.level = SFI_TRACE_SUMMARY;
    m.n_vocab = 100;
    m.n_layers = 2;
    m.n_heads = 2;
    m.n_kv_heads = 1;
    sfi_trace_writer *w;
    sfi_error e;
    ck_assert_msg(sfi_trace_create(path, &m, SFI_TRACE_OVERWRITE, 8, &w, &e) == SFI_OK, "%s", e.msg);
    for (int r = 0; r < 2; r++) {
        int32_t prompt[20];
        for (int i = 0; i < 20 + r; i++)
            prompt[i % 20] = i % 100;
        ck_assert_int_eq(sfi_trace_add_request(w, prompt, 19 + r, NULL, &e), SFI_OK);
        for (int s = 0; s < 50; s++) {
            int slow = s % 10 == 0;
            ck_assert_int_eq(sfi_trace_append_step(w, r, s, 20 + r + s, s % 100,
                                                   slow ? SFI_STEP_SLOW : SFI_STEP_FAST,
                                                   s == 0 ? SFI_REASON_FIRST
                                                          : slow ? SFI_REASON_TRIGGER : SFI_REASON_NONE,
                                                   &e),
                             SFI_OK);
            if (slow)
                for (int l = 0; l < 2; l++) {
                    int32_t sel[2] = {1, 5};
                    ck_assert_int_eq(sfi_trace_add_selection(w, r, s, l, 0, sel, 2, 0.9f, 0.0f, &e),
                                     SFI_OK);
                }
        }
    }
    if (finish)
        ck_assert_int_eq(sfi_trace_finish(w, &e), SFI_OK);
    else
        sfi_trace_writer_close(w);
}

static int sim(const char *args, char **out, char **err)
{
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "'%s' trace %s", sfi_test_build("sfi-sim"), args);
    return sfi_test_run(cmd, out, err);
}

START_TEST(check_and_info)
{
    write_trace(1);
    char args[8400], *out, *err;
    snprintf(args, sizeof args, "check --complete '%s'", path);
    ck_assert_int_eq(sim(args, &out, &err), 0);
    ck_assert_msg(strstr(out, ": ok: level summary, 2 requests, 100 steps, complete"), "%s", out);
    free(out);
    free(err);
    snprintf(args, sizeof args, "info '%s'", path);
    ck_assert_int_eq(sim(args, &out, &err), 0);
    ck_assert_msg(strstr(out, "slow steps:    10 (fraction 0.1000)"), "%s", out);
    ck_assert_msg(strstr(out, "context:       20..70"), "%s", out);
    ck_assert_msg(strstr(out, "prompt length: 19..20"), "%s", out);
    ck_assert_msg(strstr(out, "records present: tokens,summary"), "%s", out);
    free(out);
    free(err);
    snprintf(args, sizeof args, "info --json '%s'", path);
    ck_assert_int_eq(sim(args, &out, &err), 0);
    json_error_t je;
    json_t *o = json_loads(out, 0, &je);
    ck_assert_msg(o != NULL, "not JSON: %s", je.text);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "steps")), 100);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(o, "steps_by_reason"), "trigger")), 8);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(o, "steps_by_reason"), "first")), 2);
    ck_assert(json_is_true(json_object_get(o, "complete")));
    ck_assert_double_eq_tol(json_real_value(json_object_get(o, "slow_fraction")), 0.1, 1e-12);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "selections")), 20);
    json_decref(o);
    free(out);
    free(err);
}
END_TEST

START_TEST(incomplete_and_bad_files)
{
    write_trace(0);
    char args[8400], *out, *err;
    snprintf(args, sizeof args, "check '%s'", path);
    ck_assert_int_eq(sim(args, &out, &err), 0);
    ck_assert_msg(strstr(out, "incomplete"), "%s", out);
    free(out);
    free(err);
    snprintf(args, sizeof args, "check --complete '%s'", path);
    ck_assert_int_eq(sim(args, &out, &err), 1);
    ck_assert_msg(strstr(err, "incomplete"), "%s", err);
    free(out);
    free(err);
    char bad[4200];
    snprintf(bad, sizeof bad, "%s/bad.db", dir);
    sfi_test_write_file(bad, "SQLite format 3\0garbage", 24);
    snprintf(args, sizeof args, "info '%s'", bad);
    ck_assert_int_eq(sim(args, &out, &err), 1);
    ck_assert_msg(strstr(err, bad), "%s", err);
    free(out);
    free(err);
    ck_assert_int_eq(sim("check", NULL, NULL), 2);
    ck_assert_int_eq(sim("frobnicate x", NULL, NULL), 2);
    ck_assert_int_eq(sim("info --bogus x", NULL, NULL), 2);
    ck_assert_int_eq(sim("--help", &out, NULL), 0);
    ck_assert_msg(strstr(out, "usage: sfi-sim trace check"), "%s", out);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("trace_cli");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, check_and_info);
    tcase_add_test(tc, incomplete_and_bad_files);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
