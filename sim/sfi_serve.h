/* A serving engine, simulated step by step (sfi-sim serve): requests
 * arrive, are admitted while their KV blocks fit in the memory budget and
 * queue otherwise, prefill (whole or in chunks riding along decode steps),
 * decode under continuous batching with every request at its own context,
 * and are preempted (recompute, as vLLM does by default) when a running
 * request cannot grow. Each step is priced by the cost model
 * (sfi_cost_step_mix); a policy's slow and fast steps come from replaying
 * each request's token stream through ref/'s trigger policy.
 *
 * Memory per GPU: gpu_mem_util x HBM capacity holds the weights, the
 * activations of the largest step (max_batched_tokens tokens), the
 * profile's reserved_bytes and the KV budget. A request holds, at L cached
 * positions, sfi_cost_request_bytes at ceil(L / block_size) blocks: its
 * paged KV cache and its policy's buffers (SFI: compact segment and
 * Selector scratch ring), so SFI may admit fewer requests than full KV.
 *
 * Scheduling (vLLM-like; every choice documented in sfi-sim-serve(1)):
 *   - running requests are served first, in admission order: a decoding
 *     request computes 1 token, a prefilling one min(rest, token budget);
 *     when a decode step needs a new block and none is free, the running
 *     request admitted last is preempted (its blocks freed, put back at
 *     the head of the queue; when admitted again it prefills its prompt
 *     and the tokens it generated), itself if it is the last;
 *   - then, unless a request was preempted in this step, queued requests
 *     are admitted first come first served while the blocks of their whole
 *     prompt fit, fewer than max_num_seqs run and token budget is left;
 *   - chunked prefill off: a step either prefills newly admitted requests
 *     (whole prompts, prefills first) or decodes.
 *   - shared_prefix: the first shared_prefix tokens of every prompt are
 *     the same; their full blocks are computed once and held once (prefix
 *     caching). A request that needs blocks of the prefix another request
 *     is still computing waits for it (first come first served).
 * The prefill samples the first token; each decode step one more. */
#ifndef SFI_SERVE_H
#define SFI_SERVE_H

#include <stdint.h>
#include "sfi_cost.h"
#include "sfi_error.h"
#include "sfi_replay.h"
#include "sfi_state.h"

typedef struct {
    double arrival;  /* s, >= 0 */
    int prompt;      /* prompt tokens, >= 1 */
    int gen;         /* tokens to generate, >= 1 (the first from the prefill) */
} sfi_serve_request;

typedef struct {
    sfi_cost_setup cost;    /* model, GPU, profile, params, policy, TP, bytes;
                               context and batch are ignored */
    double gpu_mem_util;    /* (0, 1] of HBM capacity [0.9] */
    int block_size;         /* tokens per KV block [16] */
    int max_num_seqs;       /* running requests at most [256] */
    int max_batched_tokens; /* tokens computed per step at most [8192] */
    int chunked_prefill;    /* 1: prefill chunks beside decode steps [1] */
    int shared_prefix;      /* tokens shared by every prompt [0] */
    /* Slow steps: request i replays the stream from offset i * n / N
     * through trigger policy `trigger` (interval for SFI_TRIG_INTERVAL).
     * NULL stream: policies with slow steps take a slow step only as the
     * first decode step after each prefill, the rest fast. */
    const sfi_replay_stream *stream;
    sfi_trigger_kind trigger;
    int interval;
    int timeline;           /* 1: keep every step in the result */
} sfi_serve_config;

/* Defaults above; the caller sets cost (model, GPU, ...) and the stream. */
void sfi_serve_config_init(sfi_serve_config *c);

typedef struct {
    double arrival, admitted, first_token, finish; /* s; admitted = first admission */
    int prompt, gen;
    int preemptions;
    int64_t decode_steps, slow_steps;
} sfi_serve_req_stats;

