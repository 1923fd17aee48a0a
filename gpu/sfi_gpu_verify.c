/* The engine against the reference; see sfi_gpu_verify.h.
 *
 * Digests: sfi_decode_run hashes "sfi-decode-v1", the mode, the prompt,
 * then after the prefill (SFI mode) every layer's selected sets, then per
 * step (after that step's selected sets when it is slow in SFI mode) the
 * step, kind, reason, token and the logits' bits. The engine's observer
 * calls arrive in that same order, so hashing them gives sfi-ref's digest
 * whenever the bits are sfi-ref's (--exact).
 *
 * Deferred refresh (refresh_delay = d >= 2): both hash a decode slow step's
 * sets when they take effect (step t + d), and the engine reports them
 * then, as step t's; sets dropped by a later slow step, or whose t + d is
 * past the run's end, are never computed by the engine and not hashed by
 * the reference, so the comparison leaves them out (the reference's slow
 * steps say which ones). */
#include <config.h>

#include "sfi_gpu_verify.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_digest.h"

typedef struct {
    int32_t step, layer, n, n_kv;
    int32_t *sel; /* [n_kv][n] */
} selrec;

typedef struct {
    sfi_hasher hs;
    int hs_ok;
    int final; /* hex holds the digest (the hasher is finished) */
    char hex[65];
    float *logits; /* [max_new][V] (keep) */
    selrec *sel;
    int n_sel, cap_sel;
} reqobs;

struct sfi_gpu_verify {
    int B, max_new, V, keep;
    const int32_t *const *prompts;
    const int *n_prompt;
    reqobs *r;
    sfi_gpu_observer obs;
};

static sfi_status obs_selected(void *user, int b, int step, int layer, const int32_t *sel, int n_kv,
                               int K, int n_sel, sfi_error *err)
{
    sfi_gpu_verify *v = user;
    reqobs *r = &v->r[b];
    int32_t l32 = layer;
    sfi_hasher_update_str(&r->hs, "selected");
    sfi_hasher_update_i32(&r->hs, &l32, 1);
    for (int h = 0; h < n_kv; h++) {
        int32_t n32 = n_sel;
        sfi_hasher_update_i32(&r->hs, &n32, 1);
        sfi_hasher_update_i32(&r->hs, sel + (size_t)h * K, (size_t)n_sel);
    }
    if (!v->keep)
        return SFI_OK;
    if (r->n_sel == r->cap_sel) {
        int nc = r->cap_sel ? 2 * r->cap_sel : 64;
        selrec *ns = realloc(r->sel, (size_t)nc * sizeof *ns);
        if (!ns)
            return sfi_error_set(err, SFI_ENOMEM, "out of memory");
        r->sel = ns;
        r->cap_sel = nc;
    }
    selrec *s = &r->sel[r->n_sel];
    s->step = step;
    s->layer = layer;
    s->n = n_sel;
    s->n_kv = n_kv;
    s->sel = malloc((size_t)n_kv * (n_sel > 0 ? n_sel : 1) * 4);
    if (!s->sel)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    for (int h = 0; h < n_kv; h++)
        memcpy(s->sel + (size_t)h * n_sel, sel + (size_t)h * K, (size_t)n_sel * 4);
    r->n_sel++;
    return SFI_OK;
}

static sfi_status obs_step(void *user, int b, int step, int kind, int reason, int32_t token,
                           const float *logits, int vocab, sfi_error *err)
{
    (void)err;
    sfi_gpu_verify *v = user;
    reqobs *r = &v->r[b];
    int32_t x[4] = {step, kind, reason, token};
    sfi_hasher_update_str(&r->hs, "step");
    sfi_hasher_update_i32(&r->hs, x, 4);
    sfi_hasher_update_f32(&r->hs, logits, (size_t)vocab);
    if (v->keep && step < v->max_new)
        memcpy(r->logits + (size_t)step * vocab, logits, (size_t)vocab * 4);
    return SFI_OK;
}

