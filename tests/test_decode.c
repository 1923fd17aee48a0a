/* The decode loop (sfi(7) DECODE LOOP) on the fixture checkpoints: SFI
 * with K and n_recent covering the context equals dense bit for bit; step
 * kinds follow the trigger policy; the observer sees consistent sets; golden
 * digests of fixture runs in both modes; sfi-ref run's output and errors. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_decode.h"
#include "sfi_hf_fixture.h"
#include "sfi_qwen3.h"
#include "sfi_recorder.h"
#include "sfi_test_util.h"
#include "sfi_trace.h"
#include "sfi_vocab.h"

static const char *models[3] = {"tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen3-moe-nonorm"};

static int32_t *prompt0(const char *model, int *n)
{
    json_t *r = hf_expected();
    json_t *ms = json_object_get(r, "models");
    int32_t *ids = NULL;
    for (size_t i = 0; i < json_array_size(ms); i++) {
        json_t *M = json_array_get(ms, i);
        if (!strcmp(json_string_value(json_object_get(M, "dir")), model))
            ids =
                hf_ids(json_object_get(json_array_get(json_object_get(M, "prompts"), 0), "ids"), n);
    }
    json_decref(r);
    ck_assert_ptr_nonnull(ids);
    return ids;
}

/* Token ids that count as sentence ends in these tests (the fixtures have
 * no tokenizer). */
static uint8_t trig[512];
static void init_trig(void)
{
    for (int i = 0; i < 512; i++)
        trig[i] = i % 11 == 0;
}

typedef struct {
    int n_prefill, n_step, n_slow_layer, n_attn;
    int n_layers, vocab;
    float *logits; /* [step][vocab] */
    int bad;       /* first inconsistency found, as a line number */
    float min_mass;
    const sfi_params *prm;
} rec;

static sfi_status on_prefill(void *u, const sfi_decode_prefill_info *pi, sfi_error *err)
{
    (void)err;
    rec *r = u;
    r->n_prefill++;
    r->n_layers = pi->n_layers;
    return SFI_OK;
}

static sfi_status on_step(void *u, const sfi_decode_step_info *si, sfi_error *err)
{
    (void)err;
    rec *r = u;
    if (si->step != r->n_step && !r->bad)
        r->bad = __LINE__;
    if (si->n_ctx != si->position + 1 && !r->bad)
        r->bad = __LINE__;
    memcpy(r->logits + (size_t)si->step * r->vocab, si->logits, (size_t)r->vocab * 4);
    r->n_step++;
    return SFI_OK;
}

static sfi_status on_slow_layer(void *u, const sfi_decode_slow_layer_info *li, sfi_error *err)
{
    (void)err;
    rec *r = u;
    r->n_slow_layer++;
    int nJ = li->j_end > li->j_begin ? li->j_end - li->j_begin : 0;
    int want = nJ < li->K ? nJ : li->K;
    for (int h = 0; h < li->n_kv_heads; h++) {
        if (li->n_selected[h] != want && !r->bad)
            r->bad = __LINE__;
        const int32_t *s = li->selected + (size_t)h * li->K;
        for (int i = 0; i < li->n_selected[h]; i++) {
            if ((s[i] < li->j_begin || s[i] >= li->j_end) && !r->bad)
                r->bad = __LINE__;
            if (i && s[i] <= s[i - 1] && !r->bad)
                r->bad = __LINE__;
        }
        if (!(li->lambda[h] >= 0.0f && li->lambda[h] <= r->prm->lambda_clip) && !r->bad)
            r->bad = __LINE__;
    }
    for (int h = 0; h < li->n_heads; h++) {
        if (!(li->captured_mass[h] >= 0.0f && li->captured_mass[h] <= 1.0001f) && !r->bad)
            r->bad = __LINE__;
        if (li->captured_mass[h] < r->min_mass)
            r->min_mass = li->captured_mass[h];
    }
    return SFI_OK;
}

static sfi_status on_attention(void *u, const sfi_decode_attention_info *ai, sfi_error *err)
{
    (void)err;
    rec *r = u;
    r->n_attn++;
    for (int h = 0; h < ai->n_heads; h++) {
        float s = 0.0f;
        for (int j = 0; j < ai->n_ctx; j++)
            s += ai->probs[(size_t)h * ai->n_ctx + j];
        if (fabsf(s - 1.0f) > 1e-4f && !r->bad)
            r->bad = __LINE__;
    }
    return SFI_OK;
}

static void run(const char *model, sfi_decode_opts *o, rec *r, sfi_decode_result *res)
{
    sfi_qwen3 *m;
    sfi_error e;
    ck_assert_msg(sfi_qwen3_load(hf_path(model), &m, &e) == SFI_OK, "%s", e.msg);
    int n;
    int32_t *ids = prompt0(model, &n);
    sfi_decode_observer obs = {.user = r,
                               .want_attention = 1,
                               .on_prefill = on_prefill,
                               .on_step = on_step,
                               .on_slow_layer = on_slow_layer,
                               .on_attention = on_attention};
    memset(r, 0, sizeof *r);
    r->vocab = sfi_qwen3_config(m)->vocab_size;
    r->logits = malloc((size_t)o->max_new * r->vocab * 4);
    r->min_mass = 2.0f;
    r->prm = &o->params;
    ck_assert_msg(sfi_decode_run(m, o, ids, n, &obs, res, &e) == SFI_OK, "%s", e.msg);
    ck_assert_msg(r->bad == 0, "observer saw an inconsistency (check at line %d)", r->bad);
    ck_assert_int_eq(r->n_prefill, 1);
    ck_assert_int_eq(r->n_step, res->n_generated);
    /* every step, step 0 (the prefill's last query) included */
    ck_assert_int_eq(r->n_attn, res->n_generated * r->n_layers);
    free(ids);
    sfi_qwen3_free(m);
}

static void set(sfi_params *p, const char *kv)
{
    sfi_error e;
    ck_assert_msg(sfi_params_set(p, kv, "test", &e) == SFI_OK, "%s", e.msg);
}

