/* Hardware descriptions for sfi-sim: GPUs (built-in B200, H200, H100-SXM or
 * a JSON file) and calibration profiles (achieved fraction of peak per kernel
 * class, launch and per-step overheads, optional measured kernel times).
 *
 * GPU file (--gpu FILE), units in the key names, decimal SI prefixes:
 *   { "sfi_gpu": 1, "name": "H100-SXM",
 *     "hbm_capacity_GB": 80, "hbm_bandwidth_TBps": 3.35,
 *     "bf16_dense_TFLOPS": 989.4, "fp8_dense_TFLOPS": 1978.9,
 *     "sm_count": 132, "l2_MB": 50, "nvlink_GBps": 900 }
 * nvlink_GBps is the vendor's total (both directions) per GPU; the
 * all-reduce model uses half of it per direction. Unknown keys are errors.
 *
 * Calibration profile (--profile FILE; the GPU benchmarks write one):
 *   { "sfi_profile": 1, "name": "default", "gpu": "H100-SXM",
 *     "efficiency": { "gemm": 0.80, "attn_dense": 0.75, "attn_sparse": 0.60,
 *                     "selector": 0.50, "topk": 0.40, "reorg": 0.70,
 *                     "allreduce": 0.70, "other": 0.50, "logits": 0.17 },
 *     "fixed_us": { "attn_sparse": 5.8 },
 *     "launch_us": 2.2, "step_overhead_us": 40.0, "allreduce_latency_us": 8.0,
 *     "overlap_contention": 0.30, "cta_GBps": 60, "launch_pdl_us": 1.5,
 *     "measurements": [
 *       { "kernel": "attn_dense", "batch": 16, "context": 32768,
 *         "q_heads": 32, "kv_heads": 8, "head_dim": 128, "K": 2048,
 *         "layers": 1, "time_us": 812.0 } ] }
 * efficiency[c] is the achieved fraction of the binding roofline (HBM
 * bandwidth or tensor FLOP/s) of kernel class c; fixed_us[c] a fixed cost
 * per kernel of the class on top of launch_us; every class is optional
 * (missing ones keep the default profile's value, except that a class
 * whose efficiency is given without a fixed_us has no fixed cost). overlap_contention is
 * the fraction of side-stream (Selector + reorg) time that still slows the
 * main stream while overlapped (they share HBM). "measurements" is optional;
 * `sfi-sim validate` compares each with the model's prediction. Kernel names
 * there: attn_dense (with fp32 logits written, as SFI's slow step runs it),
 * attn_dense_nologits, attn_sparse (context = positions read), selector,
 * topk, reorg, selector_reorg (per layer, times "layers"); attn_layers,
 * slow_step_serial, slow_step_overlap ("layers" layers of the two-stream
 * slow step: attention alone, side work serial, side work on a second
 * stream); allreduce (a collective: "gpus" GPUs, "bytes" the message, as
 * sfi-gpu bench-allreduce times it); allgather (the same, "bytes" what
 * each GPU sends, sfi-gpu bench-allreduce --op allgather); others are
 * listed as not modelled. cta_GBps (optional, no limit
 * when absent) caps what one CTA of a decode attention kernel streams: a
 * launch of few CTAs (small batches) takes at least its largest CTA's
 * bytes over it. cta_GFLOPS (optional, no limit when absent) caps the
 * FLOPs one such CTA computes per second: a CTA's rows take at least their
 * QK and PV FLOPs (4 x G x head_dim a row) over it. launch_pdl_us (optional): the launch cost of a kernel
 * launched with programmatic dependent launch (its start overlaps the
 * previous kernel's tail; sfi-gpu does so in SFI mode). moe_efficiency and
 * moe_pair_GBps (optional): MoE expert kernels streaming the experts at
 * their own fraction of the bandwidth, and no faster than one (token,
 * expert) pair's expert at moe_pair_GBps (sfi-gpu's per-pair GEMV).
 * serial_step_ns (optional): one dependent step of a single thread's loop
 * over device memory (sfi-gpu's MoE routing: a thread per token selects
 * its top experts one compare at a time). fixed_us.gemm (optional,
 * 0 when absent): a decode GEMM's fixed cost besides launch_us and its
 * bytes, which tensor parallelism does not halve (sfi-sim validate prices
 * it on sfi-gpu's register-streaming GEMMs only, not on its slab
 * kernel's).
 *
 * Engine terms (optional; what a serving engine adds on top of kernels,
 * used by sfi-sim serve and, for the curve, by sweep):
 *     "attn_dense_by_context": [[8192, 0.27], [131072, 0.16]],
 *     "request_overhead_us": 25.0, "reserved_GB": 1.5
 * the efficiency of the dense decode attention kernel at each context
 * (2..16 points, increasing contexts, interpolated in log2(context)),
 * a runtime cost per running request per step on top of step_overhead_us,
 * and memory per GPU the engine holds besides weights, KV cache and the
 * activations of one step (CUDA graphs, communication buffers). The class
 * "attn_prefill" prices the causal attention of prefill chunks. */
