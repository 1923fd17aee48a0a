/* sim/sfi_cost: every term on hand-computable cases, monotonicity, bad
 * input. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_cost.h"

static sfi_model_config qwen4b, qwen30b, qwen06b;

static void setup_models(void)
{
    sfi_error e;
    ck_assert_msg(sfi_model_preset("Qwen3-4B", &qwen4b, &e) == SFI_OK, "%s", e.msg);
    ck_assert_msg(sfi_model_preset("Qwen3-30B-A3B", &qwen30b, &e) == SFI_OK, "%s", e.msg);
    ck_assert_msg(sfi_model_preset("Qwen3-0.6B", &qwen06b, &e) == SFI_OK, "%s", e.msg);
}

static void setup(sfi_cost_setup *s, const sfi_model_config *m, const char *gpu, int ctx, int b)
{
    sfi_error e;
    sfi_cost_setup_init(s);
    s->model = m;
    ck_assert_int_eq(sfi_gpu_preset(gpu, &s->gpu, &e), SFI_OK);
    s->context = ctx;
    s->batch = b;
}

/* A profile with round numbers, so hand computations do not follow the
 * default profile's calibration. */
static void round_profile(sfi_cost_setup *s)
{
    static const double eff[SFI_KC_COUNT] = {
        [SFI_KC_GEMM] = 0.8,   [SFI_KC_ATTN_DENSE] = 0.75, [SFI_KC_ATTN_SPARSE] = 0.6,
        [SFI_KC_SELECTOR] = 0.5, [SFI_KC_TOPK] = 0.4,      [SFI_KC_REORG] = 0.7,
        [SFI_KC_ALLREDUCE] = 0.7, [SFI_KC_OTHER] = 0.5,    [SFI_KC_LOGITS] = 0.2,
        [SFI_KC_ATTN_PREFILL] = 0.6,
    };
    for (int c = 0; c < SFI_KC_COUNT; c++) {
        s->prof.efficiency[c] = eff[c];
        s->prof.fixed_s[c] = 0;
    }
    s->prof.launch_s = 3e-6;
    s->prof.allreduce_latency_s = 8e-6;
    s->prof.overlap_contention = 0.3;
}

static int close_rel(double a, double b, double tol)
{
    return fabs(a - b) <= tol * fmax(fabs(a), fabs(b));
}

START_TEST(kv_bytes_of_qwen3_4b_at_32k)
{
    sfi_cost_setup s;
    setup(&s, &qwen4b, "H100", 32768, 1);
    /* 8 KV heads x 128 dims x (K + V) x 2 bytes = 4096 B per position and
     * layer; 32768 positions -> 128 MiB per layer, 4.5 GiB for 36 layers. */
    ck_assert(sfi_cost_kv_bytes_dense(&s) == 134217728.0);
    ck_assert(36 * sfi_cost_kv_bytes_dense(&s) == 4.5 * 1024 * 1024 * 1024);
    /* Fast step: 4 sink + 2048 selected + 256 recent = 2308 positions. */
    ck_assert_int_eq(sfi_cost_fast_positions(&s), 2308);
    ck_assert(sfi_cost_kv_bytes_fast(&s) == 2308.0 * 4096);
    /* Tensor parallel 2 splits the KV heads. */
    s.tp = 2;
    ck_assert(sfi_cost_kv_bytes_dense(&s) == 134217728.0 / 2);
    /* Short context: |J| = 2000 - 260 = 1740 < K, so everything is read. */
    s.tp = 1;
    s.context = 2000;
    ck_assert_int_eq(sfi_cost_fast_positions(&s), 2000);
}
END_TEST

START_TEST(weights_of_a_dense_and_a_moe_layer)
{
    sfi_cost_setup s;
    setup(&s, &qwen4b, "H100", 8192, 1);
    /* q,o: 2*2560*32*128; k,v: 2*2560*8*128; norms 2*2560+2*128; MLP
     * 3*2560*9728 -> 100,930,816 bf16 weights. */
    ck_assert(sfi_cost_layer_weight_bytes(&s, 0, 1) == 100930816.0 * 2);
    /* Expert union: E (1 - (1 - k/E)^B). */
    ck_assert(sfi_cost_expected_experts(128, 8, 1) == 8.0);
    ck_assert(close_rel(sfi_cost_expected_experts(128, 8, 2), 15.5, 1e-12));
    ck_assert(sfi_cost_expected_experts(128, 8, 0) == 0.0);
    ck_assert(sfi_cost_expected_experts(4, 8, 3) == 4.0);
    ck_assert(sfi_cost_expected_experts(128, 8, 10000) > 127.999);
    for (int b = 1; b < 256; b++)
        ck_assert(sfi_cost_expected_experts(128, 8, b + 1) > sfi_cost_expected_experts(128, 8, b));
    sfi_cost_setup m;
    setup(&m, &qwen30b, "H100", 8192, 1);
    /* Batch 1: attention + router + 8 experts of 3*2048*768. */
    double attn = 2.0 * 2048 * 32 * 128 + 2.0 * 2048 * 4 * 128 + 2 * 2048 + 2 * 128;
    double one = attn + 2048.0 * 128 + 8 * 3.0 * 2048 * 768;
    ck_assert(close_rel(sfi_cost_layer_weight_bytes(&m, 0, 1), one * 2, 1e-12));
    ck_assert(sfi_cost_layer_weight_bytes(&m, 0, 64) > sfi_cost_layer_weight_bytes(&m, 0, 8));
}
END_TEST

