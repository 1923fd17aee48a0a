/* sim/sfi_serve: hand-computable workloads on an engine whose every step
 * costs 1 ms, scheduling (admission, queueing, preemption, chunked and
 * unchunked prefill, prefix caching), and the invariants of random
 * workloads on the real cost model. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_replay.h"
#include "sfi_rng.h"
#include "sfi_serve.h"
#include "sfi_test_util.h"

static sfi_model_config m06, m4b;

static void setup_models(void)
{
    sfi_error e;
    ck_assert_msg(sfi_model_preset("Qwen3-0.6B", &m06, &e) == SFI_OK, "%s", e.msg);
    ck_assert_msg(sfi_model_preset("Qwen3-4B", &m4b, &e) == SFI_OK, "%s", e.msg);
}

/* An engine whose steps cost 1 ms plus well under a microsecond of
 * memory and compute: 1.2 GB of weights at 1e15 B/s is 1.2 us. */
static void one_ms_engine(sfi_serve_config *c, sfi_policy_kind pol)
{
    sfi_serve_config_init(c);
    c->cost.model = &m06;
    memset(&c->cost.gpu, 0, sizeof c->cost.gpu);
    strcpy(c->cost.gpu.name, "ideal");
    c->cost.gpu.hbm_capacity = 80e9;
    c->cost.gpu.hbm_bandwidth = 1e15;
    c->cost.gpu.bf16_flops = 1e18;
    c->cost.gpu.fp8_flops = 1e18;
    c->cost.gpu.sm_count = 100;
    for (int k = 0; k < SFI_KC_COUNT; k++) {
        c->cost.prof.efficiency[k] = 1;
        c->cost.prof.fixed_s[k] = 0;
    }
    c->cost.prof.launch_s = 0;
    c->cost.prof.allreduce_latency_s = 0;
    c->cost.prof.overlap_contention = 0;
    c->cost.prof.step_overhead_s = 1e-3;
    c->cost.kind = pol;
}

static int near_ms(double t, double ms)
{
    return fabs(t - ms * 1e-3) < 0.02e-3 * (ms > 1 ? ms : 1);
}

static void run_ok(const sfi_serve_config *c, const sfi_serve_request *rq, int n, sfi_serve_result *r)
{
    sfi_error e;
    ck_assert_msg(sfi_serve_run(c, rq, n, r, &e) == SFI_OK, "%s", e.msg);
}