typedef struct {
    double t;           /* start of the step, s */
    double latency;     /* s */
    double kv_used;     /* bytes per GPU held during the step (KV + policy buffers) */
    int running;        /* requests in the step */
    int waiting;        /* arrived, not running, after the step's admissions */
    int prefill_tokens; /* prefill tokens computed in the step */
    int slow;           /* requests taking a slow step */
} sfi_serve_step;

typedef struct {
    int n;
    sfi_serve_req_stats *req;   /* [n], in the input's order */
    sfi_serve_step *steps;      /* [n_steps] with config.timeline, else NULL */
    int64_t n_steps;
    double start, end;          /* first arrival, last finish (s) */
    double weights;             /* bytes per GPU */
    double activations;         /* bytes per GPU reserved for one step's activations */
    double reserved;            /* the profile's reserved_bytes */
    double kv_budget;           /* bytes per GPU left for KV + policy buffers */
    double peak_kv;             /* most of kv_budget in use at once */
    double peak_mem;            /* weights + activations + reserved + peak_kv */
    double request_bytes_max;   /* one request alone at its longest (no sharing) */
    int peak_running;
    double mean_running;        /* over steps, weighted by step time */
    int64_t preemptions;
    int64_t prefill_tokens;     /* computed, recomputation included */
    int64_t recomputed_tokens;  /* prefill tokens computed again after preemption */
    int64_t cached_tokens;      /* prompt tokens served from the shared prefix */
    int64_t request_steps, slow_request_steps; /* decode request-steps */
    double busy_s;              /* time spent in steps */
} sfi_serve_result;

/* Runs the workload (n requests, any order of arrival) to the end. Fails
 * (SFI_ERANGE, naming the request and the numbers) when a request cannot
 * fit the KV budget even alone, or when the weights do not fit at all. */
SFI_NODISCARD sfi_status sfi_serve_run(const sfi_serve_config *c, const sfi_serve_request *req,
                                       int n, sfi_serve_result *out, sfi_error *err);
void sfi_serve_result_free(sfi_serve_result *r);

/* Metrics of a finished run. TTFT = first token - arrival; TPOT = (finish
 * - first token) / (gen - 1) over requests with gen > 1; end to end =
 * finish - arrival; quantiles nearest-rank over requests. Throughput =
 * generated tokens / (end - start); goodput = generated tokens of the
 * requests meeting the SLOs (TPOT <= slo_tpot and TTFT <= slo_ttft, each
 * when > 0) / (end - start). */
typedef struct {
    double elapsed, tok_s, goodput_tok_s, slo_met; /* slo_met: fraction of requests */
    double ttft_mean, ttft_p50, ttft_p99;
    double tpot_mean, tpot_p50, tpot_p99;
    double e2e_mean, e2e_p50, e2e_p99;
    double slow_frac;          /* slow decode request-steps / decode request-steps */
    int64_t tokens;            /* generated */
} sfi_serve_summary;

SFI_NODISCARD sfi_status sfi_serve_summarize(const sfi_serve_result *r, double slo_tpot,
                                             double slo_ttft, sfi_serve_summary *s, sfi_error *err);

/* Request lengths: a fixed number ("8192", "8K"), "uniform:LO:HI" (integers,
 * inclusive), "lognormal:MEDIAN:SIGMA" (clipped to 1..2^30) or, with
 * values (a trace's lengths), "trace" (value i mod n_values for request
 * i). Sizes take K (1024) and M suffixes. */
typedef enum { SFI_LEN_FIXED, SFI_LEN_UNIFORM, SFI_LEN_LOGNORMAL, SFI_LEN_TRACE } sfi_len_kind;

typedef struct {
    sfi_len_kind kind;
    double a, b;
} sfi_len_dist;

SFI_NODISCARD sfi_status sfi_len_dist_parse(const char *spec, sfi_len_dist *d, sfi_error *err);
/* Draws the length of request i; *rng is an sfi_rng state. */
int sfi_len_dist_draw(const sfi_len_dist *d, uint64_t *rng, int i, const int64_t *values,
                      int64_t n_values);

#endif