START_TEST(kernel_roofline_and_allreduce)
{
    sfi_cost_setup s;
    setup(&s, &qwen4b, "H100", 8192, 1);
    round_profile(&s);
    /* 3.35 GB at 3.35 TB/s = 1 ms, over gemm efficiency 0.8, + 3 us. */
    ck_assert(close_rel(sfi_cost_kernel_time(&s, SFI_KC_GEMM, 3.35e9, 0), 1e-3 / 0.8 + 3e-6, 1e-12));
    /* Compute bound: 989.4 TFLOP at 989.4 TFLOP/s = 1 s. */
    ck_assert(close_rel(sfi_cost_kernel_time(&s, SFI_KC_GEMM, 1, 989.4e12), 1 / 0.8 + 3e-6, 1e-12));
    ck_assert(sfi_cost_allreduce_time(&s, 1e6) == 0);
    s.tp = 2;
    /* 2 (tp-1)/tp * 1 MB over 450 GB/s per direction, /0.7, + 8 us. */
    ck_assert(close_rel(sfi_cost_allreduce_time(&s, 1e6), 1e6 / 450e9 / 0.7 + 8e-6, 1e-12));
}
END_TEST

/* A ring all-gather over tp GPUs: each GPU receives (tp - 1) pieces over
 * one direction of its link, at the all-reduce's efficiency and latency. */
START_TEST(allgather_time)
{
    sfi_cost_setup s;
    setup(&s, &qwen4b, "H100", 8192, 1);
    round_profile(&s);
    ck_assert(sfi_cost_allgather_time(&s, 1e6) == 0);
    s.tp = 2;
    ck_assert(close_rel(sfi_cost_allgather_time(&s, 1e6), 1e6 / 450e9 / 0.7 + 8e-6, 1e-12));
    s.tp = 4;
    ck_assert(close_rel(sfi_cost_allgather_time(&s, 1e6), 3e6 / 450e9 / 0.7 + 8e-6, 1e-12));
}
END_TEST

/* sfi-gpu's engine terms at tp > 1, each against a hand computation:
 * the Selector's side work on the main stream (a fast step pays its
 * launches; a slow step all of it, as the overlapped step does at
 * contention 1), the all-gather of the Selector's scores at the graph's
 * capacity in every SFI step, the argmax all-gather, and the bytes of the
 * collectives as sfi-gpu run --bench reported them on the H200 run. */
