/* sfi_gpu_verify (sfi-gpu's check of its engine against the reference)
 * on the CPU, with the deferred refresh in mind: a stand-in engine made of
 * the reference's own observer calls reports steps and selected sets in
 * the order the GPU engine does (sfi_gpu_engine_run): the prefill's and a
 * slow step's sets right before that step's record, and with
 * refresh_delay = d the sets of slow step t only when they take effect at
 * step t + d, as step t's (never those a later slow step drops). The
 * comparison must then find every id, set and logit equal and the same
 * digest, count exactly the sets that took effect, and fail for a
 * stand-in that installs its deferred sets a step late. The engine itself
 * needs a GPU (sfi-gpu check runs the same comparison on it). */
#include <config.h>

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_decode.h"
#include "sfi_gpu_verify.h"
#include "sfi_hf_fixture.h"
#include "sfi_qwen3.h"
#include "sfi_test_util.h"

enum { N_STEPS = 28, B = 2 };

static uint8_t trig[512];

/* One request through the stand-in: forwards to the verifier's observer. */
typedef struct {
    const sfi_gpu_observer *to;
    int b, delay, late, n_layers, n_kv, K;
    int pend_step; /* deferred sets held back; -1: none */
    int32_t *pend; /* [layer][n_kv][K] */
    int *pend_n;   /* [layer] */
    int n_reported;
} standin;

static sfi_status flush_pending(standin *s, int step, sfi_error *err)
{
    if (s->pend_step < 0 || step != s->pend_step + s->delay + s->late)
        return SFI_OK;
    for (int l = 0; l < s->n_layers; l++) {
        sfi_status rc = s->to->on_selected(s->to->user, s->b, s->pend_step, l,
                                           s->pend + (size_t)l * s->n_kv * s->K, s->n_kv, s->K,
                                           s->pend_n[l], err);
        if (rc)
            return rc;
        s->n_reported++;
    }
    s->pend_step = -1;
    return SFI_OK;
}

static sfi_status si_slow_layer(void *u, const sfi_decode_slow_layer_info *in, sfi_error *err)
{
    standin *s = u;
    if (!in->deferred) {
        s->n_reported++;
        return s->to->on_selected(s->to->user, s->b, in->step, in->layer, in->selected,
                                  in->n_kv_heads, in->K, in->n_selected[0], err);
    }
    /* the engine installs (and reports) before this step's forward pass */
    sfi_status rc = flush_pending(s, in->step, err);
    if (rc)
        return rc;
    memcpy(s->pend + (size_t)in->layer * s->n_kv * s->K, in->selected,
           (size_t)s->n_kv * s->K * sizeof(int32_t));
    s->pend_n[in->layer] = in->n_selected[0];
    s->pend_step = in->step; /* drops an older one */
    return SFI_OK;
}

static sfi_status si_step(void *u, const sfi_decode_step_info *in, sfi_error *err)
{
    standin *s = u;
    sfi_status rc = flush_pending(s, in->step, err);
    if (rc)
        return rc;
    return s->to->on_step(s->to->user, s->b, in->step, in->kind, in->reason, in->token, in->logits,
                          in->vocab_size, err);
}

/* Runs the stand-in on both requests, then the verifier; returns the
 * number of failing requests, fills rep and the sets reported. */
static int check_run(const sfi_qwen3 *m, const sfi_decode_opts *o, int32_t *const *prompts,
                     const int *n_prompt, int late, sfi_gpu_verify_report *rep, int *reported)
{
    const sfi_model_config *c = sfi_qwen3_config(m);
    sfi_error e;
    sfi_gpu_verify *v;
    ck_assert_msg(sfi_gpu_verify_new(B, o->max_new, c->vocab_size, (const int32_t *const *)prompts,
                                     n_prompt, o->mode, 1, &v, &e) == SFI_OK,
                  "%s", e.msg);
    sfi_gpu_run_result res;
    memset(&res, 0, sizeof res);
    res.batch = B;
    res.max_new = o->max_new;
    res.ids = calloc((size_t)B * o->max_new, sizeof(int32_t));
    res.kinds = calloc((size_t)B * o->max_new, 1);
    res.reasons = calloc((size_t)B * o->max_new, 1);
    res.n_generated = calloc(B, sizeof(int));
    res.n_slow = calloc(B, sizeof(int));
    ck_assert(res.ids && res.kinds && res.reasons && res.n_generated && res.n_slow);
    for (int b = 0; b < B; b++) {
        standin s = {.to = sfi_gpu_verify_observer(v),
                     .b = b,
                     .delay = o->params.refresh_delay,
                     .late = late,
                     .n_layers = c->num_hidden_layers,
                     .n_kv = c->num_key_value_heads,
                     .K = o->params.K,
                     .pend_step = -1};
        s.pend = calloc((size_t)s.n_layers * s.n_kv * s.K, sizeof(int32_t));
        s.pend_n = calloc((size_t)s.n_layers, sizeof(int));
        ck_assert(s.pend && s.pend_n);
        sfi_decode_observer obs = {.user = &s, .on_step = si_step, .on_slow_layer = si_slow_layer};
        sfi_decode_result r;
        ck_assert_msg(sfi_decode_run(m, o, prompts[b], n_prompt[b], &obs, &r, &e) == SFI_OK, "%s",
                      e.msg);
        for (int t = 0; t < r.n_generated; t++) {
            res.ids[(size_t)b * o->max_new + t] = r.ids[t];
            res.kinds[(size_t)b * o->max_new + t] = (uint8_t)r.kinds[t];
            res.reasons[(size_t)b * o->max_new + t] = (uint8_t)r.reasons[t];
        }
        res.n_generated[b] = r.n_generated;
        res.n_slow[b] = r.n_slow;
        reported[b] = s.n_reported;
        sfi_decode_result_free(&r);
        free(s.pend);
        free(s.pend_n);
    }
    FILE *log = fopen("/dev/null", "w");
    ck_assert_ptr_nonnull(log);
    int failed = sfi_gpu_verify_reference(v, m, o, &res, 1, 1e-4, log, rep);
    fclose(log);
    /* (sfi_gpu_run_result_free lives in the engine, which needs CUDA) */
    free(res.ids);
    free(res.kinds);
    free(res.reasons);
    free(res.n_generated);
    free(res.n_slow);
    sfi_gpu_verify_free(v);
    return failed;
}

