/* The sfi-ref trace recorder driven by hand-made decode events (the same
 * callbacks sfi_decode_run makes, in its order): what lands in the trace at
 * each level, and the flag parsing sfi-ref run uses. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_params.h"
#include "sfi_recorder.h"
#include "sfi_test_util.h"
#include "sfi_trace.h"

enum { L = 2, H = 4, KV = 2, K = 3, NCTX0 = 8 };

static char *dir;
static char path[4096];

static void setup(void)
{
    dir = sfi_test_tmpdir();
    ck_assert_ptr_nonnull(dir);
    snprintf(path, sizeof path, "%s/r.db", dir);
}

static void teardown(void)
{
    sfi_test_rmtree(dir);
    free(dir);
}

static void fake_cfg(sfi_model_config *c)
{
    memset(c, 0, sizeof *c);
    c->vocab_size = 50;
    c->num_hidden_layers = L;
    c->num_attention_heads = H;
    c->num_key_value_heads = KV;
    c->head_dim = 8;
}

static void fake_opts(sfi_decode_opts *o)
{
    memset(o, 0, sizeof *o);
    o->mode = SFI_DECODE_SFI;
    sfi_params_default(&o->params);
    o->params.K = K;
    o->params.n_sink = 1;
    o->params.n_recent = 2;
    o->trigger = SFI_TRIG_SFI;
    o->max_new = 3;
    o->stop_token = -1;
}

/* Probabilities of head h over n positions: 1/2, 1/4, ... on positions
 * n-1, 0, 1, 2, ... (h shifts the order), the rest spread evenly. */
static void make_probs(float *p, int h, int n)
{
    double left = 1.0;
    for (int i = 0; i < n; i++)
        p[i] = 0.0f;
    for (int k = 0; k < n - 1; k++) {
        int pos = (k == 0) ? n - 1 : (k - 1 + h) % (n - 1);
        double v = k == n - 2 ? left : left / 2;
        p[pos] += (float)v;
        left -= v;
    }
}

/* Drives: prefill (selection), step 0 slow FIRST, step 1 fast, step 2 slow
 * TRIGGER. */
