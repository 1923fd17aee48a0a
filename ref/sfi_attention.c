/* Reference attention (sfi(7): MANAGED STATE and BIT-EXACT REFERENCE); see sfi_attention.h.
 *
 * The one evaluation order, shared by dense, sparse and prefill so that they
 * agree bit for bit on the same set of positions:
 *   scale    = 1 / sfi_sqrtf(head_dim)                (one float division)
 *   logit[j] = sfi_dot(q_h, k_j, head_dim) * scale    (dims ascending)
 *   p        = sfi_softmax(logits over the set, positions ascending)
 *   out[c]   = sum over the set, positions ascending, of p[j] * v_j[c],
 *              one float accumulator per c starting at 0.0f.
 * Query head h reads KV head h / (n_heads / n_kv_heads). */
#include <config.h>

#include "sfi_attention.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_math.h"
#include "sfi_sort.h"

sfi_status sfi_attn_shape_check(const sfi_attn_shape *s, sfi_error *err)
{
    if (!s)
        return sfi_error_set(err, SFI_EINVAL, "attention: no shape");
    if (s->n_heads < 1 || s->n_kv_heads < 1 || s->head_dim < 1)
        return sfi_error_set(err, SFI_EINVAL,
                             "attention: n_heads=%d, n_kv_heads=%d, head_dim=%d: each must be >= 1",
                             s->n_heads, s->n_kv_heads, s->head_dim);
    if (s->n_heads % s->n_kv_heads != 0)
        return sfi_error_set(err, SFI_EINVAL,
                             "attention: n_heads=%d is not a multiple of n_kv_heads=%d", s->n_heads,
                             s->n_kv_heads);
    return SFI_OK;
}

float sfi_attn_scale(int head_dim)
{
    return 1.0f / sfi_sqrtf((float)head_dim);
}

/* Attention of the G query heads of KV head kvh (one query) over the
 * positions pos[0..n) (ascending) or, when pos is NULL, over 0..n-1.
 * q: this query's [n_heads][head_dim]; out likewise. buf: [G][n] scratch.
 * logits (may be NULL): row h at logits + h * ld receives head h's scaled
 * logits (n of them). The loops run over positions outermost so that each
 * key and value row is read once for the whole group; each head's own
 * sums still run over positions in ascending order, so the result is the
 * same bits as one head at a time. */
static void attend_group(const sfi_attn_shape *s, const float *q, int kvh, const float *k,
                         const float *v, const int32_t *pos, int n, float scale, float *buf,
                         float *out, float *logits, size_t ld)
{
    const size_t d = (size_t)s->head_dim;
    const size_t row = (size_t)s->n_kv_heads * d;
    const int G = s->n_heads / s->n_kv_heads;
    const int h0 = kvh * G;
    /* callers validated the shape and the positions */
    assert(n >= 1 && kvh >= 0 && kvh < s->n_kv_heads);
    for (int i = 0; i < n; i++) {
        size_t j = pos ? (size_t)pos[i] : (size_t)i;
        const float *kj = k + j * row + (size_t)kvh * d;
        int g = 0;
        /* Four heads' dot products side by side: each is still its own
         * single accumulator over dims in ascending order (exactly
         * sfi_dot), but the four independent chains overlap in the CPU. */
        for (; g + 4 <= G; g += 4) {
            const float *q0 = q + (size_t)(h0 + g) * d, *q1 = q0 + d, *q2 = q1 + d, *q3 = q2 + d;
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
            for (size_t c = 0; c < d; c++) {
                const float kc = kj[c];
                a0 += q0[c] * kc;
                a1 += q1[c] * kc;
                a2 += q2[c] * kc;
                a3 += q3[c] * kc;
            }
            buf[(size_t)(g + 0) * (size_t)n + (size_t)i] = a0 * scale;
            buf[(size_t)(g + 1) * (size_t)n + (size_t)i] = a1 * scale;
            buf[(size_t)(g + 2) * (size_t)n + (size_t)i] = a2 * scale;
            buf[(size_t)(g + 3) * (size_t)n + (size_t)i] = a3 * scale;
        }
        for (; g < G; g++)
            buf[(size_t)g * (size_t)n + (size_t)i] =
                sfi_dot(q + (size_t)(h0 + g) * d, kj, d) * scale;
    }
    for (int g = 0; g < G; g++) {
        float *bg = buf + (size_t)g * (size_t)n;
        if (logits)
            memcpy(logits + (size_t)(h0 + g) * ld, bg, (size_t)n * sizeof *bg);
        sfi_softmax(bg, (size_t)n);
        float *og = out + (size_t)(h0 + g) * d;
        for (size_t c = 0; c < d; c++)
            og[c] = 0.0f;
    }
    for (int i = 0; i < n; i++) {
        size_t j = pos ? (size_t)pos[i] : (size_t)i;
        const float *vj = v + j * row + (size_t)kvh * d;
        for (int g = 0; g < G; g++) {
            const float pj = buf[(size_t)g * (size_t)n + (size_t)i];
            float *og = out + (size_t)(h0 + g) * d;
            for (size_t c = 0; c < d; c++)
                og[c] += pj * vj[c];
        }
    }
}

