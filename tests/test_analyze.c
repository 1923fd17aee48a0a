/* The analyzer engine on in-memory traces with known answers, and
 * `sfi-sim analyze` end to end on small trace files. */
#include <config.h>

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_analyze.h"
#include "sfi_analyze_synth.h"
#include "sfi_test_util.h"
#include "sfi_trace.h"

/* An in-memory source: obs[(step * L + layer) * H + head] with up to 8
 * entries each. */
enum { MAXS = 64, MAXL = 2, MAXH = 2, MAXE = 8 };
typedef struct {
    int L, H, S;
    int32_t n_ctx[MAXS];
    uint8_t trig[MAXS];
    int seq[2];
    int n[MAXS * MAXL * MAXH];
    int32_t pos[MAXS * MAXL * MAXH][MAXE];
    float prob[MAXS * MAXL * MAXH][MAXE];
    float tail[MAXS * MAXL * MAXH];
    /* snapshot of step 0, layer 0 */
    int d, nq;
    float q[64], k[64 * 64], v[64 * 64];
} mem;

static int mem_get(void *ctx, int step, int layer, int kvh, sfi_policy_obs *o, int32_t *pb,
                   float *qb, sfi_error *err)
{
    (void)pb;
    (void)qb;
    (void)err;
    mem *m = ctx;
    int i = (step * m->L + layer) * m->H + kvh;
    o->n_ctx = m->n_ctx[step];
    o->n_top = m->n[i];
    o->pos = m->pos[i];
    o->prob = m->prob[i];
    o->tail = m->tail[i];
    return 0;
}

static int mem_snap(void *ctx, int step, int layer, const float **q, const float **k,
                    const float **v)
{
    mem *m = ctx;
    if (step != 0 || layer != 0 || !m->d)
        return 0;
    *q = m->q;
    *k = m->k;
    *v = m->v;
    return 1;
}

static void mem_source(mem *m, sfi_analyze_source *s)
{
    memset(s, 0, sizeof *s);
    s->n_layers = m->L;
    s->n_kv_heads = m->H;
    s->n_steps = m->S;
    s->n_seq = 1;
    m->seq[0] = 0;
    m->seq[1] = m->S;
    s->seq_begin = m->seq;
    s->n_ctx = m->n_ctx;
    s->trigger = m->trig;
    s->max_ctx = 0;
    for (int t = 0; t < m->S; t++)
        if (m->n_ctx[t] > s->max_ctx)
            s->max_ctx = m->n_ctx[t];
    s->max_top = MAXE;
    s->get = mem_get;
    s->ctx = m;
    if (m->d) {
        s->n_heads = m->nq;
        s->head_dim = m->d;
        s->snapshot = mem_snap;
    }
}

static void set_obs(mem *m, int t, int l, int h, int n, const int32_t *pos, const float *prob)
{
    int i = (t * m->L + l) * m->H + h;
    m->n[i] = n;
    float s = 0;
    for (int e = 0; e < n; e++)
        m->pos[i][e] = pos[e], m->prob[i][e] = prob[e], s += prob[e];
    m->tail[i] = s < 1.0f ? 1.0f - s : 0.0f;
}

/* 10 steps over 50..59 positions; entries: sink 0 (0.5), the current
 * token (0.3), position 20 (0.1); tail 0.1. */
static mem *simple(void)
{
    mem *m = calloc(1, sizeof *m);
    m->L = 1;
    m->H = 1;
    m->S = 10;
    for (int t = 0; t < m->S; t++) {
        m->n_ctx[t] = 50 + t;
        int32_t pos[3] = {0, m->n_ctx[t] - 1, 20};
        float prob[3] = {0.5f, 0.3f, 0.1f};
        set_obs(m, t, 0, 0, 3, pos, prob);
    }
    m->trig[4] = 1;
    return m;
}

static sfi_analyze_opts opts(unsigned mask, int budget)
{
    sfi_analyze_opts o;
    sfi_analyze_opts_default(&o);
    o.policies = mask;
    o.budget.ratio = 0;
    o.budget.positions = budget;
    o.n_threads = 1;
    o.cfg.prm.n_recent = 6;
    return o;
}

