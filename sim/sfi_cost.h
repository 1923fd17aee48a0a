/* Cost model of one decode step of a batch on one GPU of a tensor-parallel
 * group (every term is described in sfi-sim(1), COST MODEL).
 *
 * A step of B requests, n_slow of which take a slow (dense) step, moves
 * per layer: the layer's weights (MoE: the expected distinct experts the
 * batch touches), each request's KV (dense: the whole context; sparse:
 * sink + selected + recent read as two segments), on slow steps the exposed
 * logits, the Selector's and Top-K's passes and the reorg copy of sink +
 * selected K/V; plus the LM head, two all-reduces per layer under tensor
 * parallelism, one launch cost per kernel and a fixed per-step overhead.
 * Each kernel's time is its roofline max(bytes / bandwidth, FLOPs / peak)
 * divided by its class's calibrated efficiency. Selector + Top-K + reorg
 * of layer i run on a second stream behind the main stream of layers > i;
 * what does not fit behind them is exposed (reported separately). */
#ifndef SFI_COST_H
#define SFI_COST_H

#include <stdint.h>
#include "sfi_error.h"
#include "sfi_hw.h"
#include "sfi_model.h"
#include "sfi_params.h"
#include "sfi_policies.h"

/* Every policy of ref/sfi_policies.h is priced at one budget B (positions
 * per KV head per step, sfi_budget_positions): the memory traffic, compute
 * and memory its kernels need at B, with the layout each assumes stated in
 * sfi-sim(1), COST MODEL (any extra copy of the keys is charged as memory
 * and traffic). */
typedef struct {
    const sfi_model_config *model;
    sfi_gpu gpu;
    sfi_hw_profile prof;
    sfi_policy_kind kind;  /* the policy priced */
    sfi_policy_config pol; /* its knobs; pol.prm: n_sink, n_recent, K (T_max
                              and interval are the replay's) */
    sfi_budget budget;     /* B; default "sfi": n_sink + K + n_recent */
    int tp;                /* tensor-parallel degree >= 1 */
    int context;           /* cached positions per request (current included) */
    int batch;             /* requests decoded together */
    int weight_bytes;      /* 2 = bf16 (default), 1 = fp8 */
    int kv_bytes;          /* bytes per K/V element, 2 = bf16 */
    int mixed_attention;   /* 1: a step's slow (dense + logits) and fast requests
                              share one attention launch, as sfi-gpu's engine
                              runs them (0: one launch each) */
    int moe_pair_reads;    /* 1: an MoE layer reads an expert's weights once per
                              (token, expert) pair (no deduplication); 0: once
                              per distinct expert the batch touches */
    int moe_stream;        /* 1: an MoE layer's expert kernels stream the experts at
                              the dense attention's efficiency instead of the
                              GEMMs' (sfi-gpu's per-pair GEMV: a warp per row,
                              16-byte loads, 64 CTAs per pair; prof.moe_efficiency,
                              when set, still wins) */
    int attn_split_rows;   /* sfi-gpu's SFI-mode attention: rows per CTA at most
                              (0: the dense-mode rule, one wave of CTAs over
                              the (request, KV head) pairs, >= 1024 rows
                              each); with prof.cta_bandwidth, prices launches
                              of few CTAs */
    int attn_fast_split_rows; /* with attn_split_rows: a fast (sparse) request's rows
                                 per CTA at most when they differ (sfi-gpu at small
                                 batches splits fast requests finer than slow ones;
                                 0: attn_split_rows) */
    int moe_route_steps;   /* dependent steps of the thread that routes one token in
                              an MoE layer (tokens in parallel; 0: none); each
                              costs prof.serial_step_s */
    int moe_launches;      /* launches of an MoE layer besides attention (0: the
                              model's 8; sfi-gpu's engine: 11) */
    int allreduce_bytes;   /* bytes per element of the two residual all-reduces
                              of a layer at tp > 1 (0: 2, bf16; sfi-gpu run
                              --tp sums the f32 residual: 4) */
    /* sfi-gpu's engine, beyond the generic model (sfi-sim-validate(1),
     * TENSOR PARALLELISM): */
    int side_serial;          /* 1: the Selector, Top-K and reorg of a layer run
                                 on the main stream after its attention (no
                                 second stream), and, a step being one CUDA
                                 graph, are launched in every step of a
                                 policy with slow steps: a fast step pays
                                 their launches, kernels that exit at once */
    int sel_gather_positions; /* > 0 at tp > 1: the Selector's cross-head step
                                 all-gathers each GPU's scores, batch x its KV
                                 heads x this many fp32 positions (the graph's
                                 capacity, not the context), per layer in
                                 every step of a policy with slow steps */
    int sel_split_gather;     /* with sel_gather_positions and side_serial 0
                                 (sfi-gpu since 4cf4bb6): the Selector's steps
                                 1-7 on the side stream beside the layer's O
                                 projection and MLP, the scores' all-gather on
                                 the main stream after the MLP (waiting for
                                 steps 1-7), step 8, Top-K and reorg on the side
                                 stream beside the next layers; a step without
                                 slow requests runs none of it (no all-gather),
                                 one with n gathers the rows of the next power
                                 of two of n requests, the batch at most
                                 (sfi-gpu since 86177e5) */
    int no_selector;          /* 1: slow steps run their dense attention (logits
                                 written) but no Selector, Top-K, reorg or
                                 scores' all-gather (sfi-gpu run
                                 --bench-no-selector, a timing experiment) */
    int gemm_slab_rule;       /* 1: a decode GEMM that sfi-gpu stages through
                                 shared memory (its slab kernel: at most 13 MiB
                                 of bf16 weights, a side of at most 1024, at
                                 most 64 rows) pays no prof.fixed_s[GEMM]; the
                                 register-streaming ones do (0: every GEMM
                                 launch pays it) */
    int argmax_gather;        /* 1 at tp > 1: the greedy argmax of the
                                 vocab-split LM head all-gathers each GPU's
                                 best (value, id), 8 bytes per sampled token,
                                 once per step */
} sfi_cost_setup;