static sfi_status check_common(const sfi_attn_shape *s, const float *q, const float *k,
                               const float *v, const float *out, int n_ctx, sfi_error *err)
{
    sfi_status st = sfi_attn_shape_check(s, err);
    if (st != SFI_OK)
        return st;
    if (!q || !k || !v || !out)
        return sfi_error_set(err, SFI_EINVAL, "attention: missing q, k, v or out buffer");
    if (n_ctx < 1)
        return sfi_error_set(err, SFI_EINVAL, "attention: n_ctx=%d: need at least one position",
                             n_ctx);
    return SFI_OK;
}

sfi_status sfi_attn_dense_decode(const sfi_attn_shape *s, const float *q, const float *k,
                                 const float *v, int n_ctx, float *out, float *logits,
                                 sfi_error *err)
{
    sfi_status st = check_common(s, q, k, v, out, n_ctx, err);
    if (st != SFI_OK)
        return st;
    const int group = s->n_heads / s->n_kv_heads;
    float *buf = malloc((size_t)group * (size_t)n_ctx * sizeof *buf);
    if (!buf)
        return sfi_error_set(err, SFI_ENOMEM, "attention: out of memory for %d logits", n_ctx);
    const float scale = sfi_attn_scale(s->head_dim);
    for (int kvh = 0; kvh < s->n_kv_heads; kvh++)
        attend_group(s, q, kvh, k, v, NULL, n_ctx, scale, buf, out, logits, (size_t)n_ctx);
    free(buf);
    return SFI_OK;
}

