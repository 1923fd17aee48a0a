/* sfi-sim sweep, presets and validate through the built program: outputs,
 * figures, traces, and every kind of bad input. */
#include <config.h>

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sfi_test_util.h"
#include "sfi_trace.h"

static char sim[4096], tokdir[4096];
static char *tmp;

static void setup(void)
{
    snprintf(sim, sizeof sim, "%s", sfi_test_build("sfi-sim"));
    snprintf(tokdir, sizeof tokdir, "%s", sfi_test_src("tests/fixtures/qwen3-tokenizer"));
    tmp = sfi_test_tmpdir();
    ck_assert_ptr_nonnull(tmp);
}

static void teardown(void)
{
    sfi_test_rmtree(tmp);
    free(tmp);
}

/* Runs sfi-sim with args in the temp dir (so a default PNG lands there). */
static int run(const char *args, char **out, char **err)
{
    return sfi_test_run_in(tmp, sim, args, out, err);
}

START_TEST(csv_rows_and_speedups)
{
    char *out, *err;
    int rc = run("sweep --synthetic --no-png --models Qwen3-4B --gpus H100 --contexts 32K "
                 "--batch 1 --format csv",
                 &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    /* Header + one row per policy of ref/sfi_policies.h (13). */
    int lines = 0;
    for (char *p = out; *p; p++)
        lines += *p == '\n';
    ck_assert_int_eq(lines, 14);
    ck_assert_ptr_nonnull(strstr(out, ",h2o,"));
    ck_assert_ptr_nonnull(strstr(out, ",snapkv,"));
    ck_assert_ptr_nonnull(strstr(out, "model,gpu,tp,context,batch,policy,fits,tokens_per_s,speedup"));
    ck_assert_ptr_nonnull(strstr(out, "Qwen3-4B,H100-SXM,1,32768,1,full,1,"));
    /* SFI beats full KV at 32K; full's speedup is 1. */
    char *full = strstr(out, ",full,1,"), *sfi = strstr(out, ",sfi,1,");
    ck_assert_ptr_nonnull(full);
    ck_assert_ptr_nonnull(sfi);
    double ft, fs, st, ss;
    ck_assert_int_eq(sscanf(full, ",full,1,%lf,%lf", &ft, &fs), 2);
    ck_assert_int_eq(sscanf(sfi, ",sfi,1,%lf,%lf", &st, &ss), 2);
    ck_assert(fs == 1.0);
    ck_assert(ss > 1.2 && st > ft);
    free(out);
    free(err);
}
END_TEST

START_TEST(json_and_output_file)
{
    char *out, *err, path[4200];
    int rc = run("sweep --synthetic --no-png --models Qwen3-0.6B,Qwen3-30B-A3B --contexts 8K,16K "
                 "--policies full,sfi,quest:page=32,dense_layers=1 --budget 1024 --format json "
                 "-o rows.json",
                 &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    ck_assert_str_eq(out, "");
    snprintf(path, sizeof path, "%s/rows.json", tmp);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    ck_assert_msg(j != NULL, "%s", je.text);
    json_t *rows = json_object_get(j, "rows");
    ck_assert_uint_eq(json_array_size(rows), 2 * 2 * 3);
    json_t *r = json_array_get(rows, 2);
    ck_assert_str_eq(json_string_value(json_object_get(r, "policy")),
                     "quest:page=32,dense_layers=1");
    ck_assert_str_eq(json_string_value(json_object_get(j, "budget")), "1024");
    ck_assert(json_is_true(json_object_get(r, "fits")));
    ck_assert(json_real_value(json_object_get(r, "tokens_per_s")) > 0);
    ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(j, "stream")), "SYNTHETIC"));
    json_decref(j);
    free(out);
    free(err);
}
END_TEST