/* Fills defaults: tp 1, weight_bytes 2, kv_bytes 2, default profile, policy
 * sfi with sfi_policy_config_default, budget "sfi"; model/gpu/context/batch
 * must be set by the caller. */
void sfi_cost_setup_init(sfi_cost_setup *s);
/* Checks the setup (positive sizes, K <= candidates, TP dividing the query
 * heads, ...). */
SFI_NODISCARD sfi_status sfi_cost_validate(const sfi_cost_setup *s, sfi_error *err);

typedef struct {
    double time_s;       /* step latency */
    double hbm_bytes;    /* HBM bytes moved on one GPU */
    double kv_bytes;     /* of which KV (and logits/selector traffic) */
    double weight_bytes; /* of which weights */
    double flops;        /* on one GPU */
    double side_s;       /* Selector + Top-K + reorg stream time */
    double exposed_s;    /* part of side_s (plus contention) not hidden */
    double comm_s;       /* collective time: all-reduces and all-gathers */
    int launches;        /* kernels launched */
} sfi_step_cost;

/* Cost of one batch step in which n_slow of the batch's requests take a
 * slow step (ignored by policies without slow steps). */
SFI_NODISCARD sfi_status sfi_cost_step(const sfi_cost_setup *s, int n_slow, sfi_step_cost *out,
                                       sfi_error *err);

/* A group of requests alike in one step of a mixed batch (continuous
 * batching: every request at its own context, prefill chunks beside
 * decode steps). */
typedef struct {
    int context;    /* cached positions after the step, this step's tokens included */
    int n_new;      /* tokens computed this step: 1 for a decode step, a prefill
                       chunk's length */
    int count;      /* requests alike, >= 1 */
    int prefill;    /* 1: a prefill chunk (causal attention over n_new queries) */
    int slow;       /* decode: a slow step (policies with slow steps) */
    int last_chunk; /* prefill: the chunk ends the prompt: the first token is
                       sampled and SFI's Selector starts from the prompt's last
                       W = 16 queries */
} sfi_cost_group;

/* Cost of one step of a mixed batch: the GEMMs run once over all tokens
 * of the step (prefill chunks make them FLOP-bound), each group's
 * attention at its own context, the kernels of the groups merged into
 * shared launches, the LM head over the tokens sampled. The profile's
 * request_overhead is paid per request. sfi_cost_step is the uniform case
 * (one context, n_slow slow requests). The setup's context and batch are
 * ignored; its other fields are checked as sfi_cost_validate does. */
SFI_NODISCARD sfi_status sfi_cost_step_mix(const sfi_cost_setup *s, const sfi_cost_group *g, int n,
                                           sfi_step_cost *out, sfi_error *err);

/* ---- Terms, exposed for tests and the validate command ---- */

/* Expected distinct experts touched by a batch of b tokens each routing to
 * k of E experts uniformly: E * (1 - (1 - k/E)^b). */