START_TEST(tp_engine_terms)
{
    sfi_error e;
    sfi_cost_setup s;
    setup(&s, &qwen4b, "H200", 8192 + 65, 16);
    round_profile(&s);
    s.allreduce_bytes = 4;
    const int L = qwen4b.num_hidden_layers;
    sfi_step_cost a, b;
    /* side work on the main stream, one GPU: a fast step pays 4 launches
     * (2 Selector kernels, Top-K, reorg) per layer */
    ck_assert_int_eq(sfi_cost_step(&s, 0, &a, &e), SFI_OK);
    s.side_serial = 1;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &b, &e), SFI_OK);
    ck_assert_msg(close_rel(b.time_s - a.time_s, L * 4 * 3e-6, 1e-9), "%.9g vs %.9g",
                  b.time_s - a.time_s, L * 4 * 3e-6);
    ck_assert_int_eq(b.launches - a.launches, L * 4);
    /* a slow step: all the side work exposed, as the two-stream step's
     * at contention 1, more than at contention 0 */
    s.prof.overlap_contention = 1;
    ck_assert_int_eq(sfi_cost_step(&s, 2, &b, &e), SFI_OK);
    s.side_serial = 0;
    ck_assert_int_eq(sfi_cost_step(&s, 2, &a, &e), SFI_OK);
    ck_assert(close_rel(b.time_s, a.time_s, 1e-12));
    ck_assert(close_rel(b.side_s, a.side_s, 1e-12) && b.side_s > 0);
    s.prof.overlap_contention = 0;
    ck_assert_int_eq(sfi_cost_step(&s, 2, &a, &e), SFI_OK);
    ck_assert(b.time_s > a.time_s);
    /* the dense policy has no side work */
    s.kind = SFI_POLICY_FULL;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &a, &e), SFI_OK);
    s.side_serial = 1;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &b, &e), SFI_OK);
    ck_assert(b.time_s == a.time_s);
    s.side_serial = 0;
    s.kind = SFI_POLICY_SFI;
    /* tp 2: the scores' all-gather, 16 x 4 KV heads x 8060 fp32 per layer
     * (the capacity of an 8K run of 128 steps: 8192 + 127 - 260, rounded
     * up to 4), in fast steps too; the dense policy has none */
    s.tp = 2;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &a, &e), SFI_OK);
    s.sel_gather_positions = 8060;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &b, &e), SFI_OK);
    double g = sfi_cost_allgather_time(&s, 16 * 4 * 8060 * 4.0);
    ck_assert(close_rel(b.time_s - a.time_s, L * g, 1e-9));
    ck_assert(close_rel(b.comm_s - a.comm_s, L * g, 1e-9));
    s.kind = SFI_POLICY_FULL;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &a, &e), SFI_OK);
    s.sel_gather_positions = 0;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &b, &e), SFI_OK);
    ck_assert(a.time_s == b.time_s);
    /* since 4cf4bb6 (sel_split_gather): a fast step runs no chain and no
     * all-gather; a slow step gathers after each layer's MLP on the main
     * stream, its Selector's steps 1-7 beside O and MLP on the side stream
     * and the rest beside the next layers; since 86177e5 the all-gather
     * carries the slow requests' rows, a power of two of them (2 here, 3
     * -> 4, the batch at most) */
    s.kind = SFI_POLICY_SFI;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &a, &e), SFI_OK);
    sfi_step_cost a2, b2;
    ck_assert_int_eq(sfi_cost_step(&s, 2, &a2, &e), SFI_OK);
    s.sel_gather_positions = 8060;
    s.sel_split_gather = 1;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &b, &e), SFI_OK);
    ck_assert(a.time_s == b.time_s && b.comm_s == a.comm_s);
    ck_assert_int_eq(sfi_cost_step(&s, 2, &b2, &e), SFI_OK);
    double g2 = sfi_cost_allgather_time(&s, 2 * 4 * 8060 * 4.0);
    ck_assert(close_rel(b2.comm_s - a2.comm_s, L * g2, 1e-9));
    ck_assert(b2.time_s - a2.time_s >= L * g2 * (1 - 1e-9));
    sfi_step_cost a3, b3;
    s.sel_gather_positions = 0;
    ck_assert_int_eq(sfi_cost_step(&s, 3, &a3, &e), SFI_OK);
    s.sel_gather_positions = 8060;
    ck_assert_int_eq(sfi_cost_step(&s, 3, &b3, &e), SFI_OK);
    ck_assert(close_rel(b3.comm_s - a3.comm_s, L * sfi_cost_allgather_time(&s, 4 * 4 * 8060 * 4.0),
                        1e-9));
    /* a Selector far longer than the main stream's layers: each layer's
     * all-gather waits for its steps 1-7 and step 8 for the all-gather,
     * so the step takes at least all the side work plus the all-gathers
     * (overlapped without the wait it would take about the larger) */
    sfi_step_cost c2;
    s.prof.efficiency[SFI_KC_SELECTOR] = 1e-3;
    ck_assert_int_eq(sfi_cost_step(&s, 2, &c2, &e), SFI_OK);
    ck_assert_msg(c2.time_s >= c2.side_s + L * g2 * (1 - 1e-9) && c2.side_s > 10 * L * g2,
                  "%.6g < %.6g + %.6g", c2.time_s, c2.side_s, L * g2);
    s.prof.efficiency[SFI_KC_SELECTOR] = 0.5;
    /* sel_pre_s (sfi_hw.h): steps 1-7 in line after each layer's MLP for
     * their bytes' time plus sel_pre_s, the all-gather after them; a fast
     * step does not see it */
    sfi_step_cost e2, d2, f0, f1;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &f0, &e), SFI_OK);
    ck_assert_int_eq(sfi_cost_step(&s, 2, &e2, &e), SFI_OK);
    s.prof.sel_pre_s = 25e-6;
    ck_assert_int_eq(sfi_cost_step(&s, 2, &d2, &e), SFI_OK);
    ck_assert_int_eq(sfi_cost_step(&s, 0, &f1, &e), SFI_OK);
    ck_assert(f1.time_s == f0.time_s);
    ck_assert_msg(d2.time_s >= e2.time_s + L * 25e-6 * (1 - 1e-9), "%.6g < %.6g + %.6g", d2.time_s,
                  e2.time_s, L * 25e-6);
    s.prof.sel_pre_s = 0;
    s.sel_split_gather = 0;
    s.sel_gather_positions = 0;
    s.kind = SFI_POLICY_FULL;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &b, &e), SFI_OK);
    /* collectives of a group size with parameters of its own */
    double t2 = sfi_cost_allreduce_time(&s, 1 << 20);
    s.prof.ar_by_gpus_lat[4] = 10e-6;
    s.prof.ar_by_gpus_eff[4] = 0.5;
    ck_assert(sfi_cost_allreduce_time(&s, 1 << 20) == t2); /* tp 2: the general ones */
    s.tp = 4;
    ck_assert(close_rel(sfi_cost_allreduce_time(&s, 1 << 20),
                        10e-6 + 2.0 * 3 / 4 * (1 << 20) / (s.gpu.nvlink_bandwidth / 2) / 0.5, 1e-12));
    ck_assert(close_rel(sfi_cost_allgather_time(&s, 1 << 20),
                        10e-6 + 3.0 * (1 << 20) / (s.gpu.nvlink_bandwidth / 2) / 0.5, 1e-12));
    /* all-gathers fitted apart (sfi-gpu bench-allreduce --op allgather):
     * theirs at their group size only, the all-reduces untouched */
    const double ar4 = sfi_cost_allreduce_time(&s, 1 << 20), nv = s.gpu.nvlink_bandwidth / 2;
    s.prof.ag_by_gpus_lat[4] = 20e-6;
    s.prof.ag_by_gpus_eff[4] = 0.25;
    ck_assert(sfi_cost_allreduce_time(&s, 1 << 20) == ar4);
    ck_assert(close_rel(sfi_cost_allgather_time(&s, 1 << 20), 20e-6 + 3.0 * (1 << 20) / nv / 0.25,
                        1e-12));
    s.tp = 2; /* none of 2: the all-reduce's (the profile's own) */
    ck_assert(close_rel(sfi_cost_allgather_time(&s, 1 << 20),
                        s.prof.allreduce_latency_s +
                            (1 << 20) / nv / s.prof.efficiency[SFI_KC_ALLREDUCE],
                        1e-12));
    s.prof.ag_by_gpus_eff[4] = 0;
    s.prof.ar_by_gpus_eff[4] = 0;
    s.tp = 2;
    /* an all-reduce inside a step at its cost alone plus allreduce_step_s
     * (measured on 2 x H100: 9.9 us in a step, 7.1 alone): two a layer */
    sfi_step_cost w0, w1;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &w0, &e), SFI_OK);
    s.prof.allreduce_step_s = 2.8e-6;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &w1, &e), SFI_OK);
    ck_assert(close_rel(w1.time_s - w0.time_s, 2 * L * 2.8e-6, 1e-9));
    ck_assert(close_rel(w1.comm_s - w0.comm_s, 2 * L * 2.8e-6, 1e-9));
    s.prof.allreduce_step_s = 0;
    /* the argmax: 16 (value, id) pairs gathered, one merge launch */
    s.argmax_gather = 1;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &a, &e), SFI_OK);
    ck_assert(close_rel(a.time_s - b.time_s, sfi_cost_allgather_time(&s, 128) + 3e-6, 1e-9));
    /* bytes per step and GPU: what sfi-gpu run --tp 2 --bench reported for
     * Qwen3-4B at batch 16 (gpu/profiles/h200-tp-steps.json) */
    double ar, ga;
    sfi_cost_comm_bytes(&s, 16, &ar, &ga);
    ck_assert(ar == 11796480.0 && ga == 128.0);
    s.kind = SFI_POLICY_SFI;
    s.sel_gather_positions = 8060;
    sfi_cost_comm_bytes(&s, 16, &ar, &ga);
    ck_assert(ar == 11796480.0 && ga == 74281088.0);
    s.sel_gather_positions = 32636; /* 32K */
    sfi_cost_comm_bytes(&s, 16, &ar, &ga);
    ck_assert(ga == 300773504.0);
    /* sized for the slow requests (86177e5): the bytes of a step with one
     * slow request, as the engine reports them (8K, 32K) */
    s.sel_split_gather = 1;
    sfi_cost_comm_bytes(&s, 16, &ar, &ga);
    ck_assert(ga == 18798464.0);
    s.sel_gather_positions = 8060;
    sfi_cost_comm_bytes(&s, 16, &ar, &ga);
    ck_assert(ga == 4642688.0);
    s.sel_split_gather = 0;
    s.tp = 1;
    sfi_cost_comm_bytes(&s, 16, &ar, &ga);
    ck_assert(ar == 0 && ga == 0);
}
END_TEST