START_TEST(two_requests_by_hand)
{
    sfi_serve_config c;
    one_ms_engine(&c, SFI_POLICY_FULL);
    sfi_serve_request rq[2] = {{0, 100, 5}, {0, 100, 5}};
    sfi_serve_result r;
    sfi_serve_summary s;
    sfi_error e;
    run_ok(&c, rq, 2, &r);
    /* Step 1 prefills both (200 tokens of 8192) and samples their first
     * tokens; steps 2..5 decode the other 4. */
    ck_assert_int_eq(r.n_steps, 5);
    for (int i = 0; i < 2; i++) {
        ck_assert(near_ms(r.req[i].first_token, 1));
        ck_assert(near_ms(r.req[i].finish, 5));
        ck_assert_int_eq(r.req[i].decode_steps, 4);
        ck_assert_int_eq(r.req[i].preemptions, 0);
    }
    ck_assert_int_eq(r.peak_running, 2);
    ck_assert_int_eq(r.prefill_tokens, 200);
    ck_assert_msg(sfi_serve_summarize(&r, 0, 0, &s, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(s.tokens, 10);
    ck_assert(fabs(s.tok_s - 10 / 5e-3) < 10); /* 2000 tokens/s */
    ck_assert(near_ms(s.ttft_mean, 1) && near_ms(s.tpot_p99, 1) && near_ms(s.e2e_p50, 5));
    /* An SLO of 0.5 ms per output token: nobody meets it. */
    ck_assert(sfi_serve_summarize(&r, 0.5e-3, 0, &s, &e) == SFI_OK);
    ck_assert(s.goodput_tok_s == 0 && s.slo_met == 0);
    ck_assert(sfi_serve_summarize(&r, 2e-3, 0, &s, &e) == SFI_OK);
    ck_assert(s.goodput_tok_s == s.tok_s && s.slo_met == 1);
    sfi_serve_result_free(&r);

    /* The same steps priced by the cost model itself, exactly. */
    sfi_cost_group g1 = {.context = 100, .n_new = 100, .count = 2, .prefill = 1, .last_chunk = 1};
    sfi_step_cost c1, cd;
    ck_assert(sfi_cost_step_mix(&c.cost, &g1, 1, &c1, &e) == SFI_OK);
    double t = c1.time_s;
    for (int k = 1; k <= 4; k++) {
        sfi_cost_group gd = {.context = 100 + k, .n_new = 1, .count = 2};
        ck_assert(sfi_cost_step_mix(&c.cost, &gd, 1, &cd, &e) == SFI_OK);
        t += cd.time_s;
    }
    run_ok(&c, rq, 2, &r);
    ck_assert(r.req[1].finish == t);
    sfi_serve_result_free(&r);
}
END_TEST

START_TEST(queued_when_memory_is_short)
{
    sfi_serve_config c;
    one_ms_engine(&c, SFI_POLICY_FULL);
    sfi_serve_request rq[2] = {{0, 100, 5}, {0, 100, 5}};
    sfi_serve_result r;
    run_ok(&c, rq, 2, &r);
    /* KV per position of Qwen3-0.6B: 28 layers x 8 KV heads x 128 x 2 x 2
     * bytes. Room for 1.5 requests of 7 blocks (112 positions). */
    const double pos = 28 * 8 * 128 * 2 * 2.0;
    c.cost.gpu.hbm_capacity = (r.weights + r.activations + 1.5 * 112 * pos) / c.gpu_mem_util;
    sfi_serve_result_free(&r);
    run_ok(&c, rq, 2, &r);
    /* One at a time: the second is admitted when the first finishes at
     * 5 ms, prefills in step 6 and finishes at 10 ms. */
    ck_assert_int_eq(r.peak_running, 1);
    ck_assert(near_ms(r.req[0].finish, 5));
    ck_assert(near_ms(r.req[1].admitted, 5));
    ck_assert(near_ms(r.req[1].first_token, 6));
    ck_assert(near_ms(r.req[1].finish, 10));
    ck_assert(r.peak_kv <= r.kv_budget && r.peak_kv == 112 * pos);
    ck_assert(fabs(r.kv_budget - 1.5 * 112 * pos) < 1);
    ck_assert_int_eq(r.preemptions, 0);
    sfi_serve_result_free(&r);
}
END_TEST

START_TEST(preempted_and_recomputed)
{
    sfi_serve_config c;
    one_ms_engine(&c, SFI_POLICY_FULL);
    /* Prompts of 100 (7 blocks) growing to 139 positions (9 blocks): room
     * for 250 positions admits both (224) but not both at 8 blocks (256). */
    sfi_serve_request rq[2] = {{0, 100, 40}, {0, 100, 40}};
    sfi_serve_result r;
    run_ok(&c, rq, 2, &r);
    const double pos = 28 * 8 * 128 * 2 * 2.0;
    c.cost.gpu.hbm_capacity = (r.weights + r.activations + 250 * pos) / c.gpu_mem_util;
    sfi_serve_result_free(&r);
    run_ok(&c, rq, 2, &r);
    ck_assert_int_eq(r.peak_running, 2);
    ck_assert_int_eq(r.preemptions, 1);
    ck_assert_int_eq(r.req[1].preemptions, 1);
    ck_assert(r.peak_kv <= r.kv_budget);
    /* Both sampled their first token in step 1. Request 0 then decodes
     * alone to the end; request 1 was preempted when both needed an 8th
     * block (decode step with 113 positions: step 14), waits, and
     * recomputes its 100 + 13 tokens once request 0 is done (t = 40 ms). */
    ck_assert(near_ms(r.req[0].first_token, 1) && near_ms(r.req[1].first_token, 1));
    ck_assert(near_ms(r.req[0].finish, 40));
    ck_assert_int_eq(r.recomputed_tokens, 112);
    ck_assert_int_eq(r.prefill_tokens, 200 + 113);
    /* Recompute step at 41 ms samples token 14; 26 decode steps follow. */
    ck_assert(near_ms(r.req[1].finish, 41 + 26));
    ck_assert_int_eq(r.req[1].decode_steps, 12 + 26);
    sfi_serve_result_free(&r);
}
END_TEST

START_TEST(chunked_and_unchunked_prefill)
{
    sfi_serve_config c;
    one_ms_engine(&c, SFI_POLICY_FULL);
    c.max_batched_tokens = 256;
    c.max_num_seqs = 16;
    /* A 600-token prompt in chunks of 256: first token after 3 steps; the
     * second request arrives at 0.5 ms and joins with the rest of the
     * third step's budget (256 - 88 = 168 of its 300 tokens), so its first
     * token comes in step 4 beside request 0's first decode. */
    sfi_serve_request rq[2] = {{0, 600, 3}, {0.5e-3, 300, 2}};
    sfi_serve_result r;
    run_ok(&c, rq, 2, &r);
    ck_assert(near_ms(r.req[0].first_token, 3));
    ck_assert(near_ms(r.req[1].first_token, 4));
    ck_assert(near_ms(r.req[0].finish, 5));
    ck_assert(near_ms(r.req[1].finish, 5));
    ck_assert_int_eq(r.n_steps, 5);
    ck_assert_int_eq(r.prefill_tokens, 900);
    sfi_serve_result_free(&r);
    /* Unchunked: request 0 prefills alone in step 1 (600 tokens, more than
     * the budget: a whole prompt always goes), request 1 (queued at 1 ms)
     * prefills alone in step 2, then both decode. */
    c.chunked_prefill = 0;
    c.timeline = 1;
    run_ok(&c, rq, 2, &r);
    ck_assert(near_ms(r.req[0].first_token, 1));
    ck_assert(near_ms(r.req[1].first_token, 2));
    ck_assert(near_ms(r.req[0].finish, 4));
    ck_assert(near_ms(r.req[1].finish, 3));
    ck_assert_int_eq(r.n_steps, 4);
    ck_assert_ptr_nonnull(r.steps);
    ck_assert_int_eq(r.steps[0].prefill_tokens, 600);
    ck_assert_int_eq(r.steps[0].running, 1);
    ck_assert_int_eq(r.steps[1].prefill_tokens, 300);
    ck_assert_int_eq(r.steps[1].running, 1);
    ck_assert_int_eq(r.steps[2].prefill_tokens, 0);
    ck_assert_int_eq(r.steps[2].running, 2);
    sfi_serve_result_free(&r);
}
END_TEST

START_TEST(idle_until_arrival_and_max_num_seqs)
{
    sfi_serve_config c;
    one_ms_engine(&c, SFI_POLICY_FULL);
    c.max_num_seqs = 1;
    c.max_batched_tokens = 1;
    sfi_serve_request rq[2] = {{10, 1, 2}, {0, 1, 2}};
    sfi_serve_result r;
    run_ok(&c, rq, 2, &r);
    /* Request 1 arrives first (input order is not arrival order). */
    ck_assert(near_ms(r.req[1].finish, 2));
    ck_assert(fabs(r.req[0].first_token - 10.001) < 1e-5);
    ck_assert(fabs(r.start - 0) < 1e-12 && fabs(r.end - 10.002) < 1e-5);
    ck_assert_int_eq(r.peak_running, 1);
    sfi_serve_result_free(&r);
}
END_TEST

START_TEST(shared_prefix_is_computed_and_held_once)
{
    sfi_serve_config c;
    one_ms_engine(&c, SFI_POLICY_FULL);
    sfi_serve_request rq[4];
    for (int i = 0; i < 4; i++)
        rq[i] = (sfi_serve_request){0, 1000, 4};
    sfi_serve_result a, b;
    run_ok(&c, rq, 4, &a);
    c.shared_prefix = 1 << 30;
    c.timeline = 1;
    run_ok(&c, rq, 4, &b);
    /* 992 of each prompt's 1000 tokens are full blocks of the prefix (the
     * last token is always computed): the first request computes them,
     * the others wait for them, then take them from the cache. */
    ck_assert_int_eq(b.cached_tokens, 3 * 992);
    ck_assert_int_eq(b.prefill_tokens, 1000 + 3 * 8);
    ck_assert_int_eq(a.prefill_tokens, 4000);
    const double pos = 28 * 8 * 128 * 2 * 2.0;
    ck_assert(a.peak_kv == 4 * 1008 * pos);
    ck_assert(b.peak_kv == (992 + 4 * 16) * pos);
    ck_assert(near_ms(b.req[0].first_token, 1) && near_ms(b.req[3].first_token, 2));
    ck_assert_int_eq(b.steps[0].running, 1);
    sfi_serve_result_free(&a);
    sfi_serve_result_free(&b);
}
END_TEST

START_TEST(sfi_buffers_cost_concurrency)
{
    /* Qwen3-4B on a GPU whose KV budget holds 8 requests of 16K full KV:
     * SFI's compact segment and Selector scratch leave room for fewer. */
    sfi_serve_config c;
    sfi_serve_config_init(&c);
    sfi_error e;
    c.cost.model = &m4b;
    ck_assert(sfi_gpu_preset("H100", &c.cost.gpu, &e) == SFI_OK);
    sfi_serve_request rq[16];
    for (int i = 0; i < 16; i++)
        rq[i] = (sfi_serve_request){0, 16384 - 64, 64};
    sfi_serve_result r;
    c.cost.kind = SFI_POLICY_FULL;
    run_ok(&c, rq, 16, &r);
    const double req_b = 16384 * 36 * 8 * 128 * 2 * 2.0;
    c.cost.gpu.hbm_capacity = (r.weights + r.activations + 8.5 * req_b) / c.gpu_mem_util;
    sfi_serve_result_free(&r);
    run_ok(&c, rq, 16, &r);
    int full_peak = r.peak_running;
    ck_assert_int_eq(full_peak, 8);
    sfi_serve_result_free(&r);
    c.cost.kind = SFI_POLICY_SFI;
    run_ok(&c, rq, 16, &r);
    ck_assert_int_lt(r.peak_running, full_peak);
    ck_assert(r.peak_kv <= r.kv_budget);
    /* No stream: one slow step per request, its first decode step. */
    for (int i = 0; i < 16; i++)
        ck_assert_int_eq(r.req[i].slow_steps, 1);
    sfi_serve_result_free(&r);
}
END_TEST

START_TEST(invariants_of_random_workloads)
{
    sfi_error e;
    int32_t *tok;
    uint8_t *trig;
    ck_assert(sfi_replay_synthetic(4096, 20, 7, &tok, &trig, &e) == SFI_OK);
    sfi_replay_stream stream = {tok, 4096, trig, 2};
    const sfi_policy_kind pols[] = {SFI_POLICY_FULL, SFI_POLICY_SFI, SFI_POLICY_STREAMING,
                                    SFI_POLICY_QUEST};
    for (int trial = 0; trial < 8; trial++) {
        uint64_t rng = 1234 + trial;
        sfi_len_dist pd = {SFI_LEN_LOGNORMAL, 3000, 1.0}, gd = {SFI_LEN_UNIFORM, 1, 300};
        int n = 40;
        sfi_serve_request rq[40];
        double t = 0;
        for (int i = 0; i < n; i++) {
            rq[i].prompt = sfi_len_dist_draw(&pd, &rng, i, NULL, 0);
            if (rq[i].prompt > 20000)
                rq[i].prompt = 20000;
            rq[i].gen = sfi_len_dist_draw(&gd, &rng, i, NULL, 0);
            t += -log(1 - sfi_rng_uniform(&rng)) / 50.0;
            rq[i].arrival = trial % 2 ? t : 0;
        }
        for (size_t p = 0; p < sizeof pols / sizeof pols[0]; p++) {
            sfi_serve_config c;
            sfi_serve_config_init(&c);
            c.cost.model = &m06;
            ck_assert(sfi_gpu_preset("H100", &c.cost.gpu, &e) == SFI_OK);
            /* Tight: a few GB of KV, so requests queue and get preempted. */
            c.gpu_mem_util = 0.06 + 0.01 * trial;
            c.chunked_prefill = trial % 3 != 2;
            c.max_batched_tokens = trial % 4 == 1 ? 512 : 8192;
            c.max_num_seqs = trial % 4 == 1 ? 16 : 256;
            c.shared_prefix = trial % 4 == 3 ? 1000 : 0;
            c.stream = &stream;
            c.timeline = 1;
            c.cost.kind = pols[p];
            sfi_serve_result r;
            ck_assert_msg(sfi_serve_run(&c, rq, n, &r, &e) == SFI_OK, "trial %d %s: %s", trial,
                          sfi_policy_kind_name(pols[p]), e.msg);
            int64_t decode = 0;
            for (int i = 0; i < n; i++) {
                const sfi_serve_req_stats *q = &r.req[i];
                /* Every request finishes, in order of its own events. */
                ck_assert(q->admitted >= q->arrival);
                ck_assert(q->first_token > q->admitted);
                ck_assert(q->finish >= q->first_token);
                ck_assert(q->first_token - q->arrival <= q->finish - q->arrival);
                ck_assert(q->decode_steps <= rq[i].gen - 1);
                ck_assert(q->slow_steps <= q->decode_steps);
                decode += q->decode_steps;
                if (q->preemptions == 0)
                    ck_assert_int_eq(q->decode_steps, rq[i].gen - 1);
            }
            /* Memory never exceeds the budget, steps never exceed limits. */
            ck_assert(r.peak_kv <= r.kv_budget);
            ck_assert(r.peak_running <= c.max_num_seqs);
            double tsum = 0;
            for (int64_t k = 0; k < r.n_steps; k++) {
                ck_assert(r.steps[k].kv_used <= r.kv_budget);
                ck_assert(r.steps[k].running >= 1 && r.steps[k].running <= c.max_num_seqs);
                ck_assert(r.steps[k].prefill_tokens <=
                          (c.chunked_prefill ? c.max_batched_tokens : 20000 + 300));
                ck_assert(r.steps[k].latency > 0);
                if (k > 0)
                    ck_assert(r.steps[k].t >= r.steps[k - 1].t + r.steps[k - 1].latency - 1e-12);
                tsum += r.steps[k].latency;
            }
            ck_assert(fabs(tsum - r.busy_s) <= 1e-9 * tsum);
            ck_assert(r.busy_s <= r.end - r.start + 1e-9);
            ck_assert_int_eq(decode, r.request_steps);
            sfi_serve_summary s;
            ck_assert(sfi_serve_summarize(&r, 0.05, 0, &s, &e) == SFI_OK);
            ck_assert(s.ttft_p50 <= s.ttft_p99 && s.tpot_p50 <= s.tpot_p99);
            ck_assert(s.goodput_tok_s <= s.tok_s);
            sfi_serve_result_free(&r);
        }
    }
    free(tok);
    free(trig);
}
END_TEST

START_TEST(errors_name_the_problem)
{
    sfi_serve_config c;
    sfi_serve_result r;
    sfi_error e;
    one_ms_engine(&c, SFI_POLICY_FULL);
    sfi_serve_request rq = {0, 2000000, 10};
    /* Too long for 80 GB. */
    ck_assert_int_eq(sfi_serve_run(&c, &rq, 1, &r, &e), SFI_ERANGE);
    ck_assert_msg(strstr(e.msg, "request 0") && strstr(e.msg, "KV budget"), "%s", e.msg);
    ck_assert_ptr_null(r.req);
    /* Weights alone do not fit. */
    c.cost.gpu.hbm_capacity = 1e9;
    rq.prompt = 10;
    ck_assert_int_eq(sfi_serve_run(&c, &rq, 1, &r, &e), SFI_ERANGE);
    ck_assert_msg(strstr(e.msg, "no room for KV"), "%s", e.msg);
    one_ms_engine(&c, SFI_POLICY_FULL);
    c.gpu_mem_util = 0;
    ck_assert_int_eq(sfi_serve_run(&c, &rq, 1, &r, &e), SFI_ERANGE);
    one_ms_engine(&c, SFI_POLICY_FULL);
    c.max_batched_tokens = 8;
    c.max_num_seqs = 16;
    ck_assert_int_eq(sfi_serve_run(&c, &rq, 1, &r, &e), SFI_ERANGE);
    one_ms_engine(&c, SFI_POLICY_FULL);
    rq.gen = 0;
    ck_assert_int_eq(sfi_serve_run(&c, &rq, 1, &r, &e), SFI_ERANGE);
    rq.gen = 1;
    rq.arrival = -1;
    ck_assert_int_eq(sfi_serve_run(&c, &rq, 1, &r, &e), SFI_ERANGE);
    rq.arrival = NAN;
    ck_assert_int_eq(sfi_serve_run(&c, &rq, 1, &r, &e), SFI_ERANGE);
    ck_assert_int_eq(sfi_serve_run(&c, &rq, 0, &r, &e), SFI_ERANGE);
}
END_TEST

START_TEST(length_distributions)
{
    sfi_len_dist d;
    sfi_error e;
    ck_assert(sfi_len_dist_parse("8K", &d, &e) == SFI_OK && d.kind == SFI_LEN_FIXED && d.a == 8192);
    ck_assert(sfi_len_dist_parse("uniform:1K:2K", &d, &e) == SFI_OK && d.a == 1024 && d.b == 2048);
    ck_assert(sfi_len_dist_parse("lognormal:4K:0.5", &d, &e) == SFI_OK && d.b == 0.5);
    ck_assert(sfi_len_dist_parse("trace", &d, &e) == SFI_OK && d.kind == SFI_LEN_TRACE);
    const char *bad[] = {"", "0", "-5", "8Q", "uniform:5:2", "uniform:1", "lognormal:1K:9",
                         "poisson:1:2", "uniform:1:2:3", "2G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(sfi_len_dist_parse(bad[i], &d, &e) != SFI_OK, "%s accepted", bad[i]);
    uint64_t rng = 5;
    sfi_len_dist u = {SFI_LEN_UNIFORM, 10, 12};
    int seen[3] = {0};
    for (int i = 0; i < 300; i++) {
        int v = sfi_len_dist_draw(&u, &rng, i, NULL, 0);
        ck_assert(v >= 10 && v <= 12);
        seen[v - 10]++;
    }
    ck_assert(seen[0] > 50 && seen[1] > 50 && seen[2] > 50);
    /* Lognormal: the median comes out near MEDIAN. */
    sfi_len_dist ln = {SFI_LEN_LOGNORMAL, 1000, 0.8};
    int below = 0;
    for (int i = 0; i < 2000; i++)
        below += sfi_len_dist_draw(&ln, &rng, i, NULL, 0) < 1000;
    ck_assert(below > 900 && below < 1100);
    int64_t vals[3] = {5, 6, 7};
    sfi_len_dist tr = {SFI_LEN_TRACE, 0, 0};
    ck_assert_int_eq(sfi_len_dist_draw(&tr, &rng, 4, vals, 3), 6);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("serve");
    TCase *tc = tcase_create("core");
    tcase_add_unchecked_fixture(tc, setup_models, NULL);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, two_requests_by_hand);
    tcase_add_test(tc, queued_when_memory_is_short);
    tcase_add_test(tc, preempted_and_recomputed);
    tcase_add_test(tc, chunked_and_unchunked_prefill);
    tcase_add_test(tc, idle_until_arrival_and_max_num_seqs);
    tcase_add_test(tc, shared_prefix_is_computed_and_held_once);
    tcase_add_test(tc, sfi_buffers_cost_concurrency);
    tcase_add_test(tc, invariants_of_random_workloads);
    tcase_add_test(tc, errors_name_the_problem);
    tcase_add_test(tc, length_distributions);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