START_TEST(deferred_sets_reported_when_in_effect)
{
    for (int i = 0; i < 512; i++)
        trig[i] = i % 11 == 0;
    sfi_qwen3 *m;
    sfi_error e;
    ck_assert_msg(sfi_qwen3_load(hf_path("tiny-qwen3"), &m, &e) == SFI_OK, "%s", e.msg);
    const int L = sfi_qwen3_config(m)->num_hidden_layers;
    /* two prompts of a seeded stream */
    int32_t p0[40], p1[23];
    for (int i = 0; i < 40; i++)
        p0[i] = (int32_t)((i * 37 + 5) % 500 + 1);
    for (int i = 0; i < 23; i++)
        p1[i] = (int32_t)((i * 53 + 17) % 500 + 1);
    int32_t *prompts[B] = {p0, p1};
    int n_prompt[B] = {40, 23};
    /* slow steps 0, 3, 8, 9 (8 dropped for every d >= 2), 14, 16 (14
     * dropped for d >= 3) and 25 (its sets never take effect for d >= 3) */
    int32_t forced[N_STEPS];
    for (int t = 1; t <= N_STEPS; t++)
        forced[t - 1] =
            (t == 3 || t == 8 || t == 9 || t == 14 || t == 16 || t == 25) ? 11 : 1 + (t % 7);
    /* sets that take effect, after the prefill's, by hand */
    static const int delays[4] = {0, 2, 3, 4};
    static const int in_effect[4] = {6, 5, 3, 3};
    for (int di = 0; di < 4; di++) {
        sfi_decode_opts o;
        sfi_decode_opts_default(&o);
        o.max_new = N_STEPS;
        o.is_trigger = trig;
        o.n_trigger_vocab = 512;
        o.trigger = SFI_TRIG_BOUNDARY;
        o.forced = forced;
        o.n_forced = N_STEPS;
        char kv[32];
        ck_assert(sfi_params_set(&o.params, "K=6", "test", &e) == SFI_OK);
        ck_assert(sfi_params_set(&o.params, "n_recent=4", "test", &e) == SFI_OK);
        snprintf(kv, sizeof kv, "refresh_delay=%d", delays[di]);
        ck_assert(sfi_params_set(&o.params, kv, "test", &e) == SFI_OK);
        sfi_gpu_verify_report rep[B];
        int reported[B];
        int failed = check_run(m, &o, prompts, n_prompt, 0, rep, reported);
        for (int b = 0; b < B; b++) {
            printf("d=%d request %d: sets %d of %d equal, %d missing, digest %s\n", delays[di], b,
                   rep[b].sel_sets_equal, rep[b].sel_sets, rep[b].sel_missing,
                   rep[b].digest_equal ? "equal" : "DIFFERS");
            ck_assert(rep[b].ran);
            ck_assert_int_eq(rep[b].first_diff, -1);
            ck_assert_int_eq(rep[b].sel_missing, 0);
            ck_assert_int_eq(rep[b].sel_sets, L * (1 + in_effect[di]));
            ck_assert_int_eq(rep[b].sel_sets_equal, rep[b].sel_sets);
            ck_assert_int_eq(reported[b], rep[b].sel_sets);
            ck_assert(rep[b].digest_equal);
        }
        ck_assert_int_eq(failed, 0);
        if (delays[di]) {
            /* a stand-in one step late: other logits hashed after other
             * sets -- the digest (and, for a set never reported, the
             * count) tells */
            failed = check_run(m, &o, prompts, n_prompt, 1, rep, reported);
            ck_assert_int_eq(failed, B);
            for (int b = 0; b < B; b++)
                ck_assert(!rep[b].digest_equal);
        }
    }
    sfi_qwen3_free(m);
}
END_TEST