START_TEST(sfi_covering_context_equals_dense)
{
    init_trig();
    for (int mi = 0; mi < 3; mi++) {
        sfi_decode_opts o;
        sfi_decode_opts_default(&o);
        o.max_new = 24;
        o.is_trigger = trig;
        o.n_trigger_vocab = 512;
        set(&o.params, "K=128");
        set(&o.params, "n_recent=100");
        set(&o.params, "n_sink=2");
        set(&o.params, "T_max=5");
        rec rs, rd;
        sfi_decode_result s, d;
        run(models[mi], &o, &rs, &s);
        o.mode = SFI_DECODE_DENSE;
        run(models[mi], &o, &rd, &d);
        ck_assert_int_eq(s.n_generated, 24);
        ck_assert_int_eq(d.n_slow, 24);
        ck_assert_int_gt(s.n_slow, 1);
        ck_assert_int_lt(s.n_slow, 24); /* fast steps did happen */
        for (int t = 0; t < 24; t++)
            ck_assert_int_eq(s.ids[t], d.ids[t]);
        /* bit for bit: sparse attention over every position is dense */
        ck_assert(memcmp(rs.logits, rd.logits, (size_t)24 * rs.vocab * 4) == 0);
        /* the fast set covers everything: all the mass is captured */
        ck_assert_float_ge(rs.min_mass, 0.9999f);
        ck_assert_int_eq(rs.n_slow_layer, rs.n_layers * s.n_slow); /* prefill + slow t >= 1 */
        ck_assert_str_ne(s.digest_hex, d.digest_hex);              /* the mode is hashed */
        printf("%s: sfi (K, n_recent covering the context, %d slow of 24) == dense, logits "
               "bit-identical\n",
               models[mi], s.n_slow);
        free(rs.logits);
        free(rd.logits);
        sfi_decode_result_free(&s);
        sfi_decode_result_free(&d);
    }
}
END_TEST

START_TEST(step_kinds_follow_the_trigger_policy)
{
    init_trig();
    sfi_decode_opts o;
    sfi_decode_opts_default(&o);
    o.max_new = 40;
    o.is_trigger = trig;
    o.n_trigger_vocab = 512;
    set(&o.params, "K=8");
    set(&o.params, "n_recent=6");
    set(&o.params, "T_max=7");
    rec r;
    sfi_decode_result res;
    run("tiny-qwen3-moe-nonorm", &o, &r, &res);
    ck_assert_int_eq(res.kinds[0], SFI_STEP_SLOW);
    ck_assert_int_eq(res.reasons[0], SFI_REASON_FIRST);
    int last = 0, n_trig = 0, n_tmax = 0;
    for (int t = 1; t < res.n_generated; t++) {
        int want_trig = trig[res.ids[t - 1]];
        int want_tmax = t - last >= 7;
        if (want_trig) {
            ck_assert_int_eq(res.kinds[t], SFI_STEP_SLOW);
            ck_assert_int_eq(res.reasons[t], SFI_REASON_TRIGGER);
            n_trig++;
        } else if (want_tmax) {
            ck_assert_int_eq(res.kinds[t], SFI_STEP_SLOW);
            ck_assert_int_eq(res.reasons[t], SFI_REASON_TMAX);
            n_tmax++;
        } else {
            ck_assert_int_eq(res.kinds[t], SFI_STEP_FAST);
        }
        if (res.kinds[t] == SFI_STEP_SLOW)
            last = t;
    }
    ck_assert_int_gt(n_tmax, 0);
    ck_assert_int_eq(res.n_slow, 1 + n_trig + n_tmax);
    ck_assert(fabs(res.slow_fraction - (double)res.n_slow / res.n_generated) < 1e-12);
    /* a small fast set loses some mass somewhere */
    ck_assert_float_lt(r.min_mass, 1.0f);
    printf("trigger policy: %d trigger + %d T_max slow steps of %d\n", n_trig, n_tmax,
           res.n_generated);
    free(r.logits);
    sfi_decode_result_free(&res);
}
END_TEST

/* Golden digests: the scalar reference is bit-exact across compilers and
 * optimization levels, so these runs must hash the same everywhere. */
START_TEST(golden_digests)
{
    static const char *want[3][2] = {
        {"e93a8ccd65b67cb7090fce0e94b09dc2dc10c4a3e6cb745f864d3705c0480638",
         "0a68a9860634f1c1e8f4639911d2ac9639d2690189f983ea60ef7cae06446595"},
        {"9b7eb758426893bf5a37c4ae0bd8251e349302be0583f932904ccc247a78c85b",
         "68553c7248be849836f4cc2af103864bbde767e7b8e593989683f34144e49c67"},
        {"636bd4a57c1ed98e828e84722436412054087f6b7b45f4a974f4c970f528148c",
         "902206a8e7c6651b8ba4b8ba0559521d2d393ca45c24994bafc2d66c742164ab"},
    };
    init_trig();
    int mismatches = 0;
    for (int mi = 0; mi < 3; mi++)
        for (int mode = 0; mode < 2; mode++) {
            sfi_decode_opts o;
            sfi_decode_opts_default(&o);
            o.mode = mode ? SFI_DECODE_DENSE : SFI_DECODE_SFI;
            o.max_new = 24;
            o.is_trigger = trig;
            o.n_trigger_vocab = 512;
            set(&o.params, "K=12");
            set(&o.params, "n_recent=8");
            set(&o.params, "T_max=6");
            rec r;
            sfi_decode_result res;
            run(models[mi], &o, &r, &res);
            printf("digest %s %s: %s (slow %d of %d)\n", models[mi], sfi_decode_mode_name(o.mode),
                   res.digest_hex, res.n_slow, res.n_generated);
            if (strcmp(res.digest_hex, want[mi][mode])) {
                fprintf(stderr, "digest %s %s: %s, golden %s\n", models[mi],
                        sfi_decode_mode_name(o.mode), res.digest_hex, want[mi][mode]);
                mismatches++;
            }
            free(r.logits);
            sfi_decode_result_free(&res);
        }
    ck_assert_int_eq(mismatches, 0);
}
END_TEST

/* Deferred refresh (refresh_delay = d). With K above every |J| the
 * Selector keeps all of J, so a fast step attends sink + J_t + recent:
 * exactly n_ctx(t) = n_prompt + t positions per layer and KV head, where t
 * is the slow step whose sets are in effect (0: the prefill's). The
 * observer's `attended` therefore names that step. Slow steps are placed
 * by teacher forcing (boundary policy, a trigger token fed at chosen
 * steps) at 0, 3, 8, 9, 14, 16 and 22, and the step in effect at every
 * fast step is worked out by hand below for each d: a delay off by one,
 * or a pending set of 8 (or, for d >= 3, of 14) not dropped by the slow
 * step after it, changes some entry. */