sfi_status sfi_attn_sparse_decode(const sfi_attn_shape *s, const float *q, const float *k,
                                  const float *v, int n_ctx, const int32_t *const *idx,
                                  const int *n_idx, float *out, sfi_error *err)
{
    sfi_status st = check_common(s, q, k, v, out, n_ctx, err);
    if (st != SFI_OK)
        return st;
    if (!idx || !n_idx)
        return sfi_error_set(err, SFI_EINVAL, "sparse attention: missing index sets");
    int max_n = 0;
    for (int h = 0; h < s->n_kv_heads; h++) {
        if (n_idx[h] < 1 || n_idx[h] > n_ctx)
            return sfi_error_set(err, SFI_EINVAL,
                                 "sparse attention: kv head %d: %d positions, need 1..n_ctx=%d", h,
                                 n_idx[h], n_ctx);
        if (!idx[h])
            return sfi_error_set(err, SFI_EINVAL, "sparse attention: kv head %d: no index set", h);
        if (n_idx[h] > max_n)
            max_n = n_idx[h];
    }
    const int group = s->n_heads / s->n_kv_heads;
    float *buf = malloc((size_t)group * (size_t)max_n * sizeof *buf);
    int32_t *sorted = malloc((size_t)max_n * sizeof *sorted);
    if (!buf || !sorted) {
        free(buf);
        free(sorted);
        return sfi_error_set(err, SFI_ENOMEM, "sparse attention: out of memory");
    }
    /* Validate every set before writing any output. */
    for (int h = 0; h < s->n_kv_heads && st == SFI_OK; h++) {
        for (int i = 0; i < n_idx[h]; i++) {
            if (idx[h][i] < 0 || idx[h][i] >= n_ctx) {
                st = sfi_error_set(err, SFI_EINVAL,
                                   "sparse attention: kv head %d: position %ld outside 0..%d", h,
                                   (long)idx[h][i], n_ctx - 1);
                break;
            }
        }
    }
    const float scale = sfi_attn_scale(s->head_dim);
    for (int kvh = 0; kvh < s->n_kv_heads && st == SFI_OK; kvh++) {
        const int n = n_idx[kvh];
        const int32_t *pos = idx[kvh];
        int ascending = 1;
        for (int i = 1; i < n; i++)
            if (pos[i] <= pos[i - 1])
                ascending = 0;
        if (!ascending) {
            memcpy(sorted, pos, (size_t)n * sizeof *sorted);
            qsort(sorted, (size_t)n, sizeof *sorted, sfi_cmp_i32);
            for (int i = 1; i < n; i++)
                if (sorted[i] == sorted[i - 1]) {
                    st = sfi_error_set(err, SFI_EINVAL,
                                       "sparse attention: kv head %d: position %ld listed twice",
                                       kvh, (long)sorted[i]);
                    break;
                }
            pos = sorted;
        }
        if (st != SFI_OK)
            break;
        attend_group(s, q, kvh, k, v, pos, n, scale, buf, out, NULL, 0);
    }
    free(buf);
    free(sorted);
    return st;
}

sfi_status sfi_attn_prefill(const sfi_attn_shape *s, const float *q, int T, int pos0,
                            const float *k, const float *v, float *out, int W, float *tail_logits,
                            sfi_error *err)
{
    sfi_status st = sfi_attn_shape_check(s, err);
    if (st != SFI_OK)
        return st;
    if (!q || !k || !v || !out)
        return sfi_error_set(err, SFI_EINVAL, "prefill attention: missing q, k, v or out buffer");
    if (T < 1 || pos0 < 0 || pos0 > (1 << 30) - T)
        return sfi_error_set(err, SFI_EINVAL,
                             "prefill attention: T=%d, pos0=%d: need T >= 1, pos0 >= 0", T, pos0);
    if (W < 0 || W > T || (W > 0 && !tail_logits))
        return sfi_error_set(
            err, SFI_EINVAL,
            "prefill attention: W=%d tail queries of T=%d (need 0..T and a buffer)", W, T);
    const int n_keys = pos0 + T;
    const int group = s->n_heads / s->n_kv_heads;
    float *buf = malloc((size_t)group * (size_t)n_keys * sizeof *buf);
    if (!buf)
        return sfi_error_set(err, SFI_ENOMEM, "prefill attention: out of memory for %d logits",
                             n_keys);
    const float scale = sfi_attn_scale(s->head_dim);
    const size_t qstride = (size_t)s->n_heads * (size_t)s->head_dim;
    for (int t = 0; t < T; t++) {
        const int n = pos0 + t + 1; /* causal: keys 0..pos0+t */
        const int w = t - (T - W);  /* index among the tail queries, < 0 if none */
        float *rows = w >= 0 ? tail_logits + (size_t)w * (size_t)s->n_heads * (size_t)n_keys : NULL;
        for (int kvh = 0; kvh < s->n_kv_heads; kvh++)
            attend_group(s, q + (size_t)t * qstride, kvh, k, v, NULL, n, scale, buf,
                         out + (size_t)t * qstride, rows, (size_t)n_keys);
        for (int h = 0; rows && h < s->n_heads; h++)
            for (int j = n; j < n_keys; j++)
                rows[(size_t)h * (size_t)n_keys + (size_t)j] = -INFINITY;
    }
    free(buf);
    return SFI_OK;
}
