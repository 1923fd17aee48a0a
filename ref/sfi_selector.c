/* The Selector, sfi(7) SELECTOR; see sfi_selector.h.
 *
 * Evaluation order (the GPU's bit-exact mode must follow it):
 *  1. per KV head h and window query tau: p = sfi_softmax of the logits
 *     l[h][tau][j], j in J ascending. A -inf logit is a masked position
 *     (p = 0); a query whose whole row over J is masked contributes p = 0
 *     everywhere (it still counts in n_win, as in the 1/W of step 2).
 *  2. a = alpha; mu(j) = (sum over tau ascending of sfi_powf_pos(p, a)) /
 *     n_win (float division by the float count).
 *  3. f(j) = g(j) / G, g(j) = sfi_powf_pos(mu(j), 1/a) (1/a one float
 *     division), G = sum of g over J ascending. With n_win == 1, f = p
 *     (sfi(7): "f = p_1 exactly").
 *  4. kn(j) = sfi_powf_pos(norm(j) + eps, -gamma);
 *     u(j) = (float)(j - jmin) / ((float)(jmax - jmin) + eps);
 *     pos(j) = sfi_expf(-beta * sfi_powf_pos(u, p)) *
 *              sfi_powf_pos((1 - u) + eps, eta);
 *     w(j) = kn(j) * pos(j); r(j) = w(j) / (sum of w over J ascending).
 *  5. lambda* in the numerically stable but algebraically identical form
 *     num = sum f(j) * (f(j) - r(j)), den = sum (f(j) - r(j))^2 (J
 *     ascending, one accumulator each; den >= 0 exactly, and 0 only when
 *     f == r): lambda = den == 0 ? 0 : clip(num / den, 0, lambda_clip)
 *     (a NaN quotient clips to 0). s(j) = (1 - lambda) * f(j) + lambda * r(j).
 *  6. z(j) = sfi_logf(s(j) + eps).
 *  7. m(j) = max of z(i), i in J, |i - j| <= radius (pre-NMS z);
 *     z(j) = z(j) - alpha_soft * (m(j) - z(j))  (m >= z since i = j counts).
 *  8. per position j, over heads h ascending: t_h = z_h(j) / T;
 *     q = sfi_softmax(t); z_h(j) = z_h(j) + alpha_cross * sfi_logf(max(q_h, eps)).
 *  9. per head: sfi_topk of z over J (higher first, ties to the smaller
 *     position), K_out = min(K, |J|) positions, written ascending. When
 *     |J| <= K the result is J itself (steps 1-8 still run for the
 *     intermediates). */
#include <config.h>

#include "sfi_selector.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_math.h"
#include "sfi_sort.h"

static sfi_status check_params(const sfi_params *p, sfi_error *err)
{
    if (!p)
        return sfi_error_set(err, SFI_EINVAL, "selector: no parameters");
    if (p->K < 1)
        return sfi_error_set(err, SFI_EINVAL, "selector: K=%d: must be >= 1", p->K);
    if (!(p->alpha > 0.0f && p->alpha <= 1.0f))
        return sfi_error_set(err, SFI_EINVAL, "selector: alpha=%g: must be in (0, 1]",
                             (double)p->alpha);
    if (!(p->gamma >= 0.0f) || !isfinite(p->gamma))
        return sfi_error_set(err, SFI_EINVAL, "selector: gamma=%g: must be a finite value >= 0",
                             (double)p->gamma);
    if (!(p->beta >= 0.0f) || !isfinite(p->beta))
        return sfi_error_set(err, SFI_EINVAL, "selector: beta=%g: must be a finite value >= 0",
                             (double)p->beta);
    if (!(p->p > 0.0f) || !isfinite(p->p))
        return sfi_error_set(err, SFI_EINVAL, "selector: p=%g: must be a finite value > 0",
                             (double)p->p);
    if (!(p->eta >= 0.0f) || !isfinite(p->eta))
        return sfi_error_set(err, SFI_EINVAL, "selector: eta=%g: must be a finite value >= 0",
                             (double)p->eta);
    if (!(p->lambda_clip >= 0.0f && p->lambda_clip <= 1.0f))
        return sfi_error_set(err, SFI_EINVAL, "selector: lambda_clip=%g: must be in [0, 1]",
                             (double)p->lambda_clip);
    if (p->nms_radius < 0)
        return sfi_error_set(err, SFI_EINVAL, "selector: nms_radius=%d: must be >= 0",
                             p->nms_radius);
    if (!(p->alpha_soft >= 0.0f) || !isfinite(p->alpha_soft))
        return sfi_error_set(err, SFI_EINVAL,
                             "selector: alpha_soft=%g: must be a finite value >= 0",
                             (double)p->alpha_soft);
    if (!(p->T > 0.0f) || !isfinite(p->T))
        return sfi_error_set(err, SFI_EINVAL, "selector: T=%g: must be a finite value > 0",
                             (double)p->T);
    if (!(p->alpha_cross >= 0.0f) || !isfinite(p->alpha_cross))
        return sfi_error_set(err, SFI_EINVAL,
                             "selector: alpha_cross=%g: must be a finite value >= 0",
                             (double)p->alpha_cross);
    if (!(p->eps > 0.0f) || !isfinite(p->eps))
        return sfi_error_set(err, SFI_EINVAL, "selector: eps=%g: must be a finite value > 0",
                             (double)p->eps);
    return SFI_OK;
}