static void drive(sfi_recorder *r)
{
    sfi_decode_observer obs;
    sfi_recorder_observer(r, &obs);
    sfi_error e;
    int32_t prompt[NCTX0];
    for (int i = 0; i < NCTX0; i++)
        prompt[i] = i + 1;
    sfi_state st;
    ck_assert_int_eq(sfi_state_init(&st, L, KV, K, &e), SFI_OK);
    float lambda[KV] = {0.01f, 0.02f};
    float mass[H] = {0.9f, 0.8f, 0.7f, 0.6f};
    /* Prefill: the Selector's sets per layer (step -1), then on_prefill. */
    for (int l = 0; l < L; l++) {
        for (int h = 0; h < KV; h++) {
            int32_t *s = st.selected + ((size_t)l * KV + h) * K;
            s[0] = 1 + h;
            s[1] = 3;
            s[2] = 4 + l;
            st.n_selected[l * KV + h] = 3;
        }
        sfi_decode_slow_layer_info si = {.step = -1,
                                         .layer = l,
                                         .n_ctx = NCTX0,
                                         .n_kv_heads = KV,
                                         .K = K,
                                         .selected = st.selected + (size_t)l * KV * K,
                                         .n_selected = st.n_selected + l * KV,
                                         .j_begin = 1,
                                         .j_end = NCTX0 - 2,
                                         .lambda = lambda,
                                         .captured_mass = mass,
                                         .n_heads = H};
        if (obs.on_slow_layer)
            ck_assert_int_eq(obs.on_slow_layer(obs.user, &si, &e), SFI_OK);
    }
    sfi_decode_prefill_info pi = {.prompt = prompt,
                                  .n_prompt = NCTX0,
                                  .n_layers = L,
                                  .n_heads = H,
                                  .n_kv_heads = KV,
                                  .head_dim = 8,
                                  .state = &st,
                                  .last_logits = NULL,
                                  .vocab_size = 50};
    ck_assert_msg(obs.on_prefill(obs.user, &pi, &e) == SFI_OK, "%s", e.msg);
    /* Step 0's attention: the prefill's last query over the prompt. */
    float *p0 = malloc((size_t)H * NCTX0 * sizeof(float));
    for (int h = 0; h < H; h++)
        make_probs(p0 + (size_t)h * NCTX0, h, NCTX0);
    for (int l = 0; l < L && obs.want_attention; l++) {
        sfi_decode_attention_info ai = {.step = 0,
                                        .layer = l,
                                        .kind = SFI_STEP_SLOW,
                                        .n_heads = H,
                                        .n_ctx = NCTX0,
                                        .probs = p0};
        ck_assert_msg(obs.on_attention(obs.user, &ai, &e) == SFI_OK, "%s", e.msg);
    }
    free(p0);
    sfi_decode_step_info s0 = {.step = 0,
                               .kind = SFI_STEP_SLOW,
                               .reason = SFI_REASON_FIRST,
                               .input_token = 8,
                               .position = NCTX0 - 1,
                               .n_ctx = NCTX0,
                               .token = 17};
    ck_assert_msg(obs.on_step(obs.user, &s0, &e) == SFI_OK, "%s", e.msg);
    for (int t = 1; t <= 2; t++) {
        int n = NCTX0 + t;
        sfi_step_kind kind = t == 1 ? SFI_STEP_FAST : SFI_STEP_SLOW;
        float *probs = malloc((size_t)H * n * sizeof(float));
        for (int h = 0; h < H; h++)
            make_probs(probs + (size_t)h * n, h, n);
        for (int l = 0; l < L; l++) {
            sfi_decode_attention_info ai = {
                .step = t, .layer = l, .kind = kind, .n_heads = H, .n_ctx = n, .probs = probs};
            if (obs.want_attention)
                ck_assert_msg(obs.on_attention(obs.user, &ai, &e) == SFI_OK, "%s", e.msg);
        }
        if (kind == SFI_STEP_SLOW)
            for (int l = 0; l < L; l++) {
                for (int h = 0; h < KV; h++) {
                    int32_t *s = st.selected + ((size_t)l * KV + h) * K;
                    s[0] = 2;
                    s[1] = 5;
                    s[2] = 6;
                }
                sfi_decode_slow_layer_info si = {.step = t,
                                                 .layer = l,
                                                 .n_ctx = n,
                                                 .n_kv_heads = KV,
                                                 .K = K,
                                                 .selected = st.selected + (size_t)l * KV * K,
                                                 .n_selected = st.n_selected + l * KV,
                                                 .j_begin = 1,
                                                 .j_end = n - 2,
                                                 .lambda = lambda,
                                                 .captured_mass = mass,
                                                 .n_heads = H};
                ck_assert_int_eq(obs.on_slow_layer(obs.user, &si, &e), SFI_OK);
            }
        sfi_decode_step_info sx = {.step = t,
                                   .kind = kind,
                                   .reason =
                                       kind == SFI_STEP_FAST ? SFI_REASON_NONE : SFI_REASON_TRIGGER,
                                   .input_token = 17,
                                   .position = n - 1,
                                   .n_ctx = n,
                                   .token = 20 + t};
        ck_assert_msg(obs.on_step(obs.user, &sx, &e) == SFI_OK, "%s", e.msg);
        free(probs);
    }
    sfi_state_free(&st);
}

static const char *tokenizer_dir; /* the --tokenizer the next record() names */

static sfi_trace *record_layers(sfi_trace_level level, int top_m, const char *layers)
{
    sfi_recorder_opts ro;
    sfi_recorder_opts_default(&ro);
    ro.tokenizer_dir = tokenizer_dir;
    ro.layers = layers;
    ro.path = path;
    ro.level = level;
    ro.top_m = top_m;
    sfi_model_config cfg;
    fake_cfg(&cfg);
    sfi_decode_opts o;
    fake_opts(&o);
    sfi_recorder *r;
    sfi_error e;
    ck_assert_msg(sfi_recorder_open(&ro, sfi_test_src("tests/fixtures/sfi-small-qwen3-tokenizer"),
                                    &cfg, &o, &r, &e) == SFI_OK,
                  "%s", e.msg);
    drive(r);
    ck_assert_msg(sfi_recorder_finish(r, &e) == SFI_OK, "%s", e.msg);
    sfi_trace *t;
    ck_assert_msg(sfi_trace_open(path, &t, &e) == SFI_OK, "%s", e.msg);
    ck_assert_msg(sfi_trace_check(t, &e) == SFI_OK, "%s", e.msg);
    return t;
}

