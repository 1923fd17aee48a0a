/* The peers on real queries and keys, end to end on the random-weight
 * fixture model: sfi-ref calibrate, sfi-ref run --trace-qk --trace-calib,
 * then the analyzer runs every policy on the trace's q/K snapshots with
 * the prompt observation and the calibration, and names no proxy. */
#include <config.h>

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_analyze.h"
#include "sfi_analyze_trace.h"
#include "sfi_policies.h"
#include "sfi_test_util.h"
#include "sfi_trace.h"

/* n pseudo-random ids in [5, 500) of the fixture's vocabulary of 512. */
static void write_ids(const char *path, int n, unsigned seed)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        fprintf(f, "%u ", 5 + (seed >> 16) % 495);
    }
    fclose(f);
}

static void run_ok(const char *cmd)
{
    char *out = NULL, *err = NULL;
    int rc = sfi_test_run(cmd, &out, &err);
    ck_assert_msg(rc == 0, "%s\nrc %d: %s", cmd, rc, err);
    free(out);
    free(err);
}

START_TEST(real_qk_trace_and_calibration)
{
    char model[4096];
    snprintf(model, sizeof model, "%s", sfi_test_src("tests/fixtures/hf/tiny-qwen3"));
    char calib_ids[1024], prompt_ids[1024], calib[1024], trace[1024], cmd[16384];
    snprintf(calib_ids, sizeof calib_ids, "%s/calib.ids", sfi_test_dir);
    snprintf(prompt_ids, sizeof prompt_ids, "%s/prompt.ids", sfi_test_dir);
    snprintf(calib, sizeof calib, "%s/calib.json", sfi_test_dir);
    snprintf(trace, sizeof trace, "%s/qk.db", sfi_test_dir);
    /* A calibration text unlike the evaluated one (another seed). */
    write_ids(calib_ids, 2 * 96, 7);
    write_ids(prompt_ids, 100, 1);
    snprintf(cmd, sizeof cmd, "'%s' calibrate --model '%s' --ids '%s' --prompts 2 "
             "--prompt-len 96 --param kascade_calib_k=16 --param fasa_calib_k=16 -q -o '%s'",
             sfi_test_build("sfi-ref"), model, calib_ids, calib);
    run_ok(cmd);
    sfi_policy_calib cal;
    sfi_error e;
    ck_assert_msg(sfi_policy_calib_load(calib, &cal, &e) == SFI_OK, "%s", e.msg);
    ck_assert(cal.has_kascade && cal.has_fasa);
    ck_assert_int_eq(cal.n_layers, 3);
    ck_assert_int_eq(cal.n_tip, 2); /* head_dim 16: 8 chunks, a quarter */
    sfi_policy_calib_free(&cal);
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --prompt-ids '%s' --max-new 20 "
             "--param T_max=5 --trace '%s' --trace-level full --trace-top-m 16 --trace-qkv "
             "--trace-calib '%s'",
             sfi_test_build("sfi-ref"), model, prompt_ids, trace, calib);
    run_ok(cmd);

    /* What the trace holds: step 0's query snapshot is the prompt's last
     * 32 queries, its 'a' snapshot the prompt's accumulated attention
     * (each query's softmax sums to 1: a head's row sums to 100), keys
     * and values once, at the last step. */
    sfi_trace *t;
    ck_assert_msg(sfi_trace_open(trace, &t, &e) == SFI_OK, "%s", e.msg);
    ck_assert_msg(sfi_trace_check(t, &e) == SFI_OK, "%s", e.msg);
    float *d;
    int32_t r, c;
    ck_assert_int_eq(sfi_trace_read_snapshot(t, 0, 0, 1, 'q', &d, &r, &c, &e), SFI_OK);
    ck_assert(r == 32 * 4 && c == 16);
    free(d);
    ck_assert_int_eq(sfi_trace_read_snapshot(t, 0, 0, 2, 'a', &d, &r, &c, &e), SFI_OK);
    ck_assert(r == 4 && c == 100);
    for (int h = 0; h < 4; h++) {
        double s = 0;
        for (int j = 0; j < 100; j++)
            s += d[h * 100 + j];
        ck_assert_double_eq_tol(s, 100.0, 1e-3);
    }
    free(d);
    ck_assert_int_eq(sfi_trace_read_snapshot(t, 0, 7, 0, 'q', &d, &r, &c, &e), SFI_OK);
    ck_assert(r == 4 && c == 16);
    free(d);
    ck_assert_int_eq(sfi_trace_read_snapshot(t, 0, 7, 0, 'k', &d, &r, &c, &e), SFI_ENOTFOUND);
    ck_assert_int_eq(sfi_trace_read_snapshot(t, 0, 19, 0, 'k', &d, &r, &c, &e), SFI_OK);
    ck_assert(r == 2 * 119 && c == 16);
    free(d);
    sfi_trace_close(t);

    /* Every policy on real q and K, measured exactly, no proxy named. */
    sfi_analyze_trace *at;
    ck_assert_msg(sfi_analyze_trace_open(trace, NULL, "", -1, &at, &e) == SFI_OK, "%s", e.msg);
    const sfi_analyze_source *src = sfi_analyze_trace_source(at);
    ck_assert_ptr_nonnull(src->prompt);
    ck_assert_ptr_nonnull(sfi_analyze_trace_calib(at));
    sfi_analyze_opts o;
    sfi_analyze_opts_default(&o);
    o.budget.ratio = 0.25;
    o.n_threads = 1;
    o.calib = sfi_analyze_trace_calib(at);
    ck_assert_int_eq(sfi_policy_config_set(&o.cfg, "n_recent=8", &e), SFI_OK);
    ck_assert_int_eq(sfi_policy_config_set(&o.cfg, "snapkv_window=8", &e), SFI_OK);
    ck_assert_int_eq(sfi_policy_config_set(&o.cfg, "lfps_s=8", &e), SFI_OK);
    ck_assert_int_eq(sfi_policy_config_set(&o.cfg, "kascade_anchors=1", &e), SFI_OK);
    sfi_analyze_result res;
    ck_assert_msg(sfi_analyze_run(src, &o, &res, &e) == SFI_OK, "%s", e.msg);
    /* steps 1..19 (step 0 is the prompt's), 3 layers x 2 KV heads */
    const double n = 19 * 3 * 2;
    const sfi_analyze_policy *orc = &res.pol[SFI_POLICY_ORACLE];
    for (int k = 0; k < SFI_POLICY_N_KINDS; k++) {
        const sfi_analyze_policy *p = &res.pol[k];
        const char *nm = sfi_policy_kind_name((sfi_policy_kind)k);
        ck_assert_msg(p->available, "%s", nm);
        ck_assert_msg(p->n == n && p->exact == n, "%s: %g measured, %g exact", nm, p->n,
                      p->exact);
        ck_assert_msg(p->proxy == NULL, "%s: proxy %s", nm, p->proxy);
        /* With the same B and real q/K, no set beats the exact top-B. */
        if (p->ratio / p->n <= orc->ratio / orc->n + 1e-9)
            ck_assert_msg(p->recall <= orc->recall + 1e-6, "%s recall %g > oracle %g", nm,
                          p->recall / n, orc->recall / n);
    }
    ck_assert_double_eq_tol(res.pol[SFI_POLICY_FULL].recall / n, 1.0, 1e-6);
    ck_assert_double_eq_tol(res.pol[SFI_POLICY_FULL].out_err, 0.0, 1e-3);
    ck_assert_double_eq_tol(orc->overlap / n, 1.0, 1e-12);
    ck_assert_int_eq(res.kascade_proxy, 0);
    ck_assert_int_eq(res.n_kascade_anchors, 1);
    sfi_analyze_result_free(&res);
    sfi_analyze_trace_free(at);

    /* The same through the command: the table names no proxy. */
    char *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "'%s' analyze '%s' --budget 25%% --param n_recent=8",
             sfi_test_build("sfi-sim"), trace);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    ck_assert_msg(strstr(out, "calibration: the trace's meta peer_calibration") != NULL, "%s",
                  out);
    ck_assert_ptr_null(strstr(out, "leaks"));
    free(out);
    free(err);
    /* --records-only: the same trace through the proxies, named. */
    snprintf(cmd, sizeof cmd, "'%s' analyze '%s' --budget 25%% --param n_recent=8 "
             "--records-only --format json", sfi_test_build("sfi-sim"), trace);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    ck_assert_ptr_nonnull(j);
    json_t *pols = json_object_get(j, "policies");
    int saw = 0;
    for (size_t i = 0; i < json_array_size(pols); i++) {
        json_t *p = json_array_get(pols, i);
        const char *nm = json_string_value(json_object_get(p, "name"));
        if (!strcmp(nm, "h2o") || !strcmp(nm, "snapkv") || !strcmp(nm, "lfps")) {
            ck_assert_msg(json_is_string(json_object_get(p, "proxy")), "%s", nm);
            saw++;
        }
        if (!strcmp(nm, "quest") || !strcmp(nm, "fasa"))
            ck_assert(json_is_false(json_object_get(p, "available")));
        else
            ck_assert_double_eq_tol(json_real_value(json_object_get(p, "exact_share")), 0.0,
                                    1e-12);
    }
    ck_assert_int_eq(saw, 3);
    json_decref(j);
    free(out);
    free(err);
}
END_TEST

