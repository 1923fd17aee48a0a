/* The GPU decode engine behind `sfi-gpu run`: the whole SFI decode loop of
 * method.md sections 5 and 7 for a batch of requests on one GPU.
 *
 * Weights (bf16 or f32) and every piece of decode state live on the
 * device: a paged KV cache (each request owns a contiguous run of pages,
 * addressed through a block table as a serving engine would), the key
 * norms the Selector's prior reads, per layer the selected sets and the
 * compact segment of the two-segment layout, a ring of R = 4 logits and
 * Selector scratch slots, and the run state from which a plan kernel
 * decides at the start of every step whether each request's step is slow
 * or fast (its trigger policy, on the device). A decode step is a fixed
 * sequence of launches captured once into a CUDA graph and replayed;
 * within it each request follows its own path (dense attention with
 * logits + Selector + reorg on a second stream when slow, the two-segment
 * sparse kernel when fast). Nothing is allocated after sfi_gpu_engine_create.
 *
 * Correctness: with exact = 1 (f32) every kernel computes the reference's
 * bits (sfi-ref run --backend scalar), so the run's digest equals
 * sfi-ref's; otherwise GEMMs go through cuBLAS and the attention kernels
 * are the fast ones. */
#ifndef SFI_GPU_ENGINE_H
#define SFI_GPU_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "sfi_error.h"
#include "sfi_model.h"
#include "sfi_params.h"
#include "sfi_qwen3.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int dtype; /* SFI_GPU_BF16 (serving) or SFI_GPU_F32 (checking) */
    int exact; /* bit-exact kernels (f32 only) */
    int sfi;   /* 1: SFI mode; 0: dense (every step dense) */
    sfi_params params;
    int trigger;               /* sfi_trigger_kind (ref/sfi_state.h) */
    int interval;              /* for the interval policy */
    const uint8_t *is_trigger; /* host [n_trigger_vocab] 0/1, may be NULL */
    int32_t n_trigger_vocab;
    int max_batch;         /* requests decoded together, 1..SFI_GPU_MAX_BATCH */
    int max_ctx;           /* positions per request: longest prompt + max_new */
    int max_new;           /* steps per request (step 0 is the prefill's) */
    int32_t stop_token;    /* a request stops after generating it; -1: never */
    int32_t stop_more[16]; /* more tokens that stop it (a config's eos_token_ids) */
    int n_stop_more;
    int page;          /* positions per KV page (64) */
    int prefill_chunk; /* prompt tokens per prefill pass (2048) */
    int graphs;        /* replay decode steps from a CUDA graph (1) */
    int overlap;       /* Selector + reorg on a second stream (1) */
    int pdl;           /* programmatic dependent launch in decode steps: -1 auto
                               (SFI mode on, dense mode off: measured faster each way),
                               0 off, 1 on */
    int qkv_fuse;      /* the attention makes q and appends K/V itself (sfi_gpu_attn_fuse;
                               bf16, head_dim 128): -1 default (SFI_GPU_QKV_FUSE, else
                               1), 0 never, 1 in steps without a slow request, 2 in
                               every step */
    int gemm_cublas;   /* decode GEMMs through cuBLAS instead of ours (0) */
    int skip_select;   /* timing only: slow steps run their dense attention
                               but no Selector or reorg (results are wrong) */
    /* Tensor parallelism (sfi-gpu run --tp N): this engine is rank tp_rank
     * of tp_size, on the calling thread's current device, with tp_comm its
     * NCCL communicator (sfi_gpu_nccl.h). Rank r holds KV heads [r nkv/N,
     * (r+1) nkv/N) with their query heads, their KV cache, key norms,
     * selected sets, compact segments and Selector state; the columns
     * [r I/N, (r+1) I/N) of every MLP and expert; the vocabulary rows
     * [r ceil(V/N), ...) of the LM head; embedding, norms and the MoE
     * router whole. Per layer the O projection and the MLP (or experts)
     * give partial residuals summed by an all-reduce (f32); the Selector's
     * cross-head step all-gathers the scores; the argmax combines the
     * ranks' best. Every rank makes the same calls in the same order (the
     * same requests, and at tp > 1 the Selector and reorg on the main
     * stream: no second stream, so no collective on it). tp_size 1 (the
     * default) never calls NCCL. */
    int tp_size, tp_rank;
    void *tp_comm;
} sfi_gpu_engine_opts;

void sfi_gpu_engine_opts_default(sfi_gpu_engine_opts *o);

/* Device memory the engine will hold, by purpose (bytes). */
typedef struct {
    uint64_t weights, kv, compact, key_norms, selector, logits, activations, prefill, other;
    uint64_t total;
} sfi_gpu_engine_mem;

/* What create would allocate for this model and options (no device call). */
sfi_status sfi_gpu_engine_mem_plan(const sfi_model_config *c, const sfi_gpu_engine_opts *o,
                                   sfi_gpu_engine_mem *m, sfi_error *err);

typedef struct sfi_gpu_engine sfi_gpu_engine;

