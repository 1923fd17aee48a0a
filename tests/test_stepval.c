/* sim/sfi_stepval: whole decode step measurements, their prediction, the
 * fit on a declared subset, and sfi-sim validate's step-level report. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_cost.h"
#include "sfi_hw.h"
#include "sfi_stepval.h"
#include "sfi_test_util.h"

/* The synthetic matrix: three model shapes, two batches, two contexts,
 * both modes; SFI steps with 0, 1 or 3 slow requests. */
static const char *const models[] = {"Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B"};
static const int batches[] = {1, 16}, contexts[] = {8192, 16384};
#define N_SYN (3 * 2 * 2 * 2)

static void truth_profile(sfi_hw_profile *p)
{
    sfi_hw_profile_default(p);
    sfi_sv_param_set(p, SFI_SV_P_ATTN_DENSE, 0.80);
    sfi_sv_param_set(p, SFI_SV_P_ATTN_SPARSE, 0.70);
    sfi_sv_param_set(p, SFI_SV_P_GEMM, 0.65);
    sfi_sv_param_set(p, SFI_SV_P_LAUNCH, 4.0);
    sfi_sv_param_set(p, SFI_SV_P_CONTENTION, 0.5);
    /* binds at batch 1 (a few CTAs per attention launch), not at 16 */
    sfi_sv_param_set(p, SFI_SV_P_CTA, 40.0);
    /* the per-step cost stays the default's: tens of microseconds on steps
     * of milliseconds is below what 1% noise lets a fit see */
    p->fixed_s[SFI_KC_ATTN_DENSE] = p->fixed_s[SFI_KC_ATTN_SPARSE] = 0;
}

/* The synthetic measurements, their models and step mixes, on an H100. */
typedef struct {
    sfi_step_meas ms[N_SYN];
    sfi_model_config mcs[N_SYN];
    sfi_sv_mix mixes[N_SYN];
    sfi_gpu g;
} synth_set;

/* Measurements that the truth profile predicts exactly (one static set,
 * made anew at each call). */
static synth_set *synth(void)
{
    static synth_set S;
    sfi_step_meas *ms = S.ms;
    sfi_model_config *mcs = S.mcs;
    sfi_sv_mix *mixes = S.mixes;
    const sfi_gpu *g = &S.g;
    sfi_error e;
    ck_assert_int_eq(sfi_gpu_preset("H100-SXM", &S.g, &e), SFI_OK);
    sfi_hw_profile t;
    truth_profile(&t);
    size_t k = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 2; c++)
                for (int sfi = 0; sfi < 2; sfi++, k++) {
                    sfi_step_meas *m = &ms[k];
                    memset(m, 0, sizeof *m);
                    snprintf(m->model, sizeof m->model, "%s", models[a]);
                    m->batch = batches[b];
                    m->context = contexts[c];
                    m->new_tokens = 128;
                    m->sfi = sfi;
                    m->dtype_bytes = 2;
                    ck_assert_int_eq(sfi_sv_model(m, &mcs[k], &e), SFI_OK);
                    memset(&mixes[k], 0, sizeof mixes[k]);
                    mixes[k].batch = m->batch;
                    mixes[k].hist[0] = 70;
                    mixes[k].hist[1] = 40;
                    if (m->batch >= 3)
                        mixes[k].hist[3] = 15;
                    sfi_sv_pred p;
                    ck_assert_int_eq(sfi_sv_predict(m, &mcs[k], &t, g, &mixes[k], &p, &e), SFI_OK);
                    for (int cl = 0; cl < SFI_SV_NCLASS; cl++)
                        if (p.t[cl] > 0) {
                            m->cls[cl].have = 1;
                            m->cls[cl].mean_s = p.t[cl];
                        }
                    m->tps = p.tps;
                }
    return &S;
}

START_TEST(fit_recovers_known_parameters)
{
    synth_set *S = synth();
    sfi_error e;
    int in_fit[N_SYN];
    for (int i = 0; i < N_SYN; i++)
        in_fit[i] = 1;
    sfi_hw_profile p, t;
    sfi_hw_profile_default(&p);
    truth_profile(&t);
    sfi_sv_fit f;
    ck_assert_int_eq(sfi_sv_fit_run(S->ms, S->mcs, S->mixes, in_fit, N_SYN, &S->g, &p, &f, &e),
                     SFI_OK);
    for (int j = 0; j < SFI_SV_NPARAM; j++) {
        double want = sfi_sv_param_get(&t, j), got = sfi_sv_param_get(&p, j);
        /* no PDL launch cost of its own: launches under PDL cost launch_us */
        if (j == SFI_SV_P_LAUNCH_PDL && f.identified[j] && !(want > 0))
            want = sfi_sv_param_get(&t, SFI_SV_P_LAUNCH);
        /* held (their effect too small to see at 1% noise), or without
         * a value of its own (launches under PDL cost what others do; no
         * MoE shape, no G = 8 attention: the CTAs bound by bytes) */
        /* (one GPU: nothing tells a GEMM's fixed part from the launches,
         * and no all-reduces or all-gathers) */
        ck_assert_msg(f.identified[j] || j == SFI_SV_P_STEP || j == SFI_SV_P_LAUNCH_PDL ||
                          j == SFI_SV_P_CTA_FLOPS || j == SFI_SV_P_SERIAL ||
                          j == SFI_SV_P_AR_STEP || j == SFI_SV_P_SEL_PRE ||
                          j == SFI_SV_P_GEMM_FIXED,
                      "%s not identified", sfi_sv_param_name(j));
        if (!f.identified[j]) {
            ck_assert(got == want);
            continue;
        }
        ck_assert_msg(fabs(got / want - 1) < 0.01, "%s: fitted %g, truth %g (rms %g)",
                      sfi_sv_param_name(j), got, want, f.rms);
    }
    ck_assert(f.rms < 1e-4);
    /* The default profile is not the truth: without the fit it misses. */
    sfi_hw_profile d;
    sfi_hw_profile_default(&d);
    sfi_sv_pred pr;
    ck_assert_int_eq(sfi_sv_predict(&S->ms[0], &S->mcs[0], &d, &S->g, &S->mixes[0], &pr, &e),
                     SFI_OK);
    ck_assert(fabs(pr.t[SFI_SV_DENSE] / S->ms[0].cls[SFI_SV_DENSE].mean_s - 1) > 0.02);
}
END_TEST

START_TEST(one_model_cannot_separate_weights_from_launches)
{
    synth_set *S = synth();
    sfi_error e;
    int in_fit[N_SYN];
    for (int i = 0; i < N_SYN; i++) {
        int h = sfi_sv_subset_match("model=Qwen3-0.6B", &S->ms[i], &e);
        ck_assert_int_ge(h, 0);
        in_fit[i] = h;
    }
    sfi_hw_profile p, prior;
    sfi_hw_profile_default(&p);
    prior = p;
    sfi_sv_fit f;
    ck_assert_int_eq(sfi_sv_fit_run(S->ms, S->mcs, S->mixes, in_fit, N_SYN, &S->g, &p, &f, &e),
                     SFI_OK);
    /* every dense step of one model streams the same weights through the
     * same kernels: the GEMM efficiency, the launch cost and the per-step
     * cost cannot all be told apart; what is not is held at the prior */
    int held = !f.identified[SFI_SV_P_GEMM] + !f.identified[SFI_SV_P_LAUNCH] +
               !f.identified[SFI_SV_P_STEP];
    ck_assert_int_ge(held, 1);
    for (int j = 0; j < SFI_SV_NPARAM; j++)
        if (!f.identified[j])
            ck_assert(sfi_sv_param_get(&p, j) == sfi_sv_param_get(&prior, j));
    ck_assert(f.identified[SFI_SV_P_ATTN_DENSE]);
}
END_TEST