typedef struct {
    int64_t attended[32];
    int kinds[32];
    int n_slow_layer, n_deferred, bad;
} defer_rec;

static sfi_status defer_on_step(void *u, const sfi_decode_step_info *si, sfi_error *err)
{
    (void)err;
    defer_rec *r = u;
    if (si->step < 32) {
        r->attended[si->step] = si->attended;
        r->kinds[si->step] = si->kind;
    }
    return SFI_OK;
}

static sfi_status defer_on_slow_layer(void *u, const sfi_decode_slow_layer_info *li, sfi_error *err)
{
    (void)err;
    defer_rec *r = u;
    r->n_slow_layer++;
    r->n_deferred += li->deferred;
    /* all of J is kept */
    for (int h = 0; h < li->n_kv_heads; h++)
        if (li->n_selected[h] != li->j_end - li->j_begin && !r->bad)
            r->bad = __LINE__;
    return SFI_OK;
}

enum { N_DEFER_STEPS = 28, SLOW = -1 };
/* the slow step in effect at each step (SLOW: a slow step), by hand */
static const int defer_want[4][N_DEFER_STEPS] = {
    /* d = 0: the last slow step */
    {SLOW, 0,  0,    SLOW, 3,  3,  3,  3,  SLOW, SLOW, 9,  9,  9,  9,
     SLOW, 14, SLOW, 16,   16, 16, 16, 16, SLOW, 22,   22, 22, 22, 22},
    /* d = 2: 3 from 5; 8 dropped by 9; 9 from 11; 14 installed at 16
         * (not dropped: 16 = 14 + 2), 16 from 18; 22 from 24 */
    {SLOW, 0, 0,    SLOW, 0,  3,  3,  3,  SLOW, SLOW, 3,  9,  9,  9,
     SLOW, 9, SLOW, 14,   16, 16, 16, 16, SLOW, 16,   22, 22, 22, 22},
    /* d = 3: 3 from 6; 9 from 12; 14 dropped by 16; 16 from 19 */
    {SLOW, 0, 0,    SLOW, 0, 0,  3,  3,  SLOW, SLOW, 3,  3,  9,  9,
     SLOW, 9, SLOW, 9,    9, 16, 16, 16, SLOW, 16,   16, 22, 22, 22},
    /* d = 4: 3 from 7; 9 from 13; 16 from 20; 22 from 26 */
    {SLOW, 0, 0,    SLOW, 0, 0, 0,  3,  SLOW, SLOW, 3,  3,  3,  9,
     SLOW, 9, SLOW, 9,    9, 9, 16, 16, SLOW, 16,   16, 16, 22, 22},
};
static const int defer_delays[4] = {0, 2, 3, 4};

/* x_{t-1} = forced[t-1]: 11 (a trigger) before the slow steps, else 1 */
static void defer_forced(int32_t *forced)
{
    for (int t = 1; t <= N_DEFER_STEPS; t++)
        forced[t - 1] = (t == 3 || t == 8 || t == 9 || t == 14 || t == 16 || t == 22) ? 11 : 1;
    ck_assert(trig[11] && !trig[1]);
}

static void defer_opts(sfi_decode_opts *o, const int32_t *forced, int delay)
{
    sfi_decode_opts_default(o);
    o->max_new = N_DEFER_STEPS;
    o->is_trigger = trig;
    o->n_trigger_vocab = 512;
    o->trigger = SFI_TRIG_BOUNDARY;
    o->forced = forced;
    o->n_forced = N_DEFER_STEPS;
    set(&o->params, "K=4096");
    set(&o->params, "n_recent=4");
    set(&o->params, "n_sink=2");
    char kv[32];
    snprintf(kv, sizeof kv, "refresh_delay=%d", delay);
    set(&o->params, kv);
}

START_TEST(deferred_refresh_schedule)
{
    enum { N = N_DEFER_STEPS };
    const int(*want)[N_DEFER_STEPS] = defer_want;
    const int *delays = defer_delays;
    init_trig();
    sfi_qwen3 *m;
    sfi_error e;
    ck_assert_msg(sfi_qwen3_load(hf_path("tiny-qwen3"), &m, &e) == SFI_OK, "%s", e.msg);
    const sfi_model_config *c = sfi_qwen3_config(m);
    int n;
    int32_t *ids = prompt0("tiny-qwen3", &n);
    int32_t forced[N];
    defer_forced(forced);
    char digest[4][65];
    for (int di = 0; di < 4; di++) {
        sfi_decode_opts o;
        defer_opts(&o, forced, delays[di]);
        defer_rec r;
        memset(&r, 0, sizeof r);
        sfi_decode_observer obs = {
            .user = &r, .on_step = defer_on_step, .on_slow_layer = defer_on_slow_layer};
        sfi_decode_result res;
        ck_assert_msg(sfi_decode_run(m, &o, ids, n, &obs, &res, &e) == SFI_OK, "%s", e.msg);
        ck_assert_int_eq(res.n_generated, N);
        ck_assert_msg(r.bad == 0, "observer check at line %d", r.bad);
        const int64_t per = (int64_t)c->num_hidden_layers * c->num_key_value_heads;
        for (int t = 0; t < N; t++) {
            if (want[di][t] == SLOW) {
                ck_assert_int_eq(r.kinds[t], SFI_STEP_SLOW);
                ck_assert_int_eq(r.attended[t], per * (n + t));
            } else {
                ck_assert_int_eq(r.kinds[t], SFI_STEP_FAST);
                ck_assert_msg(r.attended[t] == per * (n + want[di][t]),
                              "d=%d step %d: attended %lld positions, want the sets of step %d "
                              "(%lld)",
                              delays[di], t, (long long)r.attended[t], want[di][t],
                              (long long)(per * (n + want[di][t])));
            }
        }
        /* every slow step's Selector ran (the prefill's too), deferred ones
         * flagged */
        ck_assert_int_eq(res.n_slow, 7);
        ck_assert_int_eq(r.n_slow_layer, c->num_hidden_layers * 7);
        ck_assert_int_eq(r.n_deferred, delays[di] ? c->num_hidden_layers * 6 : 0);
        memcpy(digest[di], res.digest_hex, 65);
        sfi_decode_result_free(&res);
    }
    for (int i = 0; i < 4; i++)
        for (int k = i + 1; k < 4; k++)
            ck_assert_str_ne(digest[i], digest[k]);
    free(ids);
    sfi_qwen3_free(m);
}
END_TEST

