/* Reference attention for one layer, float32, GQA (query head h uses KV head
 * h / (n_heads / n_kv_heads)), scale 1/sqrt(head_dim).
 *
 * KV cache layout for one layer: k[pos][kv_head][head_dim], same for v;
 * positions 0..n_ctx-1 are valid (the current token's key/value included,
 * method.md section 2). Queries: q[head][head_dim]. */
#ifndef SFI_ATTENTION_H
#define SFI_ATTENTION_H

#include <stdint.h>
#include "sfi_error.h"

typedef struct {
    int n_heads;     /* query heads */
    int n_kv_heads;
    int head_dim;
} sfi_attn_shape;

sfi_status sfi_attn_shape_check(const sfi_attn_shape *s, sfi_error *err);

/* Dense decode attention of one query over positions 0..n_ctx-1.
 * out[n_heads*head_dim]. logits (may be NULL): [n_heads][n_ctx], the scaled
 * pre-softmax scores q.k/sqrt(d), which the Selector masks to J. */
sfi_status sfi_attn_dense_decode(const sfi_attn_shape *s, const float *q,
                                 const float *k, const float *v, int n_ctx,
                                 float *out, float *logits, sfi_error *err);

/* Sparse decode attention: query head h attends only to the positions
 * idx[kvh][0..n_idx[kvh]) of its KV head kvh, taken in ascending position
 * order (the function sorts a copy when needed). Same numerics as dense
 * restricted to the set: with every position, bit-identical to dense. */
sfi_status sfi_attn_sparse_decode(const sfi_attn_shape *s, const float *q,
                                  const float *k, const float *v, int n_ctx,
                                  const int32_t *const *idx, const int *n_idx,
                                  float *out, sfi_error *err);

/* Dense causal attention for a block of T prompt queries at positions
 * pos0..pos0+T-1 over keys 0..pos0+T-1 (q[t][n_heads][head_dim],
 * out likewise). tail_logits (may be NULL): the logits of the last W
 * queries, [W][n_heads][pos0+T], entries past each query's causal limit
 * set to -INFINITY. */
sfi_status sfi_attn_prefill(const sfi_attn_shape *s, const float *q, int T, int pos0,
                            const float *k, const float *v, float *out,
                            int W, float *tail_logits, sfi_error *err);

#endif