START_TEST(fit_subset_specs)
{
    sfi_step_meas m;
    memset(&m, 0, sizeof m);
    snprintf(m.model, sizeof m.model, "Qwen3-0.6B");
    m.batch = 16;
    m.context = 8192;
    m.sfi = 1;
    m.tp = 1;
    sfi_error e;
    struct {
        const char *spec;
        int want;
    } t[] = {
        {"model=Qwen3-0.6B", 1},
        {"model=qwen3-0.6b", 1},
        {"model=Qwen3-4B", 0},
        {"model=Qwen3-4B,Qwen3-0.6B", 1},
        {"model=Qwen3-0.6B:batch=16", 1},
        {"model=Qwen3-0.6B:batch=1,4", 0},
        {"context=8K:mode=sfi", 1},
        {"context=8192:mode=dense", 0},
        {"tp=1", 1},
        {"tp=2", 0},
        {"model=Qwen3-0.6B:tp=1,2", 1},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        ck_assert_msg(sfi_sv_subset_match(t[i].spec, &m, &e) == t[i].want, "%s", t[i].spec);
    const char *bad[][2] = {{"", "empty"},
                            {"model", "not KEY=VALUE"},
                            {"colour=red", "unknown key 'colour'"},
                            {"batch=x", "not a count"},
                            {"mode=fast", "sfi or dense"},
                            {"model=a,,b", "empty"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(sfi_sv_subset_match(bad[i][0], &m, &e), -1);
        ck_assert_msg(strstr(e.msg, bad[i][1]), "%s -> %s", bad[i][0], e.msg);
    }
}
END_TEST

START_TEST(malformed_step_measurements_are_named)
{
    const char *head = "{\"sfi_profile\":1,\"step_measurements\":[";
    const char *bad[][2] = {
        {"3]}", "step_measurements[0]: not an object"},
        {"{\"mode\":\"sfi\",\"context\":8192,\"batch\":16,\"decode_tokens_per_s\":1}]}", "model"},
        {"{\"model\":\"Qwen3-0.6B\",\"mode\":\"fast\",\"context\":8192,\"batch\":16,"
         "\"decode_tokens_per_s\":1}]}",
         "mode: needs"},
        {"{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\",\"context\":0,\"batch\":16,"
         "\"decode_tokens_per_s\":1}]}",
         "context"},
        {"{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\",\"context\":8192,\"batch\":16.5,"
         "\"decode_tokens_per_s\":1}]}",
         "batch"},
        {"{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\",\"context\":8192,\"batch\":16}]}",
         "decode_tokens_per_s"},
        {"{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\",\"context\":8192,\"batch\":16,"
         "\"decode_tokens_per_s\":1,\"steps\":{\"dense\":{\"mean_ms\":3}}}]}",
         "steps.dense: a sfi-mode run has no dense steps"},
        {"{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\",\"context\":8192,\"batch\":16,"
         "\"decode_tokens_per_s\":1,\"steps\":{\"slow\":{\"mean_ms\":-3}}}]}",
         "steps.slow.mean_ms"},
        {"{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\",\"context\":8192,\"batch\":16,"
         "\"decode_tokens_per_s\":1,\"steps\":{\"warm\":{\"mean_ms\":3}}}]}",
         "unknown class 'warm'"},
        {"{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\",\"context\":8192,\"batch\":16,"
         "\"decode_tokens_per_s\":1,\"dtype\":\"fp8\"}]}",
         "dtype"},
        {"{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\",\"context\":8192,\"batch\":16,"
         "\"decode_tokens_per_s\":1,\"tp\":0}]}",
         "tp: needs"},
        {"{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\",\"context\":8192,\"batch\":16,"
         "\"decode_tokens_per_s\":1,\"tp\":2,\"gather_bytes_per_step\":-8}]}",
         "gather_bytes_per_step: needs"},
        {"{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\",\"context\":8192,\"batch\":16,"
         "\"decode_tokens_per_s\":1,\"tp\":2,\"allreduce_bytes_per_step\":\"x\"}]}",
         "allreduce_bytes_per_step: needs"},
        {"{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\",\"context\":8192,\"batch\":16,"
         "\"decode_tokens_per_s\":1,\"attn_split_rows\":{\"fast\":832}}]}",
         "attn_split_rows: needs"},
        {"{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\",\"context\":8192,\"batch\":16,"
         "\"decode_tokens_per_s\":1,\"attn_split_rows\":{\"fast\":32,\"slow\":832}}]}",
         "attn_split_rows: needs"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json, "%s%s", head, bad[i][0]);
        sfi_step_meas *m = (sfi_step_meas *)1;
        size_t n = 7;
        sfi_error e;
        ck_assert_int_ne(sfi_step_meas_parse(json, strlen(json), "steps.json", &m, &n, &e), SFI_OK);
        ck_assert_msg(strstr(e.msg, "steps.json") && strstr(e.msg, bad[i][1]), "%s -> %s",
                      bad[i][0], e.msg);
        ck_assert_ptr_null(m);
        ck_assert_int_eq(n, 0);
    }
    /* A deferred-refresh run (class fast+sel) is read and listed as a
     * variant. */
    const char *ok = "{\"step_measurements\":[{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\","
                     "\"context\":8192,\"batch\":16,\"decode_tokens_per_s\":1,\"steps\":{"
                     "\"fast+sel\":{\"mean_ms\":3},\"fast\":{\"mean_ms\":3}}}]}";
    sfi_step_meas *okm = NULL;
    size_t okn = 0;
    sfi_error oke;
    ck_assert_int_eq(sfi_step_meas_parse(ok, strlen(ok), "ok.json", &okm, &okn, &oke), SFI_OK);
    ck_assert_int_eq(okn, 1);
    ck_assert(okm[0].variant && okm[0].deferred && okm[0].cls[SFI_SV_FAST].have);
    ck_assert_int_eq(okm[0].tp, 1); /* no "tp": one GPU */
    free(okm);
    /* The command names the file too and exits 1. */
    char *dir = sfi_test_tmpdir(), path[4096], cmd[8192];
    snprintf(path, sizeof path, "%s/bad.json", dir);
    char json[1024];
    snprintf(json, sizeof json, "%s%s", head, bad[3][0]);
    ck_assert_int_eq(sfi_test_write_file(path, json, strlen(json)), 0);
    snprintf(cmd, sizeof cmd, "'%s' validate --steps '%s'", sfi_test_build("sfi-sim"), path);
    char *err = NULL;
    ck_assert_int_eq(sfi_test_run(cmd, NULL, &err), 1);
    ck_assert_msg(strstr(err, "bad.json: step_measurements[0]: context"), "%s", err);
    free(err);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

/* A measurement's "tp" reaches the cost model: a dense Qwen3-4B step over
 * two GPUs reads half the weights and KV per GPU, plus two all-reduces per
 * layer: faster than on one, slower than half of it. */
START_TEST(tensor_parallel_measurements_are_priced_at_their_gpus)
{
    const char *js = "{\"step_measurements\":[{\"model\":\"Qwen3-4B\",\"mode\":\"dense\","
                     "\"context\":8192,\"batch\":16,\"decode_tokens_per_s\":1000,\"tp\":2}]}";
    sfi_step_meas *m = NULL;
    size_t n = 0;
    sfi_error e;
    ck_assert_int_eq(sfi_step_meas_parse(js, strlen(js), "tp.json", &m, &n, &e), SFI_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(m[0].tp, 2);
    sfi_gpu g;
    ck_assert_int_eq(sfi_gpu_preset("H100-SXM", &g, &e), SFI_OK);
    sfi_hw_profile p;
    truth_profile(&p);
    sfi_model_config mc;
    ck_assert_int_eq(sfi_sv_model(&m[0], &mc, &e), SFI_OK);
    sfi_sv_mix mix;
    memset(&mix, 0, sizeof mix);
    mix.batch = 16;
    sfi_sv_pred p2, p1;
    ck_assert_int_eq(sfi_sv_predict(&m[0], &mc, &p, &g, &mix, &p2, &e), SFI_OK);
    m[0].tp = 1;
    ck_assert_int_eq(sfi_sv_predict(&m[0], &mc, &p, &g, &mix, &p1, &e), SFI_OK);
    ck_assert_msg(p2.t[SFI_SV_DENSE] < p1.t[SFI_SV_DENSE] &&
                      p2.t[SFI_SV_DENSE] > 0.5 * p1.t[SFI_SV_DENSE],
                  "tp 2 %.4g s, tp 1 %.4g s", p2.t[SFI_SV_DENSE], p1.t[SFI_SV_DENSE]);
    free(m);
}
END_TEST

/* How sfi-gpu run --tp runs a step reaches the cost setup (since
 * 4cf4bb6): the Selector on the side stream around its scores' all-gather
 * on the main stream, gathered at the graph's capacity in steps with slow
 * requests only, the argmax gathered; and the model's count of
 * the bytes each GPU sends into collectives is the engine's own, for every
 * tensor-parallel run of gpu/profiles/h200-tp-steps.json and
 * h100-tp-steps.json. */
/* The tensor-parallel runs of a measurements file checked as above; how
 * many there were. */
static int tp_runs_checked(const char *file, const char *gpu)
{
    sfi_step_meas *m = NULL;
    size_t n = 0;
    sfi_error e;
    ck_assert_msg(sfi_step_meas_load(sfi_test_src(file), &m, &n, &e) == SFI_OK, "%s", e.msg);
    sfi_hw_profile p;
    sfi_hw_profile_default(&p);
    sfi_gpu g;
    ck_assert_int_eq(sfi_gpu_preset(gpu, &g, &e), SFI_OK);
    int n_tp = 0;
    for (size_t i = 0; i < n; i++) {
        sfi_model_config mc;
        ck_assert_int_eq(sfi_sv_model(&m[i], &mc, &e), SFI_OK);
        sfi_cost_setup s;
        sfi_sv_setup(&m[i], &mc, &p, &g, &s);
        ck_assert_int_eq(s.tp, m[i].tp);
        ck_assert_int_eq(s.side_serial, 0);
        ck_assert_int_eq(s.sel_split_gather, m[i].tp > 1);
        ck_assert_int_eq(s.argmax_gather, m[i].tp > 1);
        if (m[i].tp == 1) {
            ck_assert_int_eq(s.sel_gather_positions, 0);
            ck_assert(m[i].gather_bytes < 0 && m[i].allreduce_bytes < 0);
            continue;
        }
        /* context + new tokens - 1 - 4 sink - 256 recent, rounded up to 4 */
        ck_assert_int_eq(s.sel_gather_positions,
                         (m[i].context + m[i].new_tokens - 1 - 4 - 256 + 3) / 4 * 4);
        ck_assert(m[i].gather_bytes >= 0 && m[i].allreduce_bytes > 0);
        double ar, ga;
        sfi_sv_comm_bytes(&m[i], &mc, &ar, &ga);
        ck_assert_msg(ar == m[i].allreduce_bytes && ga == m[i].gather_bytes,
                      "[%zu] %s %s: model %.0f / %.0f, engine %.0f / %.0f", i, m[i].model,
                      m[i].sfi ? "sfi" : "dense", ar, ga, m[i].allreduce_bytes, m[i].gather_bytes);
        n_tp++;
    }
    free(m);
    return n_tp;
}

START_TEST(tensor_parallel_engine_setup)
{
    sfi_error e;
    sfi_hw_profile p;
    sfi_hw_profile_default(&p);
    sfi_gpu g;
    ck_assert_int_eq(sfi_gpu_preset("H200", &g, &e), SFI_OK);
    /* 4B and 30B-A3B at tp 2 and 4, 8K and 32K, dense and SFI (4 x H200),
     * and two runs without the Selector chain (argmax gather only) */
    ck_assert_int_eq(tp_runs_checked("gpu/profiles/h200-tp-steps.json", "H200"), 18);
    /* the same at tp 2 and 4 (2 and 4 x H100, 64 new tokens) */
    ck_assert_int_eq(tp_runs_checked("gpu/profiles/h100-tp-steps.json", "H100-SXM"), 14);
    /* one GPU with "overlap": false: the Selector on the main stream */
    const char *js = "{\"step_measurements\":[{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\","
                     "\"context\":8192,\"batch\":16,\"decode_tokens_per_s\":1,"
                     "\"overlap\":false}]}";
    sfi_step_meas *v = NULL;
    size_t nv = 0;
    ck_assert_int_eq(sfi_step_meas_parse(js, strlen(js), "v.json", &v, &nv, &e), SFI_OK);
    ck_assert(v[0].variant && v[0].no_overlap);
    sfi_model_config mc;
    ck_assert_int_eq(sfi_sv_model(&v[0], &mc, &e), SFI_OK);
    sfi_cost_setup s;
    sfi_sv_setup(&v[0], &mc, &p, &g, &s);
    ck_assert(s.side_serial && !s.sel_gather_positions && !s.argmax_gather);
    free(v);
    /* tp 2, a run with --bench-no-selector: a variant priced without the
     * Selector chain, its all-gathers the argmax's alone (what sfi-gpu
     * reported: 128 bytes at batch 16), its slow steps shorter */
    const char *jn = "{\"step_measurements\":[{\"model\":\"Qwen3-4B\",\"mode\":\"sfi\","
                     "\"context\":32768,\"batch\":16,\"tp\":2,\"decode_tokens_per_s\":1,"
                     "\"note\":\"run with --bench-no-selector\"}]}";
    ck_assert_int_eq(sfi_step_meas_parse(jn, strlen(jn), "n.json", &v, &nv, &e), SFI_OK);
    ck_assert(v[0].variant && v[0].no_selector && !strcmp(v[0].variant_why, "no Selector"));
    ck_assert_int_eq(sfi_sv_model(&v[0], &mc, &e), SFI_OK);
    sfi_sv_setup(&v[0], &mc, &p, &g, &s);
    ck_assert(s.no_selector && s.sel_split_gather);
    double ar, ga;
    sfi_cost_comm_bytes(&s, 16, &ar, &ga);
    ck_assert(ga == 128.0);
    sfi_step_cost with, without;
    ck_assert_int_eq(sfi_cost_step(&s, 1, &without, &e), SFI_OK);
    s.no_selector = 0;
    ck_assert_int_eq(sfi_cost_step(&s, 1, &with, &e), SFI_OK);
    ck_assert(without.side_s == 0 && with.side_s > 0 && without.time_s < with.time_s);
    free(v);
    /* the same note on a dense run: listed as that variant, priced as dense */
    const char *jd = "{\"step_measurements\":[{\"model\":\"Qwen3-4B\",\"mode\":\"dense\","
                     "\"context\":8192,\"batch\":16,\"decode_tokens_per_s\":1,"
                     "\"note\":\"run with --bench-no-selector\"}]}";
    ck_assert_int_eq(sfi_step_meas_parse(jd, strlen(jd), "d.json", &v, &nv, &e), SFI_OK);
    ck_assert(v[0].variant && !v[0].no_selector && !strcmp(v[0].variant_why, "no Selector"));
    free(v);
}
END_TEST

/* sfi-gpu's SFI-mode attention split (gpu/sfi_gpu_engine.c): when the
 * (request, KV head) pairs fill at most half the SMs, fast requests are cut
 * into pieces of 256+ rows that spread over the SMs, while slow requests
 * keep pieces of 2368 rows; at batch 16 (128 pairs on 132 SMs) every
 * request keeps the large pieces. With a per-CTA bandwidth that binds, the
 * predicted steps show each rule. */
START_TEST(small_batches_split_fast_requests_finer_than_slow_ones)
{
    const char *js = "{\"step_measurements\":[{\"model\":\"Qwen3-0.6B\",\"mode\":\"sfi\","
                     "\"context\":8192,\"batch\":1,\"decode_tokens_per_s\":500}]}";
    sfi_step_meas *m = NULL;
    size_t n = 0;
    sfi_error e;
    ck_assert_int_eq(sfi_step_meas_parse(js, strlen(js), "split.json", &m, &n, &e), SFI_OK);
    sfi_gpu g;
    ck_assert_int_eq(sfi_gpu_preset("H100-SXM", &g, &e), SFI_OK);
    sfi_hw_profile lim, free_;
    truth_profile(&lim);
    const double cta = 10e9;
    lim.cta_bandwidth = cta;
    free_ = lim;
    free_.cta_bandwidth = 0;
    sfi_model_config mc;
    ck_assert_int_eq(sfi_sv_model(&m[0], &mc, &e), SFI_OK);
    /* K/V of one row of one KV head (bf16, head_dim 128): 512 bytes; the
     * time one CTA per KV head would take over a fast request's 2308 rows */
    const double layers = mc.num_hidden_layers, row = 512, whole = layers * 2308 * row / cta;
    sfi_sv_mix mix;
    memset(&mix, 0, sizeof mix);
    mix.hist[0] = 10;
    mix.hist[1] = 1;
    for (int b = 1; b <= 16; b += 15) {
        m[0].batch = mix.batch = b;
        sfi_sv_pred pl, pf;
        ck_assert_int_eq(sfi_sv_predict(&m[0], &mc, &lim, &g, &mix, &pl, &e), SFI_OK);
        ck_assert_int_eq(sfi_sv_predict(&m[0], &mc, &free_, &g, &mix, &pf, &e), SFI_OK);
        double fast = pl.t[SFI_SV_FAST] - pf.t[SFI_SV_FAST];
        double slow = pl.t[SFI_SV_SLOW] - pf.t[SFI_SV_SLOW];
        if (b == 1) {
            /* fast: pieces of 256 rows at most; slow: its pieces of 2368 */
            ck_assert_msg(fast <= 1.01 * layers * 256 * row / cta, "batch 1 fast +%.4g s", fast);
            ck_assert_msg(slow > 0.5 * layers * 2368 * row / cta, "batch 1 slow +%.4g s", slow);
        } else {
            /* every request whole in one CTA per KV head */
            ck_assert_msg(fast > 0.3 * whole, "batch 16 fast +%.4g s (%.4g)", fast, whole);
        }
    }
    free(m);
}
END_TEST

/* An entry's attn_split_rows (what the engine reports since its slow
 * requests may be cut as finely as fast ones) set the pieces the model
 * prices; without it, the earlier rule: at tp 2, Qwen3-4B batch 16 (64
 * pairs on 132 SMs) fast pieces of 832 rows, slow ones of 2368. */
START_TEST(reported_split_rows_are_priced)
{
    const char *js =
        "{\"step_measurements\":[{\"model\":\"Qwen3-4B\",\"mode\":\"sfi\",\"tp\":2,"
        "\"context\":8192,\"batch\":16,\"new_tokens\":64,\"decode_tokens_per_s\":1},"
        "{\"model\":\"Qwen3-4B\",\"mode\":\"sfi\",\"tp\":2,\"context\":8192,\"batch\":16,"
        "\"new_tokens\":64,\"decode_tokens_per_s\":1,"
        "\"attn_split_rows\":{\"fast\":832,\"slow\":832}}]}";
    sfi_step_meas *m = NULL;
    size_t n = 0;
    sfi_error e;
    ck_assert_int_eq(sfi_step_meas_parse(js, strlen(js), "split.json", &m, &n, &e), SFI_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(m[0].split_fast, 0);
    ck_assert_int_eq(m[1].split_fast, 832);
    ck_assert_int_eq(m[1].split_slow, 832);
    sfi_gpu g;
    ck_assert_int_eq(sfi_gpu_preset("H100-SXM", &g, &e), SFI_OK);
    sfi_hw_profile p;
    sfi_hw_profile_default(&p);
    sfi_model_config mc;
    ck_assert_int_eq(sfi_sv_model(&m[0], &mc, &e), SFI_OK);
    sfi_cost_setup s0, s1;
    sfi_sv_setup(&m[0], &mc, &p, &g, &s0);
    sfi_sv_setup(&m[1], &mc, &p, &g, &s1);
    ck_assert_int_eq(s0.attn_fast_split_rows, 832);
    ck_assert_int_eq(s0.attn_split_rows, 2368);
    ck_assert_int_eq(s1.attn_fast_split_rows, 832);
    ck_assert_int_eq(s1.attn_split_rows, 832);
    /* with a per-CTA bandwidth that binds, the finer slow pieces predict a
     * faster slow step and the same fast one */
    sfi_hw_profile lim;
    truth_profile(&lim);
    lim.cta_bandwidth = 10e9;
    sfi_sv_mix mix;
    memset(&mix, 0, sizeof mix);
    mix.batch = 16;
    mix.hist[0] = 10;
    mix.hist[1] = 10;
    sfi_sv_pred a, b;
    ck_assert_int_eq(sfi_sv_predict(&m[0], &mc, &lim, &g, &mix, &a, &e), SFI_OK);
    ck_assert_int_eq(sfi_sv_predict(&m[1], &mc, &lim, &g, &mix, &b, &e), SFI_OK);
    ck_assert_msg(b.t[SFI_SV_SLOW] < 0.97 * a.t[SFI_SV_SLOW], "slow %.4g vs %.4g", b.t[SFI_SV_SLOW],
                  a.t[SFI_SV_SLOW]);
    ck_assert_double_eq_tol(b.t[SFI_SV_FAST], a.t[SFI_SV_FAST], 1e-12);
    free(m);
}
END_TEST

/* The MoE layer of sfi-gpu's engine (Qwen3-30B-A3B cut to 8 layers):
 * routing by one thread per token, E x top dependent steps a layer at
 * serial_step_ns; attention at 8 query heads per KV head, whose CTAs
 * spend 4 x 8 x 128 FLOPs a row at cta_GFLOPS; experts read once per
 * (token, expert) pair, streamed at the dense attention's efficiency.
 * Qwen3-4B (4 heads per KV head, no experts) is unaffected by the routing
 * and, at a FLOP rate under which its rows stay bound by their bytes, by
 * the CTA's FLOPs. */
static double predict_one(const char *model, int layers, int batch, const sfi_hw_profile *p)
{
    char js[320];
    snprintf(js, sizeof js,
             "{\"step_measurements\":[{\"model\":\"%s\",\"mode\":\"dense\",\"layers\":%d,"
             "\"context\":8192,\"batch\":%d,\"decode_tokens_per_s\":100}]}",
             model, layers, batch);
    sfi_step_meas *m = NULL;
    size_t n = 0;
    sfi_error e;
    ck_assert_int_eq(sfi_step_meas_parse(js, strlen(js), "moe.json", &m, &n, &e), SFI_OK);
    sfi_gpu g;
    ck_assert_int_eq(sfi_gpu_preset("H100-SXM", &g, &e), SFI_OK);
    sfi_model_config mc;
    ck_assert_int_eq(sfi_sv_model(&m[0], &mc, &e), SFI_OK);
    sfi_sv_mix mix;
    memset(&mix, 0, sizeof mix);
    mix.batch = batch;
    sfi_sv_pred pr;
    ck_assert_int_eq(sfi_sv_predict(&m[0], &mc, p, &g, &mix, &pr, &e), SFI_OK);
    free(m);
    return pr.t[SFI_SV_DENSE];
}

START_TEST(moe_routing_cta_flops_and_pair_reads_are_priced)
{
    sfi_hw_profile p0, p;
    truth_profile(&p0);
    p0.cta_bandwidth = 30e9;
    const double t0 = predict_one("Qwen3-30B-A3B", 8, 16, &p0);
    /* routing: 8 layers x 128 experts x 8 picks x 200 ns, nothing else */
    p = p0;
    p.serial_step_s = 200e-9;
    double d = predict_one("Qwen3-30B-A3B", 8, 16, &p) - t0;
    ck_assert_msg(fabs(d / (8 * 128 * 8 * 200e-9) - 1) < 1e-6, "routing +%.6g s", d);
    /* the CTA's FLOPs: dense batch 16 runs 2 CTAs per (request, KV head)
     * pair, of 4129 rows each (the timed steps' mean context, 8257), 4096
     * FLOPs a row at 80 GFLOP/s, where the launch took its K/V bytes
     * (16 x 8257 x 2048) at 0.80 of 3.35 TB/s */
    p = p0;
    p.cta_flops = 80e9;
    d = predict_one("Qwen3-30B-A3B", 8, 16, &p) - t0;
    const double flop_cta = 4129 * 4096.0 / 80e9, body = 16 * 8257 * 2048.0 / (3.35e12 * 0.80);
    ck_assert_msg(fabs(d / (8 * (flop_cta - body)) - 1) < 0.01, "CTA FLOPs +%.6g s (%.6g)", d,
                  8 * (flop_cta - body));
    /* no routing in a dense shape; at 150 GFLOP/s a G = 4 row's 2048
     * FLOPs (13.7 ns) stay under its 512 bytes at 30 GB/s (17.1 ns) */
    p.serial_step_s = 200e-9;
    p.cta_flops = 150e9;
    ck_assert(predict_one("Qwen3-4B", 36, 16, &p) == predict_one("Qwen3-4B", 36, 16, &p0));
    p.cta_flops = 60e9;
    ck_assert(predict_one("Qwen3-4B", 36, 16, &p) > predict_one("Qwen3-4B", 36, 16, &p0));
    /* pair reads (the default) against distinct experts at batch 16: 128
     * pairs against E (1 - (1 - k/E)^16) = 82.4 experts a layer, each 3 x
     * 2048 x 768 bf16 weights at the dense attention's efficiency (0.80;
     * the GEMMs' 0.65 would make it 23% more) */
    ck_assert_int_eq(sfi_sv_moe_pair_reads, 1);
    sfi_sv_moe_pair_reads = 0;
    double td = predict_one("Qwen3-30B-A3B", 8, 16, &p0);
    sfi_sv_moe_pair_reads = 1;
    double ex = 128 * (1 - pow(1 - 8.0 / 128, 16));
    double want = 8 * (128 - ex) * 3 * 2048 * 768 * 2 / (3.35e12 * 0.80);
    ck_assert_msg(fabs((t0 - td) / want - 1) < 0.01, "pairs - distinct %.6g s, want %.6g s",
                  t0 - td, want);
}
END_TEST

/* With MoE steps in the fit (the synthetic dense shapes plus the layer-cut
 * Qwen3-30B-A3B at batch 1, 4, 16, both modes), the per-CTA FLOP rate and
 * the serial step are identified and recovered. */
START_TEST(fit_recovers_cta_flops_and_serial_step)
{
    synth_set *S = synth();
    enum { NM = 6, NT = N_SYN + NM };
    static sfi_step_meas ms[NT];
    static sfi_model_config mcs[NT];
    static sfi_sv_mix mixes[NT];
    memcpy(ms, S->ms, sizeof S->ms);
    memcpy(mcs, S->mcs, sizeof S->mcs);
    memcpy(mixes, S->mixes, sizeof S->mixes);
    sfi_hw_profile t;
    truth_profile(&t);
    /* a G = 8 row (4096 FLOPs) takes 20.5 ns, more than its 512 bytes at
     * the truth's 40 GB/s (12.8 ns); a G <= 4 row stays bound by its bytes
     * (10.2 ns), as on the H100 (130 GFLOP/s against 28 GB/s) */
    sfi_sv_param_set(&t, SFI_SV_P_CTA_FLOPS, 200.0);
    sfi_sv_param_set(&t, SFI_SV_P_SERIAL, 200.0);
    sfi_error e;
    static const int mb[3] = {1, 4, 16};
    for (int k = 0; k < NM; k++) {
        sfi_step_meas *m = &ms[N_SYN + k];
        memset(m, 0, sizeof *m);
        snprintf(m->model, sizeof m->model, "Qwen3-30B-A3B");
        m->layers = 8;
        m->batch = mb[k / 2];
        m->context = 8192;
        m->new_tokens = 128;
        m->sfi = k % 2;
        m->dtype_bytes = 2;
        ck_assert_int_eq(sfi_sv_model(m, &mcs[N_SYN + k], &e), SFI_OK);
        sfi_sv_mix *x = &mixes[N_SYN + k];
        memset(x, 0, sizeof *x);
        x->batch = m->batch;
        x->hist[0] = 90;
        x->hist[1] = 35;
        sfi_sv_pred pr;
        ck_assert_int_eq(sfi_sv_predict(m, &mcs[N_SYN + k], &t, &S->g, x, &pr, &e), SFI_OK);
        for (int c = 0; c < SFI_SV_NCLASS; c++)
            if (pr.t[c] > 0) {
                m->cls[c].have = 1;
                m->cls[c].mean_s = pr.t[c];
            }
        m->tps = pr.tps;
    }
    int in_fit[NT];
    for (int i = 0; i < NT; i++)
        in_fit[i] = 1;
    sfi_hw_profile p;
    sfi_hw_profile_default(&p);
    sfi_sv_fit f;
    ck_assert_int_eq(sfi_sv_fit_run(ms, mcs, mixes, in_fit, NT, &S->g, &p, &f, &e), SFI_OK);
    for (int j = SFI_SV_P_CTA_FLOPS; j <= SFI_SV_P_SERIAL; j++) {
        ck_assert_msg(f.identified[j], "%s held", sfi_sv_param_name(j));
        double got = sfi_sv_param_get(&p, j), want = sfi_sv_param_get(&t, j);
        ck_assert_msg(fabs(got / want - 1) < 0.01, "%s: fitted %g, truth %g (rms %g, se %g)",
                      sfi_sv_param_name(j), got, want, f.rms, f.se[j]);
    }
}
END_TEST

/* Synthetic Qwen3-4B steps at batch 16, 8K, tp 1 and 2, dense and SFI,
 * under truth profile t: the n = 4 entries of ms, mcs, mixes. */
static void synth_tp(const sfi_hw_profile *t, const sfi_gpu *g, sfi_step_meas *ms,
                     sfi_model_config *mcs, sfi_sv_mix *mixes)
{
    sfi_error e;
    for (int k = 0; k < 4; k++) {
        sfi_step_meas *m = &ms[k];
        memset(m, 0, sizeof *m);
        snprintf(m->model, sizeof m->model, "Qwen3-4B");
        m->batch = 16;
        m->context = 8192;
        m->new_tokens = 64;
        m->tp = 1 + k / 2;
        m->sfi = k % 2;
        m->dtype_bytes = 2;
        ck_assert_int_eq(sfi_sv_model(m, &mcs[k], &e), SFI_OK);
        memset(&mixes[k], 0, sizeof mixes[k]);
        mixes[k].batch = 16;
        mixes[k].hist[0] = 32;
        mixes[k].hist[1] = 29;
        sfi_sv_pred pr;
        ck_assert_int_eq(sfi_sv_predict(m, &mcs[k], t, g, &mixes[k], &pr, &e), SFI_OK);
        for (int c = 0; c < SFI_SV_NCLASS; c++)
            if (pr.t[c] > 0) {
                m->cls[c].have = 1;
                m->cls[c].mean_s = pr.t[c];
            }
        m->tps = pr.tps;
    }
}

/* What tensor parallelism adds: a fit of some parameters (the others held
 * at the prior, sfi-sim validate --fit-params) recovers an all-reduce's
 * extra inside a step from tp-1 and tp-2 steps; a GEMM's fixed part and
 * the GEMMs' efficiency are told apart by the tp-2 steps (the bytes
 * halve, the fixed part stays), not by tp-1 steps alone. */
START_TEST(fit_some_recovers_tensor_parallel_terms)
{
    sfi_gpu g;
    sfi_error e;
    ck_assert_int_eq(sfi_gpu_preset("H100-SXM", &g, &e), SFI_OK);
    sfi_hw_profile prior, t;
    truth_profile(&prior);
    sfi_sv_param_set(&prior, SFI_SV_P_LAUNCH_PDL, 3.0);
    sfi_step_meas ms[4];
    sfi_model_config mcs[4];
    sfi_sv_mix mixes[4];
    int in_fit[4] = {1, 1, 1, 1}, free_p[SFI_SV_NPARAM];
    sfi_sv_fit f;
    sfi_hw_profile p;

    /* the all-reduce's extra alone */
    t = prior;
    sfi_sv_param_set(&t, SFI_SV_P_AR_STEP, 9.0);
    synth_tp(&t, &g, ms, mcs, mixes);
    memset(free_p, 0, sizeof free_p);
    free_p[SFI_SV_P_AR_STEP] = 1;
    p = prior;
    ck_assert_int_eq(sfi_sv_fit_run_some(ms, mcs, mixes, in_fit, 4, &g, free_p, &p, &f, &e),
                     SFI_OK);
    ck_assert(f.identified[SFI_SV_P_AR_STEP]);
    ck_assert_msg(fabs(sfi_sv_param_get(&p, SFI_SV_P_AR_STEP) / 9.0 - 1) < 0.01, "fitted %g",
                  sfi_sv_param_get(&p, SFI_SV_P_AR_STEP));
    for (int j = 0; j < SFI_SV_NPARAM; j++)
        if (j != SFI_SV_P_AR_STEP) {
            ck_assert(f.asked_held[j] && !f.identified[j]);
            ck_assert(sfi_sv_param_get(&p, j) == sfi_sv_param_get(&prior, j));
        }

    /* a GEMM's fixed part and the GEMM efficiency: tp 1 and 2 together */
    t = prior;
    sfi_sv_param_set(&t, SFI_SV_P_GEMM_FIXED, 4.0);
    sfi_sv_param_set(&t, SFI_SV_P_GEMM, 0.75);
    synth_tp(&t, &g, ms, mcs, mixes);
    memset(free_p, 0, sizeof free_p);
    free_p[SFI_SV_P_GEMM] = free_p[SFI_SV_P_GEMM_FIXED] = 1;
    /* from a prior of a few us: at a fraction of a us the part's slope is
     * below what 1% noise lets a fit see */
    sfi_sv_param_set(&prior, SFI_SV_P_GEMM_FIXED, 3.0);
    p = prior;
    ck_assert_int_eq(sfi_sv_fit_run_some(ms, mcs, mixes, in_fit, 4, &g, free_p, &p, &f, &e),
                     SFI_OK);
    for (int j = SFI_SV_P_GEMM; j <= SFI_SV_P_GEMM_FIXED;
         j += SFI_SV_P_GEMM_FIXED - SFI_SV_P_GEMM) {
        double got = sfi_sv_param_get(&p, j), want = sfi_sv_param_get(&t, j);
        ck_assert_msg(f.identified[j] && fabs(got / want - 1) < 0.01, "%s: fitted %g, truth %g",
                      sfi_sv_param_name(j), got, want);
    }
    /* tp 1 alone: the fixed part moves as the efficiency does; held */
    in_fit[2] = in_fit[3] = 0;
    p = prior;
    ck_assert_int_eq(sfi_sv_fit_run_some(ms, mcs, mixes, in_fit, 4, &g, free_p, &p, &f, &e),
                     SFI_OK);
    ck_assert(!f.identified[SFI_SV_P_GEMM_FIXED]);
    ck_assert(sfi_sv_param_get(&p, SFI_SV_P_GEMM_FIXED) == 3.0);
    /* the keys of --fit-params */
    ck_assert_int_eq(sfi_sv_param_lookup("gemm_fixed_us"), SFI_SV_P_GEMM_FIXED);
    ck_assert_int_eq(sfi_sv_param_lookup("allreduce_step_us"), SFI_SV_P_AR_STEP);
    ck_assert_int_eq(sfi_sv_param_lookup("sel_pre_us"), SFI_SV_P_SEL_PRE);
    ck_assert_int_eq(sfi_sv_param_lookup("gemm"), SFI_SV_P_GEMM);
    ck_assert_int_eq(sfi_sv_param_lookup("gemm fixed_us"), -1);
    for (int j = 0; j < SFI_SV_NPARAM; j++)
        ck_assert_int_eq(sfi_sv_param_lookup(sfi_sv_param_key(j)), j);
}
END_TEST

/* sfi-sim validate with args (shell words, quoted by the caller): asserts
 * exit 0 (its standard error in the message) and returns its standard
 * output. */
static char *validate_ok(const char *args)
{
    char cmd[20736]; /* the program's path and the caller's args[16384] */
    snprintf(cmd, sizeof cmd, "'%s' validate %s", sfi_test_build("sfi-sim"), args);
    char *out = NULL, *err = NULL;
    ck_assert_msg(sfi_test_run(cmd, &out, &err) == 0, "%s", err ? err : "");
    free(err);
    return out;
}

/* The collectives tests' one whole step: Qwen3-4B dense at tp 2. */
static const char tp2_dense_step[] =
    "],\"step_measurements\":[{\"model\":\"Qwen3-4B\",\"mode\":\"dense\","
    "\"context\":8192,\"batch\":16,\"tp\":2,\"decode_tokens_per_s\":2000,"
    "\"steps\":{\"dense\":{\"mean_ms\":8}}}]}";

/* json (o bytes, freed here) written to dir/name as path; fit:
 * dir/fit.json, for the caller's --fit. */
static void write_json(char *json, size_t o, const char *dir, const char *name, char *path,
                       char *fit)
{
    snprintf(path, 4096, "%s/%s", dir, name);
    snprintf(fit, 4096, "%s/fit.json", dir);
    ck_assert_int_eq(sfi_test_write_file(path, json, o), 0);
    free(json);
}

/* sfi-sim validate of the steps in path against sim/profiles/default.json
 * (and more args), as validate_ok. */
static char *validate_default_steps(const char *path, const char *more)
{
    char prof[4096], args[16384]; /* sfi_test_src and sfi_test_build share a buffer */
    snprintf(prof, sizeof prof, "%s", sfi_test_src("sim/profiles/default.json"));
    snprintf(args, sizeof args, "--profile '%s' --steps '%s' %s", prof, path, more);
    return validate_ok(args);
}

/* All-reduce measurements (sfi-gpu bench-allreduce) of 2 and 4 GPUs:
 * sfi-sim validate compares them with the ring model, --fit recovers the
 * latency and efficiency each group size was made with, and whole steps in
 * the same file are priced with those of their size. */
START_TEST(allreduce_measurements)
{
    sfi_gpu g;
    sfi_error e;
    ck_assert_int_eq(sfi_gpu_preset("H200", &g, &e), SFI_OK);
    /* t = 5 us + 2 (n-1)/n bytes / (450 GB/s x 0.6) on 2 GPUs, 10 us and
     * 0.65 on 4 */
    size_t cap = 1 << 14, o = 0;
    char *json = malloc(cap);
    o += (size_t)snprintf(json + o, cap - o,
                          "{\"sfi_profile\":1,\"name\":\"ar\",\"gpu\":\"H200\","
                          "\"measurements\":[");
    const double sizes[] = {8192, 163840, 1048576, 8388608, 67108864};
    const int gpus[] = {2, 4};
    int k = 0;
    for (int a = 0; a < 2; a++)
        for (int i = 0; i < 5; i++, k++) {
            double t = (a ? 10e-6 : 5e-6) +
                       2.0 * (gpus[a] - 1) / gpus[a] * sizes[i] / (450e9 * (a ? 0.65 : 0.6));
            o += (size_t)snprintf(json + o, cap - o,
                                  "%s{\"kernel\":\"allreduce\",\"gpus\":%d,\"bytes\":%.0f,"
                                  "\"dtype\":\"f32\",\"time_us\":%.6f}",
                                  k ? "," : "", gpus[a], sizes[i], t * 1e6);
        }
    o += (size_t)snprintf(json + o, cap - o, "%s", tp2_dense_step);
    ck_assert(o < cap);
    char *dir = sfi_test_tmpdir(), path[4096], fit[4096], args[16384];
    write_json(json, o, dir, "ar.json", path, fit);
    snprintf(args, sizeof args, "--profile '%s' --fit '%s'", path, fit);
    char *out = validate_ok(args);
    /* the rows: GPUs and bytes; the defaults (8 us, 0.70) miss the small
     * messages by 60% */
    ck_assert_msg(strstr(out, "collective") && strstr(out, "allreduce             4     67108864"),
                  "%s", out);
    ck_assert_msg(
        strstr(out, "efficiency 0.600, latency 5.00 us (from 5 all-reduces of 2 GPUs)") &&
            strstr(out, "efficiency 0.650, latency 10.00 us (from 5 all-reduces of 4 GPUs)"),
        "%s", out);
    sfi_hw_profile p;
    sfi_hw_measurement *ms = NULL;
    size_t nm = 0;
    ck_assert_int_eq(sfi_hw_profile_load(fit, &p, &ms, &nm, &e), SFI_OK);
    ck_assert(fabs(p.allreduce_latency_s - 5e-6) < 1e-8);
    ck_assert(fabs(p.efficiency[SFI_KC_ALLREDUCE] - 0.6) < 1e-4);
    ck_assert(fabs(p.ar_by_gpus_lat[4] - 10e-6) < 1e-8 && fabs(p.ar_by_gpus_eff[4] - 0.65) < 1e-4);
    ck_assert(fabs(p.ar_by_gpus_lat[2] - 5e-6) < 1e-8 && p.ar_by_gpus_eff[8] == 0);
    ck_assert_int_eq(nm, 10);
    ck_assert(ms[9].gpus == 4 && ms[9].bytes == 67108864.0);
    free(ms);
    free(out);
    /* whole steps of the same file: their collectives priced with the fit */
    out = validate_default_steps(path, "");
    ck_assert_msg(
        strstr(out, "# collectives: 5 all-reduce measurements") &&
            strstr(out, "(2 GPUs) fit latency 5.00 us, efficiency 0.600 of H200's NVLink") &&
            strstr(out, "(4 GPUs) fit latency 10.00 us, efficiency 0.650"),
        "%s", out);
    free(out);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

/* All-gather measurements (sfi-gpu bench-allreduce --op both) of 2 GPUs
 * beside the all-reduces: --fit recovers each kernel's own latency and
 * efficiency (the all-gathers' into allgather_by_gpus, the profile's own
 * collective parameters staying the all-reduces'), the table prices each
 * with its ring, and whole steps in the same file say what prices their
 * all-gathers. */
START_TEST(allgather_measurements)
{
    sfi_gpu g;
    sfi_error e;
    ck_assert_int_eq(sfi_gpu_preset("H200", &g, &e), SFI_OK);
    /* all-reduce: 5 us + 2 (n-1)/n bytes / (450 GB/s x 0.6); all-gather:
     * 12 us + (n-1) bytes / (450 GB/s x 0.45), bytes what each GPU sends */
    size_t cap = 1 << 14, o = 0;
    char *json = malloc(cap);
    o += (size_t)snprintf(json + o, cap - o,
                          "{\"sfi_profile\":1,\"name\":\"ag\",\"gpu\":\"H200\","
                          "\"measurements\":[");
    const double sizes[] = {4096, 133120, 526400, 8388608, 67108864};
    for (int a = 0; a < 2; a++)
        for (int i = 0; i < 5; i++) {
            double t = a ? 12e-6 + sizes[i] / (450e9 * 0.45) : 5e-6 + sizes[i] / (450e9 * 0.6);
            o += (size_t)snprintf(json + o, cap - o,
                                  "%s{\"kernel\":\"%s\",\"gpus\":2,\"bytes\":%.0f,"
                                  "\"message\":\"sweep\",\"time_us\":%.6f,\"eager_us\":20,"
                                  "\"busbw_GB_per_s\":1}",
                                  a || i ? "," : "", a ? "allgather" : "allreduce", sizes[i],
                                  t * 1e6);
        }
    o += (size_t)snprintf(json + o, cap - o, "%s", tp2_dense_step);
    ck_assert(o < cap);
    char *dir = sfi_test_tmpdir(), path[4096], fit[4096], args[16384];
    write_json(json, o, dir, "ag.json", path, fit);
    snprintf(args, sizeof args, "--profile '%s' --fit '%s'", path, fit);
    char *out = validate_ok(args);
    /* the all-gather rows, and under the defaults (the all-reduce's 8 us
     * and 0.70) the largest is priced by (n-1) bytes, not 2 (n-1)/n */
    sfi_hw_profile def;
    sfi_hw_profile_default(&def);
    char row[128];
    snprintf(row, sizeof row, "allgather             2     67108864 %11.2f %11.2f",
             (12e-6 + 67108864 / (450e9 * 0.45)) * 1e6,
             (def.allreduce_latency_s + 67108864 / (450e9 * def.efficiency[SFI_KC_ALLREDUCE])) *
                 1e6);
    ck_assert_msg(strstr(out, row), "no '%s' in:\n%s", row, out);
    ck_assert_msg(
        strstr(out,
               "allreduce    efficiency 0.600, latency 5.00 us (from 5 all-reduces of 2 GPUs)") &&
            strstr(
                out,
                "allgather    efficiency 0.450, latency 12.00 us (from 5 all-gathers of 2 GPUs)"),
        "%s", out);
    free(out);
    sfi_hw_profile p;
    sfi_hw_measurement *ms = NULL;
    size_t nm = 0;
    ck_assert_int_eq(sfi_hw_profile_load(fit, &p, &ms, &nm, &e), SFI_OK);
    ck_assert(fabs(p.allreduce_latency_s - 5e-6) < 1e-8);
    ck_assert(fabs(p.efficiency[SFI_KC_ALLREDUCE] - 0.6) < 1e-4);
    ck_assert(fabs(p.ag_by_gpus_lat[2] - 12e-6) < 1e-8 && fabs(p.ag_by_gpus_eff[2] - 0.45) < 1e-4);
    ck_assert(p.ag_by_gpus_eff[4] == 0);
    ck_assert_int_eq(nm, 10);
    ck_assert_str_eq(ms[9].kernel, "allgather");
    ck_assert(ms[9].gpus == 2 && ms[9].bytes == 67108864.0);
    free(ms);
    /* refitted from its own measurements, the fitted profile predicts them:
     * its all-gathers priced by allgather_by_gpus */
    snprintf(args, sizeof args, "--profile '%s'", fit);
    out = validate_ok(args);
    ck_assert_msg(strstr(out, "profile 10 (max |err| 0.0%)"), "%s", out);
    free(out);
    /* whole steps of the same file: the header names what prices what */
    out = validate_default_steps(path, "");
    ck_assert_msg(strstr(out, "they price the steps' all-reduces of 2 GPUs") &&
                      strstr(out, "# collectives: 5 all-gather measurements") &&
                      strstr(out, "(2 GPUs) fit latency 12.00 us, efficiency 0.450 of H200's "
                                  "NVLink: they price the steps' all-gathers of 2 GPUs"),
                  "%s", out);
    free(out);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

/* The command's report: rows of the subset (context 8K) marked in, the
 * others (16K) out, and the summary counts each apart; fitted on the 8K
 * rows, the truth predicts the 16K rows. */
START_TEST(report_splits_in_and_out_of_sample)
{
    synth_set *S = synth();
    sfi_error e;
    /* a profile file of the synthetic steps (no trace: the mix is the
     * measured counts, 110 fast and 40 slow steps, one slow request) */
    size_t cap = 1 << 16, o = 0;
    char *json = malloc(cap);
    o += (size_t)snprintf(json + o, cap - o, "{\"sfi_profile\":1,\"step_measurements\":[");
    int n_in = 0;
    for (int i = 0; i < N_SYN; i++) {
        const sfi_step_meas *m = &S->ms[i];
        sfi_sv_mix mx = {.batch = m->batch};
        mx.hist[0] = 110;
        mx.hist[1] = 40;
        sfi_hw_profile t;
        truth_profile(&t);
        sfi_sv_pred p;
        ck_assert_int_eq(sfi_sv_predict(m, &S->mcs[i], &t, &S->g, &mx, &p, &e), SFI_OK);
        o += (size_t)snprintf(json + o, cap - o,
                              "%s{\"model\":\"%s\",\"mode\":\"%s\",\"context\":%d,\"batch\":%d,"
                              "\"new_tokens\":128,\"decode_tokens_per_s\":%.6f,\"steps\":{",
                              i ? "," : "", m->model, m->sfi ? "sfi" : "dense", m->context,
                              m->batch, p.tps);
        if (m->sfi)
            o += (size_t)snprintf(json + o, cap - o,
                                  "\"fast\":{\"n\":110,\"mean_ms\":%.9f},\"slow\":{\"n\":40,"
                                  "\"mean_ms\":%.9f}}}",
                                  p.t[SFI_SV_FAST] * 1e3, p.t[SFI_SV_SLOW] * 1e3);
        else
            o += (size_t)snprintf(json + o, cap - o, "\"dense\":{\"mean_ms\":%.9f}}}",
                                  p.t[SFI_SV_DENSE] * 1e3);
        n_in += m->context == 8192;
    }
    o += (size_t)snprintf(json + o, cap - o, "]}");
    ck_assert(o < cap);
    char *dir = sfi_test_tmpdir(), path[4096], fit[4096], more[4200];
    write_json(json, o, dir, "steps.json", path, fit);
    snprintf(more, sizeof more, "--fit-subset context=8K --fit '%s'", fit);
    char *out = validate_default_steps(path, more);
    int rows_in = 0, rows_out = 0;
    for (char *l = out; l && *l;) {
        char *nl = strchr(l, '\n');
        if (nl)
            *nl = 0;
        char model[64], set[8];
        int L, tp, b, c;
        char mode[8];
        if (l[0] != '#' &&
            sscanf(l, "%63s %d %d %d %d %7s %7s", model, &L, &tp, &b, &c, mode, set) == 7) {
            ck_assert_int_eq(tp, 1);
            int want_in = c == 8192;
            if (!strcmp(set, "in"))
                rows_in++;
            else if (!strcmp(set, "out"))
                rows_out++;
            ck_assert_msg(!strcmp(set, want_in ? "in" : "out"), "%s", l);
        }
        if (nl)
            *nl = '\n';
        l = nl ? nl + 1 : NULL;
    }
    ck_assert_int_eq(rows_in, n_in);
    ck_assert_int_eq(rows_out, N_SYN - n_in);
    /* the truth fits: out-of-sample errors are (near) zero */
    ck_assert_msg(strstr(out, "# out-of-sample"), "%s", out);
    ck_assert_msg(strstr(out, "# in-sample"), "%s", out);
    ck_assert_msg(strstr(out, "gemm efficiency") && strstr(out, "launch_us"), "%s", out);
    char *line = strstr(out, "# out-of-sample");
    double mean, max;
    int cnt;
    ck_assert_int_eq(sscanf(line, "# out-of-sample dense step time %lf %lf %d", &mean, &max, &cnt),
                     3);
    ck_assert_int_eq(cnt, 6);
    ck_assert_msg(max < 0.1, "%.2000s", line);
    /* the written profile reproduces the fit */
    sfi_hw_profile p;
    ck_assert_int_eq(sfi_hw_profile_load(fit, &p, NULL, NULL, &e), SFI_OK);
    ck_assert(fabs(p.launch_s * 1e6 - 4.0) < 0.1);
    ck_assert(fabs(p.efficiency[SFI_KC_GEMM] - 0.65) < 0.01);
    free(out);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("stepval");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, fit_recovers_known_parameters);
    tcase_add_test(tc, one_model_cannot_separate_weights_from_launches);
    tcase_add_test(tc, fit_subset_specs);
    tcase_add_test(tc, malformed_step_measurements_are_named);
    tcase_add_test(tc, report_splits_in_and_out_of_sample);
    tcase_add_test(tc, tensor_parallel_measurements_are_priced_at_their_gpus);
    tcase_add_test(tc, tensor_parallel_engine_setup);
    tcase_add_test(tc, allreduce_measurements);
    tcase_add_test(tc, allgather_measurements);
    tcase_add_test(tc, small_batches_split_fast_requests_finer_than_slow_ones);
    tcase_add_test(tc, reported_split_rows_are_priced);
    tcase_add_test(tc, moe_routing_cta_flops_and_pair_reads_are_priced);
    tcase_add_test(tc, fit_recovers_cta_flops_and_serial_step);
    tcase_add_test(tc, fit_some_recovers_tensor_parallel_terms);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