/* A summary trace of a deferred run records, at every fast step, the dense
 * mass over the fast set that step really used: with K above every |J|
 * that set is sink + [n_sink, n_ctx(t) - n_recent) + recent, t the slow
 * step in effect (the hand-worked schedule of deferred_refresh_schedule,
 * d = 2 and 3). */
typedef struct {
    float *probs[N_DEFER_STEPS][4]; /* [step][layer]: [n_heads][n_ctx] */
} probs_rec;

static sfi_status keep_probs(void *u, const sfi_decode_attention_info *ai, sfi_error *err)
{
    (void)err;
    probs_rec *r = u;
    if (ai->step >= 0 && ai->step < N_DEFER_STEPS && ai->layer < 4) {
        size_t n = (size_t)ai->n_heads * ai->n_ctx;
        float *p = malloc(n * sizeof(float));
        ck_assert_ptr_nonnull(p);
        memcpy(p, ai->probs, n * sizeof(float));
        free(r->probs[ai->step][ai->layer]);
        r->probs[ai->step][ai->layer] = p;
    }
    return SFI_OK;
}

START_TEST(deferred_refresh_trace_fast_mass)
{
    init_trig();
    sfi_qwen3 *m;
    sfi_error e;
    ck_assert_msg(sfi_qwen3_load(hf_path("tiny-qwen3"), &m, &e) == SFI_OK, "%s", e.msg);
    const sfi_model_config *c = sfi_qwen3_config(m);
    ck_assert_int_le(c->num_hidden_layers, 4);
    int n;
    int32_t *ids = prompt0("tiny-qwen3", &n);
    int32_t forced[N_DEFER_STEPS];
    defer_forced(forced);
    char *dir = sfi_test_tmpdir();
    ck_assert_ptr_nonnull(dir);
    for (int di = 1; di <= 2; di++) {
        sfi_decode_opts o;
        defer_opts(&o, forced, defer_delays[di]);
        /* the dense probabilities of every step */
        probs_rec pr;
        memset(&pr, 0, sizeof pr);
        sfi_decode_observer po = {.user = &pr, .want_attention = 1, .on_attention = keep_probs};
        sfi_decode_result res;
        ck_assert_msg(sfi_decode_run(m, &o, ids, n, &po, &res, &e) == SFI_OK, "%s", e.msg);
        sfi_decode_result_free(&res);
        /* the same run, recorded */
        char path[4096];
        snprintf(path, sizeof path, "%s/d%d.db", dir, defer_delays[di]);
        sfi_recorder_opts ro;
        sfi_recorder_opts_default(&ro);
        ro.path = path;
        ro.level = SFI_TRACE_SUMMARY;
        sfi_recorder *rec;
        ck_assert_msg(sfi_recorder_open(&ro, hf_path("tiny-qwen3"), c, &o, &rec, &e) == SFI_OK,
                      "%s", e.msg);
        sfi_decode_observer obs;
        sfi_recorder_observer(rec, &obs);
        ck_assert_msg(sfi_decode_run(m, &o, ids, n, &obs, &res, &e) == SFI_OK, "%s", e.msg);
        sfi_decode_result_free(&res);
        ck_assert_msg(sfi_recorder_finish(rec, &e) == SFI_OK, "%s", e.msg);
        sfi_trace *t;
        ck_assert_msg(sfi_trace_open(path, &t, &e) == SFI_OK, "%s", e.msg);
        const int H = c->num_attention_heads, KV = c->num_key_value_heads, G = H / KV;
        const int n_sink = o.params.n_sink, n_recent = o.params.n_recent;
        int checked = 0;
        for (int s = 1; s < N_DEFER_STEPS; s++) {
            int eff = defer_want[di][s];
            if (eff < 0)
                continue;
            int ctx = n + s, gap0 = n + eff - n_recent, gap1 = ctx - n_recent;
            for (int l = 0; l < c->num_hidden_layers; l++)
                for (int h = 0; h < KV; h++) {
                    ck_assert_ptr_nonnull(pr.probs[s][l]);
                    double want = 0.0;
                    for (int g = 0; g < G; g++) {
                        const float *p = pr.probs[s][l] + (size_t)(h * G + g) * ctx;
                        for (int j = 0; j < ctx; j++)
                            if (j < n_sink || j < gap0 || j >= gap1)
                                want += p[j];
                    }
                    want /= G;
                    float fm;
                    ck_assert_int_eq(sfi_trace_read_fast_mass(t, 0, s, l, h, &fm, &e), SFI_OK);
                    ck_assert_msg(fabs(fm - want) < 1e-5,
                                  "d=%d step %d layer %d kv %d: traced fast mass %g, want %g "
                                  "(the sets of step %d)",
                                  defer_delays[di], s, l, h, fm, want, eff);
                    checked++;
                }
        }
        ck_assert_int_gt(checked, 0);
        sfi_trace_close(t);
        for (int s = 0; s < N_DEFER_STEPS; s++)
            for (int l = 0; l < 4; l++)
                free(pr.probs[s][l]);
    }
    sfi_test_rmtree(dir);
    free(dir);
    free(ids);
    sfi_qwen3_free(m);
}
END_TEST

/* Every step slow (always policy): a deferred set is always dropped by
 * the next slow step and no step is fast, so the logits are those of
 * refresh_delay = 0 bit for bit; only the digest differs (the d = 0 run
 * hashes every step's sets as they take effect, the deferred run none
 * after the prefill's). The pinned digest fixes where deferred sets are
 * hashed (sfi-gpu run --check compares it). */