/* A decode GEMM's fixed part (fixed_us.gemm) stays when tensor
 * parallelism halves the GEMMs' bytes: at tp 2 the GEMMs cost more than
 * half of tp 1's by it. Under sfi-gpu's rule only the register-streaming
 * products pay it. */
START_TEST(gemm_fixed_cost_does_not_shrink_with_tp)
{
    sfi_error e;
    sfi_cost_setup s;
    setup(&s, &qwen4b, "H100", 8192, 16);
    round_profile(&s);
    s.kind = SFI_POLICY_FULL;
    const int L = qwen4b.num_hidden_layers;
    const double f = 5e-6;
    /* [tp - 1][0: f = 0, 1: f; 2: f = 0 at GEMM efficiency 0.4] */
    double t[2][3];
    for (int tp = 1; tp <= 2; tp++) {
        s.tp = tp;
        sfi_step_cost c;
        for (int k = 0; k < 3; k++) {
            s.prof.fixed_s[SFI_KC_GEMM] = k == 1 ? f : 0;
            s.prof.efficiency[SFI_KC_GEMM] = k == 2 ? 0.4 : 0.8;
            ck_assert_int_eq(sfi_cost_step(&s, 0, &c, &e), SFI_OK);
            t[tp - 1][k] = c.time_s;
        }
    }
    /* every product pays it once: QKV, O, gate/up, down a layer, the LM
     * head; at tp 2 as at tp 1 */
    for (int i = 0; i < 2; i++)
        ck_assert_msg(close_rel(t[i][1] - t[i][0], (4.0 * L + 1) * f, 1e-9), "tp %d: %.9g s", i + 1,
                      t[i][1] - t[i][0]);
    /* while the GEMMs' byte time halves: their time at tp 2 is half of
     * tp 1's plus half of the fixed parts (launch and fixed_us.gemm) */
    double b1 = t[0][2] - t[0][0], b2 = t[1][2] - t[1][0];
    ck_assert_msg(close_rel(b2 / b1, 0.5, 1e-9), "byte time ratio %.9g", b2 / b1);
    double g1 = b1 + (4.0 * L + 1) * (s.prof.launch_s + f),
           g2 = b2 + (4.0 * L + 1) * (s.prof.launch_s + f);
    ck_assert(g2 > 0.5 * g1 + 0.5 * (4.0 * L + 1) * f * (1 - 1e-9));
    /* sfi-gpu's rule: Qwen3-4B's products all stream through registers
     * (every one over 13 MiB or wider than 1024 both ways); Qwen3-0.6B's
     * run on the slab kernel, all but the LM head */
    s.tp = 1;
    s.prof.efficiency[SFI_KC_GEMM] = 0.8;
    s.gemm_slab_rule = 1;
    sfi_step_cost c0, c1;
    s.prof.fixed_s[SFI_KC_GEMM] = 0;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c0, &e), SFI_OK);
    s.prof.fixed_s[SFI_KC_GEMM] = f;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c1, &e), SFI_OK);
    ck_assert(close_rel(c1.time_s - c0.time_s, (4.0 * L + 1) * f, 1e-9));
    s.model = &qwen06b;
    s.prof.fixed_s[SFI_KC_GEMM] = 0;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c0, &e), SFI_OK);
    s.prof.fixed_s[SFI_KC_GEMM] = f;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c1, &e), SFI_OK);
    ck_assert_msg(close_rel(c1.time_s - c0.time_s, f, 1e-9), "%.9g s", c1.time_s - c0.time_s);
    s.gemm_slab_rule = 0;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c1, &e), SFI_OK);
    ck_assert(close_rel(c1.time_s - c0.time_s, (4.0 * qwen06b.num_hidden_layers + 1) * f, 1e-9));
}
END_TEST

