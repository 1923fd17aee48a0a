/* Reference attention for one layer, float32, GQA (query head h uses KV head
 * h / (n_heads / n_kv_heads)), scale 1/sqrt(head_dim).
 *
 * KV cache layout for one layer: k[pos][kv_head][head_dim], same for v;
 * positions 0..n_ctx-1 are valid (the current token's key/value included,
 * sfi(7) MANAGED STATE). Queries: q[head][head_dim]. */
#ifndef SFI_ATTENTION_H
#define SFI_ATTENTION_H

#include <stdint.h>
#include "sfi_error.h"

typedef struct {
    int n_heads; /* query heads */
    int n_kv_heads;
    int head_dim;
} sfi_attn_shape;

/* Errors: a count < 1, or n_heads not a multiple of n_kv_heads. */
SFI_NODISCARD sfi_status sfi_attn_shape_check(const sfi_attn_shape *s, sfi_error *err);

/* 1 / sfi_sqrtf(head_dim), the float every logit is multiplied by.
 *
 * Evaluation order (all three functions below, so they agree bit for bit
 * on the same positions): logit = sfi_dot(q_h, k_j, head_dim) * scale;
 * p = sfi_softmax over the positions in ascending order; out[c] = sum of
 * p_j * v_j[c] over the positions in ascending order, one float
 * accumulator from 0.0f. All buffers are checked before any output is
 * written; on error the outputs are unspecified but nothing crashes.
 * Outputs must not overlap the inputs. */
float sfi_attn_scale(int head_dim);

/* Dense decode attention of one query over positions 0..n_ctx-1.
 * out[n_heads*head_dim]. logits (may be NULL): [n_heads][n_ctx], the scaled
 * pre-softmax scores q.k/sqrt(d), which the Selector masks to J. */
SFI_NODISCARD sfi_status sfi_attn_dense_decode(const sfi_attn_shape *s, const float *q,
                                               const float *k, const float *v, int n_ctx,
                                               float *out, float *logits, sfi_error *err);

/* Sparse decode attention: query head h attends only to the positions
 * idx[kvh][0..n_idx[kvh]) of its KV head kvh, taken in ascending position
 * order (the function sorts a copy when needed). Same numerics as dense
 * restricted to the set: with every position, bit-identical to dense.
 * Errors: an empty set, a position outside 0..n_ctx-1, a position twice. */
SFI_NODISCARD sfi_status sfi_attn_sparse_decode(const sfi_attn_shape *s, const float *q,
                                                const float *k, const float *v, int n_ctx,
                                                const int32_t *const *idx, const int *n_idx,
                                                float *out, sfi_error *err);

/* Dense causal attention for a block of T prompt queries at positions
 * pos0..pos0+T-1 over keys 0..pos0+T-1 (q[t][n_heads][head_dim],
 * out likewise). tail_logits (may be NULL): the logits of the last W
 * queries, [W][n_heads][pos0+T], entries past each query's causal limit
 * set to -INFINITY. Query t's output is bit-identical to
 * sfi_attn_dense_decode with n_ctx = pos0 + t + 1. Errors: T < 1, pos0 < 0,
 * W outside 0..T, W > 0 without a buffer. */
SFI_NODISCARD sfi_status sfi_attn_prefill(const sfi_attn_shape *s, const float *q, int T, int pos0,
                                          const float *k, const float *v, float *out, int W,
                                          float *tail_logits, sfi_error *err);

#endif
