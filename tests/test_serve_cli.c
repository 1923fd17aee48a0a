/* sfi-sim serve through the built program: outputs (table, CSV, JSON,
 * per-request CSV, figures), the fitted engine profile against the SFI
 * paper's Qwen3-4B numbers, and bad input. */
#include <config.h>

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sfi_test_util.h"

static char sim[4096], gpu192[4096];
static char *tmp;

static void setup(void)
{
    snprintf(sim, sizeof sim, "%s", sfi_test_build("sfi-sim"));
    snprintf(gpu192, sizeof gpu192, "%s", sfi_test_src("sim/profiles/b200-192g.json"));
    tmp = sfi_test_tmpdir();
    ck_assert_ptr_nonnull(tmp);
}

static void teardown(void)
{
    sfi_test_rmtree(tmp);
    free(tmp);
}

static int run(const char *args, char **out, char **err)
{
    return sfi_test_run_in(tmp, sim, args, out, err);
}

static int is_png(const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    return sfi_test_is_png(path);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

START_TEST(table_csv_and_requests)
{
    char *out, *err;
    int rc = run("serve --synthetic --prompt 4K,16K --requests 8 --gen 64", &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    /* Header, units line, column line, 2 prompts x 2 policies. */
    ck_assert_int_eq(count_lines(out), 3 + 4);
    ck_assert_ptr_nonnull(strstr(out, "Qwen3-4B on B200, TP 1, engine default; 8 requests"));
    ck_assert_ptr_nonnull(strstr(out, "SYNTHETIC"));
    ck_assert_ptr_nonnull(strstr(out, "\n16K "));
    free(out);
    free(err);
    /* Per-policy SFI parameters: a larger K reads more per fast step. */
    rc = run("serve --synthetic --prompt 32K --requests 4 --gen 64 --policies sfi:K=512,sfi:K=8192 "
             "--format json",
             &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    json_t *j = json_loads(out, 0, NULL);
    ck_assert_ptr_nonnull(j);
    json_t *runs = json_object_get(j, "runs");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(runs, 1), "policy")),
                     "sfi:K=8192");
    ck_assert(json_real_value(json_object_get(json_array_get(runs, 0), "tpot_mean_ms")) <
              json_real_value(json_object_get(json_array_get(runs, 1), "tpot_mean_ms")));
    json_decref(j);
    free(out);
    free(err);
    rc = run("serve --synthetic --prompt 4K --requests 8 --gen 64 --format csv "
             "--requests-csv req.csv --slo-tpot 5 -o runs.csv",
             &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    ck_assert_str_eq(out, "");
    char path[4200];
    snprintf(path, sizeof path, "%s/runs.csv", tmp);
    size_t n;
    char *csv = sfi_test_read_file(path, &n);
    ck_assert_ptr_nonnull(csv);
    ck_assert_int_eq(count_lines(csv), 3);
    ck_assert_ptr_nonnull(strstr(csv, "model,gpu,tp,engine,requests,prompt,mean_prompt,gen,policy,"
                                      "tokens_per_s,speedup,"));
    /* Full KV's speedup over itself is 1; SFI is faster at 4K x 8. */
    double ft, fs, st, ss;
    char *fl = strstr(csv, ",full,"), *sl = strstr(csv, ",sfi,");
    ck_assert(fl && sl);
    ck_assert_int_eq(sscanf(fl, ",full,%lf,%lf", &ft, &fs), 2);
    ck_assert_int_eq(sscanf(sl, ",sfi,%lf,%lf", &st, &ss), 2);
    ck_assert(fs == 1 && st > ft && ss > 1);
    free(csv);
    snprintf(path, sizeof path, "%s/req.csv", tmp);
    csv = sfi_test_read_file(path, &n);
    ck_assert_ptr_nonnull(csv);
    /* One line per request of each of the two runs. */
    ck_assert_int_eq(count_lines(csv), 1 + 2 * 8);
    ck_assert_ptr_nonnull(strstr(csv, "4K,sfi,7,4096,64,0,"));
    free(csv);
    free(out);
    free(err);
}
END_TEST

START_TEST(json_and_figures)
{
    char *out, *err;
    int rc = run("serve --synthetic --model Qwen3-0.6B --gpu H100 --prompt 2K,8K,32K --requests 24 "
                 "--gen 128 --rate 50 --policies full,sfi,streaming --format json --png s.png "
                 "--timeline-png tl.png --kv-dtype fp8",
                 &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    ck_assert_msg(j != NULL, "%s", je.text);
    ck_assert_str_eq(json_string_value(json_object_get(j, "kv_dtype")), "fp8");
    ck_assert_str_eq(json_string_value(json_object_get(j, "arrivals")), "Poisson 50 req/s");
    json_t *runs = json_object_get(j, "runs");
    ck_assert_uint_eq(json_array_size(runs), 9);
    for (size_t i = 0; i < 9; i++) {
        json_t *r = json_array_get(runs, i);
        ck_assert_int_eq(json_integer_value(json_object_get(r, "tokens")), 24 * 128);
        double ttft = json_real_value(json_object_get(r, "ttft_p99_s"));
        double e2e = json_real_value(json_object_get(r, "e2e_p99_s"));
        ck_assert(ttft > 0 && ttft <= e2e);
        ck_assert(json_real_value(json_object_get(r, "peak_kv_bytes")) <=
                  json_real_value(json_object_get(r, "kv_budget_bytes")));
    }
    ck_assert(is_png("s.png"));
    ck_assert(is_png("tl.png"));
    json_decref(j);
    free(out);
    free(err);
}
END_TEST

/* The engine profile fitted to the SFI paper's Figure 4 reproduces the
 * three numbers it was fitted to and predicts the fourth within 10%. */
START_TEST(paper_figure4_qwen3_4b)
{
    char *out, *err, args[8192];
    snprintf(args, sizeof args,
             "serve --engine vllm-triton-b200 --gpu '%s' --model Qwen3-4B-Instruct-2507 "
             "--gpu-mem-util 0.8 --requests 16 --gen 2048 --shared-prefix all "
             "--max-batched-tokens 16384 --max-num-seqs 1024 --prompt 8K,128K --format csv",
             gpu192);
    int rc = run(args, &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    const char *want[][3] = {{"8K", "full", "759"},
                             {"8K", "sfi", "1449.7"},
                             {"128K", "full", "65"},
                             {"128K", "sfi", "935"}};
    for (int i = 0; i < 4; i++) {
        char key[64];
        snprintf(key, sizeof key, ",%s,", want[i][0]);
        char *p = strstr(out, key);
        ck_assert_ptr_nonnull(p);
        snprintf(key, sizeof key, ",%s,", want[i][1]);
        p = strstr(p, key);
        ck_assert_ptr_nonnull(p);
        double tok;
        ck_assert_int_eq(sscanf(p + strlen(key), "%lf", &tok), 1);
        double w = atof(want[i][2]), tol = i == 3 ? 0.10 : 0.01;
        ck_assert_msg(fabs(tok / w - 1) <= tol, "%s %s: %.1f tok/s, paper %.1f", want[i][0],
                      want[i][1], tok, w);
    }
    free(out);
    free(err);
}
END_TEST

START_TEST(auto_tp_and_queueing_note)
{
    char *out, *err;
    /* Qwen3-235B-A22B needs several B200 for its weights: auto picks 4. */
    int rc = run("serve --synthetic --model Qwen3-235B-A22B --prompt 8K --requests 4 --gen 16",
                 &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    ck_assert_ptr_nonnull(strstr(out, "on B200, TP 4,"));
    free(out);
    free(err);
    /* 32 requests of 16K on an H100: 26 fit with full KV, SFI's compact
     * segments and Selector scratch leave room for 23, and stderr says so. */
    rc = run("serve --synthetic --gpu H100 --prompt 16K --requests 32 --gen 512", &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    ck_assert_ptr_nonnull(strstr(err, "sfi runs at most 23 requests at once, full KV 26"));
    free(out);
    free(err);
}
END_TEST

START_TEST(bad_input)
{
    const char *cases[][3] = {
        {"serve --prompt 8Q", "2", "--prompt: '8Q' is not a length"},
        {"serve --prompt uniform:9:2", "2", "uniform:LO:HI"},
        {"serve --gen 0", "2", "--gen"},
        {"serve --gpu-mem-util 1.5", "2", "--gpu-mem-util: '1.5' is not in (0, 1]"},
        {"serve --rate -1", "2", "--rate"},
        {"serve --max-batched-tokens 100", "2", "below --max-num-seqs"},
        {"serve --kv-dtype int4", "2", "--kv-dtype: 'int4' is not bf16 or fp8"},
        {"serve --requests 0", "2", "--requests"},
        {"serve --format xml", "2", "--format"},
        {"serve --bogus", "2", "unknown or incomplete option"},
        {"serve extra", "2", "unexpected argument"},
        {"serve --engine nosuch", "1", "no such profile"},
        {"serve --engine ../x/y.json", "1", "y.json"},
        {"serve --policies sfi,nosuch", "1", "unknown policy 'nosuch'"},
        {"serve --model nosuch", "1", "--model"},
        {"serve --prompt 4M --tp 1", "1", "request 0: 4194304 prompt + 2048 new tokens need"},
        {"serve --prompt trace --synthetic", "1", "'trace' lengths need a trace"},
        {"serve --slo-tpot x", "2", "--slo-tpot"},
        {"serve -o /", "1", "/"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out, *err, args[512];
        snprintf(args, sizeof args, "%s --synthetic --requests-csv r.csv", cases[i][0]);
        if (!strcmp(cases[i][0], "serve --requests 0") || !strcmp(cases[i][0], "serve extra"))
            snprintf(args, sizeof args, "%s", cases[i][0]);
        int rc = run(args, &out, &err);
        ck_assert_msg(rc == atoi(cases[i][1]), "%s: rc %d: %s", cases[i][0], rc, err);
        ck_assert_msg(strstr(err, cases[i][2]), "%s: %s", cases[i][0], err);
        /* No half-written output. */
        char path[4200];
        snprintf(path, sizeof path, "%s/r.csv", tmp);
        ck_assert_msg(access(path, F_OK) != 0, "%s left r.csv", cases[i][0]);
        free(out);
        free(err);
    }
}
END_TEST

START_TEST(trace_lengths)
{
    /* The bundled traces' own prompt and output lengths. */
    char *out, *err;
    int rc = run("serve --prompt trace --gen trace --requests 6 --format json", &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    json_t *j = json_loads(out, 0, NULL);
    ck_assert_ptr_nonnull(j);
    json_t *r = json_array_get(json_object_get(j, "runs"), 0);
    ck_assert(json_integer_value(json_object_get(r, "tokens")) > 6);
    json_decref(j);
    free(out);
    free(err);
}
END_TEST

/* Every option --help names is in the man page, and the other way round. */
START_TEST(help_matches_man_page)
{
    char *out, *err;
    ck_assert_int_eq(run("serve --help", &out, &err), 0);
    char *man = sfi_test_read_file(sfi_test_src("man/sfi-sim-serve.1"), NULL);
    ck_assert_ptr_nonnull(man);
    /* roff writes '-' as "\-"; drop the backslashes to compare. */
    char *w = man;
    for (char *r = man; *r; r++)
        if (!(r[0] == '\\' && r[1] == '-'))
            *w++ = *r;
    *w = '\0';
    int n = 0;
    for (const char *p = strstr(out, "--"); p; p = strstr(p + 2, "--")) {
        char opt[64];
        size_t len = strspn(p, "-abcdefghijklmnopqrstuvwxyz");
        if (len < 4 || len >= sizeof opt)
            continue;
        memcpy(opt, p, len);
        opt[len] = 0;
        ck_assert_msg(strstr(man, opt) != NULL, "man page lacks %s", opt);
        n++;
    }
    ck_assert_int_ge(n, 30);
    static const char *in_man[] = {"--shared-prefix", "--no-chunked-prefill", "--requests-csv",
                                   "--timeline-png",  "--slo-ttft",           "--kv-dtype",
                                   "--profile"};
    for (size_t i = 0; i < sizeof in_man / sizeof in_man[0]; i++)
        ck_assert_msg(strstr(out, in_man[i]) != NULL, "--help lacks %s", in_man[i]);
    ck_assert_ptr_nonnull(strstr(out, "sfi-sim-serve(1)"));
    free(man);
    free(out);
    free(err);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("serve_cli");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, table_csv_and_requests);
    tcase_add_test(tc, json_and_figures);
    tcase_add_test(tc, paper_figure4_qwen3_4b);
    tcase_add_test(tc, auto_tp_and_queueing_note);
    tcase_add_test(tc, bad_input);
    tcase_add_test(tc, trace_lengths);
    tcase_add_test(tc, help_matches_man_page);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