static sfi_trace *record(sfi_trace_level level, int top_m)
{
    return record_layers(level, top_m, NULL);
}

START_TEST(tokens_level)
{
    sfi_trace *t = record(SFI_TRACE_TOKENS, 4096);
    const sfi_trace_meta *m = sfi_trace_get_meta(t);
    ck_assert_str_eq(m->tool, "sfi-ref");
    ck_assert_str_eq(m->policy, "sfi");
    ck_assert_int_eq(m->n_layers, L);
    ck_assert_ptr_nonnull(strstr(m->params_json, "\"K\""));
    ck_assert_ptr_nonnull(strstr(m->tokenizer, "vocab.json sha256:"));
    ck_assert_int_eq(sfi_trace_n_requests(t), 1);
    ck_assert_int_eq(sfi_trace_n_steps(t), 3);
    ck_assert_int_eq(sfi_trace_n_selections(t), 0);
    sfi_trace_steps s;
    sfi_error e;
    ck_assert_int_eq(sfi_trace_read_steps(t, 0, &s, &e), SFI_OK);
    ck_assert_int_eq(s.token[0], 17);
    ck_assert_int_eq(s.token[2], 22);
    ck_assert_int_eq(s.ctx_len[2], NCTX0 + 2);
    ck_assert_int_eq(s.kind[1], SFI_STEP_FAST);
    ck_assert_int_eq(s.reason[2], SFI_REASON_TRIGGER);
    sfi_trace_steps_free(&s);
    ck_assert_ptr_nonnull(strstr(m->tokenizer, "model directory; "));
    sfi_trace_close(t);
    /* --tokenizer DIR: the meta names the files that made the ids, not the
     * model directory's (issue 20). */
    char tk[4096];
    snprintf(tk, sizeof tk, "%s", sfi_test_src("tests/fixtures/qwen3-tokenizer"));
    tokenizer_dir = tk;
    t = record(SFI_TRACE_TOKENS, 4096);
    tokenizer_dir = NULL;
    m = sfi_trace_get_meta(t);
    ck_assert_msg(!strncmp(m->tokenizer, tk, strlen(tk)) && !strstr(m->tokenizer, "(absent)"), "%s",
                  m->tokenizer);
    sfi_trace_close(t);
}
END_TEST

START_TEST(summary_level)
{
    sfi_trace *t = record(SFI_TRACE_SUMMARY, 4096);
    sfi_error e;
    /* Prefill's selection as step 0's, step 2's own; none at step 1. */
    ck_assert_int_eq(sfi_trace_n_selections(t), 2 * L * KV);
    int32_t *sel, n;
    float mass, lam;
    ck_assert_int_eq(sfi_trace_read_selection(t, 0, 0, 1, 1, &sel, &n, &mass, &lam, &e), SFI_OK);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(sel[0], 2);
    ck_assert_int_eq(sel[2], 5);
    ck_assert_float_eq_tol(mass, 0.65f, 1e-6f); /* mean of heads 2, 3 */
    ck_assert_float_eq(lam, 0.02f);
    free(sel);
    ck_assert_int_eq(sfi_trace_read_selection(t, 0, 2, 0, 0, &sel, &n, &mass, &lam, &e), SFI_OK);
    ck_assert_int_eq(sel[1], 5);
    ck_assert_float_eq_tol(mass, 0.85f, 1e-6f);
    free(sel);
    ck_assert_int_eq(sfi_trace_read_selection(t, 0, 1, 0, 0, &sel, &n, &mass, &lam, &e),
                     SFI_ENOTFOUND);
    /* Fast mass only on the fast step: sink {0} U selected U recent {7, 8}
     * at n_ctx 9, averaged over the group's query heads. */
    ck_assert_int_eq(sfi_trace_n_fast_mass(t), L * KV);
    int n1 = NCTX0 + 1;
    float p[H][NCTX0 + 1];
    for (int h = 0; h < H; h++)
        make_probs(p[h], h, n1);
    for (int l = 0; l < L; l++)
        for (int kv = 0; kv < KV; kv++) {
            int inset[NCTX0 + 1] = {0};
            inset[0] = inset[n1 - 2] = inset[n1 - 1] = 1;
            inset[1 + kv] = inset[3] = inset[4 + l] = 1;
            double want = 0.0;
            for (int g = 0; g < 2; g++)
                for (int i = 0; i < n1; i++)
                    if (inset[i])
                        want += p[kv * 2 + g][i];
            want /= 2;
            float fm;
            ck_assert_int_eq(sfi_trace_read_fast_mass(t, 0, 1, l, kv, &fm, &e), SFI_OK);
            ck_assert_msg(fabs(fm - want) < 1e-6, "layer %d kv %d: %g vs %g", l, kv, fm, want);
        }
    ck_assert_int_eq(sfi_trace_n_topm(t), 0);
    sfi_trace_close(t);
}
END_TEST