double sfi_cost_expected_experts(int E, int k, int b);
/* Weight bytes of one layer on one GPU (MoE: with the expected experts of
 * a batch of b). */
double sfi_cost_layer_weight_bytes(const sfi_cost_setup *s, int layer, int b);
/* KV bytes one request reads in one layer on one GPU: dense over the whole
 * context, or the two-segment fast set. */
double sfi_cost_kv_bytes_dense(const sfi_cost_setup *s);
double sfi_cost_kv_bytes_fast(const sfi_cost_setup *s);
/* Positions a fast step reads: n_sink + min(K, |J|) + n_recent, clipped to
 * the context, with n_recent and K the budget's split
 * (sfi_budget_sfi_split). */
int sfi_cost_fast_positions(const sfi_cost_setup *s);
/* B for the setup's context. */
int sfi_cost_budget(const sfi_cost_setup *s);
/* Time of one kernel: roofline over efficiency plus the launch cost. */
double sfi_cost_kernel_time(const sfi_cost_setup *s, sfi_kernel_class c, double bytes,
                            double flops);
/* Ring all-reduce of `bytes` over tp GPUs (0 when tp == 1). */
double sfi_cost_allreduce_time(const sfi_cost_setup *s, double bytes);
/* Ring all-gather over tp GPUs of `bytes` from each GPU (0 when tp == 1):
 * each GPU receives (tp - 1) x bytes over one direction of its link, at
 * the latency and efficiency of the profile's allgather_by_gpus for tp
 * where it has them (sfi-sim validate fits them to sfi-gpu bench-allreduce
 * --op allgather), else the all-reduce's. */
double sfi_cost_allgather_time(const sfi_cost_setup *s, double bytes);
/* Bytes one GPU sends per step into the all-reduces and all-gathers of a
 * step of `batch` sampled tokens (sfi-gpu run --bench's
 * allreduce_bytes_per_step and gather_bytes_per_step); 0 at tp 1. */
void sfi_cost_comm_bytes(const sfi_cost_setup *s, int batch, double *allreduce, double *gather);

/* Predicted time of one kernel of one layer for the setup's batch (all
 * requests of the batch in one launch), as `sfi-sim validate` compares
 * them with a profile's measurements: "attn_dense" (SFI's slow-step dense
 * kernel, fp32 logits over J written), "attn_dense_nologits",
 * "attn_sparse" (the setup's context = the positions read), "selector",
 * "topk", "reorg", "selector_reorg" (the three, serially). SFI_ENOTFOUND
 * for other names. */
SFI_NODISCARD sfi_status sfi_cost_kernel_predict(const sfi_cost_setup *s, const char *kernel,
                                                 double *time_s, sfi_error *err);

/* Predicted time of `layers` layers of a slow step with attention only on
 * the main stream (as the GPU benchmark's two-stream test runs it), the
 * whole batch slow: "attn_layers" (the dense attention kernels alone),
 * "slow_step_serial" (Selector + Top-K + reorg after each layer's attention
 * on one stream), "slow_step_overlap" (on a second stream, the model's
 * overlap with contention). SFI_ENOTFOUND for other names. */
SFI_NODISCARD sfi_status sfi_cost_pipeline_predict(const sfi_cost_setup *s, const char *kind,
                                                   int layers, double *time_s, sfi_error *err);

/* Memory on one GPU. */
typedef struct {
    double weights;        /* bytes of weights (/tp) */
    double kv_per_request; /* KV cache + compact buffers + policy tables */
    double scratch;        /* batch-independent scratch (Selector ring) */
    double usable;         /* capacity * SFI_COST_USABLE_HBM */
    int max_batch;         /* largest batch that fits (0: not even one) */
} sfi_cost_memory;

/* Bytes one request holds on one GPU at the setup's context: KV cache
 * (the policy's share of it) plus the policy's own buffers (SFI: compact
 * sink + selected segment of every layer and the Selector scratch ring).
 * No checks: the setup must have passed sfi_cost_validate at some
 * context. */
double sfi_cost_request_bytes(const sfi_cost_setup *s);

/* Fraction of HBM the model lets weights + KV + buffers use (the rest is
 * the runtime, activations and fragmentation). */
#define SFI_COST_USABLE_HBM 0.90
SFI_NODISCARD sfi_status sfi_cost_memory_of(const sfi_cost_setup *s, sfi_cost_memory *m,
                                            sfi_error *err);

#endif
