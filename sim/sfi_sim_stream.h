/* The token stream sfi-sim replays through trigger policies (sweep,
 * serve): the decode tokens of one or more traces, or a synthetic stream,
 * and the trigger set that marks sentence boundaries (sfi(7), TRIGGERS).
 * The traces' requests' prompt and decode lengths come along, for a
 * workload shaped like the trace's. */
#ifndef SFI_SIM_STREAM_H
#define SFI_SIM_STREAM_H

#include <stdint.h>
#include "sfi_error.h"
#include "sfi_params.h"

typedef struct {
    int32_t *tokens;       /* [n_tokens] ring of decode tokens */
    int64_t n_tokens;
    uint8_t *is_trigger;   /* [n_vocab] */
    int32_t n_vocab;
    int64_t n_requests;    /* the traces' requests (0: synthetic) */
    int32_t *req_prompt;   /* [n_requests] prompt lengths */
    int64_t *req_steps;    /* [n_requests] decode steps */
    char label[512];       /* where the stream came from, for reports */
} sfi_sim_stream;

/* Loads the stream: trace_opt, else $SFI_TRACE, else the bundled sample
 * traces (traces/sample-*.db, else traces/ *.db, in the source tree or the
 * installed data dir; only traces recorded with the first one's tokenizer
 * are joined), else (or with synthetic) a synthetic stream (say so on
 * stderr when no trace was found). The trigger set: the traces' recorded
 * sfi decisions when they tell it (same trigger characters, no tok_dir),
 * else the vocabulary of tok_dir (default: the bundled Qwen3 tokenizer)
 * under prm's trigger characters. */
SFI_NODISCARD sfi_status sfi_sim_stream_load(const char *trace_opt, const char *tok_dir,
                                             int synthetic, const sfi_params *prm,
                                             sfi_sim_stream *s, sfi_error *err);
void sfi_sim_stream_free(sfi_sim_stream *s);

#endif