#ifndef SFI_HW_H
#define SFI_HW_H

#include <stddef.h>
#include "sfi_error.h"

#define SFI_HW_NAME_MAX 64
/* Files larger than this are refused before they are read. */
#define SFI_HW_FILE_MAX (4u << 20)

typedef struct {
    char name[SFI_HW_NAME_MAX];
    double hbm_capacity;  /* bytes */
    double hbm_bandwidth; /* bytes/s */
    double bf16_flops;    /* dense FLOP/s */
    double fp8_flops;     /* dense FLOP/s */
    int sm_count;
    double l2_bytes;
    double nvlink_bandwidth; /* bytes/s, both directions together */
} sfi_gpu;

typedef enum {
    SFI_KC_GEMM = 0,     /* weight matrix-vector/-matrix products */
    SFI_KC_ATTN_DENSE,   /* dense decode attention (with exposed logits) */
    SFI_KC_ATTN_SPARSE,  /* two-segment sparse attention */
    SFI_KC_SELECTOR,     /* Selector steps 1-8 */
    SFI_KC_TOPK,         /* Top-K per KV head */
    SFI_KC_REORG,        /* packing sink + selected K/V */
    SFI_KC_ALLREDUCE,    /* tensor-parallel all-reduce over NVLink */
    SFI_KC_OTHER,        /* norms, RoPE, sampling, peer-method scoring */
    SFI_KC_LOGITS,       /* fp32 logits a dense kernel writes for the Selector
                            (the extra time of the kernel, per logit byte) */
    SFI_KC_ATTN_PREFILL, /* causal attention of a prefill chunk (FLOP-bound) */
    SFI_KC_COUNT
} sfi_kernel_class;

const char *sfi_kernel_class_name(sfi_kernel_class c);

/* Group sizes below this may have collective parameters of their own. */
#define SFI_HW_AR_GROUPS 9

/* Points of an efficiency-by-context curve a profile may carry. */
#define SFI_HW_CURVE_MAX 16

typedef struct {
    char name[SFI_HW_NAME_MAX];
    char gpu[SFI_HW_NAME_MAX];       /* GPU it was measured on ("" = any) */
    double efficiency[SFI_KC_COUNT]; /* (0,1] */
    double fixed_s[SFI_KC_COUNT];    /* extra fixed cost per kernel of a class */
    double launch_s;                 /* fixed cost per kernel */
    double launch_pdl_s;             /* the same with programmatic dependent launch
                                        (sfi-gpu's SFI mode; 0: launch_s),
                                        "launch_pdl_us" */
    double step_overhead_s;          /* fixed cost per decode step */
    double allreduce_latency_s;      /* fixed cost per all-reduce */
    /* An all-reduce inside a decode step costs more than alone: it waits
     * for the other GPUs, and the NCCL kernel breaks the chain of
     * programmatic dependent launches (the RMSNorm after it and the GEMM
     * after that start, and fetch their weights, only once it ended). The
     * extra per all-reduce, "allreduce_step_us" (default 0); sfi-sim
     * validate fits it on steps at tp 1 and tp > 1 together */
    double allreduce_step_s;
    /* At tp > 1 a slow step's all-gather of the Selector scores waits for
     * the Selector's steps 1-7 (one kernel on the side stream). Measured,
     * they do not run beside the layer's O projection and MLP (their
     * cluster needs SMs that the main stream's GEMMs hold) and take a
     * latency rather than their bytes' time: with "sel_pre_us" > 0 they
     * run after the MLP, their bytes' time plus this (default 0: beside
     * the MLP, their bytes' time only) */
    double sel_pre_s;
    /* Collectives of a group of g GPUs (2 <= g < SFI_HW_AR_GROUPS) at
     * their own latency and efficiency, where ar_by_gpus_eff[g] > 0 (as
     * fitted to sfi-gpu bench-allreduce --gpus g): NVLink collectives of 4
     * GPUs are not those of 2. "allreduce_by_gpus": {"G": [latency_us,
     * efficiency], ...} */
    double ar_by_gpus_lat[SFI_HW_AR_GROUPS];
    double ar_by_gpus_eff[SFI_HW_AR_GROUPS];
    /* The same for all-gathers, where ag_by_gpus_eff[g] > 0 (fitted to
     * sfi-gpu bench-allreduce --op allgather --gpus g); else all-gathers
     * take the all-reduce's. "allgather_by_gpus": {"G": [latency_us,
     * efficiency], ...} */
    double ag_by_gpus_lat[SFI_HW_AR_GROUPS];
    double ag_by_gpus_eff[SFI_HW_AR_GROUPS];
    double overlap_contention; /* [0,1] */
    double moe_efficiency;     /* MoE expert kernels' fraction of HBM
                                        bandwidth (0: efficiency.gemm),
                                        "moe_efficiency" */
    double moe_pair_bandwidth; /* bytes/s one (token, expert) pair's expert
                                        is streamed at most (0: no limit),
                                        "moe_pair_GBps" */
    double cta_bandwidth;      /* bytes/s one CTA of a decode attention
                                        kernel streams at most (0: no limit);
                                        "cta_GBps" */
    double cta_flops;          /* FLOP/s one CTA of a decode attention kernel
                                        computes at most (0: no limit);
                                        "cta_GFLOPS" */
    double serial_step_s;      /* one dependent step of a single thread's
                                        loop over device memory (0: free);
                                        "serial_step_ns" */
    /* What a serving engine adds on top of its kernels (engine profiles,
     * sfi-sim-serve(1)). A dense decode attention kernel whose achieved
     * bandwidth depends on the context: n_attn_curve points (context,
     * efficiency), interpolated linearly in log2(context) and held flat
     * beyond the ends; 0 points = efficiency[SFI_KC_ATTN_DENSE] at every
     * context. */
    int n_attn_curve;
    double attn_curve_ctx[SFI_HW_CURVE_MAX];
    double attn_curve_eff[SFI_HW_CURVE_MAX];
    double request_overhead_s; /* per request in a step (CPU bookkeeping) */
    double reserved_bytes;     /* per GPU, besides weights, KV, activations */
    /* Whole decode steps measured by sfi-gpu run --bench
     * (gpu/profiles/h100-e2e.json): checked when the profile is read and
     * counted here; not used in pricing. */
    int n_step_measurements;
} sfi_hw_profile;