/* sfi_gpu_verify_compare (sfi-gpu run --check-tp): two runs fed to two
 * verifiers through their observers. Equal runs pass with equal digests;
 * logits a few ulps apart pass (digests differ); logits 1e-3 apart, or one
 * id, fail at that step; a differing selected set is counted, not failed. */
enum { CMP_STEPS = 6, CMP_V = 16, CMP_KV = 2, CMP_K = 3 };

static void feed(sfi_gpu_verify *v, sfi_gpu_run_result *res, float scale, int bad_id_step,
                 int bad_set)
{
    const sfi_gpu_observer *o = sfi_gpu_verify_observer(v);
    sfi_error e;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < CMP_STEPS; t++) {
            if (t % 3 == 0) { /* slow: one layer's sets */
                int32_t sel[CMP_KV * CMP_K];
                for (int i = 0; i < CMP_KV * CMP_K; i++)
                    sel[i] = 4 + 2 * i + (bad_set && t == 3 && i == 1);
                ck_assert(o->on_selected(o->user, b, t, 0, sel, CMP_KV, CMP_K, CMP_K, &e) ==
                          SFI_OK);
            }
            float lg[CMP_V];
            for (int i = 0; i < CMP_V; i++)
                lg[i] = (float)((i * 7 + t * 3 + b) % 11) - 5.0f;
            lg[t % CMP_V] *= scale;
            int32_t id = t == bad_id_step ? 9 : t;
            ck_assert(o->on_step(o->user, b, t, t % 3 == 0, 0, id, lg, CMP_V, &e) == SFI_OK);
            res->ids[(size_t)b * CMP_STEPS + t] = id;
            res->kinds[(size_t)b * CMP_STEPS + t] = (uint8_t)(t % 3 == 0);
        }
        res->n_generated[b] = CMP_STEPS;
    }
}

static int compare_runs(float scale, int bad_id_step, int bad_set, sfi_gpu_verify_report *rep)
{
    static const int32_t p0[3] = {1, 2, 3}, p1[2] = {4, 5};
    const int32_t *prompts[B] = {p0, p1};
    const int n_prompt[B] = {3, 2};
    sfi_gpu_verify *v[2];
    sfi_gpu_run_result res[2];
    sfi_error e;
    for (int k = 0; k < 2; k++) {
        ck_assert(sfi_gpu_verify_new(B, CMP_STEPS, CMP_V, prompts, n_prompt, SFI_DECODE_SFI, 1,
                                     &v[k], &e) == SFI_OK);
        memset(&res[k], 0, sizeof res[k]);
        res[k].batch = B;
        res[k].max_new = CMP_STEPS;
        res[k].ids = calloc((size_t)B * CMP_STEPS, sizeof(int32_t));
        res[k].kinds = calloc((size_t)B * CMP_STEPS, 1);
        res[k].reasons = calloc((size_t)B * CMP_STEPS, 1);
        res[k].n_generated = calloc(B, sizeof(int));
        ck_assert(res[k].ids && res[k].kinds && res[k].reasons && res[k].n_generated);
        feed(v[k], &res[k], k ? scale : 1.0f, k ? bad_id_step : -1, k && bad_set);
    }
    FILE *log = fopen("/dev/null", "w");
    ck_assert_ptr_nonnull(log);
    int failed = sfi_gpu_verify_compare(v[0], &res[0], v[1], &res[1], 1e-4, "a", "b", log, rep);
    fclose(log);
    for (int k = 0; k < 2; k++) {
        free(res[k].ids);
        free(res[k].kinds);
        free(res[k].reasons);
        free(res[k].n_generated);
        sfi_gpu_verify_free(v[k]);
    }
    return failed;
}

START_TEST(compare_two_runs)
{
    sfi_gpu_verify_report rep[B];
    ck_assert_int_eq(compare_runs(1.0f, -1, 0, rep), 0);
    for (int b = 0; b < B; b++) {
        ck_assert(rep[b].digest_equal);
        ck_assert_int_eq(rep[b].sel_sets, 2);
        ck_assert_int_eq(rep[b].sel_sets_equal, 2);
        ck_assert(rep[b].max_rel == 0.0);
    }
    /* 1 + 2^-22: a few ulps */
    ck_assert_int_eq(compare_runs(1.0f + 0x1p-22f, -1, 0, rep), 0);
    ck_assert(!rep[0].digest_equal && rep[0].max_rel > 0 && rep[0].max_rel < 1e-6);
    ck_assert_int_eq(compare_runs(1.001f, -1, 0, rep), B);
    ck_assert_int_eq(rep[0].first_over_tol, 0);
    ck_assert_int_eq(compare_runs(1.0f, 4, 0, rep), B);
    ck_assert_int_eq(rep[1].first_diff, 4);
    ck_assert_int_eq(compare_runs(1.0f, -1, 1, rep), 0);
    ck_assert_int_eq(rep[0].sel_sets_equal, 1);
    ck_assert_int_eq(rep[0].sel_positions_differ, 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gpu_verify");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, deferred_sets_reported_when_in_effect);
    tcase_add_test(tc, compare_two_runs);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
