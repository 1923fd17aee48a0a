/* The sfi-ref run trace recorder: a decode observer (ref/sfi_decode.h)
 * that writes what the decode loop does into a trace (src/sfi_trace.h,
 * sfi-trace(5)), at level tokens, summary or full.
 *
 * Mapping of the decode loop onto the trace:
 *   - every sfi_decode_run call (on_prefill) adds a request;
 *   - every decode step (on_step) appends a step and is committed at once,
 *     so a killed sfi-ref leaves a trace of every step it finished;
 *   - summary: the Selector's sets of slow steps (on_slow_layer; the
 *     prefill's selection is recorded as step 0's, since step 0's forward
 *     pass is the prefill), with the captured mass averaged over each KV
 *     head's query heads, and lambda*; on fast steps, the dense attention
 *     mass inside sink U selected U recent per layer and KV head;
 *   - full: top-M positions and probabilities of every query head's dense
 *     attention on every step (step 0's is the prefill's last position);
 *   - full with qk: per layer, every step's roped query (step 0's with the
 *     last SFI_RECORDER_QK_TAIL prompt queries before it: the prompt
 *     observation), the prompt's accumulated attention ('a', step 0), and
 *     the key (qkv: and value) cache at the request's last step (every
 *     earlier step's cache is its prefix); calib: the Kascade/FASA
 *     calibration JSON in meta peer_calibration.
 * Records of a step are buffered until on_step and written with it. */
#ifndef SFI_RECORDER_H
#define SFI_RECORDER_H

#include "sfi_decode.h"
#include "sfi_error.h"
#include "sfi_model.h"
#include "sfi_trace.h"

typedef struct {
    const char *path;          /* --trace OUT.db; NULL: record nothing */
    sfi_trace_level level;     /* --trace-level (default tokens) */
    int top_m;                 /* --trace-top-m (default 4096) */
    const char *layers;        /* --trace-layers: comma-separated layers whose
                               per-layer records (summary and full levels) are
                               kept (NULL: all); size control */
    int qk;                    /* --trace-qk (1): query and key snapshots (full);
                               --trace-qkv (2): and values */
    const char *calib;         /* --trace-calib FILE: meta peer_calibration */
    const char *tokenizer_dir; /* --tokenizer DIR, named in meta tokenizer with its
                                  files' SHA-256 (NULL: the model directory) */
    unsigned given;            /* SFI_RECORDER_GIVEN_* bits: options set */
} sfi_recorder_opts;

/* Prompt queries kept in step 0's query snapshot under --trace-qk: what
 * SnapKV's window and LFPS's seeding read (32), and more than SFI's
 * W_prefill (16). */
#define SFI_RECORDER_QK_TAIL 32
#define SFI_RECORDER_GIVEN_LEVEL 1u
#define SFI_RECORDER_GIVEN_TOP_M 2u
#define SFI_RECORDER_GIVEN_LAYERS 4u

void sfi_recorder_opts_default(sfi_recorder_opts *o);

/* Refuses options that would be silently ignored: --trace-level,
 * --trace-top-m, --trace-layers, --trace-qk(v) or --trace-calib without
 * --trace, --trace-top-m or --trace-qk(v) below the full level,
 * --trace-layers at the tokens level (which has no per-layer records). */
SFI_NODISCARD sfi_status sfi_recorder_opts_check(const sfi_recorder_opts *o, sfi_error *err);

/* Command-line flags of the recorder, for sfi-ref run: if argv[*i] is
 * --trace, --trace-level or --trace-top-m (also as --flag=value), consumes
 * it and its value, advances *i past them and returns 1; returns 0 when
 * argv[*i] is not a recorder flag; -1 with err set on a bad or missing
 * value. */
int sfi_recorder_parse_arg(sfi_recorder_opts *o, int argc, char **argv, int *i, sfi_error *err);

/* The same for getopt_long users: name is the long option without dashes
 * ("trace", "trace-level", "trace-top-m", "trace-layers", "trace-qk" and
 * "trace-qkv" (value ignored), "trace-calib"). Returns 1 when applied, 0 when name is not a
 * recorder option, -1 with err set on a bad value. */
int sfi_recorder_set_option(sfi_recorder_opts *o, const char *name, const char *value,
                            sfi_error *err);

/* Help lines for the flags (for --help). */
const char *sfi_recorder_usage(void);

typedef struct sfi_recorder sfi_recorder;

/* Creates the trace (replacing an existing file) for runs of the model
 * whose directory (or config.json) is model_dir, with decode options
 * dopts. meta: model_config = model_dir's config.json text, tokenizer =
 * the SHA-256 of vocab.json/merges.txt in o->tokenizer_dir (else the model
 * directory), params = dopts'
 * parameters, policy = the trigger policy ("dense" in dense mode).
 * When o->path is NULL, *out = NULL and SFI_OK (nothing to record). */
SFI_NODISCARD sfi_status sfi_recorder_open(const sfi_recorder_opts *o, const char *model_dir,
                                           const sfi_model_config *cfg,
                                           const sfi_decode_opts *dopts, sfi_recorder **out,
                                           sfi_error *err);

/* Fills obs so that sfi_decode_run records into r (r may be NULL: obs is
 * then all NULL). */
void sfi_recorder_observer(sfi_recorder *r, sfi_decode_observer *obs);

/* Marks the trace complete and closes it; frees r (NULL allowed). */
SFI_NODISCARD sfi_status sfi_recorder_finish(sfi_recorder *r, sfi_error *err);

/* Closes without marking complete (after a failed run); frees r. */
void sfi_recorder_abort(sfi_recorder *r);

#endif