START_TEST(known_recall_overlap_ratio)
{
    mem *m = simple();
    sfi_analyze_source src;
    mem_source(m, &src);
    sfi_analyze_opts o = opts((1u << SFI_POLICY_FULL) | (1u << SFI_POLICY_ORACLE) |
                              (1u << SFI_POLICY_STREAMING), 10);
    sfi_analyze_result r;
    sfi_error e;
    ck_assert_msg(sfi_analyze_run(&src, &o, &r, &e) == SFI_OK, "%s", e.msg);
    double want_s = 0.0, want_o = 0.0;
    for (int t = 0; t < 10; t++) {
        want_s += 0.8 + 0.1 * 8.0 / (50 + t - 3);
        want_o += 0.9 + 0.1 * 7.0 / (50 + t - 3);
    }
    const sfi_analyze_policy *f = &r.pol[SFI_POLICY_FULL], *s = &r.pol[SFI_POLICY_STREAMING],
                             *orc = &r.pol[SFI_POLICY_ORACLE];
    ck_assert_double_eq_tol(f->n, 10, 1e-9);
    ck_assert_double_eq_tol(f->recall / f->n, 1.0, 1e-6);
    ck_assert_double_eq_tol(f->ratio / f->n, 1.0, 1e-12);
    ck_assert_double_eq_tol(s->recall / s->n, want_s / 10, 1e-6);
    ck_assert_double_eq_tol(s->recall_lo / s->n, 0.8, 1e-6);
    /* the top 3 are 0, current, 20: streaming has 2 of them */
    ck_assert_double_eq_tol(s->overlap / s->n, 2.0 / 3.0, 1e-9);
    ck_assert_double_eq_tol(orc->recall / orc->n, want_o / 10, 1e-6);
    ck_assert_double_eq_tol(orc->overlap / orc->n, 1.0, 1e-12);
    double ratio = 0.0;
    for (int t = 0; t < 10; t++)
        ratio += 10.0 / (50 + t);
    ck_assert_double_eq_tol(orc->ratio / orc->n, ratio / 10, 1e-9);
    ck_assert(!r.pol[SFI_POLICY_H2O].used);
    sfi_analyze_result_free(&r);
    free(m);
}
END_TEST

START_TEST(sfi_slow_steps_and_fast_recall)
{
    mem *m = simple();
    sfi_analyze_source src;
    mem_source(m, &src);
    /* B = 12: sink 4 + recent 6 + K = 2 selected; the Selector sees 20
     * as J's heaviest position. Slow at step 0 and after the trigger
     * (x_4 ends a sentence): step 5. */
    sfi_analyze_opts o = opts((1u << SFI_POLICY_SFI) | (1u << SFI_POLICY_STREAMING), 12);
    sfi_analyze_result r;
    sfi_error e;
    ck_assert_msg(sfi_analyze_run(&src, &o, &r, &e) == SFI_OK, "%s", e.msg);
    const sfi_analyze_policy *p = &r.pol[SFI_POLICY_SFI];
    ck_assert_double_eq_tol(p->n_slow, 2, 1e-9);
    ck_assert_double_eq_tol(p->n_steps, 10, 1e-9);
    ck_assert_double_eq_tol(p->fast_n, 8, 1e-9);
    /* fast steps keep 0, the current token and 20: recall >= 0.9 */
    ck_assert(p->fast_recall / p->fast_n >= 0.9);
    ck_assert(p->fast_recall / p->fast_n > r.pol[SFI_POLICY_STREAMING].recall /
                                               r.pol[SFI_POLICY_STREAMING].n);
    /* before the trigger's slow step: step 4 (fast); after: step 6 */
    ck_assert_double_eq_tol(p->before_n, 1, 1e-9);
    ck_assert_double_eq_tol(p->after_n, 1, 1e-9);
    /* recall by steps since the slow step: steps 1..4 and 6..9 */
    ck_assert_double_eq_tol(p->since_n[1], 2, 1e-9);
    ck_assert_double_eq_tol(p->since_n[4], 2, 1e-9);
    sfi_analyze_result_free(&r);
    free(m);
}
END_TEST