sfi_status sfi_gpu_verify_new(int B, int max_new, int vocab, const int32_t *const *prompts,
                              const int *n_prompt, sfi_decode_mode mode, int keep,
                              sfi_gpu_verify **out, sfi_error *err)
{
    *out = NULL;
    sfi_gpu_verify *v = calloc(1, sizeof *v);
    if (!v || !(v->r = calloc((size_t)B, sizeof *v->r))) {
        free(v);
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    }
    v->B = B;
    v->max_new = max_new;
    v->V = vocab;
    v->keep = keep;
    v->prompts = prompts;
    v->n_prompt = n_prompt;
    v->obs.user = v;
    v->obs.on_step = obs_step;
    v->obs.on_selected = obs_selected;
    for (int b = 0; b < B; b++) {
        reqobs *r = &v->r[b];
        sfi_status rc = sfi_hasher_init(&r->hs, err);
        if (rc) {
            sfi_gpu_verify_free(v);
            return rc;
        }
        r->hs_ok = 1;
        sfi_hasher_update_str(&r->hs, "sfi-decode-v1");
        sfi_hasher_update_str(&r->hs, sfi_decode_mode_name(mode));
        sfi_hasher_update_i32(&r->hs, prompts[b], (size_t)n_prompt[b]);
        if (keep && !(r->logits = malloc((size_t)max_new * vocab * sizeof(float)))) {
            sfi_gpu_verify_free(v);
            return sfi_error_set(err, SFI_ENOMEM,
                                 "out of memory keeping %d steps of logits for the check", max_new);
        }
    }
    *out = v;
    return SFI_OK;
}

void sfi_gpu_verify_free(sfi_gpu_verify *v)
{
    if (!v)
        return;
    for (int b = 0; b < v->B; b++) {
        reqobs *r = &v->r[b];
        if (r->hs_ok)
            sfi_hasher_free(&r->hs);
        free(r->logits);
        for (int i = 0; i < r->n_sel; i++)
            free(r->sel[i].sel);
        free(r->sel);
    }
    free(v->r);
    free(v);
}

const sfi_gpu_observer *sfi_gpu_verify_observer(sfi_gpu_verify *v)
{
    return &v->obs;
}

sfi_status sfi_gpu_verify_digest(sfi_gpu_verify *v, int b, char hex[65], sfi_error *err)
{
    reqobs *r = &v->r[b];
    if (!r->final) {
        sfi_status rc = sfi_hasher_final_hex(&r->hs, r->hex, NULL, err);
        if (rc)
            return rc;
        r->final = 1;
    }
    memcpy(hex, r->hex, 65);
    return SFI_OK;
}

/* ---- the reference, one thread per request ---- */

typedef struct {
    const sfi_qwen3 *m;
    sfi_decode_opts o;
    const int32_t *prompt;
    int n_prompt, V;
    const reqobs *gpu;
    double tol;
    sfi_decode_result res;
    sfi_status rc;
    sfi_error err;
    sfi_gpu_verify_report *rep;
    int *defer_missing; /* deferred slow steps (one entry per layer) with no engine record */
    int n_defer_missing, cap_defer_missing;
} refjob;

static sfi_status ref_on_slow_layer(void *user, const sfi_decode_slow_layer_info *in,
                                    sfi_error *err)
{
    refjob *j = user;
    const reqobs *g = j->gpu;
    sfi_gpu_verify_report *rp = j->rep;
    const selrec *s = NULL;
    for (int i = 0; i < g->n_sel; i++)
        if (g->sel[i].step == in->step && g->sel[i].layer == in->layer) {
            s = &g->sel[i];
            break;
        }
    rp->sel_sets++;
    if (!s && in->deferred) {
        /* maybe never in effect: judged once the steps are known */
        if (j->n_defer_missing == j->cap_defer_missing) {
            int nc = j->cap_defer_missing ? 2 * j->cap_defer_missing : 64;
            int *ns = realloc(j->defer_missing, (size_t)nc * sizeof *ns);
            if (!ns)
                return sfi_error_set(err, SFI_ENOMEM, "out of memory");
            j->defer_missing = ns;
            j->cap_defer_missing = nc;
        }
        j->defer_missing[j->n_defer_missing++] = in->step;
        return SFI_OK;
    }
    if (!s) {
        rp->sel_missing++;
        return SFI_OK;
    }
    int equal = 1;
    for (int h = 0; h < in->n_kv_heads; h++) {
        int nr = in->n_selected[h], ng = s->n;
        const int32_t *a = in->selected + (size_t)h * in->K, *b = s->sel + (size_t)h * s->n;
        /* both ascending: the common positions */
        int i = 0, k = 0;
        long common = 0;
        while (i < nr && k < ng) {
            if (a[i] == b[k]) {
                common++;
                i++;
                k++;
            } else if (a[i] < b[k]) {
                i++;
            } else {
                k++;
            }
        }
        rp->sel_positions += nr;
        rp->sel_positions_differ += nr - common;
        if (nr != ng || common != nr)
            equal = 0;
    }
    rp->sel_sets_equal += equal;
    return SFI_OK;
}

