/* Step-level validation of the cost model against whole decode steps that
 * sfi-gpu run --bench measured ("step_measurements" of a profile, e.g.
 * gpu/profiles/h100-steps.json): the measurements, their predicted step
 * times per class and tokens/s, and a fit of the profile's physical
 * parameters on a declared subset of them (sfi-sim-validate(1), STEP-LEVEL
 * VALIDATION).
 *
 * Step classes (as sfi-gpu run --bench reports them): dense = a step in
 * dense mode; slow = an SFI step in which at least one request is slow;
 * fast = an SFI step in which every request is fast. */
#ifndef SFI_STEPVAL_H
#define SFI_STEPVAL_H

#include <stddef.h>
#include <stdint.h>
#include "sfi_error.h"
#include "sfi_cost.h"
#include "sfi_hw.h"
#include "sfi_model.h"
#include "sfi_vocab.h"

/* Largest batch a step measurement may have here. */
#define SFI_SV_MAXB 1024

enum { SFI_SV_DENSE = 0, SFI_SV_SLOW, SFI_SV_FAST, SFI_SV_NCLASS };

typedef struct {
    int have;      /* the class was measured (steps.CLASS with mean_ms) */
    int n;         /* steps of the class (0: not given) */
    double mean_s; /* mean step time */
    double bytes;  /* bytes_per_step (0: not given) */
} sfi_sv_class;

typedef struct {
    char model[64]; /* sfi-sim preset name (or config.json path) */
    int layers;     /* layers kept (--layers of sfi-gpu run; 0 = all) */
    int context;    /* prompt tokens per request (--replay-ctx) */
    int batch;
    int new_tokens;             /* steps per request, step 0 the prefill's (128) */
    int tp;                     /* GPUs of the run (sfi-gpu run --tp; 1) */
    int sfi;                    /* mode: 1 sfi, 0 dense */
    int dtype_bytes;            /* 2 bf16, 4 f32 */
    int variant;                /* engine settings other than sfi-gpu run's defaults */
    int deferred;               /* steps of class fast+sel (deferred refresh) were measured */
    int no_overlap;             /* "overlap": false (--no-overlap): the Selector on the main
                        stream */
    int no_selector;            /* a note naming --bench-no-selector: slow steps
                        without Selector, Top-K, reorg or all-gather */
    int split_fast, split_slow; /* "attn_split_rows": the most rows an attention
                        CTA took of a fast and of a slow request, as the
                        engine reported them (0: not given) */
    double allreduce_bytes, gather_bytes; /* bytes one GPU sent per step into
                        all-reduces and all-gathers, as the engine reported
                        them (-1: not given) */
    char variant_why[64];
    char replay[512]; /* trace the run replayed ("" = none) */
    double tps;       /* decode tokens/s over the timed steps */
    sfi_sv_class cls[SFI_SV_NCLASS];
} sfi_step_meas;

/* Reads "step_measurements" of a profile file. Entries may carry more keys
 * than are read here; the ones read are checked, and a bad one gets
 * "PATH: step_measurements[i]: problem". *out is malloc'd (free()); a file
 * without step_measurements gives *n = 0. */
sfi_status sfi_step_meas_load(const char *path, sfi_step_meas **out, size_t *n, sfi_error *err);
sfi_status sfi_step_meas_parse(const char *json, size_t len, const char *origin,
                               sfi_step_meas **out, size_t *n, sfi_error *err);

/* The mix of a measurement's timed SFI steps: hist[k] = timed steps with k
 * slow requests (k = 0..batch). From sfi-sim's own trigger replay of the
 * trace the run replayed, else (no trace at hand) from the measured step
 * counts with one slow request per slow step. */
typedef struct {
    int batch;
    int64_t hist[SFI_SV_MAXB + 1];
    int replayed; /* 1: from the replay, 0: measured counts */
} sfi_sv_mix;

/* The SFI trigger set (default trigger characters) of DIR's vocab.json. */
sfi_status sfi_sv_trigger_set(const char *tok_dir, sfi_trigger_set *ts, sfi_error *err);

/* Replays the run's trace as sfi-gpu run --replay lays it out (request i
 * of the trace in slot i, further copies staggered) under the sfi trigger
 * policy with the default parameters and trigger set ts, over the steps
 * sfi-gpu run --bench times (3 .. new_tokens - 1). */
sfi_status sfi_sv_replay(const sfi_step_meas *m, const char *trace_path, const sfi_trigger_set *ts,
                         sfi_sv_mix *mix, sfi_error *err);

typedef struct {
    double t[SFI_SV_NCLASS]; /* predicted mean step time per class measured */
    double tps;
} sfi_sv_pred;

/* How the engine's MoE layers read expert weights (sfi_cost_setup's
 * moe_pair_reads): 1 once per (token, expert) pair (default: sfi-gpu's
 * expert GEMV gives each pair its own blocks, which read that pair's
 * expert), 0 once per distinct expert the batch touches. */
extern int sfi_sv_moe_pair_reads;

/* The cost setup of a measurement: its model, GPU, profile, and the
 * engine's way of running it (sfi-gpu run: mixed attention launch, PDL in
 * SFI mode, split rule, MoE launches, and at tp > 1 the f32 residual
 * all-reduces, the Selector on the main stream with its scores'
 * all-gather, the argmax all-gather). */