static sfi_status check_input(const sfi_selector_input *in, sfi_error *err)
{
    if (!in)
        return sfi_error_set(err, SFI_EINVAL, "selector: no input");
    if (in->n_kv_heads < 1 || in->n_win < 1 || in->n_pos < 1)
        return sfi_error_set(err, SFI_EINVAL,
                             "selector: n_kv_heads=%d, n_win=%d, n_pos=%d: each must be >= 1",
                             in->n_kv_heads, in->n_win, in->n_pos);
    if (in->j_begin < 0 || in->j_end > in->n_pos || in->j_end < in->j_begin)
        return sfi_error_set(err, SFI_EINVAL, "selector: J=[%d,%d) is not inside 0..%d",
                             in->j_begin, in->j_end, in->n_pos);
    if (in->j_end == in->j_begin)
        return sfi_error_set(err, SFI_EINVAL,
                             "selector: J=[%d,%d) is empty: nothing to select from", in->j_begin,
                             in->j_end);
    if (!in->logits || !in->key_norms)
        return sfi_error_set(err, SFI_EINVAL, "selector: missing logits or key norms");
    for (int h = 0; h < in->n_kv_heads; h++) {
        int seen = 0; /* some window query of this head sees some j in J */
        for (int t = 0; t < in->n_win; t++) {
            const float *row =
                in->logits + ((size_t)h * (size_t)in->n_win + (size_t)t) * (size_t)in->n_pos;
            for (int j = in->j_begin; j < in->j_end; j++) {
                if (row[j] == -INFINITY)
                    continue; /* masked (e.g. past a prefill query's causal limit) */
                if (!isfinite(row[j]))
                    return sfi_error_set(
                        err, SFI_EINVAL,
                        "selector: logit of kv head %d, window query %d, position %d is %s", h, t,
                        j, isnan(row[j]) ? "NaN" : "+infinite");
                seen = 1;
            }
        }
        if (!seen)
            return sfi_error_set(
                err, SFI_EINVAL,
                "selector: kv head %d: every logit over J=[%d,%d) is masked (-inf)", h, in->j_begin,
                in->j_end);
        const float *kn = in->key_norms + (size_t)h * (size_t)in->n_pos;
        for (int j = in->j_begin; j < in->j_end; j++)
            if (!(kn[j] >= 0.0f) || !isfinite(kn[j]))
                return sfi_error_set(
                    err, SFI_EINVAL,
                    "selector: key norm of kv head %d, position %d is %g (need finite >= 0)", h, j,
                    (double)kn[j]);
    }
    return SFI_OK;
}

/* Steps 1-3 for one head: f[0..nJ). tmp[nJ] scratch. Returns the
 * normaliser G (1 with one window query). */