static sfi_status ref_on_step(void *user, const sfi_decode_step_info *in, sfi_error *err)
{
    (void)err;
    refjob *j = user;
    if (in->step >= j->o.max_new)
        return SFI_OK;
    const float *g = j->gpu->logits + (size_t)in->step * j->V;
    float mx = 0.f, d = 0.f;
    for (int i = 0; i < j->V; i++) {
        float a = fabsf(in->logits[i]), e = fabsf(in->logits[i] - g[i]);
        mx = a > mx ? a : mx;
        d = e > d || isnan(e) ? e : d;
    }
    double rel = mx > 0 ? d / mx : d;
    if (isnan(rel))
        rel = INFINITY;
    if (rel > j->rep->max_rel)
        j->rep->max_rel = rel;
    if (rel > j->tol && j->rep->first_over_tol < 0)
        j->rep->first_over_tol = in->step;
    return SFI_OK;
}

static void *ref_thread(void *arg)
{
    refjob *j = arg;
    sfi_decode_observer obs = {.user = j,
                               .on_step = ref_on_step,
                               .on_slow_layer =
                                   j->o.mode == SFI_DECODE_SFI ? ref_on_slow_layer : NULL};
    sfi_error_clear(&j->err);
    j->rc = sfi_decode_run(j->m, &j->o, j->prompt, j->n_prompt, &obs, &j->res, &j->err);
    return NULL;
}