START_TEST(stability_within_vs_across)
{
    mem *m = calloc(1, sizeof *m);
    m->L = 1;
    m->H = 2;
    m->S = 10;
    for (int t = 0; t < 10; t++) {
        m->n_ctx[t] = 100 + t;
        int32_t a[3] = {10, 11, 12}, b[3] = {30, 31, 32};
        float pr[3] = {0.3f, 0.2f, 0.1f};
        for (int h = 0; h < 2; h++)
            set_obs(m, t, 0, h, 3, t < 5 ? a : b, pr);
    }
    m->trig[4] = 1; /* pair (4,5) crosses a boundary */
    sfi_analyze_source src;
    mem_source(m, &src);
    sfi_analyze_opts o = opts(1u << SFI_POLICY_FULL, 3);
    sfi_analyze_result r;
    sfi_error e;
    ck_assert_msg(sfi_analyze_run(&src, &o, &r, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(r.jw_n[0], 16);
    ck_assert_int_eq(r.ja_n[0], 2);
    ck_assert_double_eq_tol(r.jw_sum[0] / r.jw_n[0], 1.0, 1e-9);
    ck_assert_double_eq_tol(r.ja_sum[0] / r.ja_n[0], 0.0, 1e-9);
    ck_assert_double_eq_tol(sfi_analyze_quantile(r.jw[0], r.jw_n[0], 0.5), 1.0, 1e-9);
    sfi_analyze_result_free(&r);
    free(m);
}
END_TEST

START_TEST(output_error_on_snapshots)
{
    mem *m = simple();
    m->d = 4;
    m->nq = 2; /* two query heads share the one KV head */
    unsigned s = 1;
    for (int i = 0; i < 64 * 64; i++) {
        s = s * 1103515245u + 12345u;
        m->k[i] = (float)((s >> 16) & 1023) / 512.0f - 1.0f;
        s = s * 1103515245u + 12345u;
        m->v[i] = (float)((s >> 16) & 1023) / 512.0f - 1.0f;
    }
    for (int i = 0; i < 8; i++)
        m->q[i] = 4.0f * (0.5f * (float)(i % 3) - 0.4f); /* peaked attention */
    /* Step 0's record: the true top 3 of the snapshot's attention (mean
     * over the two query heads), so that the oracle is the real one. */
    {
        double pr[50] = {0};
        for (int g = 0; g < 2; g++) {
            double l[50], mx = -1e30, z = 0;
            for (int j = 0; j < 50; j++) {
                l[j] = 0;
                for (int x = 0; x < 4; x++)
                    l[j] += (double)m->q[g * 4 + x] * m->k[j * 4 + x];
                l[j] /= 2.0; /* sqrt(head_dim) */
                if (l[j] > mx)
                    mx = l[j];
            }
            for (int j = 0; j < 50; j++)
                z += exp(l[j] - mx);
            for (int j = 0; j < 50; j++)
                pr[j] += exp(l[j] - mx) / z / 2;
        }
        int32_t top[3];
        float tp[3];
        for (int r = 0; r < 3; r++) {
            int b = -1;
            for (int j = 0; j < 50; j++)
                if ((b < 0 || pr[j] > pr[b]) && (r < 1 || j != top[0]) && (r < 2 || j != top[1]))
                    b = j;
            top[r] = b;
            tp[r] = (float)pr[b];
        }
        set_obs(m, 0, 0, 0, 3, top, tp);
    }
    sfi_analyze_source src;
    mem_source(m, &src);
    sfi_analyze_opts o = opts((1u << SFI_POLICY_FULL) | (1u << SFI_POLICY_STREAMING) |
                              (1u << SFI_POLICY_FASA) | (1u << SFI_POLICY_ORACLE), 10);
    o.cfg.fasa_tip = 1;
    o.cfg.fasa_calib_k = 5;
    sfi_analyze_result r;
    sfi_error e;
    ck_assert_msg(sfi_analyze_run(&src, &o, &r, &e) == SFI_OK, "%s", e.msg);
    ck_assert_double_eq_tol(r.pol[SFI_POLICY_FULL].n_err, 1, 1e-9);
    ck_assert_double_eq_tol(r.pol[SFI_POLICY_FULL].out_err, 0.0, 1e-6);
    ck_assert(r.pol[SFI_POLICY_STREAMING].out_err > 1e-3);
    /* the oracle's 7 unnamed members are the next positions of the exact
     * dense ranking: its error is below the streaming window's */
    ck_assert_double_eq_tol(r.pol[SFI_POLICY_ORACLE].n_err, 1, 1e-9);
    ck_assert_msg(r.pol[SFI_POLICY_ORACLE].out_err < r.pol[SFI_POLICY_STREAMING].out_err,
                  "oracle %g streaming %g", r.pol[SFI_POLICY_ORACLE].out_err,
                  r.pol[SFI_POLICY_STREAMING].out_err);
    /* FASA acts only on the snapshot step */
    ck_assert(r.pol[SFI_POLICY_FASA].available);
    ck_assert_double_eq_tol(r.pol[SFI_POLICY_FASA].n, 1, 1e-9);
    sfi_analyze_result_free(&r);
    free(m);
}
END_TEST

START_TEST(threads_do_not_change_results)
{
    sfi_analyze_synth syn;
    sfi_error e;
    ck_assert_int_eq(sfi_analyze_synth_init(&syn, 4, 2, 60, 3000, 16, 10, &e), SFI_OK);
    sfi_analyze_source src;
    sfi_analyze_synth_source(&syn, &src);
    sfi_analyze_opts o;
    sfi_analyze_opts_default(&o);
    o.budget.ratio = 0.1;
    sfi_analyze_result r1, r2;
    o.n_threads = 1;
    ck_assert_msg(sfi_analyze_run(&src, &o, &r1, &e) == SFI_OK, "%s", e.msg);
    o.n_threads = 2;
    ck_assert_msg(sfi_analyze_run(&src, &o, &r2, &e) == SFI_OK, "%s", e.msg);
    ck_assert_mem_eq(r1.pol, r2.pol, sizeof r1.pol);
    /* 4 layers: ceil(5 * 4 / 36) = 1 anchor besides the dense layer 0,
     * planned from the trace itself for want of a calibration. */
    ck_assert_int_eq(r1.n_kascade_anchors, 1);
    ck_assert_int_eq(r1.kascade_anchors[0], 1);
    ck_assert_int_eq(r1.kascade_proxy, 1);
    ck_assert_ptr_nonnull(r1.pol[SFI_POLICY_KASCADE].proxy);
    /* the synthetic support is stable within sentences */
    double jw = 0, ja = 0;
    long nw = 0, na = 0;
    for (int l = 0; l < 4; l++)
        jw += r1.jw_sum[l], ja += r1.ja_sum[l], nw += r1.jw_n[l], na += r1.ja_n[l];
    ck_assert(na > 0 && nw > 0);
    ck_assert(jw / nw > ja / na + 0.2);
    /* the oracle is the best a set of this size can do */
    const sfi_analyze_policy *orc = &r1.pol[SFI_POLICY_ORACLE];
    for (int k = 0; k < SFI_POLICY_N_KINDS; k++) {
        const sfi_analyze_policy *p = &r1.pol[k];
        if (!p->available || k == SFI_POLICY_FULL || k == SFI_POLICY_SFI || k == SFI_POLICY_KASCADE ||
            k == SFI_POLICY_QUEST || k == SFI_POLICY_LFPS)
            continue; /* those may keep more than B or attend densely */
        ck_assert_msg(p->recall_lo / p->n <= orc->recall_lo / orc->n + 1e-9, "%s",
                      sfi_policy_kind_name((sfi_policy_kind)k));
    }
    sfi_analyze_result_free(&r1);
    sfi_analyze_result_free(&r2);
    sfi_analyze_synth_free(&syn);
}
END_TEST

START_TEST(bad_records_are_named)
{
    mem *m = simple();
    m->pos[3][2] = 500; /* step 3: position past the context */
    sfi_analyze_source src;
    mem_source(m, &src);
    sfi_analyze_opts o = opts(1u << SFI_POLICY_ORACLE, 10);
    sfi_analyze_result r;
    sfi_error e;
    ck_assert_int_eq(sfi_analyze_run(&src, &o, &r, &e), SFI_EFORMAT);
    ck_assert_msg(strstr(e.msg, "step 3 layer 0 head 0") != NULL, "%s", e.msg);
    m->pos[3][2] = 20;
    src.n_steps = 0;
    ck_assert_int_eq(sfi_analyze_run(&src, &o, &r, &e), SFI_EINVAL);
    ck_assert_msg(strstr(e.msg, "no attention records") != NULL, "%s", e.msg);
    free(m);
}
END_TEST

/* A small full-level trace: 2 layers x 2 KV heads (4 query heads, dim 4),
 * top-4 records, one request of 30 steps over 40..69 positions; token 3
 * ends a sentence (steps after it are recorded as trigger slow steps);
 * q/K/V snapshots at step 5 of layer 0. level/policy are for bad cases. */
static char *write_trace(const char *dir, const char *name, sfi_trace_level level,
                         const char *policy)
{
    char *path = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(path, "%s/%s", dir, name);
    sfi_trace_meta m;
    sfi_trace_meta_init(&m);
    m.tool = "test_analyze";
    m.tool_version = "0";
    m.policy = policy;
    m.level = level;
    m.n_vocab = 16;
    m.n_layers = 2;
    m.n_heads = 4;
    m.n_kv_heads = 2;
    m.head_dim = 4;
    m.top_m = 4;
    m.topm_heads = SFI_TRACE_HEADS_KV;
    sfi_trace_writer *w;
    sfi_error e;
    ck_assert_msg(sfi_trace_create(path, &m, SFI_TRACE_OVERWRITE, 0, &w, &e) == SFI_OK, "%s",
                  e.msg);
    int32_t prompt[10] = {1, 2, 4, 5, 6, 7, 8, 9, 10, 11};
    int64_t req;
    ck_assert_int_eq(sfi_trace_add_request(w, prompt, 10, &req, &e), SFI_OK);
    int32_t prev = -1;
    for (int t = 0; t < 30; t++) {
        int32_t ctx = 40 + t, tok = (t * 5) % 7 + 1;
        sfi_step_kind k = t == 0 || prev == 3 ? SFI_STEP_SLOW : SFI_STEP_FAST;
        sfi_step_reason r = t == 0 ? SFI_REASON_FIRST : prev == 3 ? SFI_REASON_TRIGGER
                                                                 : SFI_REASON_NONE;
        ck_assert_msg(sfi_trace_append_step(w, req, t, ctx, tok, k, r, &e) == SFI_OK, "%s",
                      e.msg);
        prev = tok;
        if (level != SFI_TRACE_FULL)
            continue;
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 2; h++) {
                int32_t pos[4] = {0, ctx - 1, 10 + h + l + (t / 8) * 3, 25 - h};
                float prob[4] = {0.4f, 0.3f, 0.1f, 0.05f};
                ck_assert_msg(sfi_trace_add_topm(w, req, t, l, h, pos, prob, 4, 0.15f, &e) ==
                              SFI_OK, "%s", e.msg);
            }
        if (t == 5) {
            float q[16], *kv = malloc(sizeof(float) * 2 * ctx * 4);
            for (int i = 0; i < 16; i++)
                q[i] = 0.1f * (float)(i % 5) - 0.2f;
            for (int i = 0; i < 2 * ctx * 4; i++)
                kv[i] = 0.01f * (float)((i * 37) % 101) - 0.5f;
            ck_assert_int_eq(sfi_trace_add_snapshot(w, req, t, 0, 'q', 4, 4, q, &e), SFI_OK);
            ck_assert_int_eq(sfi_trace_add_snapshot(w, req, t, 0, 'k', 2 * ctx, 4, kv, &e),
                             SFI_OK);
            for (int i = 0; i < 2 * ctx * 4; i++)
                kv[i] = -kv[i] * 0.5f;
            ck_assert_int_eq(sfi_trace_add_snapshot(w, req, t, 0, 'v', 2 * ctx, 4, kv, &e),
                             SFI_OK);
            free(kv);
        }
    }
    ck_assert_msg(sfi_trace_finish(w, &e) == SFI_OK, "%s", e.msg);
    return path;
}

/* Under LeakSanitizer, fontconfig's process-lifetime caches (reached
 * through cairo's text when a PNG is drawn) read as leaks; they are not
 * ours, so a suppression file names that library only. */
static int run_cli(const char *dir, const char *args, char **out, char **errs)
{
    char supp[4096];
    snprintf(supp, sizeof supp, "%s/lsan.supp", dir);
    ck_assert_int_eq(sfi_test_write_file(supp, "leak:libfontconfig\n", 19), 0);
    const char *lo = getenv("LSAN_OPTIONS");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "LSAN_OPTIONS='%s%ssuppressions=%s' '%s' analyze %s", lo ? lo : "",
             lo && *lo ? ":" : "", supp, sfi_test_build("sfi-sim"), args);
    return sfi_test_run(cmd, out, errs);
}