START_TEST(slow_step_terms)
{
    /* 32 q / 8 KV heads, head_dim 128 (Qwen3-4B), batch 16, 32K, K 2048 on
     * H100: |J| = 32768 - 4 - 256 = 32508. */
    sfi_cost_setup s;
    sfi_error e;
    setup(&s, &qwen4b, "H100", 32768, 16);
    round_profile(&s);
    const double bw = 3.35e12, J = 32508, launch = 3e-6;
    double t;
    /* Dense attention writing fp32 logits over J (at the logits class's
     * efficiency). */
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "attn_dense", &t, &e), SFI_OK);
    ck_assert(close_rel(t, 16 * 32768.0 * 4096 / bw / 0.75 + launch + 16 * 32 * J * 4 / bw / 0.2, 1e-12));
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "attn_dense_nologits", &t, &e), SFI_OK);
    ck_assert(close_rel(t, 16 * 32768.0 * 4096 / bw / 0.75 + launch, 1e-12));
    /* Selector: logits of 32 query heads + norms of 8 KV heads, read once,
     * two launches. */
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "selector", &t, &e), SFI_OK);
    ck_assert(close_rel(t, 16 * (32 + 8) * J * 4 / bw / 0.5 + 2 * launch, 1e-12));
    /* Top-K: one read of the 8 x |J| scores, K indices out. */
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "topk", &t, &e), SFI_OK);
    ck_assert(close_rel(t, 16 * (8 * J * 4 + 8 * 2048.0 * 4) / bw / 0.4 + launch, 1e-12));
    /* Reorg: read + write sink + K positions of K and V. */
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "reorg", &t, &e), SFI_OK);
    ck_assert(close_rel(t, 16 * 2.0 * (4 + 2048) * 4096 / bw / 0.7 + launch, 1e-12));
    /* Sparse: positions read = context. */
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "attn_sparse", &t, &e), SFI_OK);
    ck_assert(close_rel(t, 16 * 32768.0 * 4096 / bw / 0.6 + launch, 1e-12));
    /* A class's fixed cost adds to each of its kernels. */
    s.prof.fixed_s[SFI_KC_ATTN_SPARSE] = 5e-6;
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "attn_sparse", &t, &e), SFI_OK);
    ck_assert(close_rel(t, 16 * 32768.0 * 4096 / bw / 0.6 + launch + 5e-6, 1e-12));
    s.prof.fixed_s[SFI_KC_ATTN_SPARSE] = 0;
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "step_fast", &t, &e), SFI_ENOTFOUND);
    double sel, topk, reorg, all;
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "selector", &sel, &e), SFI_OK);
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "topk", &topk, &e), SFI_OK);
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "reorg", &reorg, &e), SFI_OK);
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "selector_reorg", &all, &e), SFI_OK);
    ck_assert(close_rel(all, sel + topk + reorg, 1e-12));
    /* Two-stream pipeline of 28 layers: serial = 28 (attn + side); with
     * overlap, between attention alone and serial. */
    double dense, al, ser, ov;
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "attn_dense", &dense, &e), SFI_OK);
    ck_assert_int_eq(sfi_cost_pipeline_predict(&s, "attn_layers", 28, &al, &e), SFI_OK);
    ck_assert_int_eq(sfi_cost_pipeline_predict(&s, "slow_step_serial", 28, &ser, &e), SFI_OK);
    ck_assert_int_eq(sfi_cost_pipeline_predict(&s, "slow_step_overlap", 28, &ov, &e), SFI_OK);
    ck_assert(close_rel(al, 28 * dense, 1e-12));
    ck_assert(close_rel(ser, 28 * (dense + sel + topk + reorg), 1e-12));
    ck_assert(ov > al && ov < ser);
    /* side < attention: only the last layer's side work is exposed, plus
     * contention (0.3) of the other 27 layers' side work. */
    ck_assert(close_rel(ov, al + all + 0.3 * 27 * all, 1e-9));
    ck_assert_int_eq(sfi_cost_pipeline_predict(&s, "step", 28, &ov, &e), SFI_ENOTFOUND);
    ck_assert_int_eq(sfi_cost_pipeline_predict(&s, "attn_layers", 0, &ov, &e), SFI_ERANGE);
    /* The side stream of a slow step is 36 layers of the three; with no
     * contention the exposed part is at most the last layer's plus what
     * could not fit behind the main stream. */
    sfi_step_cost slow;
    s.prof.overlap_contention = 0;
    ck_assert_int_eq(sfi_cost_step(&s, 16, &slow, &e), SFI_OK);
    ck_assert(close_rel(slow.side_s, 36 * all, 1e-9));
    ck_assert(slow.exposed_s <= slow.side_s);
    /* The last layer's side work can only hide behind its MLP and the LM
     * head; with 36 layers of main stream far longer than one layer's side
     * work, little is exposed. */
    ck_assert(slow.exposed_s < all);
}
END_TEST

START_TEST(step_costs_add_up)
{
    sfi_cost_setup s;
    sfi_step_cost full, fast, slow;
    sfi_error e;
    setup(&s, &qwen4b, "H100", 32768, 1);
    s.kind = SFI_POLICY_FULL;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &full, &e), SFI_OK);
    /* Full KV reads every layer's whole cache once. */
    ck_assert(full.kv_bytes == 36 * 134217728.0);
    s.kind = SFI_POLICY_SFI;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &fast, &e), SFI_OK);
    ck_assert(fast.kv_bytes == 36 * 2308.0 * 4096);
    ck_assert(fast.weight_bytes == full.weight_bytes);
    ck_assert(fast.side_s == 0 && fast.exposed_s == 0);
    ck_assert_int_eq(sfi_cost_step(&s, 1, &slow, &e), SFI_OK);
    ck_assert(slow.time_s > full.time_s && slow.time_s > fast.time_s);
    ck_assert(slow.side_s > 0);
    ck_assert(slow.exposed_s >= 0 && slow.exposed_s <= slow.side_s);
    /* The step is dominated by 8 GB of weights + KV: sane magnitudes. */
    ck_assert(full.time_s > 2e-3 && full.time_s < 10e-3);
    ck_assert(fast.time_s < full.time_s * 0.8);
    /* A policy without slow steps ignores n_slow; StreamingLLM reads the
     * same budget as SFI's fast step (n_sink + K + n_recent). */
    s.kind = SFI_POLICY_STREAMING;
    sfi_step_cost a, b;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &a, &e), SFI_OK);
    ck_assert_int_eq(sfi_cost_step(&s, 1, &b, &e), SFI_OK);
    ck_assert(a.time_s == b.time_s);
    ck_assert(a.kv_bytes == 36 * 2308.0 * 4096);
}
END_TEST