int sfi_gpu_verify_reference(sfi_gpu_verify *v, const sfi_qwen3 *m, const sfi_decode_opts *opts,
                             const sfi_gpu_run_result *res, int exact, double tol, FILE *log,
                             sfi_gpu_verify_report *rep)
{
    const int B = v->B;
    refjob *jobs = calloc((size_t)B, sizeof *jobs);
    pthread_t *th = calloc((size_t)B, sizeof *th);
    int *started = calloc((size_t)B, sizeof *started);
    if (!jobs || !th || !started || !v->keep) {
        free(jobs);
        free(th);
        free(started);
        for (int b = 0; b < B; b++) {
            memset(&rep[b], 0, sizeof rep[b]);
            snprintf(rep[b].err, sizeof rep[b].err, "%s",
                     v->keep ? "out of memory" : "the run kept no logits");
        }
        return B;
    }
    for (int b = 0; b < B; b++) {
        refjob *j = &jobs[b];
        memset(&rep[b], 0, sizeof rep[b]);
        rep[b].first_diff = rep[b].first_over_tol = -1;
        j->m = m;
        j->o = *opts;
        j->o.max_new = v->max_new;
        j->prompt = v->prompts[b];
        j->n_prompt = v->n_prompt[b];
        j->V = v->V;
        j->gpu = &v->r[b];
        j->tol = tol;
        j->rep = &rep[b];
    }
    for (int b = 0; b < B; b++) {
        started[b] = pthread_create(&th[b], NULL, ref_thread, &jobs[b]) == 0;
        if (!started[b])
            ref_thread(&jobs[b]);
    }
    for (int b = 0; b < B; b++)
        if (started[b])
            pthread_join(th[b], NULL);
    int failed = 0;
    for (int b = 0; b < B; b++) {
        refjob *j = &jobs[b];
        sfi_gpu_verify_report *rp = &rep[b];
        if (j->rc) {
            /* the message cut to the report's field (bounded, so that gcc
             * at -O1 sees no truncation to warn about) */
            snprintf(rp->err, sizeof rp->err, "%.*s", (int)sizeof rp->err - 1, j->err.msg);
            fprintf(log, "check request %d: the reference failed: %s\n", b, j->err.msg);
            failed++;
            continue;
        }
        rp->ran = 1;
        memcpy(rp->ref_digest, j->res.digest_hex, sizeof rp->ref_digest);
        /* deferred sets the engine did not report: missing only when they
         * took effect (step t + d reached, no slow step in between) */
        const int dl = j->o.params.refresh_delay;
        for (int i = 0; i < j->n_defer_missing; i++) {
            const int t = j->defer_missing[i];
            int in_effect = t + dl < j->res.n_generated;
            for (int k = t + 1; in_effect && k < t + dl; k++)
                in_effect = j->res.kinds[k] != SFI_STEP_SLOW;
            if (in_effect)
                rp->sel_missing++;
            else
                rp->sel_sets--; /* not a set of this run's steps: not compared */
        }
        int ng = res->n_generated[b], n = j->res.n_generated < ng ? j->res.n_generated : ng;
        const int mn = res->max_new;
        for (int t = 0; t < n && rp->first_diff < 0; t++)
            if (j->res.ids[t] != res->ids[(size_t)b * mn + t] ||
                (int)j->res.kinds[t] != res->kinds[(size_t)b * mn + t] ||
                (int)j->res.reasons[t] != res->reasons[(size_t)b * mn + t])
                rp->first_diff = t;
        if (j->res.n_generated != ng && rp->first_diff < 0)
            rp->first_diff = n;
        char hex[65];
        sfi_error e;
        rp->digest_equal =
            sfi_gpu_verify_digest(v, b, hex, &e) == SFI_OK && !strcmp(hex, j->res.digest_hex);
        int bad = rp->first_diff >= 0 || rp->first_over_tol >= 0 || rp->sel_missing ||
                  (exact && (!rp->digest_equal || rp->sel_sets_equal != rp->sel_sets));
        failed += bad;
        char fd[32] = "";
        if (rp->first_diff >= 0)
            snprintf(fd, sizeof fd, " from step %d", rp->first_diff);
        fprintf(log,
                "check request %d (%d prompt tokens, %d steps): ids/kinds/reasons %s%s; "
                "selected sets %d of %d equal (%ld of %ld positions differ, %d missing); logits "
                "max rel err %.3g (tolerance %.0e%s); digest %s: %s\n",
                b, v->n_prompt[b], ng, rp->first_diff < 0 ? "equal" : "DIFFER", fd,
                rp->sel_sets_equal, rp->sel_sets, rp->sel_positions_differ, rp->sel_positions,
                rp->sel_missing, rp->max_rel, tol, rp->first_over_tol >= 0 ? ", EXCEEDED" : "",
                rp->digest_equal ? "equal"
                : exact          ? "DIFFERS"
                                 : "differs (bits: only --exact)",
                bad ? "FAIL" : "ok");
        sfi_decode_result_free(&j->res);
    }
    for (int b = 0; b < B; b++)
        free(jobs[b].defer_missing);
    free(jobs);
    free(th);
    free(started);
    return failed;
}

/* ---- two engine runs ---- */

/* Request q's sets of a against b's, matched by (step, layer). */
static void compare_sets(const reqobs *a, const reqobs *b, sfi_gpu_verify_report *rp)
{
    for (int i = 0; i < a->n_sel; i++) {
        const selrec *x = &a->sel[i], *y = NULL;
        for (int k = 0; k < b->n_sel && !y; k++)
            if (b->sel[k].step == x->step && b->sel[k].layer == x->layer)
                y = &b->sel[k];
        rp->sel_sets++;
        if (!y) {
            rp->sel_missing++;
            continue;
        }
        long n = (long)x->n_kv * x->n, differ = 0;
        if (y->n != x->n || y->n_kv != x->n_kv) {
            differ = n;
        } else {
            for (long j = 0; j < n; j++)
                differ += x->sel[j] != y->sel[j];
        }
        rp->sel_positions += n;
        rp->sel_positions_differ += differ;
        rp->sel_sets_equal += differ == 0;
    }
}