START_TEST(cli_end_to_end)
{
    char *dir = sfi_test_tmpdir();
    char *tr = write_trace(dir, "full.db", SFI_TRACE_FULL, "sfi");
    char args[4096], *out = NULL, *errs = NULL;
    snprintf(args, sizeof args, "'%s' --budget 0.25 --param kascade_anchors=2 --param fasa_tip=1 "
             "--param fasa_calib_k=4 --param n_recent=4 --format json", tr);
    int rc = run_cli(dir, args, &out, &errs);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, errs);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    ck_assert_msg(j != NULL, "not JSON: %s", out);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "steps")), 30);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "snapshots")), 1);
    json_t *pols = json_object_get(j, "policies");
    ck_assert_int_eq(json_array_size(pols), SFI_POLICY_N_KINDS);
    for (size_t i = 0; i < json_array_size(pols); i++) {
        json_t *p = json_array_get(pols, i);
        const char *nm = json_string_value(json_object_get(p, "name"));
        ck_assert(json_is_true(json_object_get(p, "available")));
        double rec = json_real_value(json_object_get(p, "recall"));
        ck_assert_msg(rec > 0.0 && rec <= 1.0 + 1e-9, "%s recall %g", nm, rec);
        if (!strcmp(nm, "full")) {
            ck_assert_double_eq_tol(rec, 1.0, 1e-6);
            ck_assert_double_eq_tol(json_real_value(json_object_get(p, "out_err")), 0.0, 1e-5);
        }
        if (!strcmp(nm, "fasa")) /* only the snapshot step: 2 heads */
            ck_assert_double_eq_tol(json_real_value(json_object_get(p, "n")), 2.0, 1e-9);
    }
    /* token 3 is produced at steps 6, 13, 20, 27: slow steps 0, 7, 14, 21, 28 */
    json_t *sfi = json_object_get(j, "sfi");
    ck_assert_double_eq_tol(json_real_value(json_object_get(sfi, "slow_fraction")), 5.0 / 30,
                            1e-9);
    json_t *st = json_object_get(j, "stability");
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(st, "across"), "n")),
                     4 * 4);
    json_decref(j);
    free(out);
    free(errs);
    /* CSV and table, and the pictures */
    snprintf(args, sizeof args, "'%s' --budget 12 --policies oracle,sfi --format csv", tr);
    ck_assert_int_eq(run_cli(dir, args, &out, &errs), 0);
    ck_assert_msg(!strncmp(out, "section,name,layer,metric,value\n", 32), "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "policy,oracle,,recall,"));
    ck_assert_ptr_null(strstr(out, "policy,h2o"));
    free(out);
    free(errs);
    snprintf(args, sizeof args, "'%s' --policies streaming,sfi --layer 1 --head 1 "
             "--png-prefix '%s/pic'", tr, dir);
    rc = run_cli(dir, args, &out, &errs);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, errs);
    ck_assert_ptr_nonnull(strstr(out, "support stability"));
    static const char *const pics[] = {"support", "recall-budget", "stability"};
    for (int i = 0; i < 3; i++) {
        char pth[4096];
        snprintf(pth, sizeof pth, "%s/pic-%s.png", dir, pics[i]);
        size_t n;
        char *png = sfi_test_read_file(pth, &n);
        ck_assert_msg(png && n > 1000 && !memcmp(png, "\x89PNG", 4), "%s", pth);
        free(png);
    }
    free(out);
    free(errs);
    free(tr);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(cli_bad_input)
{
    char *dir = sfi_test_tmpdir();
    char *full = write_trace(dir, "full.db", SFI_TRACE_FULL, "sfi");
    char *tok = write_trace(dir, "tokens.db", SFI_TRACE_TOKENS, "sfi");
    char *alw = write_trace(dir, "always.db", SFI_TRACE_FULL, "always");
    char junk[4096];
    snprintf(junk, sizeof junk, "%s/junk.db", dir);
    ck_assert_int_eq(sfi_test_write_file(junk, "not a database at all", 21), 0);
    struct {
        const char *fmt;
        const char *file;
        int rc;
        const char *msg;
    } cases[] = {
        {"'%s'", tok, 1, "full-level trace"},
        {"'%s'", alw, 1, "--vocab"},
        {"'%s'", junk, 1, "junk.db"},
        {"'%s.missing'", full, 1, "missing"},
        {"'%s' --budget 1.5", full, 2, "--budget"},
        {"'%s' --budget 0", full, 2, "--budget"},
        {"'%s' --policies oracle,bogus", full, 2, "bogus"},
        {"'%s' --layer 2", full, 2, "2 layers"},
        {"'%s' --format xml", full, 2, "xml"},
        {"'%s' --param nope=1", full, 2, "nope"},
        {"'%s' --request 3", full, 1, "request 3"},
        {"'%s' --frobnicate", full, 2, "--frobnicate"},
        /* the figures' directory must exist: said before the analysis */
        {"'%s' --png-prefix /nonexistent-sfi-dir/x", full, 1,
         "--png-prefix: /nonexistent-sfi-dir/x-support.png: directory /nonexistent-sfi-dir"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[4096], *out = NULL, *errs = NULL;
        snprintf(args, sizeof args, cases[i].fmt, cases[i].file);
        int rc = run_cli(dir, args, &out, &errs);
        ck_assert_msg(rc == cases[i].rc, "%s: rc %d (want %d): %s", args, rc, cases[i].rc, errs);
        ck_assert_msg(strstr(errs, cases[i].msg) != NULL, "%s: message '%s' lacks '%s'", args,
                      errs, cases[i].msg);
        ck_assert_msg(out == NULL || *out == 0, "%s: wrote output on error: %s", args, out);
        free(out);
        free(errs);
    }
    char *out = NULL;
    ck_assert_int_eq(run_cli(dir, "--help", &out, NULL), 0);
    ck_assert_ptr_nonnull(strstr(out, "--png-prefix"));
    free(out);
    free(full);
    free(tok);
    free(alw);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(cli_pools_query_head_records)
{
    /* 1 layer, 2 query heads sharing 1 KV head, records per query head:
     * q0 = {5: 0.6, 9: 0.1}, q1 = {7: 0.4, 5: 0.2}; the KV head's pooled
     * record is the mean: 5: 0.4, 7: 0.2, 9: 0.05. */
    char *dir = sfi_test_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/q.db", dir);
    sfi_trace_meta m;
    sfi_trace_meta_init(&m);
    m.tool = "test_analyze";
    m.policy = "sfi";
    m.level = SFI_TRACE_FULL;
    m.n_layers = 1;
    m.n_heads = 2;
    m.n_kv_heads = 1;
    m.head_dim = 4;
    m.top_m = 2;
    m.topm_heads = SFI_TRACE_HEADS_QUERY;
    sfi_trace_writer *w;
    sfi_error e;
    ck_assert_msg(sfi_trace_create(path, &m, 0, 0, &w, &e) == SFI_OK, "%s", e.msg);
    int32_t prompt[3] = {1, 2, 3};
    int64_t req;
    ck_assert_int_eq(sfi_trace_add_request(w, prompt, 3, &req, &e), SFI_OK);
    for (int t = 0; t < 5; t++) {
        ck_assert_int_eq(sfi_trace_append_step(w, req, t, 20 + t, 1, t ? SFI_STEP_FAST : SFI_STEP_SLOW,
                                               t ? SFI_REASON_NONE : SFI_REASON_FIRST, &e), 0);
        int32_t p0[2] = {5, 9}, p1[2] = {7, 5};
        float q0[2] = {0.6f, 0.1f}, q1[2] = {0.4f, 0.2f};
        ck_assert_int_eq(sfi_trace_add_topm(w, req, t, 0, 0, p0, q0, 2, 0.3f, &e), 0);
        ck_assert_int_eq(sfi_trace_add_topm(w, req, t, 0, 1, p1, q1, 2, 0.4f, &e), 0);
    }
    ck_assert_msg(sfi_trace_finish(w, &e) == SFI_OK, "%s", e.msg);
    double want[2] = {0.4, 0.6};
    for (int b = 1; b <= 2; b++) {
        char args[8192], *out = NULL, *errs = NULL;
        snprintf(args, sizeof args, "'%s' --budget %d --policies oracle,sfi --param n_recent=2 "
                 "--format json", path, b);
        int rc = run_cli(dir, args, &out, &errs);
        ck_assert_msg(rc == 0, "rc %d: %s", rc, errs);
        json_error_t je;
        json_t *j = json_loads(out, 0, &je);
        ck_assert_ptr_nonnull(j);
        json_t *o = json_array_get(json_object_get(j, "policies"), 0);
        ck_assert_str_eq(json_string_value(json_object_get(o, "name")), "oracle");
        ck_assert_double_eq_tol(json_real_value(json_object_get(o, "recall_lo")), want[b - 1],
                                1e-6);
        json_decref(j);
        free(out);
        free(errs);
    }
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

/* Both bundled full-level traces -- sfi-ref's and record_hf.py's, the
 * recorders the README names -- pass trace check and are analyzed
 * (issue 20.4: sfi-ref's lacked step 0 and most layers). */
START_TEST(cli_bundled_traces)
{
    char *dir = sfi_test_tmpdir();
    static const char *const names[] = {"traces/full/sfi-small-qwen3-8k.db",
                                        "traces/full/sfi-small-qwen3-8k-hf.db"};
    for (int i = 0; i < 2; i++) {
        char path[4096], args[4200], *out = NULL, *errs = NULL;
        snprintf(path, sizeof path, "%s", sfi_test_src(names[i]));
        snprintf(args, sizeof args, "'%s' --format json --policies oracle,sfi,streaming", path);
        int rc = run_cli(dir, args, &out, &errs);
        ck_assert_msg(rc == 0, "%s: rc %d: %s", names[i], rc, errs);
        json_t *j = json_loads(out, 0, NULL);
        ck_assert_msg(j != NULL, "not JSON: %s", out);
        ck_assert_int_eq(json_integer_value(json_object_get(j, "steps")), 128);
        ck_assert_int_eq(json_integer_value(json_object_get(j, "layers")), 10);
        json_t *o = json_array_get(json_object_get(j, "policies"), 0);
        double rec = json_real_value(json_object_get(o, "recall"));
        ck_assert_msg(rec > 0.3 && rec < 1.0, "%s: oracle recall %g", names[i], rec);
        json_decref(j);
        free(out);
        free(errs);
    }
    /* --vocab of another tokenizer than the recorded one: a note (the
     * meta's vocab.json SHA-256 differs); the recorded one: none. */
    char path[4096], args[8400], voc[4096], *out = NULL, *errs = NULL;
    snprintf(path, sizeof path, "%s", sfi_test_src(names[0]));
    snprintf(voc, sizeof voc, "%s", sfi_test_src("tests/fixtures/qwen3-tokenizer"));
    snprintf(args, sizeof args, "'%s' --policies oracle --vocab '%s'", path, voc);
    ck_assert_int_eq(run_cli(dir, args, &out, &errs), 0);
    ck_assert_msg(strstr(errs, "qwen3-tokenizer/vocab.json is not the vocabulary"), "%s", errs);
    free(out);
    free(errs);
    snprintf(voc, sizeof voc, "%s", sfi_test_src("tests/fixtures/sfi-small-qwen3-tokenizer"));
    snprintf(args, sizeof args, "'%s' --policies oracle --vocab '%s'", path, voc);
    ck_assert_int_eq(run_cli(dir, args, &out, &errs), 0);
    ck_assert_msg(!strstr(errs, "is not the vocabulary"), "%s", errs);
    free(out);
    free(errs);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("analyze");
    TCase *tc = tcase_create("engine");
    tcase_add_test(tc, known_recall_overlap_ratio);
    tcase_add_test(tc, sfi_slow_steps_and_fast_recall);
    tcase_add_test(tc, stability_within_vs_across);
    tcase_add_test(tc, output_error_on_snapshots);
    tcase_add_test(tc, threads_do_not_change_results);
    tcase_add_test(tc, bad_records_are_named);
    TCase *tcli = tcase_create("cli");
    tcase_set_timeout(tcli, 120);
    tcase_add_test(tcli, cli_end_to_end);
    tcase_add_test(tcli, cli_bad_input);
    tcase_add_test(tcli, cli_pools_query_head_records);
    tcase_add_test(tcli, cli_bundled_traces);
    suite_add_tcase(s, tcli);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