static float evidence(const sfi_params *prm, const sfi_selector_input *in, int h, float *f,
                      float *mu, float *tmp)
{
    const int nJ = in->j_end - in->j_begin;
    const float a = prm->alpha;
    assert(nJ >= 1 && in->n_win >= 1); /* check_input */
    for (int i = 0; i < nJ; i++)
        mu[i] = 0.0f;
    for (int t = 0; t < in->n_win; t++) {
        const float *row = in->logits +
                           ((size_t)h * (size_t)in->n_win + (size_t)t) * (size_t)in->n_pos +
                           in->j_begin;
        memcpy(tmp, row, (size_t)nJ * sizeof *tmp);
        sfi_softmax(tmp, (size_t)nJ);
        if (in->n_win == 1) { /* f = p_1 exactly */
            memcpy(f, tmp, (size_t)nJ * sizeof *f);
            return 1.0f;
        }
        for (int i = 0; i < nJ; i++)
            mu[i] += sfi_powf_pos(tmp[i], a);
    }
    const float fw = (float)in->n_win;
    const float inv_a = 1.0f / a;
    float G = 0.0f;
    for (int i = 0; i < nJ; i++) {
        f[i] = sfi_powf_pos(mu[i] / fw, inv_a);
        G += f[i];
    }
    for (int i = 0; i < nJ; i++)
        f[i] = f[i] / G;
    return G;
}

/* Step 4 for one head. Returns the normaliser (sum of w). */
static float prior(const sfi_params *prm, const sfi_selector_input *in, int h, float *r)
{
    const int nJ = in->j_end - in->j_begin;
    const float *kn = in->key_norms + (size_t)h * (size_t)in->n_pos + in->j_begin;
    const float span = (float)(nJ - 1) + prm->eps; /* jmax - jmin + eps */
    assert(nJ >= 1);
    float sum = 0.0f;
    for (int i = 0; i < nJ; i++) {
        float pk = sfi_powf_pos(kn[i] + prm->eps, -prm->gamma);
        float u = (float)i / span;
        float pp = sfi_expf(-prm->beta * sfi_powf_pos(u, prm->p)) *
                   sfi_powf_pos((1.0f - u) + prm->eps, prm->eta);
        r[i] = pk * pp;
        sum += r[i];
    }
    for (int i = 0; i < nJ; i++)
        r[i] = r[i] / sum;
    return sum;
}

float sfi_selector_fuse(const sfi_params *prm, int nJ, const float *f, const float *r, float *s)
{
    float num = 0.0f, den = 0.0f;
    for (int i = 0; i < nJ; i++) {
        float d = f[i] - r[i];
        num += f[i] * d;
        den += d * d;
    }
    float lam = 0.0f;
    if (den != 0.0f) {
        lam = num / den;
        if (!(lam > 0.0f)) /* negative or NaN */
            lam = 0.0f;
        if (lam > prm->lambda_clip)
            lam = prm->lambda_clip;
    }
    const float one_m = 1.0f - lam;
    for (int i = 0; i < nJ; i++)
        s[i] = one_m * f[i] + lam * r[i];
    return lam;
}

/* Step 7 for one head: z_out from z (pre-NMS), window max by a direct scan
 * (radius is small; the scan order does not matter for a max of finite
 * values). */
void sfi_selector_soft_nms(const sfi_params *prm, int nJ, const float *z, float *z_out)
{
    const int R = prm->nms_radius;
    assert(R >= 0); /* a negative radius would read z[-1] */
    for (int i = 0; i < nJ; i++) {
        int lo = i - R < 0 ? 0 : i - R;
        int hi = i > nJ - 1 - R ? nJ - 1 : i + R;
        float m = z[lo];
        for (int t = lo + 1; t <= hi; t++)
            if (z[t] > m)
                m = z[t];
        z_out[i] = z[i] - prm->alpha_soft * (m - z[i]);
    }
}

void sfi_key_norms(const float *k, int n_pos, int n_kv_heads, int head_dim, float *out)
{
    const size_t d = (size_t)head_dim;
    for (int j = 0; j < n_pos; j++)
        for (int h = 0; h < n_kv_heads; h++) {
            const float *kj = k + ((size_t)j * (size_t)n_kv_heads + (size_t)h) * d;
            out[(size_t)h * (size_t)n_pos + (size_t)j] = sfi_sqrtf(sfi_dot(kj, kj, d));
        }
}

