/* A full-level trace file (src/sfi_trace.h) as an analyzer source: every
 * top-M record loaded once into flat arrays (per step sorted, query-head
 * records pooled into KV-head records), snapshots into memory, sentence
 * boundaries from the tokenizer's trigger set or from the recorded step
 * reasons. */
#ifndef SFI_ANALYZE_TRACE_H
#define SFI_ANALYZE_TRACE_H

#include "sfi_analyze.h"

typedef struct sfi_analyze_trace sfi_analyze_trace;

/* Opens and loads path. vocab_dir (may be NULL): a tokenizer directory for
 * the trigger set (sfi(7) TRIGGERS) with trigger_chars; without it the
 * boundaries come from the recorded reasons, which needs a trace recorded
 * under the sfi or boundary trigger policy. request: one request, or -1
 * for all. Errors name the file and the problem (not full level, missing
 * records, inconsistent sizes). */
SFI_NODISCARD sfi_status sfi_analyze_trace_open(const char *path, const char *vocab_dir,
                                                const char *trigger_chars, int request,
                                                sfi_analyze_trace **out, sfi_error *err);
void sfi_analyze_trace_free(sfi_analyze_trace *t);
/* The source (valid while t lives). */
const sfi_analyze_source *sfi_analyze_trace_source(const sfi_analyze_trace *t);
/* Snapshot layer-steps loaded. */
long sfi_analyze_trace_n_snapshots(const sfi_analyze_trace *t);
/* The calibration in the trace's meta key peer_calibration, or NULL. */
const sfi_policy_calib *sfi_analyze_trace_calib(const sfi_analyze_trace *t);

#endif