START_TEST(full_level)
{
    sfi_trace *t = record(SFI_TRACE_FULL, 4);
    sfi_error e;
    ck_assert_int_eq(sfi_trace_get_meta(t)->top_m, 4);
    /* Steps 0 (the prefill's last query), 1 and 2, every layer and query
     * head. */
    ck_assert_int_eq(sfi_trace_n_topm(t), 3 * L * H);
    int32_t pos[4], m;
    float prob[4], tail;
    ck_assert_int_eq(sfi_trace_read_topm(t, 0, 2, 1, 3, pos, prob, &m, &tail, &e), SFI_OK);
    int n = NCTX0 + 2;
    ck_assert_int_eq(m, 4);
    ck_assert_int_eq(pos[0], n - 1);
    ck_assert_int_eq(pos[1], 3 % (n - 1));
    ck_assert_int_eq(pos[2], 4);
    ck_assert_float_eq(prob[0], 0.5f);
    ck_assert_float_eq(prob[3], 0.0625f);
    ck_assert_float_eq_tol(tail, 0.0625f, 1e-6f);
    ck_assert_int_eq(sfi_trace_read_topm(t, 0, 0, 0, 0, pos, prob, &m, &tail, &e), SFI_OK);
    ck_assert_int_eq(pos[0], NCTX0 - 1);
    char *v;
    ck_assert_int_eq(sfi_trace_get_meta_value(t, "topm_layers", &v, &e), SFI_OK);
    ck_assert_str_eq(v, "all");
    free(v);
    sfi_trace_close(t);
    /* Only layer 1's top-M records when asked. */
    t = record_layers(SFI_TRACE_FULL, 4, "1");
    ck_assert_int_eq(sfi_trace_n_topm(t), 3 * H);
    ck_assert_int_eq(sfi_trace_read_topm(t, 0, 1, 0, 0, pos, prob, &m, &tail, &e), SFI_ENOTFOUND);
    ck_assert_int_eq(sfi_trace_read_topm(t, 0, 1, 1, 0, pos, prob, &m, &tail, &e), SFI_OK);
    ck_assert_int_eq(sfi_trace_get_meta_value(t, "topm_layers", &v, &e), SFI_OK);
    ck_assert_str_eq(v, "1");
    free(v);
    ck_assert_int_eq(sfi_trace_get_meta_value(t, "nonesuch", &v, &e), SFI_ENOTFOUND);
    sfi_trace_close(t);
}
END_TEST