/* Checks the shape and options, compares the memory plan with the
 * device's free memory (refusing, with the numbers, what does not fit),
 * allocates everything and uploads the weights: from m (a loaded
 * checkpoint) or, with m == NULL, random weights of cfg's shape made on
 * the device from seed (method of sfi_qwen3_write_random). */
sfi_status sfi_gpu_engine_create(const sfi_model_config *cfg, const sfi_qwen3 *m, uint64_t seed,
                                 const sfi_gpu_engine_opts *o, sfi_gpu_engine **out,
                                 sfi_error *err);
void sfi_gpu_engine_free(sfi_gpu_engine *e);
const sfi_gpu_engine_mem *sfi_gpu_engine_memory(const sfi_gpu_engine *e);

typedef struct {
    const int32_t *prompt;
    int n_prompt;
    /* teacher forcing (replay): the inputs of steps 1.. (force[t-1] is
     * fed at step t instead of x_{t-1}); NULL: greedy decoding */
    const int32_t *force;
    int n_force; /* >= max_new - 1 when force is given */
} sfi_gpu_request;

/* Per-step observation (reads the step's results back every step, so
 * not for timing runs). Callbacks may be NULL. At tp_size > 1 the
 * readback gathers the ranks' logits and sets (collective calls): give
 * every rank an observer with the same callbacks set (no-ops on ranks
 * other than 0) or none; rank 0's sees the whole vocabulary and every KV
 * head. */
typedef struct {
    void *user;
    /* step t of request b: kind (sfi_step_kind), reason, generated token,
     * its logits [vocab] */
    sfi_status (*on_step)(void *user, int b, int step, int kind, int reason, int32_t token,
                          const float *logits, int vocab, sfi_error *err);
    /* selected sets of layer l after a slow step (step -1: prefill) of
     * request b: sel [n_kv][K] (first n_sel of each row valid) */
    sfi_status (*on_selected)(void *user, int b, int step, int layer, const int32_t *sel, int n_kv,
                              int K, int n_sel, sfi_error *err);
} sfi_gpu_observer;

typedef struct {
    int batch, max_new;
    int32_t *ids;              /* [batch][max_new]: generated (argmax) tokens */
    uint8_t *kinds, *reasons;  /* [batch][max_new] */
    int *n_generated, *n_slow; /* [batch] */
    double prefill_s;          /* wall seconds of all prefills (synchronised) */
    double decode_s;           /* wall seconds of steps 1.. */
    int n_timed;               /* steps with a time in step_ms (1..) */
    float *step_ms;            /* [max_new] event-timed batch steps (step_ms[0] unused) */
    double graph_build_s;
    int n_no_chain; /* steps replayed without the Selector chain (tp > 1) */
    /* 1: the step graph had its conditional node (one GPU, SFI: steps
     * without a slow request ran without the chain); -1: it was tried and
     * could not be instantiated (cond_why), the plain graph ran instead */
    int cond_graph;
    char cond_why[96];
} sfi_gpu_run_result;

void sfi_gpu_run_result_free(sfi_gpu_run_result *r);

/* Decodes B <= max_batch requests together (each prompt <= max_ctx -
 * max_new + 1 tokens). obs: per-step readback (NULL: the host does not
 * read per-step state; results come back at the end). time_steps: record
 * an event after every step (bench). */
sfi_status sfi_gpu_engine_run(sfi_gpu_engine *e, const sfi_gpu_request *rq, int B,
                              const sfi_gpu_observer *obs, int time_steps, sfi_gpu_run_result *res,
                              sfi_error *err);

/* Bytes a step must move per request (for bench's bandwidth figures):
 * KV rows read by a dense or fast step at context ctx, and the weights. */
uint64_t sfi_gpu_engine_weight_bytes(const sfi_gpu_engine *e);
uint64_t sfi_gpu_engine_kv_row_bytes(const sfi_gpu_engine *e); /* K+V of one position, all layers */
/* Weight bytes one decode step of `batch` requests reads: every weight of
 * a dense model; for MoE layers only the touched experts, estimated as the
 * expected number of distinct experts among batch * top uniform picks (the
 * routing is not read back in timed runs). */
double sfi_gpu_engine_step_weight_bytes(const sfi_gpu_engine *e, int batch);
/* Bytes this rank sends into collectives per decode step of `batch`
 * requests (0 at tp_size 1): the two all-reduces of every layer (batch x
 * hidden f32 each), and in SFI mode the Selector's all-gathers of the
 * scores of a step in which one request is slow (every layer; a step
 * with n slow requests sends the next power of two of n requests' rows,
 * one without none) and the argmax's. */
void sfi_gpu_engine_comm_bytes(const sfi_gpu_engine *e, int batch, uint64_t *allreduce,
                               uint64_t *gather);
/* This engine's share: rank, ranks, its KV heads (nkv / ranks). */
void sfi_gpu_engine_tp(const sfi_gpu_engine *e, int *rank, int *size, int *n_kv_local);
/* SFI mode: the most rows an attention CTA takes of a fast request and of
 * a slow one (plan_splits); 0 and 0 in dense mode */
void sfi_gpu_engine_attn_split_rows(const sfi_gpu_engine *e, int *fast, int *slow);

#ifdef __cplusplus
}
#endif
#endif
