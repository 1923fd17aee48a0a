/* The Selector of sfi(7) SELECTOR (all nine steps), per layer, over the
 * KV heads of that layer. Scalar float32, one documented order per sum. */
#ifndef SFI_SELECTOR_H
#define SFI_SELECTOR_H

#include <stdint.h>
#include "sfi_error.h"
#include "sfi_params.h"

/* Inputs for one layer at one slow step (or prefill). J = [j_begin, j_end)
 * is a contiguous range of positions (sfi(7) MANAGED STATE: positions past
 * the sink and before the recent window). */
typedef struct {
    int n_kv_heads;
    int n_win;              /* window queries per KV head: W * group size */
    int n_pos;              /* row length of logits and key_norms */
    int j_begin, j_end;     /* J */
    const float *logits;    /* [n_kv_heads][n_win][n_pos] scaled logits */
    const float *key_norms; /* [n_kv_heads][n_pos] ||k_h(j)||_2 */
} sfi_selector_input;

/* Optional intermediates, each [n_kv_heads][|J|] (index j - j_begin) except
 * lambda [n_kv_heads]; any pointer may be NULL. For tests, the analyzer and
 * the GPU checker. */
typedef struct {
    float *f;       /* evidence distribution (step 3) */
    float *r;       /* prior (step 4) */
    float *lambda;  /* lambda* (step 5) */
    float *s;       /* fused distribution (step 5) */
    float *z_log;   /* log score (step 6) */
    float *z_nms;   /* after Soft-NMS (step 7) */
    float *z_cross; /* after cross-head exclusivity (step 8) */
} sfi_selector_detail;

/* The evaluation order of every step is documented at the top of
 * ref/sfi_selector.c.
 * Writes selected[h*K_out .. ] (K_out = min(K, |J|)) as ascending positions
 * per head and *n_selected = K_out. When |J| <= K every position of J is
 * selected. A -inf logit means "masked" (probability 0). Errors: NaN or
 * +inf logits in J, a head whose logits over J are all masked, negative or
 * non-finite key norms, K < 1, empty J, out-of-range parameters and
 * inconsistent sizes (SFI_EINVAL); an evidence or prior normaliser that
 * under/overflows with extreme parameters and inputs (SFI_ERANGE). selected must hold n_kv_heads * min(K, |J|) entries. */
SFI_NODISCARD sfi_status sfi_selector_run(const sfi_params *prm, const sfi_selector_input *in,
                                          int32_t *selected, int *n_selected,
                                          sfi_selector_detail *detail, sfi_error *err);

/* Single steps, exposed for hand-computed tests and for checkers. No
 * argument checks beyond what sfi_selector_run does before calling them.
 * Step 5: lambda* of f and r over n positions (returned) and s = (1 -
 * lambda) f + lambda r. */
float sfi_selector_fuse(const sfi_params *prm, int n, const float *f, const float *r, float *s);
/* Step 7: z_out from the pre-NMS scores z[0..n) (z_out != z). */
void sfi_selector_soft_nms(const sfi_params *prm, int n, const float *z, float *z_out);
/* Step 8, in place on z[H][n]. SFI_ENOMEM is the only failure. */
SFI_NODISCARD sfi_status sfi_selector_cross_head(const sfi_params *prm, int H, int n, float *z);

/* Inputs in the Selector's layout.
 * Key norms ||k_h(j)||_2 = sfi_sqrtf(sfi_dot(k_h(j), k_h(j), head_dim)) for
 * the KV cache layout of sfi_attention.h (k[pos][kv_head][head_dim]):
 * out[kv_head][n_pos]. */
void sfi_key_norms(const float *k, int n_pos, int n_kv_heads, int head_dim, float *out);
/* Window queries. Decode: the logits of sfi_attn_dense_decode,
 * [n_heads][n_pos], are already [n_kv_heads][G][n_pos] with G = n_heads /
 * n_kv_heads: use them directly with n_win = G (tau = g). Prefill: the tail
 * logits of sfi_attn_prefill, [W][n_heads][n_pos], are re-laid here into
 * out[n_kv_heads][W*G][n_pos], window query tau = w*G + g for tail query w
 * and query head kv*G + g (time-major: the order ref/sfi_decode.c uses, and
 * the decode layout when W = 1; the power mean sums over tau in this
 * order). n_heads must be a multiple of n_kv_heads. */
void sfi_selector_window_from_prefill(int n_heads, int n_kv_heads, int W, int n_pos,
                                      const float *tail, float *out);

/* Top-K of scores[0..n) by value, ties to the smaller index; writes the
 * chosen indices in ascending order. k <= n. */
SFI_NODISCARD sfi_status sfi_topk(const float *scores, int n, int k, int32_t *out, sfi_error *err);

#endif