START_TEST(mixed_steps)
{
    sfi_cost_setup s;
    sfi_step_cost u, m;
    sfi_error e;
    setup(&s, &qwen4b, "H100", 32768, 8);
    round_profile(&s);
    /* The uniform step is the mixed step of two groups. */
    ck_assert_int_eq(sfi_cost_step(&s, 3, &u, &e), SFI_OK);
    sfi_cost_group g[3] = {{.context = 32768, .n_new = 1, .count = 3, .slow = 1},
                           {.context = 32768, .n_new = 1, .count = 5}};
    ck_assert_int_eq(sfi_cost_step_mix(&s, g, 2, &m, &e), SFI_OK);
    ck_assert(close_rel(m.time_s, u.time_s, 1e-12));
    ck_assert(m.kv_bytes == u.kv_bytes && m.launches == u.launches);
    /* The same requests split into groups: same bytes, same launches
     * (one attention kernel per layer serves every group), same time. */
    sfi_cost_group split[3] = {{.context = 32768, .n_new = 1, .count = 3, .slow = 1},
                               {.context = 32768, .n_new = 1, .count = 2},
                               {.context = 32768, .n_new = 1, .count = 3}};
    ck_assert_int_eq(sfi_cost_step_mix(&s, split, 3, &m, &e), SFI_OK);
    ck_assert(close_rel(m.time_s, u.time_s, 1e-12));
    ck_assert_int_eq(m.launches, u.launches);
    /* Full KV at two contexts reads the sum of their caches. */
    s.kind = SFI_POLICY_FULL;
    sfi_cost_group two[2] = {{.context = 8192, .n_new = 1, .count = 2},
                             {.context = 65536, .n_new = 1, .count = 1}};
    ck_assert_int_eq(sfi_cost_step_mix(&s, two, 2, &m, &e), SFI_OK);
    ck_assert(m.kv_bytes == 36 * 4096.0 * (2 * 8192 + 65536));
    /* A prefill chunk of 4096 tokens at the start of a prompt: the GEMMs
     * and causal attention are FLOP-bound; at least 2 FLOPs per weight per
     * token, and the step takes at least that at peak. */
    sfi_cost_group pf = {.context = 4096, .n_new = 4096, .count = 1, .prefill = 1};
    ck_assert_int_eq(sfi_cost_step_mix(&s, &pf, 1, &m, &e), SFI_OK);
    double attended = 4096.0 * 4097 / 2;
    double attn_fl = 36 * 4.0 * 32 * 128 * attended;
    ck_assert(m.flops >= 2.0 * 4096 * 3.6e9 + attn_fl);
    ck_assert(m.time_s >= m.flops / 989.4e12);
    ck_assert(m.time_s < 3 * m.flops / 989.4e12 / 0.6);
    /* A non-final chunk samples nothing: no LM head. The last chunk does. */
    sfi_step_cost last;
    pf.last_chunk = 1;
    ck_assert_int_eq(sfi_cost_step_mix(&s, &pf, 1, &last, &e), SFI_OK);
    ck_assert(last.weight_bytes > m.weight_bytes);
    /* Under SFI the last chunk also starts the Selector (side stream). */
    s.kind = SFI_POLICY_SFI;
    ck_assert_int_eq(sfi_cost_step_mix(&s, &pf, 1, &last, &e), SFI_OK);
    ck_assert(last.side_s > 0);
    /* A decode step with a prefill chunk beside it costs more than alone. */
    g[2] = pf;
    sfi_step_cost mixed;
    ck_assert_int_eq(sfi_cost_step_mix(&s, g, 3, &mixed, &e), SFI_OK);
    ck_assert(mixed.time_s > u.time_s);
    /* Small contexts are fine in a mixed step (K larger than the context
     * keeps every candidate). */
    sfi_cost_group tiny = {.context = 100, .n_new = 1, .count = 1};
    ck_assert_int_eq(sfi_cost_step_mix(&s, &tiny, 1, &m, &e), SFI_OK);
    /* Bad groups. */
    sfi_cost_group bad = {.context = 100, .n_new = 2, .count = 1};
    ck_assert_int_eq(sfi_cost_step_mix(&s, &bad, 1, &m, &e), SFI_ERANGE);
    bad.prefill = 1;
    bad.n_new = 101;
    ck_assert_int_eq(sfi_cost_step_mix(&s, &bad, 1, &m, &e), SFI_ERANGE);
    bad.n_new = 1;
    bad.count = 0;
    ck_assert_int_eq(sfi_cost_step_mix(&s, &bad, 1, &m, &e), SFI_ERANGE);
    ck_assert_int_eq(sfi_cost_step_mix(&s, &bad, 0, &m, &e), SFI_EINVAL);
}
END_TEST

START_TEST(engine_terms)
{
    sfi_cost_setup s;
    sfi_step_cost a, b;
    sfi_error e;
    setup(&s, &qwen4b, "B200", 8192, 4);
    round_profile(&s);
    s.kind = SFI_POLICY_FULL;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &a, &e), SFI_OK);
    /* Per-request overhead: paid once per request. */
    s.prof.request_overhead_s = 1e-3;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &b, &e), SFI_OK);
    ck_assert(close_rel(b.time_s - a.time_s, 4e-3, 1e-9));
    s.prof.request_overhead_s = 0;
    /* A curve of dense attention efficiency: at its points, the point's
     * value; between them, log2-linear; outside, flat. */
    s.prof.n_attn_curve = 2;
    s.prof.attn_curve_ctx[0] = 8192;
    s.prof.attn_curve_eff[0] = 0.5;
    s.prof.attn_curve_ctx[1] = 131072;
    s.prof.attn_curve_eff[1] = 0.1;
    ck_assert(sfi_hw_attn_dense_efficiency(&s.prof, 8192) == 0.5);
    ck_assert(close_rel(sfi_hw_attn_dense_efficiency(&s.prof, 32768), 0.3, 1e-12));
    ck_assert(sfi_hw_attn_dense_efficiency(&s.prof, 1e6) == 0.1);
    ck_assert(sfi_hw_attn_dense_efficiency(&s.prof, 10) == 0.5);
    double t1, t2;
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "attn_dense_nologits", &t1, &e), SFI_OK);
    s.context = 131072;
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "attn_dense_nologits", &t2, &e), SFI_OK);
    /* 16x the bytes at a fifth of the efficiency: 80x the roofline time. */
    ck_assert(close_rel(t2 - 3e-6, 80 * (t1 - 3e-6), 1e-9));
    /* The curve is the engine's stock kernel: SFI's dense kernel that
     * writes logits keeps efficiency.attn_dense (0.75). */
    double tl, tn;
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "attn_dense", &tl, &e), SFI_OK);
    s.prof.n_attn_curve = 0;
    ck_assert_int_eq(sfi_cost_kernel_predict(&s, "attn_dense", &tn, &e), SFI_OK);
    ck_assert(tl == tn);
}
END_TEST