START_TEST(deferred_refresh_always_slow_and_golden)
{
    init_trig();
    sfi_decode_opts o;
    sfi_decode_opts_default(&o);
    o.max_new = 16;
    o.is_trigger = trig;
    o.n_trigger_vocab = 512;
    o.trigger = SFI_TRIG_ALWAYS;
    set(&o.params, "K=12");
    set(&o.params, "n_recent=8");
    rec r0, r2;
    sfi_decode_result a, b;
    run("tiny-qwen3-moe", &o, &r0, &a);
    set(&o.params, "refresh_delay=2");
    run("tiny-qwen3-moe", &o, &r2, &b);
    ck_assert_int_eq(a.n_slow, 16);
    ck_assert(memcmp(r0.logits, r2.logits, (size_t)16 * r0.vocab * 4) == 0);
    ck_assert_str_ne(a.digest_hex, b.digest_hex);
    free(r0.logits);
    free(r2.logits);
    sfi_decode_result_free(&a);
    sfi_decode_result_free(&b);
    /* a deferred run with fast steps, pinned */
    o.trigger = SFI_TRIG_INTERVAL;
    o.interval = 5;
    o.max_new = 24;
    run("tiny-qwen3", &o, &r2, &b);
    printf("digest tiny-qwen3 sfi refresh_delay=2 interval 5: %s\n", b.digest_hex);
    ck_assert_str_eq(b.digest_hex,
                     "45592ab2afeb7d442b5d904b724ab9fd98b951ccccbb7b82b93d6a4d0a330d8a");
    free(r2.logits);
    sfi_decode_result_free(&b);
}
END_TEST

/* A run from a shared prefix is the same run (digest, logits) as one that
 * prefills, in both modes and from one prefix for several runs; teacher
 * forcing with the greedy tokens is greedy decoding, and with other tokens
 * feeds them (the trigger policy sees the fed tokens). */
START_TEST(prefix_and_teacher_forcing)
{
    init_trig();
    for (int mi = 0; mi < 3; mi++) {
        sfi_qwen3 *m;
        sfi_error e;
        ck_assert_msg(sfi_qwen3_load(hf_path(models[mi]), &m, &e) == SFI_OK, "%s", e.msg);
        int n;
        int32_t *ids = prompt0(models[mi], &n);
        sfi_decode_prefix pre;
        ck_assert_msg(sfi_decode_prefix_build(m, SFI_BACKEND_SCALAR, ids, n, n, 16, &pre, &e) ==
                          SFI_OK,
                      "%s", e.msg);
        ck_assert_int_eq(pre.kv.n, n);
        for (int mode = 0; mode < 2; mode++) {
            sfi_decode_opts o;
            sfi_decode_opts_default(&o);
            o.mode = mode ? SFI_DECODE_DENSE : SFI_DECODE_SFI;
            o.max_new = 20;
            o.is_trigger = trig;
            o.n_trigger_vocab = 512;
            set(&o.params, "K=12");
            set(&o.params, "n_recent=8");
            set(&o.params, "T_max=6");
            sfi_decode_result a, b, f, g;
            ck_assert_msg(sfi_decode_run(m, &o, ids, n, NULL, &a, &e) == SFI_OK, "%s", e.msg);
            ck_assert_msg(sfi_decode_run_prefix(m, &o, &pre, NULL, &b, &e) == SFI_OK, "%s", e.msg);
            ck_assert_str_eq(a.digest_hex, b.digest_hex);
            /* forced = the greedy tokens: the same run */
            o.forced = a.ids;
            o.n_forced = a.n_generated;
            ck_assert_msg(sfi_decode_run_prefix(m, &o, &pre, NULL, &f, &e) == SFI_OK, "%s", e.msg);
            ck_assert_str_eq(a.digest_hex, f.digest_hex);
            /* forced = other tokens (every one a trigger): every step slow
             * in SFI mode, and the run differs */
            int32_t other[32];
            for (int t = 0; t < 32; t++)
                other[t] = (int32_t)(11 * ((a.ids[t % a.n_generated] + t) % 46));
            o.forced = other;
            o.n_forced = 19;
            ck_assert_msg(sfi_decode_run_prefix(m, &o, &pre, NULL, &g, &e) == SFI_OK, "%s", e.msg);
            ck_assert_str_ne(a.digest_hex, g.digest_hex);
            ck_assert_int_eq(g.n_slow, 20);
            o.n_forced = 18; /* too few */
            sfi_decode_result x;
            ck_assert_int_eq(sfi_decode_run_prefix(m, &o, &pre, NULL, &x, &e), SFI_EINVAL);
            ck_assert_ptr_nonnull(strstr(e.msg, "forced"));
            other[5] = 512;
            o.n_forced = 19;
            ck_assert_int_eq(sfi_decode_run_prefix(m, &o, &pre, NULL, &x, &e), SFI_ERANGE);
            sfi_decode_result_free(&a);
            sfi_decode_result_free(&b);
            sfi_decode_result_free(&f);
            sfi_decode_result_free(&g);
        }
        /* a prefix too short for the Selector's window is refused */
        sfi_decode_prefix small;
        ck_assert_int_eq(sfi_decode_prefix_build(m, SFI_BACKEND_SCALAR, ids, n, n, 4, &small, &e),
                         SFI_OK);
        sfi_decode_opts o;
        sfi_decode_opts_default(&o);
        sfi_decode_result x;
        ck_assert_int_eq(sfi_decode_run_prefix(m, &o, &small, NULL, &x, &e), SFI_EINVAL);
        /* (building into `small` again would lose its buffers: free first) */
        sfi_decode_prefix_free(&small);
        ck_assert_int_eq(
            sfi_decode_prefix_build(m, SFI_BACKEND_SCALAR, ids, n, n - 1, 4, &small, &e),
            SFI_ERANGE);
        sfi_decode_prefix_free(&small);
        sfi_decode_prefix_free(&pre);
        free(ids);
        sfi_qwen3_free(m);
        printf("%s: prefix runs == prefilled runs; teacher forcing checked\n", models[mi]);
    }
}
END_TEST

START_TEST(bad_requests_refused)
{
    sfi_qwen3 *m;
    sfi_error e;
    ck_assert_int_eq(sfi_qwen3_load(hf_path("tiny-qwen3"), &m, &e), SFI_OK);
    sfi_decode_opts o;
    sfi_decode_opts_default(&o);
    sfi_decode_result res;
    int32_t ids[300];
    for (int i = 0; i < 300; i++)
        ids[i] = i;
    o.max_new = 10;
    /* max_position_embeddings is 256 */
    ck_assert_int_eq(sfi_decode_run(m, &o, ids, 250, NULL, &res, &e), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "max_position_embeddings 256"));
    ck_assert_int_eq(sfi_decode_run(m, &o, ids, 0, NULL, &res, &e), SFI_EINVAL);
    ids[3] = 512;
    ck_assert_int_eq(sfi_decode_run(m, &o, ids, 5, NULL, &res, &e), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "token 3"));
    ids[3] = 3;
    o.max_new = 0;
    ck_assert_int_eq(sfi_decode_run(m, &o, ids, 5, NULL, &res, &e), SFI_EINVAL);
    o.max_new = 3;
    o.params.K = 0;
    ck_assert_int_ne(sfi_decode_run(m, &o, ids, 5, NULL, &res, &e), SFI_OK);
    sfi_qwen3_free(m);
    sfi_decode_mode m2;
    ck_assert_int_eq(sfi_decode_mode_parse("sparse", &m2, &e), SFI_EINVAL);
}
END_TEST

