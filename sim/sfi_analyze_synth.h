/* A synthetic full-level attention source for the analyzer's benchmark,
 * tests and demos: per (step, layer, KV head) M entries generated on the
 * fly from a hash, no trace file. The support has the shape the SFI
 * observation describes: a sink, a few recent positions, and "anchor"
 * positions fixed within a sentence (a quarter drift every step) that move
 * when a sentence ends (a trigger about every sent_len steps). */
#ifndef SFI_ANALYZE_SYNTH_H
#define SFI_ANALYZE_SYNTH_H

#include <stdint.h>
#include "sfi_analyze.h"

typedef struct {
    int n_layers, n_kv_heads, n_steps, ctx0, M, sent_len;
    float tail;
    int32_t *n_ctx;
    uint8_t *trigger;
    int *sent;        /* sentence index of each step */
    int seq_begin[2];
} sfi_analyze_synth;

/* Steps t = 0..n_steps-1 with n_ctx = ctx0 + t. M >= 6. */
SFI_NODISCARD sfi_status sfi_analyze_synth_init(sfi_analyze_synth *s, int n_layers, int n_kv_heads,
                                                int n_steps, int ctx0, int M, int sent_len,
                                                sfi_error *err);
void sfi_analyze_synth_free(sfi_analyze_synth *s);
/* A source reading s (which must outlive it). */
void sfi_analyze_synth_source(sfi_analyze_synth *s, sfi_analyze_source *src);

#endif