START_TEST(monotonicity)
{
    sfi_error e;
    const sfi_model_config *models[] = {&qwen4b, &qwen30b};
    for (int mi = 0; mi < 2; mi++)
        for (int pk = 0; pk < SFI_POLICY_N_KINDS; pk++) {
            double prev = 0;
            for (int ctx = 4096; ctx <= 262144; ctx *= 2) {
                sfi_cost_setup s;
                sfi_step_cost c, full, fastb, fullb;
                setup(&s, models[mi], "B200", ctx, 4);
                s.kind = (sfi_policy_kind)pk;
                /* More context never makes a step faster. */
                ck_assert_int_eq(sfi_cost_step(&s, 4, &c, &e), SFI_OK);
                ck_assert_msg(c.time_s >= prev, "%s at %d",
                              sfi_policy_kind_name((sfi_policy_kind)pk), ctx);
                prev = c.time_s;
                /* More bandwidth never slower. */
                sfi_cost_setup f = s;
                f.gpu.hbm_bandwidth *= 1.5;
                sfi_step_cost cf;
                ck_assert_int_eq(sfi_cost_step(&f, 4, &cf, &e), SFI_OK);
                ck_assert(cf.time_s <= c.time_s);
                /* SFI never reads more KV than full KV. */
                ck_assert(sfi_cost_kv_bytes_fast(&s) <= sfi_cost_kv_bytes_dense(&s));
                sfi_cost_setup sf = s;
                sf.kind = SFI_POLICY_FULL;
                ck_assert_int_eq(sfi_cost_step(&sf, 0, &full, &e), SFI_OK);
                sf.kind = SFI_POLICY_SFI;
                ck_assert_int_eq(sfi_cost_step(&sf, 0, &fastb, &e), SFI_OK);
                ck_assert(fastb.kv_bytes <= full.kv_bytes);
                (void)fullb;
                /* Memory: a longer context never fits more requests. */
                sfi_cost_memory m1, m2;
                ck_assert_int_eq(sfi_cost_memory_of(&s, &m1, &e), SFI_OK);
                s.context = ctx * 2;
                ck_assert_int_eq(sfi_cost_memory_of(&s, &m2, &e), SFI_OK);
                ck_assert(m2.max_batch <= m1.max_batch);
            }
        }
}
END_TEST

START_TEST(memory_and_max_batch)
{
    sfi_cost_setup s;
    sfi_cost_memory m;
    sfi_error e;
    setup(&s, &qwen4b, "B200", 131072, 1);
    s.kind = SFI_POLICY_FULL;
    ck_assert_int_eq(sfi_cost_memory_of(&s, &m, &e), SFI_OK);
    /* 36 layers x 131072 x 4096 B = 18 GiB per request. */
    ck_assert(m.kv_per_request == 36.0 * 131072 * 4096);
    /* Weights: 4.02 B params (tied embeddings) in bf16. */
    ck_assert(m.weights > 7.9e9 && m.weights < 8.2e9);
    ck_assert_int_eq(m.max_batch, (int)floor((180e9 * 0.9 - m.weights) / m.kv_per_request));
    /* SFI keeps the cache plus compact buffers: never more requests. */
    sfi_cost_memory ms;
    s.kind = SFI_POLICY_SFI;
    ck_assert_int_eq(sfi_cost_memory_of(&s, &ms, &e), SFI_OK);
    ck_assert(ms.kv_per_request > m.kv_per_request);
    ck_assert(ms.max_batch <= m.max_batch);
    /* StreamingLLM, SnapKV and H2O evict down to the budget: many more. */
    s.kind = SFI_POLICY_STREAMING;
    ck_assert_int_eq(sfi_cost_memory_of(&s, &ms, &e), SFI_OK);
    ck_assert(ms.kv_per_request == 36.0 * 2308 * 4096);
    ck_assert(ms.max_batch > 40 * m.max_batch);
    s.kind = SFI_POLICY_H2O; /* plus an fp32 score per kept position and KV head */
    ck_assert_int_eq(sfi_cost_memory_of(&s, &ms, &e), SFI_OK);
    ck_assert(ms.kv_per_request == 36.0 * 2308 * (4096 + 8 * 4));
    /* FASA keeps a compact copy of the dominant dims of every key:
     * 2 x 16 dims x 2 B x 8 KV heads per position and layer. */
    s.kind = SFI_POLICY_FASA;
    ck_assert_int_eq(sfi_cost_memory_of(&s, &ms, &e), SFI_OK);
    ck_assert(ms.kv_per_request == m.kv_per_request + 36.0 * 131072 * 8 * 32 * 2);
    /* LFPS: two fp32 tables over the context plus the d x d key
     * statistics per KV head. */
    s.kind = SFI_POLICY_LFPS;
    ck_assert_int_eq(sfi_cost_memory_of(&s, &ms, &e), SFI_OK);
    ck_assert(ms.kv_per_request ==
              m.kv_per_request + 36.0 * 8 * (2.0 * 131072 * 4 + 128.0 * 128 * 8 + 128 * 8));
}
END_TEST