/* sfi-ref run: JSON output equals the library's result; errors exit 1/2
 * with a message. */
START_TEST(cli_run)
{
    /* sfi_test_build and sfi_test_src share a static buffer: copy */
    char sfi_ref[2048];
    snprintf(sfi_ref, sizeof sfi_ref, "%s", sfi_test_build("sfi-ref"));
    char *dir = sfi_test_tmpdir();
    char ids_path[2048], cmd[16384];
    snprintf(ids_path, sizeof ids_path, "%s/p.ids", dir);
    int n;
    int32_t *ids = prompt0("tiny-qwen3", &n);
    FILE *f = fopen(ids_path, "w");
    for (int i = 0; i < n; i++)
        fprintf(f, "%d%c", (int)ids[i], i % 10 == 9 ? '\n' : ' ');
    fclose(f);
    char *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd,
             "%s run --model %s --prompt-ids %s --max-new 12 --param K=12 "
             "--param n_recent=8 --param T_max=4 --json",
             sfi_ref, hf_path("tiny-qwen3"), ids_path);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    ck_assert_msg(j != NULL, "not JSON: %s", out);
    json_t *g = json_object_get(j, "generated_ids"), *steps = json_object_get(j, "steps");
    ck_assert_uint_eq(json_array_size(g), 12);
    ck_assert_uint_eq(json_array_size(steps), 12);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(steps, 0), "kind")), "slow");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(steps, 0), "reason")),
                     "first");
    /* same run through the library */
    sfi_qwen3 *m;
    sfi_error e;
    ck_assert_int_eq(sfi_qwen3_load(hf_path("tiny-qwen3"), &m, &e), SFI_OK);
    sfi_decode_opts o;
    sfi_decode_opts_default(&o);
    o.max_new = 12;
    set(&o.params, "K=12");
    set(&o.params, "n_recent=8");
    set(&o.params, "T_max=4");
    sfi_decode_result res;
    ck_assert_int_eq(sfi_decode_run(m, &o, ids, n, NULL, &res, &e), SFI_OK);
    for (int t = 0; t < 12; t++)
        ck_assert_int_eq(json_integer_value(json_array_get(g, (size_t)t)), res.ids[t]);
    ck_assert_str_eq(json_string_value(json_object_get(j, "digest")), res.digest_hex);
    ck_assert(fabs(json_real_value(json_object_get(j, "slow_fraction")) - res.slow_fraction) <
              1e-12);
    sfi_decode_result_free(&res);
    sfi_qwen3_free(m);
    json_decref(j);
    free(out);
    free(err);
    /* text output has the digest line and one line per step */
    snprintf(cmd, sizeof cmd, "%s run --model %s --prompt-ids %s --max-new 3 --mode dense", sfi_ref,
             hf_path("tiny-qwen3"), ids_path);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    ck_assert_ptr_nonnull(strstr(out, "\ndigest: "));
    ck_assert_ptr_nonnull(strstr(out, "  2 slow always "));
    ck_assert_ptr_nonnull(strstr(out, "slow_fraction: 1.000000 (3 of 3 steps)"));
    free(out);
    free(err);
    /* errors */
    struct {
        const char *args;
        int status;
        const char *msg;
    } bad[] = {
        {"--max-new 250", 1, "max_position_embeddings 256"},
        {"--max-new 0", 2, "--max-new '0'"},
        {"--max-new 3 --mode sparse", 2, "mode 'sparse'"},
        {"--max-new 3 --param K=-1", 2, "K"},
        {"--max-new 3 --backend gpu", 2, "backend 'gpu'"},
        {"--max-new 3 --bogus", 2, "--bogus"},
        /* recorder options that would be ignored */
        {"--max-new 3 --trace-layers 0", 2, "--trace-layers needs --trace FILE"},
        {"--max-new 3 --trace-top-m 8", 2, "--trace-top-m needs --trace FILE"},
        {"--max-new 3 --trace-level full", 2, "--trace-level needs --trace FILE"},
        /* the option once, not "--trace-top-m: --trace-top-m: ..." */
        {"--max-new 3 --trace-top-m 0", 2, "run: --trace-top-m: '0' is not an integer"},
        {"--max-new 3 --trace-level all", 2, "run: --trace-level: trace level 'all'"},
        {"--max-new 3 --trace-layers x", 2, "run: --trace-layers: 'x' is not"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s run --model %s --prompt-ids %s %s", sfi_ref,
                 hf_path("tiny-qwen3"), ids_path, bad[i].args);
        ck_assert_int_eq(sfi_test_run(cmd, &out, &err), bad[i].status);
        ck_assert_msg(strstr(err, bad[i].msg) != NULL, "%s: stderr '%s'", bad[i].args, err);
        free(out);
        free(err);
    }
    /* a prompt longer than max_position_embeddings, a bad ids file, no model,
     * text without a tokenizer */
    f = fopen(ids_path, "w");
    for (int i = 0; i < 300; i++)
        fprintf(f, "%d ", i);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s run --model %s --prompt-ids %s --max-new 1", sfi_ref,
             hf_path("tiny-qwen3"), ids_path);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_ptr_nonnull(
        strstr(err, "prompt of 300 tokens is longer than the model's max_position_embeddings 256"));
    free(out);
    free(err);
    f = fopen(ids_path, "w");
    fprintf(f, "1 2 x3\n");
    fclose(f);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_ptr_nonnull(strstr(err, "p.ids: id 3: 'x3' is not a decimal token id"));
    free(out);
    free(err);
    /* A NUL byte once ended the list silently (issue 20.6: prompt_tokens 2,
     * exit 0); an endless file is refused at the limit. */
    ck_assert_int_eq(sfi_test_write_file(ids_path, "5 6\0 7 8\n", 9), 0);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_msg(strstr(err, "p.ids: byte 3 is a NUL byte"), "%s", err);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s run --model %s --prompt-ids /dev/zero --max-new 1", sfi_ref,
             hf_path("tiny-qwen3"));
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_msg(strstr(err, "/dev/zero: more than 268435456 bytes is too large"), "%s", err);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s run --model %s/none --prompt-ids %s --max-new 1", sfi_ref, dir,
             ids_path);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_ptr_nonnull(strstr(err, "none"));
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s run --model %s --prompt hello --max-new 1", sfi_ref,
             hf_path("tiny-qwen3"));
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_ptr_nonnull(strstr(err, "no vocab.json"));
    free(out);
    free(err);
    /* a trace: written complete; an unwritable one is refused before decoding */
    f = fopen(ids_path, "w");
    fprintf(f, "5 6 7 8 9 10 11 12\n");
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "%s run --model %s --prompt-ids %s --max-new 6 --param K=2 "
             "--param n_recent=2 --param T_max=3 --trace %s/t.db --trace-level summary",
             sfi_ref, hf_path("tiny-qwen3"), ids_path, dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "test -s %s/t.db", dir);
    ck_assert_int_eq(sfi_test_run(cmd, NULL, NULL), 0);
    snprintf(cmd, sizeof cmd,
             "%s run --model %s --prompt-ids %s --max-new 6 --trace "
             "%s/no/such/dir/t.db",
             sfi_ref, hf_path("tiny-qwen3"), ids_path, dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_ptr_nonnull(strstr(err, "no/such/dir/t.db"));
    ck_assert_ptr_null(strstr(out, "digest"));
    free(out);
    free(err);
    /* --trace never replaces an input of the run or any file that is not
     * an sfi trace (issue 20.3); it does replace a finished trace. */
    snprintf(cmd, sizeof cmd, "cp -r %s %s/m && cp %s %s/p.copy", hf_path("tiny-qwen3"), dir,
             ids_path, dir);
    ck_assert_int_eq(sfi_test_run(cmd, NULL, NULL), 0);
    static const char *const inputs[] = {"m/model.safetensors", "m/config.json", "p.ids"};
    for (size_t i = 0; i < sizeof inputs / sizeof *inputs; i++) {
        snprintf(cmd, sizeof cmd, "%s run --model %s/m --prompt-ids %s --max-new 2 --trace %s/%s",
                 sfi_ref, dir, ids_path, dir, inputs[i]);
        ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
        ck_assert_msg(strstr(err, "is not an sfi trace; not replacing it"), "%s", err);
        free(out);
        free(err);
    }
    snprintf(cmd, sizeof cmd,
             "cmp %s/m/model.safetensors %s/model.safetensors && "
             "cmp %s/m/config.json %s/config.json && cmp %s %s/p.copy",
             dir, hf_path("tiny-qwen3"), dir, hf_path("tiny-qwen3"), ids_path, dir);
    ck_assert_int_eq(sfi_test_run(cmd, NULL, NULL), 0);
    snprintf(cmd, sizeof cmd, "%s run --model %s --prompt-ids %s --max-new 3 --trace %s/t.db",
             sfi_ref, hf_path("tiny-qwen3"), ids_path, dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    free(out);
    free(err);
    /* The recorder-to-analyzer path (issue 20.4): a full-level trace of
     * sfi-ref is complete (step 0 included) and sfi-sim analyze reads it;
     * one recorded with --trace-layers is refused with a message. */
    char sfi_sim[2048];
    snprintf(sfi_sim, sizeof sfi_sim, "%s", sfi_test_build("sfi-sim"));
    snprintf(cmd, sizeof cmd,
             "%s run --model %s --prompt-ids %s --max-new 10 --param K=2 "
             "--param n_recent=2 --param T_max=3 --trace %s/full.db --trace-level full "
             "--trace-top-m 6 && %s trace check %s/full.db && %s analyze %s/full.db --format json "
             "--budget 4",
             sfi_ref, hf_path("tiny-qwen3"), ids_path, dir, sfi_sim, dir, sfi_sim, dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    ck_assert_msg(strstr(out, "\"steps\": 10,") && strstr(out, "\"layers\": 3,"), "%s", out);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "sqlite3 %s/full.db 'SELECT count(*) FROM topm WHERE step = 0'", dir);
    if (sfi_test_run(cmd, &out, NULL) == 0) /* the sqlite3 program is optional here */
        ck_assert_msg(atoi(out) == 3 * 4, "step 0 top-M records: %s", out);
    free(out);
    snprintf(cmd, sizeof cmd,
             "%s run --model %s --prompt-ids %s --max-new 4 --trace %s/part.db "
             "--trace-level full --trace-layers 1 && %s analyze %s/part.db",
             sfi_ref, hf_path("tiny-qwen3"), ids_path, dir, sfi_sim, dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_msg(strstr(err, "top-M records of layers 1 only"), "%s", err);
    free(out);
    free(err);
    /* Issue 20.7. Every id of an eos_token_id list stops --stop-at-eos
     * (the later ones were unchecked and unused). */
    snprintf(cmd, sizeof cmd, "%s run --model %s/m --prompt-ids %s --max-new 6 --json", sfi_ref,
             dir, ids_path);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    json_t *gj = json_loads(out, 0, NULL);
    ck_assert_ptr_nonnull(gj);
    json_t *gen = json_object_get(gj, "generated_ids");
    int gid[6], stop_at = -1;
    for (int i = 0; i < 6; i++)
        gid[i] = (int)json_integer_value(json_array_get(gen, (size_t)i));
    json_decref(gj);
    free(out);
    free(err);
    for (int i = 1; i < 6 && stop_at < 0; i++) {
        int seen = 0;
        for (int k = 0; k < i; k++)
            seen |= gid[k] == gid[i];
        if (!seen)
            stop_at = i;
    }
    if (stop_at > 0) {
        int never = 0;
        for (int c = 0; c < 512; c++) {
            int used = 0;
            for (int k = 0; k < 6; k++)
                used |= gid[k] == c;
            if (!used) {
                never = c;
                break;
            }
        }
        char cfgp[4200];
        snprintf(cfgp, sizeof cfgp, "%s/m/config.json", dir);
        json_t *cj = json_load_file(cfgp, 0, NULL);
        ck_assert_ptr_nonnull(cj);
        json_t *eos = json_array();
        json_array_append_new(eos, json_integer(never));
        json_array_append_new(eos, json_integer(gid[stop_at]));
        json_object_set_new(cj, "eos_token_id", eos);
        ck_assert_int_eq(json_dump_file(cj, cfgp, 0), 0);
        json_decref(cj);
        snprintf(cmd, sizeof cmd,
                 "%s run --model %s/m --prompt-ids %s --max-new 6 --json "
                 "--stop-at-eos",
                 sfi_ref, dir, ids_path);
        ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
        gj = json_loads(out, 0, NULL);
        ck_assert_ptr_nonnull(gj);
        ck_assert_int_eq(json_array_size(json_object_get(gj, "generated_ids")), stop_at + 1);
        json_decref(gj);
        free(out);
        free(err);
    }
    /* NaN weights: refused at load, naming the tensor (they printed "!!!!"
     * and exited 0). */
    snprintf(cmd, sizeof cmd,
             "cp -r %s %s/nan && printf '\\377\\377\\377\\377' | "
             "dd of=%s/nan/model.safetensors bs=1 seek=$(( $(stat -c %%s %s/nan/model.safetensors) "
             "- 4 )) conv=notrunc 2>/dev/null && %s run --model %s/nan --prompt-ids %s --max-new 2",
             hf_path("tiny-qwen3"), dir, dir, dir, sfi_ref, dir, ids_path);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_msg(strstr(err, "is NaN; weights must be finite"), "%s", err);
    ck_assert_ptr_null(strstr(out, "digest"));
    free(out);
    free(err);
    /* A tokenizer with more ids than the model's vocabulary (512 here). */
    char big_tok[2048];
    snprintf(big_tok, sizeof big_tok, "%s",
             sfi_test_src("tests/fixtures/sfi-small-qwen3-tokenizer"));
    snprintf(cmd, sizeof cmd, "%s run --model %s --tokenizer %s --prompt hello --max-new 2",
             sfi_ref, hf_path("tiny-qwen3"), big_tok);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_msg(strstr(err, "past the model's vocab_size 512: not this model's tokenizer"), "%s",
                  err);
    free(out);
    free(err);
    /* standard output that cannot be written */
    snprintf(cmd, sizeof cmd, "%s run --model %s --prompt-ids %s --max-new 2 > /dev/full", sfi_ref,
             hf_path("tiny-qwen3"), ids_path);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_ptr_nonnull(strstr(err, "standard output"));
    free(out);
    free(err);
    free(ids);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

/* Writes a byte-level tokenizer of 512 tokens (the fixtures' vocab_size)
 * to dir: ids 0..255 the single bytes, 256..511 byte b twice. */
static void write_byte_tokenizer(const char *dir)
{
    json_t *v = json_object();
    for (int id = 0; id < 512; id++) {
        char key[8];
        size_t k = 0;
        for (int rep = 0; rep < (id < 256 ? 1 : 2); rep++) {
            uint32_t cp = sfi_unicode_of_byte((uint8_t)(id & 255));
            if (cp < 0x80) {
                key[k++] = (char)cp;
            } else {
                key[k++] = (char)(0xC0 | (cp >> 6));
                key[k++] = (char)(0x80 | (cp & 63));
            }
        }
        key[k] = 0;
        json_object_set_new(v, key, json_integer(id));
    }
    char path[2048];
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    ck_assert_int_eq(json_dump_file(v, path, 0), 0);
    json_decref(v);
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    ck_assert_int_eq(sfi_test_write_file(path, "#version: 0.2\n", 14), 0);
}

/* sfi-ref run --json with a byte-level tokenizer: the generated bytes need
 * not be UTF-8 (they once made json_dumps fail, "out of memory"); the JSON
 * text holds them with U+FFFD for each stray byte. */
START_TEST(cli_run_json_text_not_utf8)
{
    char sfi_ref[2048];
    snprintf(sfi_ref, sizeof sfi_ref, "%s", sfi_test_build("sfi-ref"));
    char *dir = sfi_test_tmpdir();
    write_byte_tokenizer(dir);
    char ids_path[2048], cmd[16384];
    snprintf(ids_path, sizeof ids_path, "%s/p.ids", dir);
    int n;
    int32_t *ids = prompt0("tiny-qwen3", &n);
    FILE *f = fopen(ids_path, "w");
    for (int i = 0; i < n; i++)
        fprintf(f, "%d ", (int)ids[i]);
    fclose(f);
    free(ids);
    char *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd,
             "%s run --model %s --tokenizer %s --prompt-ids %s --max-new 24 "
             "--json",
             sfi_ref, hf_path("tiny-qwen3"), dir, ids_path);
    ck_assert_msg(sfi_test_run(cmd, &out, &err) == 0, "%s", err);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    ck_assert_msg(j != NULL, "not JSON: %s", out);
    const char *text = json_string_value(json_object_get(j, "text"));
    ck_assert_ptr_nonnull(text);
    /* the run's bytes, decoded here: not UTF-8, and cleaned as the JSON has them */
    json_t *g = json_object_get(j, "generated_ids");
    char raw[64];
    size_t nr = 0;
    for (size_t t = 0; t < json_array_size(g); t++) {
        int id = (int)json_integer_value(json_array_get(g, t));
        for (int rep = 0; rep < (id < 256 ? 1 : 2) && nr < sizeof raw; rep++)
            raw[nr++] = (char)(id & 255);
    }
    size_t nc;
    char *clean = sfi_utf8_clean(raw, nr, &nc);
    ck_assert_ptr_nonnull(strstr(clean, "\xEF\xBF\xBD")); /* the case this test is for */
    ck_assert_uint_eq(json_string_length(json_object_get(j, "text")), nc);
    ck_assert_mem_eq(text, clean, nc);
    free(clean);
    json_decref(j);
    free(out);
    free(err);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("decode");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, sfi_covering_context_equals_dense);
    tcase_add_test(tc, step_kinds_follow_the_trigger_policy);
    tcase_add_test(tc, golden_digests);
    tcase_add_test(tc, deferred_refresh_schedule);
    tcase_add_test(tc, deferred_refresh_always_slow_and_golden);
    tcase_add_test(tc, deferred_refresh_trace_fast_mass);
    tcase_add_test(tc, prefix_and_teacher_forcing);
    tcase_add_test(tc, bad_requests_refused);
    tcase_add_test(tc, cli_run);
    tcase_add_test(tc, cli_run_json_text_not_utf8);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