START_TEST(parse_flags)
{
    sfi_recorder_opts o;
    sfi_recorder_opts_default(&o);
    char *argv[] = {"run",
                    "--trace",
                    "x.db",
                    "--trace-level=full",
                    "--trace-top-m",
                    "64",
                    "--other",
                    "--trace-level",
                    "most",
                    "--trace-top-m",
                    "0",
                    "--trace"};
    int argc = 12, i = 1;
    sfi_error e;
    ck_assert_int_eq(sfi_recorder_parse_arg(&o, argc, argv, &i, &e), 1);
    ck_assert_int_eq(i, 3);
    ck_assert_str_eq(o.path, "x.db");
    ck_assert_int_eq(sfi_recorder_parse_arg(&o, argc, argv, &i, &e), 1);
    ck_assert_int_eq(o.level, SFI_TRACE_FULL);
    ck_assert_int_eq(sfi_recorder_parse_arg(&o, argc, argv, &i, &e), 1);
    ck_assert_int_eq(o.top_m, 64);
    ck_assert_int_eq(i, 6);
    ck_assert_int_eq(sfi_recorder_parse_arg(&o, argc, argv, &i, &e), 0);
    i = 7;
    ck_assert_int_eq(sfi_recorder_parse_arg(&o, argc, argv, &i, &e), -1);
    i = 9;
    ck_assert_int_eq(sfi_recorder_parse_arg(&o, argc, argv, &i, &e), -1);
    ck_assert_ptr_nonnull(strstr(e.msg, "--trace-top-m"));
    i = 11;
    ck_assert_int_eq(sfi_recorder_parse_arg(&o, argc, argv, &i, &e), -1);
    ck_assert_ptr_nonnull(strstr(sfi_recorder_usage(), "--trace-level"));
    ck_assert_int_eq(sfi_recorder_set_option(&o, "trace-layers", "0,2,9", &e), 1);
    ck_assert_str_eq(o.layers, "0,2,9");
    ck_assert_int_eq(sfi_recorder_set_option(&o, "trace-layers", "0,,1", &e), -1);
    ck_assert_int_eq(sfi_recorder_set_option(&o, "trace-layers", "1,", &e), -1);
    ck_assert_int_eq(sfi_recorder_set_option(&o, "trace-layers", "x", &e), -1);
    ck_assert_int_eq(sfi_recorder_set_option(&o, "model", "x", &e), 0);
    ck_assert_int_eq(sfi_recorder_set_option(&o, "trace-level", "summary", &e), 1);
    ck_assert_int_eq(o.level, SFI_TRACE_SUMMARY);
    /* No --trace: nothing to record. */
    sfi_recorder_opts_default(&o);
    sfi_model_config cfg;
    fake_cfg(&cfg);
    sfi_decode_opts d;
    fake_opts(&d);
    sfi_recorder *r = (sfi_recorder *)&o;
    ck_assert_int_eq(sfi_recorder_open(&o, ".", &cfg, &d, &r, &e), SFI_OK);
    ck_assert_ptr_null(r);
    sfi_decode_observer obs;
    sfi_recorder_observer(NULL, &obs);
    ck_assert_ptr_null(obs.on_step);
    ck_assert_int_eq(sfi_recorder_finish(NULL, &e), SFI_OK);
    /* Options that would be ignored are refused: the recorder's options
     * without --trace, top-M below the full level, layers at tokens. */
    sfi_recorder_opts_default(&o);
    ck_assert_int_eq(sfi_recorder_opts_check(&o, &e), SFI_OK);
    ck_assert_int_eq(sfi_recorder_set_option(&o, "trace-layers", "0", &e), 1);
    ck_assert_int_eq(sfi_recorder_opts_check(&o, &e), SFI_EINVAL);
    ck_assert_msg(strstr(e.msg, "--trace-layers needs --trace FILE") != NULL, "%s", e.msg);
    sfi_recorder_opts_default(&o);
    ck_assert_int_eq(sfi_recorder_set_option(&o, "trace-top-m", "8", &e), 1);
    ck_assert_int_eq(sfi_recorder_opts_check(&o, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "--trace-top-m needs --trace FILE"));
    ck_assert_int_eq(sfi_recorder_set_option(&o, "trace", "t.db", &e), 1);
    ck_assert_int_eq(sfi_recorder_opts_check(&o, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "full level only"));
    ck_assert_int_eq(sfi_recorder_set_option(&o, "trace-level", "full", &e), 1);
    ck_assert_int_eq(sfi_recorder_opts_check(&o, &e), SFI_OK);
    sfi_recorder_opts_default(&o);
    ck_assert_int_eq(sfi_recorder_set_option(&o, "trace", "t.db", &e), 1);
    ck_assert_int_eq(sfi_recorder_set_option(&o, "trace-layers", "0", &e), 1);
    ck_assert_int_eq(sfi_recorder_opts_check(&o, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "summary and full"));
    ck_assert_int_eq(sfi_recorder_set_option(&o, "trace-level", "summary", &e), 1);
    ck_assert_int_eq(sfi_recorder_opts_check(&o, &e), SFI_OK);
    sfi_recorder_opts_default(&o);
    ck_assert_int_eq(sfi_recorder_set_option(&o, "trace-level", "summary", &e), 1);
    ck_assert_int_eq(sfi_recorder_opts_check(&o, &e), SFI_EINVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("trace_recorder");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, tokens_level);
    tcase_add_test(tc, summary_level);
    tcase_add_test(tc, full_level);
    tcase_add_test(tc, parse_flags);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