void sfi_sv_setup(const sfi_step_meas *m, const sfi_model_config *mc, const sfi_hw_profile *p,
                  const sfi_gpu *gpu, sfi_cost_setup *out);

/* The bytes one GPU sends per step into all-reduces and all-gathers by the
 * cost model's account of the engine (compared with what the run
 * reported: m->allreduce_bytes, m->gather_bytes). */
void sfi_sv_comm_bytes(const sfi_step_meas *m, const sfi_model_config *mc, double *allreduce,
                       double *gather);

/* Predicts a measurement under a profile on a GPU with the step mix (SFI
 * mode; ignored in dense mode). */
sfi_status sfi_sv_predict(const sfi_step_meas *m, const sfi_model_config *mc,
                          const sfi_hw_profile *p, const sfi_gpu *gpu, const sfi_sv_mix *mix,
                          sfi_sv_pred *out, sfi_error *err);

/* The model shape of a measurement (preset, cut to its layers). */
sfi_status sfi_sv_model(const sfi_step_meas *m, sfi_model_config *mc, sfi_error *err);

/* The fitted parameters, in the order the fit identifies them. */
enum {
    SFI_SV_P_ATTN_DENSE = 0,
    SFI_SV_P_ATTN_SPARSE,
    SFI_SV_P_GEMM,
    SFI_SV_P_LAUNCH,
    SFI_SV_P_LAUNCH_PDL,
    SFI_SV_P_CONTENTION,
    SFI_SV_P_CTA,
    SFI_SV_P_CTA_FLOPS,
    SFI_SV_P_SERIAL,
    SFI_SV_P_STEP,
    /* what an all-reduce adds inside a step (allreduce_step_us): only
     * steps at tp > 1 beside tp-1 ones determine it */
    SFI_SV_P_AR_STEP,
    /* the Selector's steps 1-7 before a slow step's all-gather at tp > 1
     * (sel_pre_us): only slow steps at tp > 1 determine it */
    SFI_SV_P_SEL_PRE,
    /* a decode GEMM's fixed cost (fixed_us.gemm): steps of one GPU cannot
     * tell it from the launch costs (every dense layer has the same GEMMs
     * per launch); tp-1 and tp-2 steps of one model can (the GEMMs' bytes
     * halve, their fixed part stays). Last, so that where it cannot be
     * told apart it is the one held. */
    SFI_SV_P_GEMM_FIXED,
    SFI_SV_NPARAM
};
const char *sfi_sv_param_name(int i);
/* The parameter's key in --fit-params (its profile key: "gemm" for the
 * GEMM efficiency, "gemm_fixed_us", "launch_pdl_us", ...), and the index
 * of a key (-1: none). */
const char *sfi_sv_param_key(int i);
int sfi_sv_param_lookup(const char *key);
double sfi_sv_param_get(const sfi_hw_profile *p, int i);
void sfi_sv_param_set(sfi_hw_profile *p, int i, double v);

typedef struct {
    int identified[SFI_SV_NPARAM]; /* 1: fitted; 0: held at the prior */
    int asked_held[SFI_SV_NPARAM]; /* 1: held because the caller left it out of
                                      the free parameters (not judged) */
    double value[SFI_SV_NPARAM];
    double prior[SFI_SV_NPARAM];
    double se[SFI_SV_NPARAM]; /* standard error of log(value) at 1% noise, where the
                                 parameter was last judged (identified: the fit's) */
    int n_resid;              /* residuals the fit used */
    double rms;               /* their RMS relative error after the fit */
} sfi_sv_fit;

/* Fits the profile's parameters to the measurements with in_fit[i] set
 * (variants excluded): least squares of the relative errors of every
 * measured class time (and tokens/s where only that was kept). A parameter
 * the subset cannot determine (standard error of its log above 0.25 at 1%
 * measurement noise, with the others free; the worst is held first, e.g.
 * the GEMM efficiency next to the launch cost when the subset holds one
 * model) is held at its prior value. p is updated. */
sfi_status sfi_sv_fit_run(const sfi_step_meas *ms, const sfi_model_config *mcs,
                          const sfi_sv_mix *mixes, const int *in_fit, size_t n, const sfi_gpu *gpu,
                          sfi_hw_profile *p, sfi_sv_fit *out, sfi_error *err);
/* The same with only the parameters j with free_params[j] set free (NULL:
 * all), the others held at p's values: a second data set that determines
 * a few parameters (tp-2 steps beside tp-1 ones: a GEMM's fixed cost)
 * refines a profile fitted on a larger one without refitting the rest on
 * a handful of values. */
sfi_status sfi_sv_fit_run_some(const sfi_step_meas *ms, const sfi_model_config *mcs,
                               const sfi_sv_mix *mixes, const int *in_fit, size_t n,
                               const sfi_gpu *gpu, const int *free_params, sfi_hw_profile *p,
                               sfi_sv_fit *out, sfi_error *err);

/* A fit subset: KEY=V[,V...][:KEY=V[,V...]...] with keys model, batch,
 * context, mode, tp (all terms must hold; values of one key are alternatives).
 * Returns 1 when m matches, 0 when not, -1 (message in err) on a bad
 * spec. */
int sfi_sv_subset_match(const char *spec, const sfi_step_meas *m, sfi_error *err);

#endif