/* Efficiency of dense decode attention for a request at `context`
 * positions: the profile's curve, else efficiency[SFI_KC_ATTN_DENSE]. */
double sfi_hw_attn_dense_efficiency(const sfi_hw_profile *p, double context);

typedef struct {
    char kernel[32];
    int batch, context, q_heads, kv_heads, head_dim, K, layers;
    int gpus;     /* collectives ("allreduce", "allgather"): GPUs taking part */
    double bytes; /* collectives: the message (bytes per GPU; an all-gather's:
                     what each GPU sends) */
    double time_s;
} sfi_hw_measurement;

/* Built-in GPUs. Lookup is case-insensitive; "H100" also names H100-SXM. */
size_t sfi_gpu_preset_count(void);
const sfi_gpu *sfi_gpu_preset_at(size_t i);
SFI_NODISCARD sfi_status sfi_gpu_preset(const char *name, sfi_gpu *out, sfi_error *err);
/* Parses a GPU JSON text (origin names it in messages) / reads a file. */
SFI_NODISCARD sfi_status sfi_gpu_parse(const char *json, size_t len, const char *origin,
                                       sfi_gpu *out, sfi_error *err);
SFI_NODISCARD sfi_status sfi_gpu_load(const char *path, sfi_gpu *out, sfi_error *err);
/* A preset name, else a path to a GPU file. */
SFI_NODISCARD sfi_status sfi_gpu_resolve(const char *name_or_path, sfi_gpu *out, sfi_error *err);
SFI_NODISCARD sfi_status sfi_gpu_validate(const sfi_gpu *g, const char *origin, sfi_error *err);

/* The documented default profile (sim/profiles/default.json holds the same
 * numbers; a test keeps them equal). */
void sfi_hw_profile_default(sfi_hw_profile *p);
/* Parses/reads a profile; starts from the default so missing keys keep
 * their defaults. With meas != NULL, the measurements are returned in a
 * malloc'd array (*meas, *n_meas; free() it). */
SFI_NODISCARD sfi_status sfi_hw_profile_parse(const char *json, size_t len, const char *origin,
                                              sfi_hw_profile *out, sfi_hw_measurement **meas,
                                              size_t *n_meas, sfi_error *err);
SFI_NODISCARD sfi_status sfi_hw_profile_load(const char *path, sfi_hw_profile *out,
                                             sfi_hw_measurement **meas, size_t *n_meas,
                                             sfi_error *err);

#endif