START_TEST(one_budget_for_every_policy)
{
    /* At a budget of 6% of 64K (3932 positions) every policy's final
     * attention reads B positions; what differs is what each pays to
     * choose them. Qwen3-4B: 36 layers, 8 KV heads, 32 query heads. */
    sfi_cost_setup s;
    sfi_step_cost c, full;
    sfi_error e;
    setup(&s, &qwen4b, "H100", 65536, 1);
    ck_assert_int_eq(sfi_budget_parse("6%", &s.budget, &e), SFI_OK);
    ck_assert_int_eq(sfi_cost_budget(&s), 3932);
    s.kind = SFI_POLICY_FULL;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &full, &e), SFI_OK);
    const double pos_b = 4096, key_b = 2048, P = 3932, L = 65536;
    /* SFI: K = B - n_sink - n_recent, so its fast step reads B. */
    ck_assert_int_eq(sfi_cost_fast_positions(&s), 3932);
    s.kind = SFI_POLICY_STREAMING;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c, &e), SFI_OK);
    ck_assert(c.kv_bytes == 36 * P * pos_b);
    s.kind = SFI_POLICY_SNAPKV;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c, &e), SFI_OK);
    ck_assert(c.kv_bytes == 36 * P * pos_b);
    /* Oracle: keys of the whole context, fp32 logits of 32 heads, their
     * pooling and a top-k, then B positions. */
    s.kind = SFI_POLICY_ORACLE;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c, &e), SFI_OK);
    double topk = L * key_b + 32 * L * 4.0 + (32 * L * 4.0 + 8 * L * 4.0) + 8 * L * 4.0;
    ck_assert_msg(close_rel(c.kv_bytes, 36 * (topk + P * pos_b), 1e-12), "%g", c.kv_bytes);
    /* Kascade (36 layers: 5 anchors): layer 0 dense, 5 anchors pay the
     * exact top-k, every layer but 0 reads B positions and their indices. */
    s.kind = SFI_POLICY_KASCADE;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c, &e), SFI_OK);
    double want = L * pos_b + 5 * topk + 35 * P * (pos_b + 8 * 4.0);
    ck_assert_msg(close_rel(c.kv_bytes, want, 1e-12), "%g vs %g", c.kv_bytes, want);
    /* FASA: the compact copy of 2 N_tip = 32 dims of every key (not the
     * whole key), scores out and a top-k, then B positions. */
    s.kind = SFI_POLICY_FASA;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c, &e), SFI_OK);
    want = 36 * (L * 8 * 32 * 2.0 + 8 * L * 4.0 + 8 * L * 4.0 + P * pos_b);
    ck_assert_msg(close_rel(c.kv_bytes, want, 1e-12), "%g vs %g", c.kv_bytes, want);
    /* LFPS: candidates from the paper's table at 64K (between 4.6% at 8K
     * and 1.7% at 128K); the final attention reads min(B, candidates). */
    s.kind = SFI_POLICY_LFPS;
    double share = sfi_policy_lfps_cand_share(&s.pol, 65536);
    ck_assert(share > 0.017 && share < 0.046);
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c, &e), SFI_OK);
    double cand = ceil(share * L) + 4, fin = cand < P ? cand : P;
    want = 36 * (8 * (2 * 2 * L * 4.0 + 128 * 128 * 8.0) + cand * key_b + 8 * cand * 4.0 +
                 fin * pos_b + 32 * fin * 4.0 + 8 * fin * 2 * 8.0);
    ck_assert_msg(close_rel(c.kv_bytes, want, 1e-12), "%g vs %g", c.kv_bytes, want);
    /* Quest: the first 2 layers dense, then page metadata and whole pages
     * up to B (floor(B / 16) pages). */
    s.kind = SFI_POLICY_QUEST;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c, &e), SFI_OK);
    want = 2 * L * pos_b + 34 * (4096 * 2.0 * 8 * 128 * 2 + 8 * 4096 * 4.0 + 3920 * pos_b);
    ck_assert_msg(close_rel(c.kv_bytes, want, 1e-12), "%g vs %g", c.kv_bytes, want);
    ck_assert(c.kv_bytes < full.kv_bytes);
}
END_TEST

START_TEST(bad_input)
{
    sfi_cost_setup s;
    sfi_step_cost c;
    sfi_error e;
    setup(&s, &qwen4b, "H100", 1024, 1);
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c, &e), SFI_EINVAL); /* K 2048 > 1024 */
    ck_assert_ptr_nonnull(strstr(e.msg, "K = 2048 is larger than the context"));
    s.context = 8192;
    s.tp = 3;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "--tp 3"));
    s.tp = 1;
    s.batch = 0;
    ck_assert_int_ne(sfi_cost_step(&s, 0, &c, &e), SFI_OK);
    s.batch = 2;
    ck_assert_int_ne(sfi_cost_step(&s, 3, &c, &e), SFI_OK);
    sfi_policy_kind k;
    sfi_policy_config p;
    sfi_policy_config_default(&p);
    ck_assert_int_eq(sfi_policy_spec_parse("h2o-ish", &k, &p, &e), SFI_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "unknown policy"));
    ck_assert_int_eq(sfi_policy_spec_parse("quest:page=32", &k, &p, &e), SFI_OK);
    ck_assert(k == SFI_POLICY_QUEST && p.quest_page == 32);
    ck_assert_int_eq(sfi_policy_spec_parse("interval:interval=0", &k, &p, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_policy_spec_parse("quest:page", &k, &p, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_policy_spec_parse("fasa:tip=65", &k, &p, &e), SFI_OK);
    s.kind = k;
    s.pol = p;
    ck_assert_int_eq(sfi_cost_step(&s, 0, &c, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "tip=65"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cost");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup_models, NULL);
    tcase_add_test(tc, kv_bytes_of_qwen3_4b_at_32k);
    tcase_add_test(tc, weights_of_a_dense_and_a_moe_layer);
    tcase_add_test(tc, kernel_roofline_and_allreduce);
    tcase_add_test(tc, allgather_time);
    tcase_add_test(tc, tp_engine_terms);
    tcase_add_test(tc, gemm_fixed_cost_does_not_shrink_with_tp);
    tcase_add_test(tc, slow_step_terms);
    tcase_add_test(tc, step_costs_add_up);
    tcase_add_test(tc, mixed_steps);
    tcase_add_test(tc, engine_terms);
    tcase_add_test(tc, monotonicity);
    tcase_add_test(tc, memory_and_max_batch);
    tcase_add_test(tc, one_budget_for_every_policy);
    tcase_add_test(tc, bad_input);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