int sfi_gpu_verify_compare(sfi_gpu_verify *a, const sfi_gpu_run_result *ra, sfi_gpu_verify *b,
                           const sfi_gpu_run_result *rb, double tol, const char *name_a,
                           const char *name_b, FILE *log, sfi_gpu_verify_report *rep)
{
    const int B = a->B;
    int failed = 0;
    for (int q = 0; q < B; q++) {
        sfi_gpu_verify_report *rp = &rep[q];
        memset(rp, 0, sizeof *rp);
        rp->first_diff = rp->first_over_tol = -1;
        if (!a->keep || !b->keep || b->B != B || b->V != a->V || ra->max_new != rb->max_new) {
            snprintf(rp->err, sizeof rp->err, "the runs kept no logits or differ in shape");
            fprintf(log, "check request %d: %s\n", q, rp->err);
            failed++;
            continue;
        }
        rp->ran = 1;
        const int mn = ra->max_new, na = ra->n_generated[q], nb = rb->n_generated[q];
        const int n = na < nb ? na : nb;
        for (int t = 0; t < n && rp->first_diff < 0; t++) {
            const size_t i = (size_t)q * mn + t;
            if (ra->ids[i] != rb->ids[i] || ra->kinds[i] != rb->kinds[i] ||
                ra->reasons[i] != rb->reasons[i])
                rp->first_diff = t;
        }
        if (na != nb && rp->first_diff < 0)
            rp->first_diff = n;
        /* logits of the steps both ran with the same inputs: up to the
         * first difference (inclusive: its logits explain it) */
        const int nl = rp->first_diff >= 0 ? rp->first_diff + 1 : n;
        for (int t = 0; t < nl && t < a->max_new; t++) {
            const float *x = a->r[q].logits + (size_t)t * a->V,
                        *y = b->r[q].logits + (size_t)t * a->V;
            float mx = 0.f, d = 0.f;
            for (int i = 0; i < a->V; i++) {
                float ax = fabsf(x[i]), e = fabsf(y[i] - x[i]);
                mx = ax > mx ? ax : mx;
                d = e > d || isnan(e) ? e : d;
            }
            double rel = mx > 0 ? d / mx : d;
            if (isnan(rel))
                rel = INFINITY;
            if (rel > rp->max_rel)
                rp->max_rel = rel;
            if (rel > tol && rp->first_over_tol < 0)
                rp->first_over_tol = t;
        }
        compare_sets(&a->r[q], &b->r[q], rp);
        char ha[65] = "", hb[65] = "";
        sfi_error e;
        if (sfi_gpu_verify_digest(b, q, hb, &e) == SFI_OK)
            memcpy(rp->ref_digest, hb, sizeof hb);
        rp->digest_equal =
            sfi_gpu_verify_digest(a, q, ha, &e) == SFI_OK && hb[0] && !strcmp(ha, hb);
        const int bad = rp->first_diff >= 0 || rp->first_over_tol >= 0;
        failed += bad;
        char fd[32] = "";
        if (rp->first_diff >= 0)
            snprintf(fd, sizeof fd, " from step %d", rp->first_diff);
        fprintf(log,
                "check request %d (%d steps): %s vs %s: ids/kinds/reasons %s%s; logits max rel "
                "err %.3g (tolerance %.0e%s); selected sets %d of %d equal (%ld of %ld positions "
                "differ, %d missing); digest %s: %s\n",
                q, na, name_b, name_a, rp->first_diff < 0 ? "equal" : "DIFFER", fd, rp->max_rel,
                tol, rp->first_over_tol >= 0 ? ", EXCEEDED" : "", rp->sel_sets_equal, rp->sel_sets,
                rp->sel_positions_differ, rp->sel_positions, rp->sel_missing,
                rp->digest_equal ? "equal" : "differs", bad ? "FAIL" : "ok");
    }
    return failed;
}