void sfi_selector_window_from_prefill(int n_heads, int n_kv_heads, int W, int n_pos,
                                      const float *tail, float *out)
{
    assert(n_kv_heads >= 1 && n_heads % n_kv_heads == 0);
    const int G = n_heads / n_kv_heads;
    const size_t row = (size_t)n_pos * sizeof *out;
    for (int kv = 0; kv < n_kv_heads; kv++)
        for (int g = 0; g < G; g++)
            for (int w = 0; w < W; w++) {
                const float *src =
                    tail + ((size_t)w * (size_t)n_heads + (size_t)(kv * G + g)) * (size_t)n_pos;
                float *dst =
                    out + ((size_t)kv * (size_t)(G * W) + (size_t)(w * G + g)) * (size_t)n_pos;
                memcpy(dst, src, row);
            }
}

sfi_status sfi_selector_cross_head(const sfi_params *prm, int H, int nJ, float *z)
{
    float *col = malloc((size_t)(H > 0 ? H : 1) * sizeof *col);
    if (!col)
        return SFI_ENOMEM;
    /* Position by position, heads ascending. */
    for (int i = 0; i < nJ; i++) {
        for (int h = 0; h < H; h++)
            col[h] = z[(size_t)h * (size_t)nJ + (size_t)i] / prm->T;
        sfi_softmax(col, (size_t)H);
        for (int h = 0; h < H; h++) {
            float q = col[h] > prm->eps ? col[h] : prm->eps;
            float *zp = &z[(size_t)h * (size_t)nJ + (size_t)i];
            *zp = *zp + prm->alpha_cross * sfi_logf(q);
        }
    }
    free(col);
    return SFI_OK;
}

typedef struct {
    float v;
    int32_t i;
} scored;

/* "x ranks above y": higher score, or equal score (-0 == +0) and smaller
 * index. A total order, so the top k is one well-defined set whatever the
 * algorithm. */
static int better(const scored *x, const scored *y)
{
    return x->v > y->v || (x->v == y->v && x->i < y->i);
}

/* Min-heap under better(): the root is the worst of the kept k. */
static void sift_down(scored *h, int k, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && better(&h[w], &h[l]))
            w = l;
        if (r < k && better(&h[w], &h[r]))
            w = r;
        if (w == i)
            return;
        scored t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

sfi_status sfi_topk(const float *scores, int n, int k, int32_t *out, sfi_error *err)
{
    if (n < 1 || k < 1 || k > n || !scores || !out)
        return sfi_error_set(err, SFI_EINVAL, "top-k: k=%d of n=%d: need 1 <= k <= n", k, n);
    for (int i = 0; i < n; i++)
        if (scores[i] != scores[i])
            return sfi_error_set(err, SFI_EINVAL, "top-k: score %d is NaN", i);
    if (k == n) {
        for (int i = 0; i < n; i++)
            out[i] = i;
        return SFI_OK;
    }
    scored *h = malloc((size_t)k * sizeof *h);
    if (!h)
        return sfi_error_set(err, SFI_ENOMEM, "top-k: out of memory for k=%d", k);
    /* Keep the best k seen so far in a heap: O(n log k). */
    for (int i = 0; i < k; i++) {
        h[i].v = scores[i];
        h[i].i = i;
    }
    for (int i = k / 2 - 1; i >= 0; i--)
        sift_down(h, k, i);
    for (int i = k; i < n; i++) {
        scored c = {scores[i], i};
        if (better(&c, &h[0])) {
            h[0] = c;
            sift_down(h, k, 0);
        }
    }
    for (int i = 0; i < k; i++)
        out[i] = h[i].i;
    free(h);
    qsort(out, (size_t)k, sizeof *out, sfi_cmp_i32);
    for (int i = 1; i < k; i++)
        assert(out[i - 1] < out[i]); /* k distinct positions, ascending */
    return SFI_OK;
}