START_TEST(default_run_writes_table_and_png)
{
    char *out, *err, path[4200];
    /* Default everything, but a synthetic stream so the test does not depend
     * on which sample traces are bundled. */
    int rc = run("--synthetic --timeline-png tl.png", &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    ck_assert_ptr_nonnull(strstr(out, "SYNTHETIC trigger stream"));
    ck_assert_ptr_nonnull(strstr(out, "Qwen3-235B-A22B  B200"));
    ck_assert_ptr_nonnull(strstr(out, "131072"));
    ck_assert_ptr_nonnull(strstr(out, "kascade"));
    snprintf(path, sizeof path, "%s/sfi-sim-sweep.png", tmp);
    ck_assert(sfi_test_is_png(path));
    snprintf(path, sizeof path, "%s/tl.png", tmp);
    ck_assert(sfi_test_is_png(path));
    free(out);
    free(err);
}
END_TEST

/* A tokens-level trace whose text ends a sentence ('.' = id 13) every 10
 * tokens. */
static void make_trace(const char *path, int n_steps)
{
    sfi_trace_meta m;
    sfi_trace_meta_init(&m);
    m.tool = "test_sweep";
    m.policy = "sfi";
    m.n_vocab = 151936;
    sfi_trace_writer *w;
    sfi_error e;
    ck_assert_msg(sfi_trace_create(path, &m, SFI_TRACE_OVERWRITE, 0, &w, &e) == SFI_OK, "%s", e.msg);
    int32_t prompt[4] = {785, 3974, 13, 1};
    int64_t id;
    ck_assert_int_eq(sfi_trace_add_request(w, prompt, 4, &id, &e), SFI_OK);
    for (int t = 0; t < n_steps; t++)
        ck_assert_msg(sfi_trace_append_step(w, id, t, 100 + t, t % 10 == 9 ? 13 : 2000 + t % 7,
                                            t % 10 == 0 ? SFI_STEP_SLOW : SFI_STEP_FAST,
                                            t % 10 == 0 ? SFI_REASON_TRIGGER : SFI_REASON_NONE, &e) == SFI_OK,
                      "%s", e.msg);
    ck_assert_int_eq(sfi_trace_finish(w, &e), SFI_OK);
}

START_TEST(default_run_finds_bundled_traces)
{
    /* With the repository's traces/ databases the default run replays them;
     * without any, it says it fell back to a synthetic stream. */
    char pat[4200];
    snprintf(pat, sizeof pat, "%s", sfi_test_src("traces/kjv-8k.db"));
    int have = access(pat, R_OK) == 0;
    char *out, *err;
    int rc = run("--no-png --models Qwen3-0.6B --contexts 8K --policies sfi", &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    if (have) {
        ck_assert_msg(strstr(out, "# sfi-sim sweep: trace ") != NULL, "%s", out);
        ck_assert_ptr_nonnull(strstr(out, "decode tokens"));
    } else {
        ck_assert_ptr_nonnull(strstr(out, "SYNTHETIC"));
        ck_assert_ptr_nonnull(strstr(err, "no sample trace found"));
    }
    free(out);
    free(err);
}
END_TEST

/* A trace whose writer did not finish (killed, or still recording) is
 * replayed with a note saying it is partial (issue 20, hunt). */
START_TEST(incomplete_trace_is_noted)
{
    char path[4200], args[8400], *out, *err;
    snprintf(path, sizeof path, "%s/part.db", tmp);
    sfi_trace_meta m;
    sfi_trace_meta_init(&m);
    m.tool = "test_sweep";
    m.policy = "sfi";
    sfi_trace_writer *w;
    sfi_error e;
    ck_assert_msg(sfi_trace_create(path, &m, SFI_TRACE_OVERWRITE, 0, &w, &e) == SFI_OK, "%s", e.msg);
    int32_t prompt[2] = {1, 2};
    int64_t id;
    ck_assert_int_eq(sfi_trace_add_request(w, prompt, 2, &id, &e), SFI_OK);
    for (int t = 0; t < 50; t++)
        ck_assert_int_eq(sfi_trace_append_step(w, id, t, 2 + t, 7, t ? SFI_STEP_FAST : SFI_STEP_SLOW,
                                               t ? SFI_REASON_NONE : SFI_REASON_FIRST, &e),
                         SFI_OK);
    sfi_trace_writer_close(w); /* committed, never marked complete */
    snprintf(args, sizeof args, "--trace '%s' --no-png --models Qwen3-4B --contexts 8K "
             "--policies sfi --steps 100", path);
    int rc = run(args, &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    ck_assert_msg(strstr(err, "part.db is incomplete (its writer did not finish); using its 50 "
                              "committed steps"), "%s", err);
    free(out);
    free(err);
    /* A --tokenizer other than the one the trace recorded: a note. */
    char full[4200];
    snprintf(full, sizeof full, "%s", sfi_test_src("traces/full/sfi-small-qwen3-8k.db"));
    snprintf(args, sizeof args, "--trace '%s' --tokenizer '%s' --no-png --models Qwen3-4B "
             "--contexts 8K --policies sfi --steps 100", full, tokdir);
    rc = run(args, &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    ck_assert_msg(strstr(err, "vocab.json is not the vocabulary"), "%s", err);
    free(out);
    free(err);
}
END_TEST

START_TEST(trace_drives_the_trigger_stream)
{
    char path[4200], args[12000], *out, *err;
    snprintf(path, sizeof path, "%s/t.db", tmp);
    make_trace(path, 1000);
    snprintf(args, sizeof args,
             "--trace '%s' --tokenizer '%s' --no-png --models Qwen3-4B --contexts 32K --batch 1 "
             "--policies boundary,sfi --steps 1000 --format csv",
             path, tokdir);
    int rc = run(args, &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    /* Boundary: step 0 plus one slow step after each '.' (every 10th
     * token): 1 + 99 of 1000 steps (the last '.' is x_999). */
    char *b = strstr(out, ",boundary,1,");
    ck_assert_ptr_nonnull(b);
    double v[7];
    ck_assert_int_eq(sscanf(b, ",boundary,1,%lf,%lf,%lf,%lf,%lf,%lf", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]), 6);
    ck_assert_msg(v[5] > 0.0999 && v[5] < 0.1001, "slow fraction %g", v[5]);
    free(out);
    free(err);
    /* Without --tokenizer, the trigger tokens come from the trace's
     * recorded sfi decisions: the same slow fraction. */
    snprintf(args, sizeof args,
             "--trace '%s' --no-png --models Qwen3-4B --contexts 32K --batch 1 "
             "--policies boundary,sfi --steps 1000 --format json",
             path);
    rc = run(args, &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    ck_assert_ptr_nonnull(strstr(out, "recorded decisions"));
    ck_assert_msg(strstr(out, "\"slow_fraction\": 0.1,") != NULL, "%s", out);
    free(out);
    free(err);
    /* The same through $SFI_TRACE, table format names the trace. */
    char cmd[16000];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && SFI_TRACE='%s' '%s' --tokenizer '%s' --no-png --models Qwen3-4B "
             "--contexts 32K --policies sfi",
             tmp, path, sim, tokdir);
    rc = sfi_test_run(cmd, &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    ck_assert_ptr_nonnull(strstr(out, "trace "));
    ck_assert_ptr_nonnull(strstr(out, "t.db"));
    ck_assert_ptr_null(strstr(out, "SYNTHETIC"));
    free(out);
    free(err);
}
END_TEST

static void expect_fail(const char *args, int want_rc, const char *want_msg)
{
    char *out, *err;
    int rc = run(args, &out, &err);
    ck_assert_msg(rc == want_rc, "'%s': rc %d, want %d; stderr: %s", args, rc, want_rc, err);
    ck_assert_msg(strstr(err, want_msg) != NULL, "'%s': stderr lacks '%s': %s", args, want_msg, err);
    free(out);
    free(err);
}

START_TEST(bad_input)
{
    expect_fail("--synthetic --no-png --gpus A100", 1, "unknown GPU 'A100'");
    expect_fail("--synthetic --no-png --models Qwen9-1T", 1, "Qwen9-1T");
    expect_fail("--synthetic --no-png --models Qwen3-4B --contexts 1K", 1,
                "K = 2048 is larger than the context");
    expect_fail("--synthetic --no-png --models Qwen3-4B --contexts 32K --param K=40000", 1,
                "K = 40000 is larger than the context");
    /* Issue 20.8: the sink and recent windows too (2^24 was priced). */
    expect_fail("--synthetic --no-png --models Qwen3-4B --contexts 8K --param n_recent=16777216",
                1, "n_recent = 16777216 is larger than the context (8192 positions)");
    expect_fail("--synthetic --no-png --models Qwen3-4B --contexts 8K --param n_sink=8193", 1,
                "n_sink = 8193 is larger than the context");
    expect_fail("--synthetic --no-png --models Qwen3-235B-A22B --gpus H100 --tp 1 --batch 64", 1,
                "nothing fits");
    expect_fail("--synthetic --no-png --models Qwen3-4B --tp 3", 1, "--tp 3");
    expect_fail("--synthetic --no-png --policies sfi,h2o-ish", 1, "unknown policy 'h2o-ish'");
    expect_fail("--synthetic --no-png --budget 0", 2, "budget '0'");
    expect_fail("--synthetic --no-png --budget 150%", 2, "budget '150%'");
    expect_fail("--synthetic --no-png --format xml", 2, "--format");
    expect_fail("--synthetic --no-png --contexts 8Q", 2, "--contexts");
    expect_fail("--synthetic --no-png --bogus", 2, "--bogus");
    expect_fail("--trace /nonexistent/x.db --no-png", 1, "/nonexistent/x.db");
    expect_fail("--synthetic --no-png --profile /nonexistent/p.json", 1, "/nonexistent/p.json");
    expect_fail("--synthetic --no-png --param K=-3", 1, "K");
    /* A file that is not a trace, and a trace without decode steps. */
    char path[4200], args[9000];
    snprintf(path, sizeof path, "%s/junk.db", tmp);
    ck_assert_int_eq(sfi_test_write_file(path, "not sqlite at all", 17), 0);
    snprintf(args, sizeof args, "--trace '%s' --no-png", path);
    expect_fail(args, 1, "junk.db");
    snprintf(path, sizeof path, "%s/empty.db", tmp);
    make_trace(path, 0);
    snprintf(args, sizeof args, "--trace '%s' --tokenizer '%s' --no-png", path, tokdir);
    expect_fail(args, 1, "no decode steps");
    /* A GPU file with a bad value. */
    snprintf(path, sizeof path, "%s/gpu.json", tmp);
    const char *g = "{\"sfi_gpu\":1,\"name\":\"G\",\"hbm_capacity_GB\":80,\"hbm_bandwidth_TBps\":0,"
                    "\"bf16_dense_TFLOPS\":1,\"fp8_dense_TFLOPS\":1,\"sm_count\":1,\"l2_MB\":1,"
                    "\"nvlink_GBps\":1}";
    ck_assert_int_eq(sfi_test_write_file(path, g, strlen(g)), 0);
    snprintf(args, sizeof args, "--synthetic --no-png --gpus '%s'", path);
    expect_fail(args, 1, "hbm_bandwidth_TBps");
    /* Nothing half-written: an unwritable PNG path fails cleanly. */
    expect_fail("--synthetic --models Qwen3-4B --contexts 32K --png /nonexistent/dir/x.png", 1,
                "/nonexistent/dir/x.png");
}
END_TEST

START_TEST(presets_and_validate)
{
    char *out, *err;
    ck_assert_int_eq(run("presets", &out, &err), 0);
    ck_assert_ptr_nonnull(strstr(out, "B200"));
    ck_assert_ptr_nonnull(strstr(out, "H100-SXM"));
    ck_assert_ptr_nonnull(strstr(out, "Qwen3-235B-A22B"));
    ck_assert_ptr_nonnull(strstr(out, "kascade"));
    /* Units said, and decimal: Qwen3-8B's KV is 147456 bytes per token. */
    ck_assert_ptr_nonnull(strstr(out, "GB = 1e9 bytes"));
    ck_assert_ptr_nonnull(strstr(out, "KV_kB/token"));
    ck_assert_ptr_nonnull(strstr(out, "147.5"));
    free(out);
    free(err);
    char path[4200], args[9000];
    snprintf(path, sizeof path, "%s/prof.json", tmp);
    const char *p = "{\"sfi_profile\":1,\"name\":\"t\",\"gpu\":\"H100-SXM\","
                    "\"efficiency\":{\"attn_dense\":0.5},\"launch_us\":1,\"measurements\":["
                    "{\"kernel\":\"attn_dense_nologits\",\"batch\":16,\"context\":32768,\"q_heads\":32,"
                    "\"kv_heads\":8,\"head_dim\":128,\"time_us\":850}]}";
    ck_assert_int_eq(sfi_test_write_file(path, p, strlen(p)), 0);
    snprintf(args, sizeof args, "validate --profile '%s'", path);
    ck_assert_int_eq(run(args, &out, &err), 0);
    /* The profile's column: 16 x 32768 x 4096 B = 2 GiB at 3.35 TB/s / 0.5
     * + 1 us = 1283.1 us. */
    ck_assert_msg(strstr(out, "attn_dense_nologits") && strstr(out, "1283.1"), "%s", out);
    /* It says which calibration to trust: the default errs less here. */
    ck_assert_msg(strstr(out, "# verdict: trust the built-in default for this GPU") != NULL, "%s", out);
    free(out);
    free(err);
    expect_fail("validate --profile /nonexistent/p.json", 1, "/nonexistent/p.json");
    /* --fit-params: an unknown key, an empty item */
    snprintf(args, sizeof args,
             "validate --profile '%s' --fit-subset tp=1 --fit-params gemm,bogus", path);
    expect_fail(args, 2, "unknown parameter 'bogus'");
    snprintf(args, sizeof args,
             "validate --profile '%s' --fit-subset tp=1 --fit-params gemm,,launch_us", path);
    expect_fail(args, 2, "empty item in 'gemm,,launch_us'");
    /* --fit recovers efficiency 0.5 and 10 us fixed from two sparse sizes
     * made with them: t = 16 P 4096 B / 3.35 TB/s / 0.5 + 2.2 + 10 us. */
    char mp[4200], fp[4200];
    snprintf(mp, sizeof mp, "%s/m.json", tmp);
    snprintf(fp, sizeof fp, "%s/fit.json", tmp);
    char body[1024];
    double t1 = 16.0 * 1000 * 4096 / 3.35e12 / 0.5 * 1e6 + 12.2,
           t2 = 16.0 * 4000 * 4096 / 3.35e12 / 0.5 * 1e6 + 12.2;
    snprintf(body, sizeof body,
             "{\"sfi_profile\":1,\"measurements\":["
             "{\"kernel\":\"attn_sparse\",\"batch\":16,\"context\":1000,\"K\":700,\"time_us\":%.6f},"
             "{\"kernel\":\"attn_sparse\",\"batch\":16,\"context\":4000,\"K\":3700,\"time_us\":%.6f}]}",
             t1, t2);
    ck_assert_int_eq(sfi_test_write_file(mp, body, strlen(body)), 0);
    snprintf(args, sizeof args, "validate --profile '%s' --fit '%s'", mp, fp);
    ck_assert_int_eq(run(args, &out, &err), 0);
    ck_assert_msg(strstr(out, "attn_sparse  efficiency 0.500, fixed 10.0 us"), "%s", out);
    free(out);
    free(err);
    snprintf(args, sizeof args, "validate --profile '%s'", fp);
    ck_assert_int_eq(run(args, &out, &err), 0);
    ck_assert_msg(strstr(out, "profile 2 (max |err| 0.0%)"), "%s", out);
    ck_assert_msg(strstr(out, "# verdict: trust the profile ") != NULL, "%s", out);
    free(out);
    free(err);
    ck_assert_int_eq(run("validate --help", &out, &err), 0);
    ck_assert_ptr_nonnull(strstr(out, "--profile"));
    free(out);
    free(err);
}
END_TEST

/* Field `col` (0-based) of the CSV line of `out` whose fields 3 (context)
 * and 5 (policy) are `ctx` and `policy`; copied into buf ("" when absent).
 * Returns 1 when the line was found. */
static int csv_get(const char *out, int ctx, const char *policy, int col, char *buf, size_t cap)
{
    for (const char *line = out; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char f[24][128];
        int nf = 0, q = 0;
        size_t k = 0;
        for (size_t i = 0; i <= len && nf < 24; i++) {
            char c = i < len ? line[i] : ',';
            if (c == '"') {
                q = !q;
                continue;
            }
            if (c == ',' && !q) {
                f[nf][k < 127 ? k : 127] = 0;
                nf++;
                k = 0;
                continue;
            }
            if (k < 127)
                f[nf][k++] = c;
        }
        if (nf > col && nf > 5 && atoi(f[3]) == ctx && !strcmp(f[5], policy)) {
            snprintf(buf, cap, "%s", f[col]);
            return 1;
        }
        line = end ? end + 1 : NULL;
    }
    buf[0] = 0;
    return 0;
}

static double csv_num(const char *out, int ctx, const char *policy, int col)
{
    char b[128];
    ck_assert_msg(csv_get(out, ctx, policy, col, b, sizeof b), "no row %d %s in:\n%s", ctx, policy, out);
    ck_assert_msg(b[0], "row %d %s: column %d empty", ctx, policy, col);
    return atof(b);
}

/* Columns of the CSV output. */
enum { C_TP = 2, C_FITS = 6, C_TOKS = 7, C_SPEEDUP = 8, C_SLOW = 12, C_KV = 14, C_MAXB = 15,
       C_TOKS_GPU = 17, C_WTS = 18, C_HBM = 19, C_USABLE = 20 };

START_TEST(tp_auto_per_context)
{
    /* The answer at 32K must not depend on whether 128K is in the sweep:
     * --tp auto picks the degree per context. */
    char *out, *err, *out1, *err1;
    int rc = run("sweep --synthetic --no-png --models Qwen3-8B --gpus H200 --contexts 32K,128K "
                 "--batch 16 --policies full,sfi --format csv",
                 &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    rc = run("sweep --synthetic --no-png --models Qwen3-8B --gpus H200 --contexts 32K --batch 16 "
             "--policies full,sfi --format csv",
             &out1, &err1);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err1);
    ck_assert(csv_num(out, 32768, "full", C_TP) == 1);
    ck_assert(csv_num(out, 131072, "full", C_TP) > 1);
    ck_assert(csv_num(out, 32768, "full", C_TOKS) == csv_num(out1, 32768, "full", C_TOKS));
    ck_assert(csv_num(out, 32768, "sfi", C_TOKS) == csv_num(out1, 32768, "sfi", C_TOKS));
    /* Per GPU: tokens/s divided by the GPUs; memory per GPU adds up. */
    double tp = csv_num(out, 131072, "sfi", C_TP);
    ck_assert(fabs(csv_num(out, 131072, "sfi", C_TOKS_GPU) * tp - csv_num(out, 131072, "sfi", C_TOKS)) <
              1e-3 * csv_num(out, 131072, "sfi", C_TOKS));
    double hbm = csv_num(out, 131072, "sfi", C_HBM), w = csv_num(out, 131072, "sfi", C_WTS),
           kv = csv_num(out, 131072, "sfi", C_KV);
    ck_assert(fabs(hbm - (w + 16 * kv)) < 1e-6 * hbm);
    ck_assert(hbm <= csv_num(out, 131072, "sfi", C_USABLE));
    /* Qwen3-8B is trained to 40960 positions: 128K is warned about. */
    ck_assert_msg(strstr(err, "max_position_embeddings (40960)") && strstr(err, "128K"), "%s", err);
    ck_assert_ptr_null(strstr(err1, "max_position_embeddings"));
    free(out);
    free(err);
    free(out1);
    free(err1);
    /* The table names the GPU count and the per-GPU throughput. */
    rc = run("sweep --synthetic --no-png --models Qwen3-8B --gpus H200 --contexts 32K,128K "
             "--batch 16 --policies full,sfi",
             &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    ck_assert_ptr_nonnull(strstr(out, " GPUs "));
    ck_assert_ptr_nonnull(strstr(out, "tok/s/GPU"));
    ck_assert_ptr_nonnull(strstr(out, "--tp auto: per context"));
    ck_assert_ptr_nonnull(strstr(out, "GB = 1e9 bytes"));
    free(out);
    free(err);
}
END_TEST

START_TEST(no_baseline_and_no_room)
{
    char *out, *err;
    /* On one H100, 16 requests at 32K: full KV does not fit, StreamingLLM
     * does; its speedup has no baseline: "-" in the table, empty in CSV,
     * null in JSON, never nan. */
    const char *base = "sweep --synthetic --no-png --models Qwen3-8B --gpus H100 --tp 1 --contexts 32K "
                       "--batch 16 --policies full,streaming";
    int rc = run(base, &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    ck_assert_ptr_null(strstr(out, "nan"));
    ck_assert_ptr_nonnull(strstr(out, "# speedup -: full KV does not fit"));
    free(out);
    free(err);
    char args[1024];
    snprintf(args, sizeof args, "%s --format csv", base);
    ck_assert_int_eq(run(args, &out, &err), 0);
    char b[128];
    ck_assert(csv_get(out, 32768, "streaming", C_SPEEDUP, b, sizeof b));
    ck_assert_str_eq(b, "");
    ck_assert(csv_num(out, 32768, "streaming", C_FITS) == 1);
    ck_assert(csv_num(out, 32768, "full", C_FITS) == 0);
    ck_assert_ptr_null(strstr(out, "nan"));
    free(out);
    free(err);
    snprintf(args, sizeof args, "%s --format json", base);
    ck_assert_int_eq(run(args, &out, &err), 0);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    ck_assert_msg(j != NULL, "%s", je.text);
    json_t *r = json_array_get(json_object_get(j, "rows"), 1);
    ck_assert_str_eq(json_string_value(json_object_get(r, "policy")), "streaming");
    ck_assert(json_is_null(json_object_get(r, "speedup")));
    json_decref(j);
    free(out);
    free(err);
    /* max_batch 0 is explained: the weights alone exceed one H100. */
    rc = run("sweep --synthetic --no-png --models Qwen3-235B-A22B --gpus H100 --tp 1 --contexts 32K "
             "--batch 1 --policies full",
             &out, &err);
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strstr(out, "# max_batch 0 with wts_GB above the usable HBM") != NULL, "%s", out);
    free(out);
    free(err);
}
END_TEST

START_TEST(per_policy_parameters)
{
    char *out, *err;
    /* Several T_max and K values in one sweep. */
    int rc = run("sweep --synthetic --no-png --models Qwen3-4B --gpus H100 --tp 1 --contexts 32K "
                 "--batch 4 --policies sfi,sfi:T_max=16,sfi:K=1024,n_recent=128,tmax:T_max=8 "
                 "--format csv",
                 &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    double s0 = csv_num(out, 32768, "sfi", C_SLOW), s16 = csv_num(out, 32768, "sfi:T_max=16", C_SLOW);
    ck_assert_msg(s16 > s0, "T_max=16 slow %g vs %g", s16, s0);
    ck_assert(csv_num(out, 32768, "tmax:T_max=8", C_SLOW) > 0.12);
    /* A smaller K and recent window: less KV state per request, more
     * tokens/s. */
    ck_assert(csv_num(out, 32768, "sfi:K=1024,n_recent=128", C_KV) < csv_num(out, 32768, "sfi", C_KV));
    ck_assert(csv_num(out, 32768, "sfi:K=1024,n_recent=128", C_TOKS) > csv_num(out, 32768, "sfi", C_TOKS));
    free(out);
    free(err);
    expect_fail("--synthetic --no-png --policies sfi:alpha=0.3", 1, "does not change what a step costs");
    expect_fail("--synthetic --no-png --policies quest:T_max=8", 1, "T_max applies to sfi and tmax only");
    expect_fail("--synthetic --no-png --policies sfi:T_max=0", 1, "T_max");
    expect_fail("--synthetic --no-png --policies sfi:bogus=1", 1, "bogus");
}
END_TEST

/* Height of a PNG (its IHDR), or -1. */
static int png_height(const char *path)
{
    size_t n;
    unsigned char *d = (unsigned char *)sfi_test_read_file(path, &n);
    int h = d && n > 24 ? (d[20] << 24) | (d[21] << 16) | (d[22] << 8) | d[23] : -1;
    free(d);
    return h;
}

START_TEST(figure_layouts)
{
    char *out, *err, path[4200];
    /* One context: bars, one row per policy (70 + 30 per policy pixels);
     * several contexts: lines (400 pixels per row of panels). */
    int rc = run("sweep --synthetic --models Qwen3-8B --gpus H100 --tp 1 --contexts 32K --batch 8 "
                 "--policies full,sfi,streaming --png one.png",
                 &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    snprintf(path, sizeof path, "%s/one.png", tmp);
    ck_assert(sfi_test_is_png(path));
    ck_assert_int_eq(png_height(path), 70 + 30 * 3);
    free(out);
    free(err);
    /* Two models, one of which fits nowhere: its panels say so; the
     * figure is still written. */
    rc = run("sweep --synthetic --models Qwen3-8B,Qwen3-235B-A22B --gpus H100 --tp 1 "
             "--contexts 8K,32K --batch 8 --policies full,sfi --png two.png",
             &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    snprintf(path, sizeof path, "%s/two.png", tmp);
    ck_assert(sfi_test_is_png(path));
    ck_assert_int_eq(png_height(path), 2 * 400);
    free(out);
    free(err);
}
END_TEST

START_TEST(short_stream_is_noted)
{
    char *out, *err;
    /* 32 requests x 4096 steps read more than the synthetic stream's 65536
     * tokens: a note says they are replayed again. */
    int rc = run("sweep --synthetic --no-png --models Qwen3-0.6B --contexts 8K --batch 32 --steps 4096 "
                 "--policies sfi",
                 &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    ck_assert_msg(strstr(err, "tokens are replayed about 2.0 times") != NULL, "%s", err);
    free(out);
    free(err);
    rc = run("sweep --synthetic --no-png --models Qwen3-0.6B --contexts 8K --batch 8 --policies sfi", &out,
             &err);
    ck_assert_int_eq(rc, 0);
    ck_assert_ptr_null(strstr(err, "replayed"));
    free(out);
    free(err);
}
END_TEST

/* fp8 KV halves a request's cache and full KV's KV reads. */
START_TEST(kv_dtype_fp8)
{
    char *out, *err;
    double kv[2], hbm[2];
    for (int k = 0; k < 2; k++) {
        int rc = run(k ? "sweep --synthetic --no-png --models Qwen3-4B --gpus B200 --tp 1 --contexts 64K "
                         "--batch 4 --policies full --format json --kv-dtype fp8"
                       : "sweep --synthetic --no-png --models Qwen3-4B --gpus B200 --tp 1 --contexts 64K "
                         "--batch 4 --policies full --format json",
                     &out, &err);
        ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
        json_t *j = json_loads(out, 0, NULL);
        ck_assert_ptr_nonnull(j);
        ck_assert_str_eq(json_string_value(json_object_get(j, "kv_dtype")), k ? "fp8" : "bf16");
        json_t *r = json_array_get(json_object_get(j, "rows"), 0);
        kv[k] = json_real_value(json_object_get(r, "kv_bytes_per_request"));
        hbm[k] = json_real_value(json_object_get(r, "hbm_bytes_per_token"));
        json_decref(j);
        free(out);
        free(err);
    }
    ck_assert(kv[1] == kv[0] / 2);
    ck_assert(hbm[1] < hbm[0] * 0.6 && hbm[1] > hbm[0] * 0.5);
    ck_assert_int_eq(run("sweep --kv-dtype int4", &out, &err), 2);
    ck_assert_ptr_nonnull(strstr(err, "--kv-dtype: 'int4' is not bf16 or fp8"));
    free(out);
    free(err);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sweep");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, csv_rows_and_speedups);
    tcase_add_test(tc, json_and_output_file);
    tcase_add_test(tc, default_run_writes_table_and_png);
    tcase_add_test(tc, default_run_finds_bundled_traces);
    tcase_add_test(tc, trace_drives_the_trigger_stream);
    tcase_add_test(tc, incomplete_trace_is_noted);
    tcase_add_test(tc, bad_input);
    tcase_add_test(tc, presets_and_validate);
    tcase_add_test(tc, tp_auto_per_context);
    tcase_add_test(tc, no_baseline_and_no_room);
    tcase_add_test(tc, per_policy_parameters);
    tcase_add_test(tc, short_stream_is_noted);
    tcase_add_test(tc, figure_layouts);
    tcase_add_test(tc, kv_dtype_fp8);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