START_TEST(bad_calibration_inputs)
{
    char model[4096];
    snprintf(model, sizeof model, "%s", sfi_test_src("tests/fixtures/hf/tiny-qwen3"));
    char ids[1024], cmd[16384], bad[1024];
    snprintf(ids, sizeof ids, "%s/short.ids", sfi_test_dir);
    write_ids(ids, 50, 3);
    char *out = NULL, *err = NULL;
    /* too short for the prompts asked */
    snprintf(cmd, sizeof cmd, "'%s' calibrate --model '%s' --ids '%s' --prompts 2 "
             "--prompt-len 64 -o '%s/c.json'", sfi_test_build("sfi-ref"), model, ids, sfi_test_dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_msg(strstr(err, "need 128") != NULL, "%s", err);
    free(out);
    free(err);
    /* a calibration of another shape is refused by the recorder */
    snprintf(bad, sizeof bad, "%s/bad.json", sfi_test_dir);
    FILE *f = fopen(bad, "w");
    fputs("{\"format\":\"sfi-policy-calibration\",\"version\":1,\"n_layers\":5,"
          "\"n_kv_heads\":2,\"head_dim\":16}", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --prompt-ids '%s' --max-new 2 --trace "
             "'%s/t.db' --trace-level full --trace-calib '%s'", sfi_test_build("sfi-ref"), model,
             ids, sfi_test_dir, bad);
    ck_assert_int_ne(sfi_test_run(cmd, &out, &err), 0);
    ck_assert_msg(strstr(err, "for 5 layers") != NULL, "%s", err);
    free(out);
    free(err);
    /* teacher forcing needs an id per step after the first */
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --prompt-ids '%s' --forced-ids '%s' "
             "--max-new 60", sfi_test_build("sfi-ref"), model, ids, ids);
    ck_assert_int_ne(sfi_test_run(cmd, &out, &err), 0);
    ck_assert_msg(strstr(err, "50 ids for 60 steps (need 59)") != NULL, "%s", err);
    free(out);
    free(err);
    /* --trace-qk needs the full level */
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --prompt-ids '%s' --max-new 2 --trace "
             "'%s/t2.db' --trace-qk", sfi_test_build("sfi-ref"), model, ids, sfi_test_dir);
    ck_assert_int_ne(sfi_test_run(cmd, &out, &err), 0);
    ck_assert_msg(strstr(err, "--trace-qk needs --trace-level full") != NULL, "%s", err);
    free(out);
    free(err);
    /* a malformed calibration file names the file and the problem */
    f = fopen(bad, "w");
    fputs("{\"format\":\"sfi-policy-calibration\",\"version\":1,\"n_layers\":3,"
          "\"n_kv_heads\":2,\"head_dim\":16,\"fasa\":{\"k\":4,\"n_tip\":2,\"tip\":[[[1,0]]]}}", f);
    fclose(f);
    sfi_policy_calib cal;
    sfi_error e;
    ck_assert_int_eq(sfi_policy_calib_load(bad, &cal, &e), SFI_EFORMAT);
    ck_assert_msg(strstr(e.msg, bad) && strstr(e.msg, "fasa"), "%s", e.msg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("policy_trace");
    TCase *tc = tcase_create("e2e");
    tcase_add_checked_fixture(tc, sfi_test_dir_setup, sfi_test_dir_teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, real_qk_trace_and_calibration);
    tcase_add_test(tc, bad_calibration_inputs);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