sfi_status sfi_selector_run(const sfi_params *prm, const sfi_selector_input *in, int32_t *selected,
                            int *n_selected, sfi_selector_detail *detail, sfi_error *err)
{
    sfi_status st = check_params(prm, err);
    if (st == SFI_OK)
        st = check_input(in, err);
    if (st != SFI_OK)
        return st;
    if (!selected || !n_selected)
        return sfi_error_set(err, SFI_EINVAL, "selector: missing output buffer");
    const int H = in->n_kv_heads;
    const int nJ = in->j_end - in->j_begin;
    const size_t HJ = (size_t)H * (size_t)nJ;
    const int K_out = prm->K < nJ ? prm->K : nJ;

    /* z[H][nJ] is kept for step 8 (across heads); the rest is per head. */
    float *z = malloc(HJ * sizeof *z);
    float *zn = malloc(HJ * sizeof *zn);
    float *work = malloc((size_t)nJ * 5 * sizeof *work);
    int32_t *top = malloc((size_t)K_out * sizeof *top);
    if (!z || !zn || !work || !top) {
        free(z);
        free(zn);
        free(work);
        free(top);
        return sfi_error_set(err, SFI_ENOMEM, "selector: out of memory for %d heads x %d positions",
                             H, nJ);
    }
    float *f = work, *r = work + nJ, *s = work + 2 * (size_t)nJ, *mu = work + 3 * (size_t)nJ,
          *tmp = work + 4 * (size_t)nJ;
    const float eps = prm->eps;

    for (int h = 0; h < H; h++) {
        float G = evidence(prm, in, h, f, mu, tmp);
        float R = prior(prm, in, h, r);
        /* Finite, valid inputs can still under/overflow here with extreme
         * parameters (a tiny alpha, a large gamma with huge or tiny key
         * norms): refuse rather than rank NaNs. */
        if (!(G > 0.0f && G < INFINITY) || !(R > 0.0f && R < INFINITY)) {
            st = sfi_error_set(
                err, SFI_ERANGE,
                "selector: kv head %d: %s normaliser is %g (under/overflow: alpha=%g, gamma=%g "
                "with these logits and key norms)",
                h, !(G > 0.0f && G < INFINITY) ? "evidence" : "prior",
                (double)(!(G > 0.0f && G < INFINITY) ? G : R), (double)prm->alpha,
                (double)prm->gamma);
            break;
        }
        float lam = sfi_selector_fuse(prm, nJ, f, r, s);
        float *zh = z + (size_t)h * (size_t)nJ;
        for (int i = 0; i < nJ; i++)
            zh[i] = sfi_logf(s[i] + eps);
        if (detail) {
            size_t off = (size_t)h * (size_t)nJ, bytes = (size_t)nJ * sizeof(float);
            if (detail->f)
                memcpy(detail->f + off, f, bytes);
            if (detail->r)
                memcpy(detail->r + off, r, bytes);
            if (detail->lambda)
                detail->lambda[h] = lam;
            if (detail->s)
                memcpy(detail->s + off, s, bytes);
            if (detail->z_log)
                memcpy(detail->z_log + off, zh, bytes);
        }
        sfi_selector_soft_nms(prm, nJ, zh, zn + (size_t)h * (size_t)nJ);
    }
    if (st != SFI_OK) {
        free(z);
        free(zn);
        free(work);
        free(top);
        return st;
    }
    if (detail && detail->z_nms)
        memcpy(detail->z_nms, zn, HJ * sizeof *zn);

    /* Step 8. */
    if (sfi_selector_cross_head(prm, H, nJ, zn) != SFI_OK) {
        free(z);
        free(zn);
        free(work);
        free(top);
        return sfi_error_set(err, SFI_ENOMEM, "selector: out of memory");
    }
    if (detail && detail->z_cross)
        memcpy(detail->z_cross, zn, HJ * sizeof *zn);

    /* Step 9. */
    for (int h = 0; h < H && st == SFI_OK; h++) {
        int32_t *dst = selected + (size_t)h * (size_t)K_out;
        if (K_out == nJ) {
            for (int i = 0; i < nJ; i++)
                dst[i] = in->j_begin + i;
            continue;
        }
        st = sfi_topk(zn + (size_t)h * (size_t)nJ, nJ, K_out, top, err);
        if (st != SFI_OK) {
            sfi_error_prefix(err, "selector: kv head %d", h);
            break;
        }
        for (int i = 0; i < K_out; i++)
            dst[i] = in->j_begin + top[i];
    }
    if (st == SFI_OK)
        *n_selected = K_out;
    free(z);
    free(zn);
    free(work);
    free(top);
    return st;
}
