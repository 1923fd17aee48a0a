/* sfi-gpu check: the GPU kernels against the reference (ref/), case by
 * case, on seeded random inputs. See man sfi-gpu for what is compared and
 * the tolerances (and why they are what they are).
 *
 * Each case builds a batch of requests with slightly different context
 * lengths, K/V in the reference layout [pos][kv_head][D] (bf16 cases: the
 * values are rounded to bf16 once and both sides read exactly those), a
 * paged device copy with a shuffled block table whose unused rows hold
 * NaN (a kernel reading past a request's end poisons its output), and
 * then compares: dense outputs and logits; the Selector's lambda*, s and
 * selected sets on the reference's logits and key norms; the reorg'd
 * compact rows and the two-segment sparse output against the reference's
 * sparse attention on sink + selected + recent; Top-K on tie-heavy scores.
 * --bit-exact adds the exact kernels on the f32 cases, compared bit for
 * bit. */
#include <config.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <sys/stat.h>
#include <unistd.h>

#include "sfi_attention.h"
#include "sfi_digest.h"
#include "sfi_gpu.h"
#include "sfi_gpu_cli.h"
#include "sfi_gpu_engine.h"
#include "sfi_gpu_model.h"
#include "sfi_gpu_moe.h"
#include "sfi_gpu_verify.h"
#include "sfi_io.h"
#include "sfi_math.h"
#include "sfi_model.h"
#include "sfi_params.h"
#include "sfi_parse.h"
#include "sfi_qwen3.h"
#include "sfi_selector.h"
#include "sfi_tokenizer.h"
#include "sfi_vocab.h"

#define CK(x) SFI_GPU_CK("check", x, #x)

typedef struct {
    int batch, n_kv, G, D, ctx, page, K, n_recent, dtype;
} tcase;

static const tcase k_cases[] = {
    {1, 1, 1, 64, 50, 16, 8, 16, SFI_GPU_F32},
    {2, 2, 4, 128, 777, 16, 64, 64, SFI_GPU_F32},
    {3, 4, 2, 64, 3000, 64, 256, 256, SFI_GPU_BF16},
    {3, 4, 2, 128, 6000, 64, 512, 256, SFI_GPU_BF16},
    /* sfi-small-qwen3's group and head size (6 query heads over 2, D 64) */
    {1, 2, 3, 64, 1500, 64, 128, 128, SFI_GPU_BF16},
    {2, 8, 4, 128, 5000, 64, 512, 256, SFI_GPU_F32},
    {2, 4, 8, 128, 9000, 32, 100, 128, SFI_GPU_F32},
    {2, 2, 1, 128, 4000, 16, 4096, 64, SFI_GPU_BF16},
    {2, 8, 4, 128, 33000, 64, 2048, 256, SFI_GPU_BF16},
    {1, 8, 4, 128, 40000, 64, 2048, 256, SFI_GPU_F32},
    {1, 8, 4, 128, 131072, 64, 2048, 256, SFI_GPU_BF16},
    /* a group of 16 with |J| past the Selector cluster kernel's 16K: its
     * one-CTA kernel, two passes of 8 window rows */
    {1, 1, 16, 128, 20000, 64, 1024, 256, SFI_GPU_BF16},
    /* groups of 16 (Qwen3-235B-A22B at --tp 4: one KV head a GPU; head
     * slices of 8), 5 (Qwen3-14B; its own instance), 12 (3 slices of 4),
     * 6 at head_dim 64 (2 of 3); these run under --quick too
     * (N_QUICK_TAIL) */
    {2, 1, 16, 128, 5000, 64, 256, 256, SFI_GPU_F32},
    {2, 2, 5, 128, 3000, 32, 128, 128, SFI_GPU_F32},
    {2, 2, 16, 128, 9000, 64, 512, 256, SFI_GPU_BF16},
    {3, 2, 5, 64, 6000, 64, 256, 256, SFI_GPU_BF16},
    {1, 2, 12, 128, 4000, 64, 256, 128, SFI_GPU_F32},
    {2, 3, 6, 64, 2500, 16, 64, 64, SFI_GPU_F32},
};
#define N_QUICK 6
/* the last N_QUICK_TAIL cases run under --quick too */
#define N_QUICK_TAIL 6
#define N_SINK 4

static uint64_t g_rng;
static float urand(void) /* [-1, 1) */
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0);
}

static uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static void *xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "sfi-gpu check: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static void *dmalloc(size_t n)
{
    void *p;
    CK(cudaMalloc(&p, n ? n : 16));
    CK(cudaMemset(p, 0, n ? n : 16));
    return p;
}

/* The method's defaults with the case's K. */
static void set_params(sfi_params *p, int K)
{
    sfi_params_default(p);
    p->n_sink = N_SINK;
    p->K = K;
}

/* Worst violation of |g - r| <= atol + rtol*|r| as a ratio (<= 1 passes). */
static double tol_ratio(const float *g, const float *r, size_t n, double atol, double rtol,
                        double *max_abs)
{
    double worst = 0, ma = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)g[i] - (double)r[i]);
        if (!(e == e) || isinf(g[i]) != isinf(r[i]))
            return INFINITY;
        double t = atol + rtol * fabs((double)r[i]);
        double q = t > 0 ? e / t : (e > 0 ? INFINITY : 0);
        if (q > worst)
            worst = q;
        if (e > ma)
            ma = e;
    }
    if (max_abs)
        *max_abs = ma;
    return worst;
}

/* Worst of |g - r| / (atol + rtol*|r| + 2*|r - x|): like tol_ratio, but
 * the reference's own float32 rounding error, measured against x (an
 * oracle: float64, or for the Selector the same float formulas with
 * float64 sums), is allowed on top. The
 * reference sums in one float accumulator in ascending order, so at long
 * contexts small terms added to a large sum are partly rounded away; the
 * GPU's split sums are closer to the exact value, and a bound that
 * ignored this would blame the GPU for the reference's error. */
static double tol_ratio_x(const float *g, const float *r, const double *x, size_t n, double atol,
                          double rtol, double *ref_err)
{
    double worst = 0, re = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)g[i] - (double)r[i]);
        if (!(e == e))
            return INFINITY;
        double rx = fabs((double)r[i] - x[i]);
        if (rx > re)
            re = rx;
        double t = atol + rtol * fabs((double)r[i]) + 2 * rx;
        double q = t > 0 ? e / t : (e > 0 ? INFINITY : 0);
        if (q > worst)
            worst = q;
    }
    if (ref_err)
        *ref_err = re;
    return worst;
}

/* Float64 dense attention of one request (the oracle behind tol_ratio_x).
 * pos == NULL: positions 0..n-1; else the n positions listed per KV head. */
static void attn_f64(int H, int HK, int D, const float *q, const float *k, const float *v, int n,
                     const int32_t *const *pos, double *out)
{
    const int G = H / HK;
    const size_t row = (size_t)HK * D;
    double *lg = malloc((size_t)n * sizeof *lg);
    if (!lg) {
        fprintf(stderr, "sfi-gpu check: out of memory\n");
        exit(1);
    }
    const double sc = 1.0 / sqrt((double)D);
    for (int h = 0; h < H; h++) {
        const int kvh = h / G;
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < n; i++) {
            size_t j = pos ? (size_t)pos[kvh][i] : (size_t)i;
            const float *kr = k + j * row + (size_t)kvh * D;
            double a = 0;
            for (int x = 0; x < D; x++)
                a += (double)q[(size_t)h * D + x] * kr[x];
            lg[i] = a * sc;
            if (lg[i] > mx)
                mx = lg[i];
        }
        for (int i = 0; i < n; i++)
            sum += lg[i] = exp(lg[i] - mx);
        for (int x = 0; x < D; x++)
            out[(size_t)h * D + x] = 0;
        for (int i = 0; i < n; i++) {
            size_t j = pos ? (size_t)pos[kvh][i] : (size_t)i;
            const float *vr = v + j * row + (size_t)kvh * D;
            for (int x = 0; x < D; x++)
                out[(size_t)h * D + x] += lg[i] / sum * vr[x];
        }
    }
    free(lg);
}

/* The Selector's oracle: the reference's float32 formulas element by
 * element (its own sfi_expf/sfi_logf/sfi_powf_pos, in its order), but every
 * sum over J accumulated in float64 and rounded once. Summation order is
 * the only freedom the GPU's fast path takes, so this is what both sides
 * approximate: the reference with one float accumulator over up to 128K
 * terms, the GPU with parallel partial sums. Outputs s[HK][nJ], lam[HK],
 * z (after step 8) [HK][nJ], as doubles of the float results. */
static void selector_f64(const sfi_params *prm, int HK, int nwin, int n_pos, int j0, int nJ,
                         const float *logits, const float *norms, double *s, double *lam, double *z)
{
    const float eps = prm->eps, a = prm->alpha;
    float *f = malloc((size_t)nJ * 4), *r = malloc((size_t)nJ * 4), *mu = malloc((size_t)nJ * 4);
    float *e = malloc((size_t)nJ * 4), *zl = malloc((size_t)HK * nJ * 4);
    float *zn = malloc((size_t)HK * nJ * 4);
    if (!f || !r || !mu || !e || !zl || !zn) {
        fprintf(stderr, "sfi-gpu check: out of memory\n");
        exit(1);
    }
    for (int h = 0; h < HK; h++) {
        for (int i = 0; i < nJ; i++)
            mu[i] = 0.0f;
        for (int w = 0; w < nwin; w++) {
            const float *l = logits + ((size_t)h * nwin + w) * n_pos + j0;
            float mx = sfi_max(l, (size_t)nJ);
            double S = 0;
            for (int i = 0; i < nJ; i++)
                S += e[i] = sfi_expf(l[i] - mx);
            const float Sf = (float)S;
            for (int i = 0; i < nJ; i++) {
                float p = e[i] / Sf;
                if (nwin == 1)
                    f[i] = p;
                else
                    mu[i] += sfi_powf_pos(p, a);
            }
        }
        if (nwin > 1) {
            const float fw = (float)nwin, inv_a = 1.0f / a;
            double Gs = 0;
            for (int i = 0; i < nJ; i++)
                Gs += f[i] = sfi_powf_pos(mu[i] / fw, inv_a);
            for (int i = 0; i < nJ; i++)
                f[i] = f[i] / (float)Gs;
        }
        const float *kn = norms + (size_t)h * n_pos + j0;
        const float span = (float)(nJ - 1) + eps;
        double Sr = 0;
        for (int i = 0; i < nJ; i++) {
            float pk = sfi_powf_pos(kn[i] + eps, -prm->gamma);
            float u = (float)i / span;
            float pp = sfi_expf(-prm->beta * sfi_powf_pos(u, prm->p)) *
                       sfi_powf_pos((1.0f - u) + eps, prm->eta);
            Sr += r[i] = pk * pp;
        }
        double num = 0, den = 0;
        for (int i = 0; i < nJ; i++) {
            r[i] = r[i] / (float)Sr;
            float dd = f[i] - r[i];
            num += (double)f[i] * dd;
            den += (double)dd * dd;
        }
        float L = 0.0f;
        if (den != 0) {
            L = (float)(num / den);
            if (!(L > 0.0f))
                L = 0.0f;
            if (L > prm->lambda_clip)
                L = prm->lambda_clip;
        }
        lam[h] = L;
        const float om = 1.0f - L;
        for (int i = 0; i < nJ; i++) {
            float si = om * f[i] + L * r[i];
            s[(size_t)h * nJ + i] = si;
            zl[(size_t)h * nJ + i] = sfi_logf(si + eps);
        }
        const float *zh = zl + (size_t)h * nJ;
        for (int i = 0; i < nJ; i++) {
            int lo = i - prm->nms_radius < 0 ? 0 : i - prm->nms_radius;
            int hi = i + prm->nms_radius > nJ - 1 ? nJ - 1 : i + prm->nms_radius;
            float m = zh[lo];
            for (int t = lo + 1; t <= hi; t++)
                m = zh[t] > m ? zh[t] : m;
            zn[(size_t)h * nJ + i] = zh[i] - prm->alpha_soft * (m - zh[i]);
        }
    }
    for (int i = 0; i < nJ; i++) {
        float col[64];
        for (int h = 0; h < HK; h++)
            col[h] = zn[(size_t)h * nJ + i] / prm->T;
        sfi_softmax(col, (size_t)HK);
        for (int h = 0; h < HK; h++) {
            float qh = col[h] > eps ? col[h] : eps;
            z[(size_t)h * nJ + i] = zn[(size_t)h * nJ + i] + prm->alpha_cross * sfi_logf(qh);
        }
    }
    free(f);
    free(r);
    free(mu);
    free(e);
    free(zl);
    free(zn);
}

static int g_fail, g_checks;

static void report(int ci, const char *what, int ok, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#include <stdarg.h>
static void report(int ci, const char *what, int ok, const char *fmt, ...)
{
    va_list ap;
    g_checks++;
    if (!ok)
        g_fail++;
    printf("  case %d %-18s %s  ", ci, what, ok ? "ok      " : "MISMATCH");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
}

/* One kernel case: its shape, the host data in the reference layout, the
 * paged device copy, the reference's (and the float64 oracle's) results
 * and the buffers the checks share. Phases fill it in order; the random
 * stream (urand) is drawn in that order too, so a seed gives the same
 * inputs. */
typedef struct {
    const tcase *c;
    int ci, B, HK, G, H, D, P, bf, esz, maxctx, maxJ, max_nb;
    int ctx[SFI_GPU_MAX_BATCH], kout[SFI_GPU_MAX_BATCH];
    size_t row; /* floats per position: HK * D */
    /* host inputs */
    float **k, **v, *q;
    int32_t *bt, *perm;
    unsigned char *hk, *hv;
    /* device inputs */
    void *d_k, *d_v;
    int32_t *d_bt;
    float *d_q;
    sfi_gpu_step_desc h, *d_desc;
    sfi_gpu_attn_ws aws;
    void *aws_mem;
    /* reference results; x_*: the float64 oracle's */
    sfi_params prm;
    float *r_out, *r_lg, *norms, *r_lam, *r_s, *r_z, *r_sp;
    int32_t *r_sel;
    double *x_out, *x_sp, *x_s, *x_lam, *x_z;
    /* device results and their host copies */
    float *d_out, *d_lg, *g_out, *g_lg, *d_rlg, *d_norm, *d_s, *g_s, *g_lam;
    int32_t *d_sel, *g_sel, *d_cpos, *g_cpos, *idx_mem;
    sfi_gpu_sel_ws sws;
    void *sws_mem, *d_ck, *d_cv;
} kcase;

/* Context lengths (each request 13 shorter than the one before) and the
 * sizes that follow from them. */
static void case_geometry(kcase *s)
{
    const tcase *c = s->c;
    s->B = c->batch;
    s->HK = c->n_kv;
    s->G = c->G;
    s->H = s->HK * s->G;
    s->D = c->D;
    s->P = c->page;
    s->bf = c->dtype == SFI_GPU_BF16;
    s->esz = s->bf ? 2 : 4;
    s->row = (size_t)s->HK * s->D;
    for (int b = 0; b < s->B; b++) {
        s->ctx[b] = c->ctx - b * 13;
        if (s->ctx[b] > s->maxctx)
            s->maxctx = s->ctx[b];
        int nJ = s->ctx[b] - N_SINK - c->n_recent;
        if (nJ > s->maxJ)
            s->maxJ = nJ;
        int nb = (s->ctx[b] + s->P - 1) / s->P;
        if (nb > s->max_nb)
            s->max_nb = nb;
    }
}

/* Host data, reference layout: K and V uniform in [-1, 1) (a few keys 4x
 * larger, so that the key-norm prior and the logits vary; bf16 cases
 * rounded once), queries in [-4, 4). */
static void make_host_data(kcase *s)
{
    const int B = s->B, H = s->H, D = s->D, bf = s->bf;
    const size_t row = s->row;
    float **k = s->k = xmalloc(B * sizeof *k), **v = s->v = xmalloc(B * sizeof *v);
    float *q = s->q = xmalloc((size_t)B * H * D * 4);
    for (int b = 0; b < B; b++) {
        k[b] = xmalloc((size_t)s->ctx[b] * row * 4);
        v[b] = xmalloc((size_t)s->ctx[b] * row * 4);
        for (size_t i = 0; i < (size_t)s->ctx[b] * row; i++) {
            float a = urand(), e = urand();
            if ((i / D) % 97 == 5)
                a *= 4.0f;
            k[b][i] = bf ? from_bf16(to_bf16(a)) : a;
            v[b][i] = bf ? from_bf16(to_bf16(e)) : e;
        }
    }
    for (size_t i = 0; i < (size_t)B * H * D; i++)
        q[i] = 4.0f * urand();
}

/* Writes request b's K and V into the host pool's blocks (s->bt). */
static void fill_pool(kcase *s, int b)
{
    const int HK = s->HK, P = s->P, D = s->D, max_nb = s->max_nb;
    const size_t row = s->row;
    for (int p = 0; p < s->ctx[b]; p++)
        for (int h = 0; h < HK; h++) {
            size_t dst = (((size_t)s->bt[(size_t)b * max_nb + p / P] * HK + h) * P + p % P) * D;
            for (int x = 0; x < D; x++) {
                float kv = s->k[b][(size_t)p * row + (size_t)h * D + x];
                float vv = s->v[b][(size_t)p * row + (size_t)h * D + x];
                if (s->bf) {
                    uint16_t a = to_bf16(kv), e = to_bf16(vv);
                    memcpy(s->hk + (dst + x) * 2, &a, 2);
                    memcpy(s->hv + (dst + x) * 2, &e, 2);
                } else {
                    memcpy(s->hk + (dst + x) * 4, &kv, 4);
                    memcpy(s->hv + (dst + x) * 4, &vv, 4);
                }
            }
        }
}

/* Paged device cache: shuffled blocks, unused rows NaN (a kernel reading
 * past a request's end poisons its output); the queries. */
static void make_paged_cache(kcase *s)
{
    const int B = s->B, H = s->H, D = s->D, esz = s->esz, max_nb = s->max_nb;
    int total_blocks = 0, nbk[SFI_GPU_MAX_BATCH];
    for (int b = 0; b < B; b++)
        total_blocks += nbk[b] = (s->ctx[b] + s->P - 1) / s->P;
    s->bt = xmalloc((size_t)B * max_nb * 4);
    int32_t *perm = s->perm = xmalloc((size_t)total_blocks * 4);
    for (int i = 0; i < total_blocks; i++)
        perm[i] = i;
    for (int i = total_blocks - 1; i > 0; i--) {
        int j = (int)((urand() * 0.5f + 0.5f) * (i + 1));
        if (j > i)
            j = i;
        int32_t x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    const size_t blk_elems = (size_t)s->HK * s->P * D,
                 pool_elems = (size_t)total_blocks * blk_elems;
    s->hk = xmalloc(pool_elems * esz);
    s->hv = xmalloc(pool_elems * esz);
    memset(s->hk, 0xff, pool_elems * esz); /* NaN in both f32 and bf16 */
    memset(s->hv, 0xff, pool_elems * esz);
    for (int b = 0, nxt = 0; b < B; b++) {
        for (int i = 0; i < nbk[b]; i++)
            s->bt[(size_t)b * max_nb + i] = perm[nxt++];
        fill_pool(s, b);
    }
    s->d_k = dmalloc(pool_elems * esz);
    s->d_v = dmalloc(pool_elems * esz);
    CK(cudaMemcpy(s->d_k, s->hk, pool_elems * esz, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s->d_v, s->hv, pool_elems * esz, cudaMemcpyHostToDevice));
    s->d_bt = dmalloc((size_t)B * max_nb * 4);
    CK(cudaMemcpy(s->d_bt, s->bt, (size_t)B * max_nb * 4, cudaMemcpyHostToDevice));
    s->d_q = dmalloc((size_t)B * H * D * 4);
    CK(cudaMemcpy(s->d_q, s->q, (size_t)B * H * D * 4, cudaMemcpyHostToDevice));
}

/* The step descriptor (K capped at each request's |J|: kout) on host and
 * device, and the attention workspace. */
static void make_step_desc(kcase *s)
{
    const tcase *c = s->c;
    sfi_gpu_step_desc *h = &s->h;
    memset(h, 0, sizeof *h);
    h->batch = s->B;
    h->n_heads = s->H;
    h->n_kv = s->HK;
    h->head_dim = s->D;
    h->page = s->P;
    h->max_blocks = s->max_nb;
    h->ld_logits = s->maxctx;
    h->compact_cap = N_SINK + c->K;
    h->n_sink = N_SINK;
    h->K = c->K;
    h->max_ctx = s->maxctx;
    h->max_J = s->maxJ;
    h->block_table = s->d_bt;
    for (int b = 0; b < s->B; b++) {
        h->req[b].ctx_len = s->ctx[b];
        h->req[b].recent_begin = s->ctx[b] - c->n_recent;
        h->req[b].j_begin = N_SINK;
        h->req[b].j_end = s->ctx[b] - c->n_recent;
        int nJ = h->req[b].j_end - h->req[b].j_begin;
        s->kout[b] = c->K < nJ ? c->K : nJ;
        h->req[b].n_compact = N_SINK + s->kout[b];
    }
    s->d_desc = dmalloc(sizeof *h);
    CK(cudaMemcpy(s->d_desc, h, sizeof *h, cudaMemcpyHostToDevice));
    s->aws_mem = dmalloc(sfi_gpu_attn_ws_bytes(s->B, s->H, s->D));
    sfi_gpu_attn_ws_carve(&s->aws, s->aws_mem, s->B, s->H, s->D);
    CK(sfi_gpu_attn_ws_init(&s->aws, 0));
}

/* Request b's Selector: the reference's sets, lambda*, s and z, the
 * oracle's s, lambda* and z, into rows of maxJ (sets: rows of K). */
static void reference_selector(kcase *s, int b)
{
    const tcase *c = s->c;
    const int H = s->H, HK = s->HK, G = s->G, maxctx = s->maxctx, maxJ = s->maxJ;
    sfi_error err;
    sfi_selector_input in = {.n_kv_heads = HK,
                             .n_win = G,
                             .n_pos = maxctx,
                             .j_begin = s->h.req[b].j_begin,
                             .j_end = s->h.req[b].j_end,
                             .logits = s->r_lg + (size_t)b * H * maxctx,
                             .key_norms = s->norms + (size_t)b * HK * maxctx};
    const int nJ = in.j_end - in.j_begin;
    float *s_tmp = xmalloc((size_t)HK * nJ * 4), *z_tmp = xmalloc((size_t)HK * nJ * 4);
    sfi_selector_detail det = {.lambda = s->r_lam + (size_t)b * HK, .s = s_tmp, .z_cross = z_tmp};
    double *xs = xmalloc((size_t)HK * nJ * 8), *xz = xmalloc((size_t)HK * nJ * 8);
    selector_f64(&s->prm, HK, G, maxctx, in.j_begin, nJ, in.logits, in.key_norms, xs,
                 s->x_lam + (size_t)b * HK, xz);
    for (int hh = 0; hh < HK; hh++) {
        memcpy(s->x_s + ((size_t)b * HK + hh) * maxJ, xs + (size_t)hh * nJ, (size_t)nJ * 8);
        memcpy(s->x_z + ((size_t)b * HK + hh) * maxJ, xz + (size_t)hh * nJ, (size_t)nJ * 8);
    }
    free(xs);
    free(xz);
    int nsel;
    int32_t *r_sel = s->r_sel;
    if (sfi_selector_run(&s->prm, &in, r_sel + (size_t)b * HK * c->K, &nsel, &det, &err) !=
        SFI_OK) {
        fprintf(stderr, "sfi-gpu check: reference selector: %s\n", err.msg);
        exit(1);
    }
    /* reference writes [h][K_out]; repack to the GPU's [h][K] rows */
    if (nsel != c->K)
        for (int hh = HK - 1; hh >= 0; hh--)
            memmove(r_sel + ((size_t)b * HK + hh) * c->K,
                    r_sel + (size_t)b * HK * c->K + (size_t)hh * nsel, (size_t)nsel * 4);
    for (int hh = 0; hh < HK; hh++) {
        memcpy(s->r_s + ((size_t)b * HK + hh) * maxJ, s_tmp + (size_t)hh * nJ, (size_t)nJ * 4);
        memcpy(s->r_z + ((size_t)b * HK + hh) * maxJ, z_tmp + (size_t)hh * nJ, (size_t)nJ * 4);
    }
    free(s_tmp);
    free(z_tmp);
}

/* The reference (and oracle) side: dense output and logits, key norms,
 * Selector, request by request. */
static void reference(kcase *s)
{
    const int B = s->B, H = s->H, HK = s->HK, D = s->D, maxctx = s->maxctx, maxJ = s->maxJ;
    const size_t row = s->row;
    const sfi_attn_shape shp = {H, HK, D};
    sfi_error err;
    s->r_out = xmalloc((size_t)B * H * D * 4);
    s->r_lg = xmalloc((size_t)B * H * maxctx * 4);
    s->norms = xmalloc((size_t)B * HK * maxctx * 4);
    set_params(&s->prm, s->c->K);
    s->r_sel = xmalloc((size_t)B * HK * s->c->K * 4);
    s->r_lam = xmalloc((size_t)B * HK * 4);
    s->r_s = xmalloc((size_t)B * HK * maxJ * 4);
    float *tmp_lg = xmalloc((size_t)H * maxctx * 4);
    s->x_out = xmalloc((size_t)B * H * D * 8);
    s->x_sp = xmalloc((size_t)B * H * D * 8);
    s->x_s = xmalloc((size_t)B * HK * maxJ * 8);
    s->x_lam = xmalloc((size_t)B * HK * 8);
    s->x_z = xmalloc((size_t)B * HK * maxJ * 8);
    s->r_z = xmalloc((size_t)B * HK * maxJ * 4);
    for (int b = 0; b < B; b++) {
        const float *qb = s->q + (size_t)b * H * D;
        attn_f64(H, HK, D, qb, s->k[b], s->v[b], s->ctx[b], NULL, s->x_out + (size_t)b * H * D);
        if (sfi_attn_dense_decode(&shp, qb, s->k[b], s->v[b], s->ctx[b],
                                  s->r_out + (size_t)b * H * D, tmp_lg, &err) != SFI_OK) {
            fprintf(stderr, "sfi-gpu check: reference dense: %s\n", err.msg);
            exit(1);
        }
        for (int hh = 0; hh < H; hh++)
            memcpy(s->r_lg + ((size_t)b * H + hh) * maxctx, tmp_lg + (size_t)hh * s->ctx[b],
                   (size_t)s->ctx[b] * 4);
        for (int hh = 0; hh < HK; hh++)
            for (int p = 0; p < s->ctx[b]; p++) {
                const float *kr = s->k[b] + (size_t)p * row + (size_t)hh * D;
                s->norms[((size_t)b * HK + hh) * maxctx + p] =
                    sfi_sqrtf(sfi_dot(kr, kr, (size_t)D));
            }
        reference_selector(s, b);
    }
    free(tmp_lg);
}

/* Request b's logits (g_lg, every head, its ctx[b] positions) against the
 * reference's: the worst ratio to the tolerance 1e-5 (1 + |l_ref|). */
static double logits_ratio(const kcase *s, int b)
{
    double worst = 0;
    for (int hh = 0; hh < s->H; hh++) {
        const size_t o = ((size_t)b * s->H + hh) * s->maxctx;
        const double w = tol_ratio(s->g_lg + o, s->r_lg + o, (size_t)s->ctx[b], 1e-5, 1e-5, NULL);
        if (w > worst)
            worst = w;
    }
    return worst;
}

/* A. dense output and logits. */
static void check_dense(kcase *s)
{
    const int B = s->B, H = s->H, D = s->D, maxctx = s->maxctx, ci = s->ci;
    s->d_out = dmalloc((size_t)B * H * D * 4);
    s->d_lg = dmalloc((size_t)B * H * maxctx * 4);
    s->g_out = xmalloc((size_t)B * H * D * 4);
    s->g_lg = xmalloc((size_t)B * H * maxctx * 4);
    CK(sfi_gpu_attn_dense(&s->h, s->d_desc, s->c->dtype, s->d_q, s->d_k, s->d_v, s->d_out, s->d_lg,
                          &s->aws, 0, 0));
    CK(cudaMemcpy(s->g_out, s->d_out, (size_t)B * H * D * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(s->g_lg, s->d_lg, (size_t)B * H * maxctx * 4, cudaMemcpyDeviceToHost));
    double ma, worst;
    /* max|v| = 1 by construction (uniform in [-1, 1)) */
    double rerr = 0;
    worst = tol_ratio_x(s->g_out, s->r_out, s->x_out, (size_t)B * H * D, 2e-5, 1e-5, &rerr);
    tol_ratio(s->g_out, s->r_out, (size_t)B * H * D, 2e-5, 1e-5, &ma);
    report(ci, "dense output", worst <= 1,
           "max |gpu-ref| %.3g, %.3g of tolerance (ref vs f64 %.3g)", ma, worst, rerr);
    worst = 0;
    for (int b = 0; b < B; b++) {
        const double w = logits_ratio(s, b);
        if (w > worst)
            worst = w;
    }
    report(ci, "dense logits", worst <= 1, "%.3g of tolerance", worst);
}

/* Top-K: identical sets required. If they differ (fast mode only), every
 * swapped position must sit within the score errors of the K-th score:
 * |z_ref(j) - z_ref(K-th)| <= 2 (d_ref + d_gpu), d = max distance of each
 * side's final scores from the float64 oracle's. That is reported as
 * "equivalent", never silently. */
static void check_topk_sets(const kcase *s, const float *g_z, int exact, const char *tag)
{
    const int B = s->B, HK = s->HK, K = s->c->K, maxJ = s->maxJ;
    const int32_t *g_sel = s->g_sel, *r_sel = s->r_sel;
    const float *r_z = s->r_z;
    const double *x_z = s->x_z;
    const int *kout = s->kout;
    char name[40];
    int identical = 1, equivalent = 1, swaps = 0;
    double d_ref_max = 0, d_gpu_max = 0;
    for (int b = 0; b < B; b++)
        for (int hh = 0; hh < HK; hh++) {
            size_t o = ((size_t)b * HK + hh) * K, oz = ((size_t)b * HK + hh) * maxJ;
            const int nJ = s->h.req[b].j_end - s->h.req[b].j_begin, j0 = s->h.req[b].j_begin;
            double dr = 0, dg = 0;
            for (int i = 0; i < nJ; i++) {
                double e1 = fabs(r_z[oz + i] - x_z[oz + i]), e2 = fabs(g_z[oz + i] - x_z[oz + i]);
                dr = e1 > dr ? e1 : dr;
                dg = e2 > dg ? e2 : dg;
            }
            d_ref_max = dr > d_ref_max ? dr : d_ref_max;
            d_gpu_max = dg > d_gpu_max ? dg : d_gpu_max;
            if (!memcmp(g_sel + o, r_sel + o, (size_t)kout[b] * 4))
                continue;
            identical = 0;
            float thr = INFINITY;
            for (int i = 0; i < kout[b]; i++)
                thr = r_z[oz + r_sel[o + i] - j0] < thr ? r_z[oz + r_sel[o + i] - j0] : thr;
            /* symmetric difference of two ascending lists */
            int a1 = 0, a2 = 0;
            while (a1 < kout[b] || a2 < kout[b]) {
                int32_t x1 = a1 < kout[b] ? g_sel[o + a1] : INT32_MAX;
                int32_t x2 = a2 < kout[b] ? r_sel[o + a2] : INT32_MAX;
                int32_t jj;
                if (x1 == x2) {
                    a1++;
                    a2++;
                    continue;
                }
                if (x1 < x2) {
                    jj = x1;
                    a1++;
                } else {
                    jj = x2;
                    a2++;
                }
                swaps++;
                if (fabs((double)r_z[oz + jj - j0] - thr) > 2 * (dr + dg))
                    equivalent = 0;
            }
        }
    snprintf(name, sizeof name, "top-k sets%s", tag);
    if (identical)
        report(s->ci, name, 1,
               "identical (%d per head); final-score error vs oracle: ref %.3g, gpu %.3g", kout[0],
               d_ref_max, d_gpu_max);
    else
        report(s->ci, name, !exact && equivalent,
               "%s: %d positions swapped at the K-th score, within the score errors vs the oracle "
               "(ref %.3g, gpu %.3g)",
               equivalent ? "EQUIVALENT, not identical" : "DIFFERENT", swaps / 2, d_ref_max,
               d_gpu_max);
}

/* lambda* and s against the reference: within 1e-6 relative plus the
 * reference's own error (fast), bit for bit (exact). */
static void check_lambda_s(const kcase *s, int exact, const char *tag)
{
    const int B = s->B, HK = s->HK, maxJ = s->maxJ, ci = s->ci;
    const float *g_lam = s->g_lam, *r_lam = s->r_lam, *g_s = s->g_s, *r_s = s->r_s;
    const double *x_lam = s->x_lam, *x_s = s->x_s;
    char name[40];
    double lw = 0, sw = 0, lre = 0, sre = 0, sgx = 0;
    float w_g = 0, w_r = 0;
    double w_x = 0;
    int lbits = 1, sbits = 1;
    for (int i = 0; i < B * HK; i++) {
        double re = 0;
        double w = tol_ratio_x(g_lam + i, r_lam + i, x_lam + i, 1, 1e-30, 1e-6, &re);
        lw = w > lw ? w : lw;
        lre = re > lre ? re : lre;
        lbits &= !memcmp(g_lam + i, r_lam + i, 4);
    }
    for (int b = 0; b < B; b++)
        for (int hh = 0; hh < HK; hh++) {
            size_t o = ((size_t)b * HK + hh) * maxJ;
            int nJ = s->h.req[b].j_end - s->h.req[b].j_begin;
            double re = 0;
            double w = tol_ratio_x(g_s + o, r_s + o, x_s + o, (size_t)nJ, 1e-30, 1e-6, &re);
            sw = w > sw ? w : sw;
            for (int i = 0; i < nJ; i++) {
                double e = fabs(g_s[o + i] - x_s[o + i]) / fabs(x_s[o + i]);
                if (e > sgx) {
                    sgx = e;
                    w_g = g_s[o + i];
                    w_r = r_s[o + i];
                    w_x = x_s[o + i];
                }
            }
            sre = re > sre ? re : sre;
            sbits &= !memcmp(g_s + o, r_s + o, (size_t)nJ * 4);
        }
    snprintf(name, sizeof name, "lambda*%s", tag);
    if (exact)
        report(ci, name, lbits, "%s (e.g. %.9g)", lbits ? "bit-identical" : "bits differ",
               (double)g_lam[0]);
    else
        report(ci, name, lw <= 1, "%.3g of 1e-6 rel + ref error (e.g. %.9g; ref vs oracle %.3g)",
               lw, (double)g_lam[0], lre);
    snprintf(name, sizeof name, "s%s", tag);
    if (exact)
        report(ci, name, sbits, "%s", sbits ? "bit-identical" : "bits differ");
    else
        report(ci, name, sw <= 1,
               "%.3g of 1e-6 rel + ref error (ref vs oracle max %.3g; gpu vs oracle max rel %.3g: "
               "gpu %.9g ref %.9g oracle %.9g)",
               sw, sre, sgx, (double)w_g, (double)w_r, w_x);
}

/* B. the Selector on the reference's logits and norms, fast and (with
 * --bit-exact on f32 cases) exact. */
static void check_selector(kcase *s, int bit_exact)
{
    const int B = s->B, H = s->H, HK = s->HK, K = s->c->K, maxctx = s->maxctx, maxJ = s->maxJ;
    const sfi_params *prm = &s->prm;
    s->d_rlg = dmalloc((size_t)B * H * maxctx * 4);
    s->d_norm = dmalloc((size_t)B * HK * maxctx * 4);
    CK(cudaMemcpy(s->d_rlg, s->r_lg, (size_t)B * H * maxctx * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s->d_norm, s->norms, (size_t)B * HK * maxctx * 4, cudaMemcpyHostToDevice));
    s->sws_mem = dmalloc(sfi_gpu_sel_ws_bytes(B, HK, maxJ));
    sfi_gpu_sel_ws_carve(&s->sws, s->sws_mem, B, HK, maxJ);
    s->d_s = dmalloc((size_t)B * HK * maxJ * 4);
    s->d_sel = dmalloc((size_t)B * HK * K * 4);
    sfi_gpu_sel_params gp = {prm->alpha,       prm->gamma,       prm->beta,       prm->p,
                             prm->eta,         prm->lambda_clip, prm->alpha_soft, prm->T,
                             prm->alpha_cross, prm->eps,         prm->nms_radius};
    s->g_sel = xmalloc((size_t)B * HK * K * 4);
    s->g_s = xmalloc((size_t)B * HK * maxJ * 4);
    s->g_lam = xmalloc((size_t)B * HK * 4);
    for (int exact = 0; exact <= (bit_exact && !s->bf); exact++) {
        const char *tag = exact ? " (exact)" : "";
        CK(sfi_gpu_selector(&s->h, s->d_desc, &gp, s->d_rlg, s->d_norm, &s->sws, s->d_s, s->d_sel,
                            exact, 0));
        CK(cudaMemcpy(s->g_sel, s->d_sel, (size_t)B * HK * K * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(s->g_s, s->d_s, (size_t)B * HK * maxJ * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(s->g_lam, s->sws.lambda, (size_t)B * HK * 4, cudaMemcpyDeviceToHost));
        float *g_z = xmalloc((size_t)B * HK * maxJ * 4);
        CK(cudaMemcpy(g_z, s->sws.z1, (size_t)B * HK * maxJ * 4, cudaMemcpyDeviceToHost));
        check_topk_sets(s, g_z, exact, tag);
        free(g_z);
        check_lambda_s(s, exact, tag);
    }
}

/* Request b's reference sparse attention (and the oracle's) on sink +
 * the reference's selected + recent; pos_ok is cleared when the reorg's
 * row positions differ from sink + selected. */
static void reference_sparse(kcase *s, int b, int *pos_ok)
{
    const tcase *c = s->c;
    const int H = s->H, HK = s->HK, D = s->D;
    const sfi_attn_shape shp = {H, HK, D};
    sfi_error err;
    const int32_t *idx[64];
    int nidx[64];
    for (int hh = 0; hh < HK; hh++) {
        int32_t *ix = s->idx_mem + (size_t)hh * (N_SINK + c->K + c->n_recent);
        int n = 0;
        for (int i = 0; i < N_SINK; i++)
            ix[n++] = i;
        for (int i = 0; i < s->kout[b]; i++)
            ix[n++] = s->r_sel[((size_t)b * HK + hh) * c->K + i];
        for (int i = 0; i < n; i++)
            if (s->g_cpos[((size_t)b * HK + hh) * s->h.compact_cap + i] != ix[i])
                *pos_ok = 0;
        for (int p = s->h.req[b].recent_begin; p < s->ctx[b]; p++)
            ix[n++] = p;
        idx[hh] = ix;
        nidx[hh] = n;
    }
    const float *qb = s->q + (size_t)b * H * D;
    if (sfi_attn_sparse_decode(&shp, qb, s->k[b], s->v[b], s->ctx[b], idx, nidx,
                               s->r_sp + (size_t)b * H * D, &err) != SFI_OK) {
        fprintf(stderr, "sfi-gpu check: reference sparse: %s\n", err.msg);
        exit(1);
    }
    attn_f64(H, HK, D, qb, s->k[b], s->v[b], nidx[0], idx, s->x_sp + (size_t)b * H * D);
}

/* C. reorg + two-segment sparse attention on the reference's sets. */
static void check_sparse(kcase *s)
{
    const tcase *c = s->c;
    const int B = s->B, H = s->H, HK = s->HK, D = s->D, esz = s->esz, cap = s->h.compact_cap;
    s->d_ck = dmalloc((size_t)B * HK * cap * D * esz);
    s->d_cv = dmalloc((size_t)B * HK * cap * D * esz);
    s->d_cpos = dmalloc((size_t)B * HK * cap * 4);
    CK(cudaMemcpy(s->d_sel, s->r_sel, (size_t)B * HK * c->K * 4, cudaMemcpyHostToDevice));
    CK(sfi_gpu_reorg(&s->h, s->d_desc, c->dtype, s->d_k, s->d_v, s->d_sel, s->d_ck, s->d_cv,
                     s->d_cpos, 0));
    s->g_cpos = xmalloc((size_t)B * HK * cap * 4);
    CK(cudaMemcpy(s->g_cpos, s->d_cpos, (size_t)B * HK * cap * 4, cudaMemcpyDeviceToHost));
    int pos_ok = 1;
    s->r_sp = xmalloc((size_t)B * H * D * 4);
    s->idx_mem = xmalloc((size_t)HK * (N_SINK + c->K + c->n_recent) * 4);
    for (int b = 0; b < B; b++)
        reference_sparse(s, b, &pos_ok);
    report(s->ci, "reorg rows", pos_ok, "sink + selected positions %s",
           pos_ok ? "in order" : "WRONG");
    CK(sfi_gpu_attn_sparse(&s->h, s->d_desc, c->dtype, s->d_q, s->d_k, s->d_v, s->d_ck, s->d_cv,
                           s->d_cpos, s->d_out, &s->aws, 0, 0));
    CK(cudaMemcpy(s->g_out, s->d_out, (size_t)B * H * D * 4, cudaMemcpyDeviceToHost));
    double ma, rerr = 0;
    double worst = tol_ratio_x(s->g_out, s->r_sp, s->x_sp, (size_t)B * H * D, 2e-5, 1e-5, &rerr);
    tol_ratio(s->g_out, s->r_sp, (size_t)B * H * D, 2e-5, 1e-5, &ma);
    report(s->ci, "sparse output", worst <= 1,
           "max |gpu-ref| %.3g, %.3g of tolerance (ref vs f64 %.3g)", ma, worst, rerr);
}

/* F. mixed mode, as the engine's SFI steps run it (each request dense or
 * fast on its own): even requests fast (the compact + recent rows of C),
 * odd ones dense with their logits. */
static void check_mixed(kcase *s)
{
    const int B = s->B, H = s->H, D = s->D, maxctx = s->maxctx, ci = s->ci;
    sfi_gpu_step_desc hm = s->h;
    for (int b = 0; b < B; b++)
        hm.req[b].flags = b % 2 == 0 ? SFI_GPU_REQ_SPARSE : 0;
    sfi_gpu_step_desc *d_hm = dmalloc(sizeof hm);
    CK(cudaMemcpy(d_hm, &hm, sizeof hm, cudaMemcpyHostToDevice));
    CK(cudaMemset(s->d_out, 0xff, (size_t)B * H * D * 4));
    CK(cudaMemset(s->d_lg, 0, (size_t)B * H * maxctx * 4));
    CK(sfi_gpu_attn_mixed(&hm, d_hm, s->c->dtype, s->d_q, s->d_k, s->d_v, s->d_ck, s->d_cv,
                          s->d_out, s->d_lg, &s->aws, 0, 0));
    CK(cudaMemcpy(s->g_out, s->d_out, (size_t)B * H * D * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(s->g_lg, s->d_lg, (size_t)B * H * maxctx * 4, cudaMemcpyDeviceToHost));
    double worst = 0, lworst = 0;
    for (int b = 0; b < B; b++) {
        const size_t o = (size_t)b * H * D;
        const int fast = b % 2 == 0;
        double rerr = 0;
        const double w =
            tol_ratio_x(s->g_out + o, (fast ? s->r_sp : s->r_out) + o,
                        (fast ? s->x_sp : s->x_out) + o, (size_t)H * D, 2e-5, 1e-5, &rerr);
        if (w > worst)
            worst = w;
        const double lw = fast ? 0 : logits_ratio(s, b);
        if (lw > lworst)
            lworst = lw;
    }
    report(ci, "mixed output", worst <= 1, "%.3g of tolerance (even requests fast, odd dense)",
           worst);
    report(ci, "mixed logits", lworst <= 1, "%.3g of tolerance", lworst);
    CK(cudaFree(d_hm));
}

/* E. bit-exact attention: dense output and logits, sparse output. */
static void check_exact(kcase *s)
{
    const int B = s->B, H = s->H, D = s->D, maxctx = s->maxctx, ci = s->ci, dt = s->c->dtype;
    CK(cudaMemset(s->d_lg, 0, (size_t)B * H * maxctx * 4));
    CK(sfi_gpu_attn_dense(&s->h, s->d_desc, dt, s->d_q, s->d_k, s->d_v, s->d_out, s->d_lg, &s->aws,
                          1, 0));
    CK(cudaMemcpy(s->g_out, s->d_out, (size_t)B * H * D * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(s->g_lg, s->d_lg, (size_t)B * H * maxctx * 4, cudaMemcpyDeviceToHost));
    int ob = !memcmp(s->g_out, s->r_out, (size_t)B * H * D * 4), lb = 1;
    for (int b = 0; b < B; b++)
        for (int hh = 0; hh < H; hh++)
            lb &= !memcmp(s->g_lg + ((size_t)b * H + hh) * maxctx,
                          s->r_lg + ((size_t)b * H + hh) * maxctx, (size_t)s->ctx[b] * 4);
    report(ci, "dense output exact", ob, "%s", ob ? "bit-identical" : "bits differ");
    report(ci, "dense logits exact", lb, "%s", lb ? "bit-identical" : "bits differ");
    CK(sfi_gpu_attn_sparse(&s->h, s->d_desc, dt, s->d_q, s->d_k, s->d_v, s->d_ck, s->d_cv,
                           s->d_cpos, s->d_out, &s->aws, 1, 0));
    CK(cudaMemcpy(s->g_out, s->d_out, (size_t)B * H * D * 4, cudaMemcpyDeviceToHost));
    ob = !memcmp(s->g_out, s->r_sp, (size_t)B * H * D * 4);
    report(ci, "sparse output exact", ob, "%s", ob ? "bit-identical" : "bits differ");
}

/* D. Top-K on tie-heavy scores (few distinct values, -0 and +0). */
static void check_topk_ties(kcase *s)
{
    const int B = s->B, HK = s->HK, K = s->c->K, maxJ = s->maxJ;
    sfi_error err;
    float *sc = xmalloc((size_t)B * HK * maxJ * 4);
    for (size_t i = 0; i < (size_t)B * HK * maxJ; i++) {
        float x = (float)(int)((urand() * 0.5f + 0.5f) * 6.0f) - 3.0f;
        sc[i] = x == 0.0f && (i & 1) ? -0.0f : x;
    }
    float *d_sc = dmalloc((size_t)B * HK * maxJ * 4);
    CK(cudaMemcpy(d_sc, sc, (size_t)B * HK * maxJ * 4, cudaMemcpyHostToDevice));
    CK(sfi_gpu_topk(&s->h, s->d_desc, d_sc, maxJ, s->d_sel, 0));
    CK(cudaMemcpy(s->g_sel, s->d_sel, (size_t)B * HK * K * 4, cudaMemcpyDeviceToHost));
    int same = 1;
    int32_t *tk = xmalloc((size_t)K * 4);
    for (int b = 0; b < B; b++)
        for (int hh = 0; hh < HK; hh++) {
            const int j0 = s->h.req[b].j_begin, nJ = s->h.req[b].j_end - j0;
            if (sfi_topk(sc + ((size_t)b * HK + hh) * maxJ, nJ, s->kout[b], tk, &err) != SFI_OK) {
                fprintf(stderr, "sfi-gpu check: reference top-k: %s\n", err.msg);
                exit(1);
            }
            for (int i = 0; i < s->kout[b]; i++)
                if (s->g_sel[((size_t)b * HK + hh) * K + i] != j0 + tk[i])
                    same = 0;
        }
    report(s->ci, "top-k with ties", same, "%s", same ? "identical" : "differ");
    free(tk);
    free(sc);
    CK(cudaFree(d_sc));
}

static void kcase_free(kcase *s)
{
    for (int b = 0; b < s->B; b++) {
        free(s->k[b]);
        free(s->v[b]);
    }
    void *host[] = {s->k,     s->v,     s->q,     s->bt,    s->perm,   s->hk,   s->hv,
                    s->r_out, s->r_lg,  s->norms, s->r_sel, s->r_lam,  s->r_s,  s->g_out,
                    s->g_lg,  s->g_sel, s->g_s,   s->g_lam, s->g_cpos, s->r_sp, s->idx_mem,
                    s->x_out, s->x_sp,  s->x_s,   s->x_lam, s->x_z,    s->r_z};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
    void *dev[] = {s->d_k,   s->d_v,  s->d_bt,  s->d_q,    s->d_desc,  s->aws_mem,
                   s->d_out, s->d_lg, s->d_rlg, s->d_norm, s->sws_mem, s->d_s,
                   s->d_sel, s->d_ck, s->d_cv,  s->d_cpos};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        CK(cudaFree(dev[i]));
}

/* One kernel case: inputs, the reference, then checks A (dense), B
 * (Selector), C (reorg + sparse), E (exact, with --bit-exact) and D (Top-K
 * ties), in the order that draws the random stream. Returns 1 when every
 * check passed. */
static int run_case(int ci, const tcase *c, int bit_exact, uint64_t seed)
{
    const int fail0 = g_fail;
    kcase s;
    memset(&s, 0, sizeof s);
    s.c = c;
    s.ci = ci;
    case_geometry(&s);
    g_rng = seed * 0x9e3779b97f4a7c15ull + (uint64_t)ci * 0x632be59bd9b4e019ull + 1;
    printf(
        "case %d: batch %d, %d kv x %d q heads, D %d, context %d, page %d, K %d, recent %d, %s\n",
        ci, s.B, s.HK, s.H, s.D, c->ctx, s.P, c->K, c->n_recent, s.bf ? "bf16" : "f32");
    make_host_data(&s);
    make_paged_cache(&s);
    make_step_desc(&s);
    reference(&s);
    check_dense(&s);
    check_selector(&s, bit_exact);
    check_sparse(&s);
    check_mixed(&s);
    if (bit_exact && !s.bf)
        check_exact(&s);
    check_topk_ties(&s);
    CK(cudaDeviceSynchronize());
    kcase_free(&s);
    return g_fail == fail0;
}

/* ---- decode GEMMs (sfi_gpu_gemm_skinny): both kernels against a float64
 * product of the same bf16 inputs. The tolerance is 1e-4 of sum |w x| per
 * output (f32 accumulation of exact bf16 products; an indexing mistake
 * errs by the order of that sum); SwiGLU outputs are bf16 (2^-8). Shapes
 * cover M not a multiple of 16, T across the token-tile sizes, N below
 * one k-block per warp, and every epilogue. */
typedef struct {
    int T, M, N, epi;
} gcase;

static const gcase k_gemm[] = {
    {1, 1000, 1024, SFI_GPU_EPI_STORE},       {16, 1024, 3072, SFI_GPU_EPI_ACCUMULATE},
    {16, 6144, 1024, SFI_GPU_EPI_SWIGLU},     {5, 4096, 1024, SFI_GPU_EPI_ACCUMULATE},
    {17, 2048, 2048, SFI_GPU_EPI_STORE},      {33, 1040, 64, SFI_GPU_EPI_STORE},
    {64, 2560, 4096, SFI_GPU_EPI_ACCUMULATE}, {40, 1536, 1024, SFI_GPU_EPI_SWIGLU},
};
#define N_GEMM_QUICK 3

static const char *epi_name(int epi)
{
    return epi == SFI_GPU_EPI_STORE        ? "store"
           : epi == SFI_GPU_EPI_ACCUMULATE ? "accumulate"
                                           : "swiglu";
}

/* A case's inputs on the device, uploaded once for its three runs (the
 * kernels only read them). */
typedef struct {
    void *w, *x;    /* bf16 weights [M][N], bf16 activations [T][N] */
    float *xf, *nw; /* the fused-RMSNorm form's f32 residual [T][N] and norm weights [N] */
} gemm_dev;

/* One product through kernel `which` (through the fused-RMSNorm form where
 * fused); max of |err| / allowed over the outputs. */
static double gemm_run_one(const gcase *c, int which, int fused, const gemm_dev *d, const float *y0,
                           const double *ref, const double *scale)
{
    const int T = c->T, M = c->M, N = c->N, sw = c->epi == SFI_GPU_EPI_SWIGLU;
    const size_t ny = (size_t)T * (sw ? M / 2 : M);
    void *dy = dmalloc(ny * (sw ? 2 : 4));
    if (!sw)
        CK(cudaMemcpy(dy, y0, ny * 4, cudaMemcpyHostToDevice));
    sfi_gpu_gemm_select(which, which == SFI_GPU_GEMM_SLAB ? 1024 : -1);
    if (fused)
        CK(sfi_gpu_gemm_norm(d->w, d->xf, d->nw, 1e-6f, dy, T, M, N, c->epi, 0));
    else
        CK(sfi_gpu_gemm_skinny(d->w, d->x, dy, T, M, N, c->epi, 0));
    CK(cudaDeviceSynchronize());
    sfi_gpu_gemm_select(SFI_GPU_GEMM_SLAB, -1); /* the engine's default */
    double worst = 0;
    if (sw) {
        uint16_t *g = xmalloc(ny * 2);
        CK(cudaMemcpy(g, dy, ny * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < ny; i++) {
            const double r = ref[i], d = fabs((double)from_bf16(g[i]) - r);
            const double tol = 0.0079 * fabs(r) + 1e-4 * scale[i] + 1e-6;
            if (!(d / tol <= worst))
                worst = d / tol; /* NaN propagates as a failure */
        }
        free(g);
    } else {
        float *g = xmalloc(ny * 4);
        CK(cudaMemcpy(g, dy, ny * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < ny; i++) {
            const double d = fabs((double)g[i] - ref[i]);
            const double tol = 1e-4 * scale[i] + 1e-6 * (1.0 + fabs(ref[i]));
            if (!(d / tol <= worst))
                worst = d / tol;
        }
        free(g);
    }
    CK(cudaFree(dy));
    return worst;
}

/* The deferred norm (sfi_gpu_rownorm) on case c's shape, slab kernel.
 * Consumer: X = bf16(xf) unnormalised, weights bf16(w * nw) by column,
 * partial sums of squares of xf as a producer leaves them; against a
 * float64 product of those bf16 values times rsqrt(mean + eps) (the
 * SwiGLU on the scaled gate and up). Producer (accumulate cases): the
 * residual as gemm_run_one's, its bf16 copy equal to the rounded
 * residual, and each 8 columns' sum of squares within 1e-5 relative. */
static void gemm_rownorm_run(int ci, const gcase *c, const uint16_t *w, const float *xf,
                             const float *nw, const gemm_dev *d, const float *y0, const double *ref,
                             const double *scale)
{
    const int T = c->T, M = c->M, N = c->N, sw = c->epi == SFI_GPU_EPI_SWIGLU;
    sfi_gpu_gemm_select(SFI_GPU_GEMM_SLAB, 1024);
    if (!sfi_gpu_gemm_rownorm_applies(T, M, N, c->epi, 1) || N % 8) {
        sfi_gpu_gemm_select(SFI_GPU_GEMM_SLAB, -1);
        return;
    }
    const float eps = 1e-6f;
    uint16_t *wf = xmalloc((size_t)M * N * 2), *xb = xmalloc((size_t)T * N * 2);
    float *ss = xmalloc((size_t)(N / 8) * 64 * 4);
    memset(ss, 0, (size_t)(N / 8) * 64 * 4);
    double *r = xmalloc((size_t)T * 8);
    for (size_t i = 0; i < (size_t)M * N; i++)
        wf[i] = to_bf16(from_bf16(w[i]) * nw[i % N]);
    for (int t = 0; t < T; t++) {
        double a = 0;
        for (int g = 0; g < N / 8; g++) {
            float p = 0.f;
            for (int j = 0; j < 8; j++) {
                const float v = xf[(size_t)t * N + 8 * g + j];
                xb[(size_t)t * N + 8 * g + j] = to_bf16(v);
                p += v * v;
                a += (double)v * v;
            }
            ss[(size_t)t * (N / 8) + g] = p;
        }
        r[t] = 1.0 / sqrt(a / N + eps);
    }
    const size_t ny = (size_t)T * (sw ? M / 2 : M);
    void *dw = dmalloc((size_t)M * N * 2), *dx = dmalloc((size_t)T * N * 2), *dy = dmalloc(ny * 4);
    float *dss = dmalloc((size_t)(N / 8) * 64 * 4);
    CK(cudaMemcpy(dw, wf, (size_t)M * N * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, xb, (size_t)T * N * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dss, ss, (size_t)(N / 8) * 64 * 4, cudaMemcpyHostToDevice));
    if (c->epi == SFI_GPU_EPI_ACCUMULATE)
        CK(cudaMemcpy(dy, y0, ny * 4, cudaMemcpyHostToDevice));
    sfi_gpu_rownorm in = {.ss_in = dss, .eps = eps};
    CK(sfi_gpu_gemm_rownorm(dw, dx, dy, T, M, N, c->epi, &in, 0));
    CK(cudaDeviceSynchronize());
    double worst = 0;
    double *dot = xmalloc((size_t)M * 8), *ad = xmalloc((size_t)M * 8);
    float *g = xmalloc(ny * 4);
    uint16_t *gb = (uint16_t *)g;
    CK(cudaMemcpy(g, dy, ny * (sw ? 2 : 4), cudaMemcpyDeviceToHost));
    for (int t = 0; t < T; t++) {
        for (int m = 0; m < M; m++) {
            double a = 0, s = 0;
            for (int k = 0; k < N; k++) {
                const double p = (double)from_bf16(wf[(size_t)m * N + k]) *
                                 (double)from_bf16(xb[(size_t)t * N + k]) * r[t];
                a += p;
                s += fabs(p);
            }
            dot[m] = a;
            ad[m] = s;
        }
        for (int i = 0; i < (sw ? M / 2 : M); i++) {
            double rf, sc, got;
            if (sw) {
                const int m_g = (i / 8) * 16 + i % 8, m_u = m_g + 8;
                const double gt = dot[m_g], up = dot[m_u], sg = gt / (1.0 + exp(-gt));
                rf = sg * up;
                sc = 1.1 * ad[m_g] * fabs(up) + fabs(sg) * ad[m_u];
                got = from_bf16(gb[(size_t)t * (M / 2) + i]);
            } else {
                const double base =
                    c->epi == SFI_GPU_EPI_ACCUMULATE ? (double)y0[(size_t)t * M + i] : 0.0;
                rf = base + dot[i];
                sc = ad[i];
                got = g[(size_t)t * M + i];
            }
            const double tol =
                (sw ? 0.0079 * fabs(rf) : 1e-6 * (1.0 + fabs(rf))) + 1e-4 * sc + 1e-6;
            if (!(fabs(got - rf) / tol <= worst))
                worst = fabs(got - rf) / tol;
        }
    }
    report(ci, "gemm deferred norm", worst <= 1.0, "max err / tolerance %.3g", worst);
    if (c->epi == SFI_GPU_EPI_ACCUMULATE) {
        /* producer: the plain product into the residual, with its sums */
        float *dso = dmalloc((size_t)(M / 8) * 64 * 4);
        void *dxb = dmalloc((size_t)T * M * 2);
        CK(cudaMemcpy(dy, y0, ny * 4, cudaMemcpyHostToDevice));
        sfi_gpu_rownorm out = {.ss_out = dso, .xb_out = dxb, .eps = eps};
        CK(sfi_gpu_gemm_rownorm(d->w, d->x, dy, T, M, N, c->epi, &out, 0));
        CK(cudaDeviceSynchronize());
        float *so = xmalloc((size_t)(M / 8) * 64 * 4);
        uint16_t *ob = xmalloc((size_t)T * M * 2);
        CK(cudaMemcpy(g, dy, ny * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(so, dso, (size_t)(M / 8) * 64 * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(ob, dxb, (size_t)T * M * 2, cudaMemcpyDeviceToHost));
        double wy = 0, ws = 0;
        int bits = 1;
        for (int t = 0; t < T; t++)
            for (int m = 0; m < M; m++) {
                const size_t i = (size_t)t * M + m;
                const double tol = 1e-4 * scale[i] + 1e-6 * (1.0 + fabs(ref[i]));
                if (!(fabs(g[i] - ref[i]) / tol <= wy))
                    wy = fabs(g[i] - ref[i]) / tol;
                bits &= ob[i] == to_bf16(g[i]);
            }
        for (int t = 0; t < T; t++)
            for (int gg = 0; gg < M / 8; gg++) {
                double a = 0;
                for (int j = 0; j < 8; j++)
                    a += (double)g[(size_t)t * M + 8 * gg + j] * g[(size_t)t * M + 8 * gg + j];
                const double e = fabs(so[(size_t)t * (M / 8) + gg] - a) / (1e-5 * a + 1e-30);
                if (!(e <= ws))
                    ws = e;
            }
        report(ci, "gemm norm producer", wy <= 1.0 && bits && ws <= 1.0,
               "residual %.3g of tolerance, bf16 copy %s, sums of squares %.3g of tolerance", wy,
               bits ? "exact" : "WRONG", ws);
        CK(cudaFree(dso));
        CK(cudaFree(dxb));
        free(so);
        free(ob);
    }
    sfi_gpu_gemm_select(SFI_GPU_GEMM_SLAB, -1);
    CK(cudaFree(dw));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    CK(cudaFree(dss));
    free(wf);
    free(xb);
    free(ss);
    free(r);
    free(dot);
    free(ad);
    free(g);
}

static int run_gemm_case(int ci, const gcase *c, uint64_t seed)
{
    const int fail0 = g_fail;
    const int T = c->T, M = c->M, N = c->N, sw = c->epi == SFI_GPU_EPI_SWIGLU;
    g_rng = seed * 0x9e3779b97f4a7c15ull + (uint64_t)(ci + 1000) * 0x632be59bd9b4e019ull + 1;
    printf("case %d: decode GEMM, %d tokens x %d rows x %d, %s\n", ci, T, M, N, epi_name(c->epi));
    uint16_t *w = xmalloc((size_t)M * N * 2), *x = xmalloc((size_t)T * N * 2);
    float *xf = xmalloc((size_t)T * N * 4), *nw = xmalloc((size_t)N * 4);
    for (size_t i = 0; i < (size_t)M * N; i++)
        w[i] = to_bf16(urand());
    /* x: what RMSNorm(xf) * nw gives in bf16 with rmsnorm's formula (the
     * fused form makes it on the device; a 1-ulp difference in the norm
     * can flip a rounding, well inside the tolerance) */
    for (int k = 0; k < N; k++)
        nw[k] = 1.0f + 0.5f * urand();
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int k = 0; k < N; k++) {
            const float v = 3.0f * urand();
            xf[(size_t)t * N + k] = v;
            ss += (double)v * v;
        }
        const float r = (float)(1.0 / sqrt(ss / N + 1e-6));
        for (int k = 0; k < N; k++)
            x[(size_t)t * N + k] = to_bf16(nw[k] * (xf[(size_t)t * N + k] * r));
    }
    const size_t ny = (size_t)T * (sw ? M / 2 : M);
    float *y0 = xmalloc(ny * 4);
    double *ref = xmalloc(ny * 8), *scale = xmalloc(ny * 8);
    double *dot = xmalloc((size_t)M * 8), *abs_dot = xmalloc((size_t)M * 8);
    for (size_t i = 0; i < ny; i++)
        y0[i] = c->epi == SFI_GPU_EPI_ACCUMULATE ? urand() : 0.f;
    for (int t = 0; t < T; t++) {
        for (int m = 0; m < M; m++) {
            double a = 0, s = 0;
            for (int k = 0; k < N; k++) {
                const double p = (double)from_bf16(w[(size_t)m * N + k]) *
                                 (double)from_bf16(x[(size_t)t * N + k]);
                a += p;
                s += fabs(p);
            }
            dot[m] = a;
            abs_dot[m] = s;
        }
        if (sw) { /* tiles of 16 rows: 8 gates, then their 8 ups */
            for (int i = 0; i < M / 2; i++) {
                const int m_g = (i / 8) * 16 + i % 8, m_u = m_g + 8;
                const double gt = dot[m_g], up = dot[m_u], sg = gt / (1.0 + exp(-gt));
                ref[(size_t)t * (M / 2) + i] = sg * up;
                scale[(size_t)t * (M / 2) + i] =
                    1.1 * abs_dot[m_g] * fabs(up) + fabs(sg) * abs_dot[m_u];
            }
        } else {
            for (int m = 0; m < M; m++) {
                ref[(size_t)t * M + m] = (double)y0[(size_t)t * M + m] + dot[m];
                scale[(size_t)t * M + m] = abs_dot[m];
            }
        }
    }
    gemm_dev d = {dmalloc((size_t)M * N * 2), dmalloc((size_t)T * N * 2),
                  dmalloc((size_t)T * N * 4), dmalloc((size_t)N * 4)};
    CK(cudaMemcpy(d.w, w, (size_t)M * N * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.x, x, (size_t)T * N * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.xf, xf, (size_t)T * N * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.nw, nw, (size_t)N * 4, cudaMemcpyHostToDevice));
    const double e_slab = gemm_run_one(c, SFI_GPU_GEMM_SLAB, 0, &d, y0, ref, scale);
    report(ci, "gemm slab", e_slab <= 1.0, "max err / tolerance %.3g", e_slab);
    const double e_regs = gemm_run_one(c, SFI_GPU_GEMM_REGS, 0, &d, y0, ref, scale);
    report(ci, "gemm registers", e_regs <= 1.0, "max err / tolerance %.3g", e_regs);
    const double e_norm = gemm_run_one(c, SFI_GPU_GEMM_SLAB, 1, &d, y0, ref, scale);
    report(ci, "gemm fused norm", e_norm <= 1.0, "max err / tolerance %.3g", e_norm);
    gemm_rownorm_run(ci, c, w, xf, nw, &d, y0, ref, scale);
    CK(cudaFree(d.w));
    CK(cudaFree(d.x));
    CK(cudaFree(d.xf));
    CK(cudaFree(d.nw));
    free(w);
    free(x);
    free(xf);
    free(nw);
    free(y0);
    free(ref);
    free(scale);
    free(dot);
    free(abs_dot);
    return g_fail == fail0;
}

/* ---- grouped MoE experts (prefill, sfi_gpu_moe.h) against the per-pair
 * products of decode steps (sfi_gpu_moe_gemv), on the same route, weights
 * and residual. The route is made here so that one expert gets no pair
 * (its GEMM must be skipped, not run with 0 rows) and expert 0 one pair of
 * every token. The sort is checked exactly (counts, and positions a stable
 * counting sort's); the residual within 1e-4 (f32: both f32 products, in
 * other orders) or 1.5e-2 (bf16: the grouped form rounds its inputs and
 * SwiGLU to bf16, the per-pair form keeps them f32) of the largest change
 * the experts make -- a wrong row or expert errs by the order of that
 * change. */
typedef struct {
    int T, top, E, H, Im, empty, dtype;
} mcase;

static const mcase k_moe[] = {
    {37, 2, 6, 96, 40, 3, SFI_GPU_F32},
    {37, 2, 6, 96, 40, 3, SFI_GPU_BF16},
    {300, 8, 16, 256, 64, 5, SFI_GPU_F32},
    {300, 8, 16, 256, 64, 11, SFI_GPU_BF16},
};
#define N_MOE_QUICK 2

/* One expert's weights on the device: rows x cols uniform in [-s, s). */
static void *moe_weights(int rows, int cols, int bf, float sc)
{
    const size_t n = (size_t)rows * cols;
    void *h = xmalloc(n * (bf ? 2 : 4));
    for (size_t i = 0; i < n; i++) {
        const float v = sc * urand();
        if (bf)
            ((uint16_t *)h)[i] = to_bf16(v);
        else
            ((float *)h)[i] = v;
    }
    void *d = dmalloc(n * (bf ? 2 : 4));
    CK(cudaMemcpy(d, h, n * (bf ? 2 : 4), cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static int run_moe_case(int ci, const mcase *c, uint64_t seed)
{
    const int fail0 = g_fail;
    const int T = c->T, top = c->top, E = c->E, H = c->H, Im = c->Im, pairs = T * top;
    const int bf = c->dtype == SFI_GPU_BF16;
    g_rng = seed * 0x9e3779b97f4a7c15ull + (uint64_t)(ci + 2000) * 0x632be59bd9b4e019ull + 1;
    printf("case %d: grouped MoE experts, %d tokens x top %d of %d experts, hidden %d, width %d, "
           "%s\n",
           ci, T, top, E, H, Im, bf ? "bf16" : "f32");
    /* the route: expert 0, then top - 1 distinct others but `empty`,
     * ascending (as sfi_gpu_moe_route writes it) */
    int32_t *sel = xmalloc((size_t)pairs * 4);
    float *sw = xmalloc((size_t)pairs * 4), *x = xmalloc((size_t)T * H * 4);
    float *h0 = xmalloc((size_t)T * H * 4);
    for (int t = 0; t < T; t++) {
        int k = 0;
        sel[(size_t)t * top + k++] = 0;
        for (int j = 0; k < top; j++) {
            const int x_ = 1 + (t * 7 + j) % (E - 1);
            int dup = x_ == c->empty;
            for (int i = 0; i < k; i++)
                dup |= sel[(size_t)t * top + i] == x_;
            if (!dup)
                sel[(size_t)t * top + k++] = x_;
        }
        for (int a = 1; a < top; a++) /* insertion sort */
            for (int b = a; b > 0 && sel[(size_t)t * top + b - 1] > sel[(size_t)t * top + b]; b--) {
                const int32_t tmp = sel[(size_t)t * top + b];
                sel[(size_t)t * top + b] = sel[(size_t)t * top + b - 1];
                sel[(size_t)t * top + b - 1] = tmp;
            }
        for (int k2 = 0; k2 < top; k2++)
            sw[(size_t)t * top + k2] = 0.5f + 0.5f * urand();
    }
    for (size_t i = 0; i < (size_t)T * H; i++) {
        x[i] = urand();
        h0[i] = urand();
    }
    void **w_gu = xmalloc((size_t)E * sizeof(void *)), **w_d = xmalloc((size_t)E * sizeof(void *));
    for (int e = 0; e < E; e++) {
        w_gu[e] = moe_weights(2 * Im, H, bf, 1.0f / sqrtf((float)H));
        w_d[e] = moe_weights(H, Im, bf, 1.0f / sqrtf((float)Im));
    }
    void **d_gu = dmalloc((size_t)E * sizeof(void *)), **d_d = dmalloc((size_t)E * sizeof(void *));
    CK(cudaMemcpy(d_gu, w_gu, (size_t)E * sizeof(void *), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_d, w_d, (size_t)E * sizeof(void *), cudaMemcpyHostToDevice));
    int32_t *d_sel = dmalloc((size_t)pairs * 4), *d_cnt = dmalloc((size_t)E * 4);
    int32_t *d_pos = dmalloc((size_t)pairs * 4), *h_cnt;
    CK(cudaMallocHost((void **)&h_cnt, (size_t)E * 4));
    float *d_sw = dmalloc((size_t)pairs * 4), *d_x = dmalloc((size_t)T * H * 4);
    float *d_h = dmalloc((size_t)T * H * 4), *d_y1 = dmalloc((size_t)pairs * 2 * Im * 4);
    float *d_act = dmalloc((size_t)pairs * Im * 4), *d_y2 = dmalloc((size_t)pairs * H * 4);
    CK(cudaMemcpy(d_sel, sel, (size_t)pairs * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_sw, sw, (size_t)pairs * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_x, x, (size_t)T * H * 4, cudaMemcpyHostToDevice));
    /* the per-pair form, as a decode step runs it */
    CK(cudaMemcpy(d_h, h0, (size_t)T * H * 4, cudaMemcpyHostToDevice));
    CK(sfi_gpu_moe_gemv(d_gu, c->dtype, d_sel, T, top, d_x, 0, 2 * Im, H, d_y1, 0, 0));
    CK(sfi_gpu_silu_mul(d_y1, pairs, Im, 0, d_act, SFI_GPU_F32, 0, 0));
    CK(sfi_gpu_moe_gemv(d_d, c->dtype, d_sel, T, top, d_act, 1, H, Im, d_y2, 0, 0));
    CK(sfi_gpu_moe_combine(d_h, d_y2, d_sw, T, top, H, 0, 0));
    float *r = xmalloc((size_t)T * H * 4), *g = xmalloc((size_t)T * H * 4);
    CK(cudaMemcpy(r, d_h, (size_t)T * H * 4, cudaMemcpyDeviceToHost));
    /* the grouped form */
    CK(cudaMemcpy(d_h, h0, (size_t)T * H * 4, cudaMemcpyHostToDevice));
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "sfi-gpu check: cublasCreate failed\n");
        exit(1);
    }
    sfi_gpu_moe_grouped_args ga = {.T = T,
                                   .top = top,
                                   .E = E,
                                   .H = H,
                                   .Im = Im,
                                   .dtype = c->dtype,
                                   .w_gu = w_gu,
                                   .w_d = w_d,
                                   .x = d_x,
                                   .sel_e = d_sel,
                                   .sel_w = d_sw,
                                   .h = d_h,
                                   .cnt = d_cnt,
                                   .h_cnt = h_cnt,
                                   .pos = d_pos,
                                   .y1 = d_y1,
                                   .act = d_act,
                                   .y2 = d_y2};
    sfi_error err;
    sfi_error_clear(&err);
    if (sfi_gpu_moe_grouped(&ga, blas, 0, &err)) {
        fprintf(stderr, "sfi-gpu check: %s\n", err.msg);
        exit(1);
    }
    CK(cudaDeviceSynchronize());
    cublasDestroy(blas);
    CK(cudaMemcpy(g, d_h, (size_t)T * H * 4, cudaMemcpyDeviceToHost));
    /* the sort: counts, and positions expert by expert in pair order */
    int32_t *pos = xmalloc((size_t)pairs * 4), *cnt = xmalloc((size_t)E * 4);
    int32_t *next = xmalloc((size_t)E * 4);
    CK(cudaMemcpy(pos, d_pos, (size_t)pairs * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(cnt, d_cnt, (size_t)E * 4, cudaMemcpyDeviceToHost));
    int sort_ok = 1, n_max = 0;
    for (int e = 0, off = 0; e < E; e++) {
        int n = 0;
        for (int p = 0; p < pairs; p++)
            n += sel[p] == e;
        sort_ok &= cnt[e] == n;
        next[e] = off;
        off += n;
        n_max = n > n_max ? n : n_max;
    }
    for (int p = 0; p < pairs; p++)
        sort_ok &= pos[p] == next[sel[p]]++;
    report(ci, "moe sort", sort_ok && cnt[c->empty] == 0,
           "expert %d has %d pairs, the most %d of %d", c->empty, cnt[c->empty], n_max, pairs);
    double big = 0, worst = 0;
    for (size_t i = 0; i < (size_t)T * H; i++)
        big = fmax(big, fabs((double)r[i] - h0[i]));
    const double tol = (bf ? 1.5e-2 : 1e-4) * big + 1e-7;
    for (size_t i = 0; i < (size_t)T * H; i++) {
        const double d = fabs((double)g[i] - r[i]) / tol;
        if (!(d <= worst))
            worst = d; /* NaN propagates as a failure */
    }
    report(ci, "moe grouped", worst <= 1.0 && big > 0,
           "max err / tolerance %.3g (largest change %.3g)", worst, big);
    for (int e = 0; e < E; e++) {
        CK(cudaFree(w_gu[e]));
        CK(cudaFree(w_d[e]));
    }
    void *dev[] = {d_gu, d_d, d_sel, d_cnt, d_pos, d_sw, d_x, d_h, d_y1, d_act, d_y2};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        CK(cudaFree(dev[i]));
    CK(cudaFreeHost(h_cnt));
    free(w_gu);
    free(w_d);
    free(sel);
    free(sw);
    free(x);
    free(h0);
    free(r);
    free(g);
    free(pos);
    free(cnt);
    free(next);
    return g_fail == fail0;
}

/* ---- end to end: the engine (sfi-gpu run) against sfi-ref's decode loop ----
 * Each case decodes a batch with the engine and with sfi_decode_run on the
 * CPU (sfi_gpu_verify.h) and compares ids, step kinds and reasons, the
 * selected sets of every slow step and layer, and the logits (1e-4 of the
 * largest |logit|); exact cases must also give sfi-ref's digest and equal
 * selected sets. The test fixtures live in the source tree ($SFI_SRCDIR,
 * default .); the trained model in $SFI_SHARED (default ../shared), and
 * its cases say SKIP when it is absent. */
typedef struct {
    const char *name;
    /* under tests/fixtures/hf/, "small", or "gen:CONFIG": a random f32
     * checkpoint of that config (under the source tree), written to a
     * temporary directory as sfi-ref make-checkpoint --seed 1 does */
    const char *dir;
    int sfi, exact, B, max_new, quick;
    int len[4];
    const char *params; /* extra KEY=VALUE, space-separated */
} e2e_case;

static const e2e_case k_e2e[] = {
    {"tiny-qwen3 exact sfi",
     "tiny-qwen3",
     1,
     1,
     4,
     200,
     1,
     {30, 23, 40, 23},
     "n_recent=32 K=16 T_max=8"},
    {"tiny-qwen3-moe exact sfi",
     "tiny-qwen3-moe",
     1,
     1,
     4,
     200,
     1,
     {30, 23, 40, 23},
     "n_recent=32 K=16 T_max=8"},
    {"tiny-qwen3-moe-nonorm exact dense",
     "tiny-qwen3-moe-nonorm",
     0,
     1,
     2,
     200,
     0,
     {40, 23, 0, 0},
     ""},
    {"tiny-qwen3-moe f32 sfi",
     "tiny-qwen3-moe",
     1,
     0,
     4,
     200,
     0,
     {30, 23, 40, 23},
     "n_recent=32 K=16 T_max=8"},
    /* GQA groups of 16 (64 query heads over 4 KV heads, as Qwen3-235B-A22B)
     * and 5 (10 over 2; Qwen3-14B: 40 over 8), head_dim 64 */
    {"gqa-g16 exact sfi",
     "gen:tests/fixtures/gqa/g16.json",
     1,
     1,
     4,
     200,
     1,
     {30, 23, 40, 23},
     "n_recent=32 K=16 T_max=8"},
    {"gqa-g16 f32 sfi",
     "gen:tests/fixtures/gqa/g16.json",
     1,
     0,
     4,
     200,
     0,
     {30, 23, 40, 23},
     "n_recent=32 K=16 T_max=8"},
    {"gqa-g5 exact sfi",
     "gen:tests/fixtures/gqa/g5.json",
     1,
     1,
     4,
     200,
     0,
     {30, 23, 40, 23},
     "n_recent=32 K=16 T_max=8"},
    {"gqa-g5 f32 sfi",
     "gen:tests/fixtures/gqa/g5.json",
     1,
     0,
     4,
     200,
     0,
     {30, 23, 40, 23},
     "n_recent=32 K=16 T_max=8"},
    {"sfi-small-qwen3 exact sfi", "small", 1, 1, 4, 256, 0, {700, 900, 1100, 1300}, "K=256"},
    {"sfi-small-qwen3 exact sfi (quick)", "small", 1, 1, 1, 64, 1, {1000, 0, 0, 0}, "K=256"},
    {"sfi-small-qwen3 exact dense", "small", 0, 1, 4, 256, 0, {700, 900, 1100, 1300}, ""},
    {"sfi-small-qwen3 f32 sfi", "small", 1, 0, 4, 256, 0, {700, 900, 1100, 1300}, "K=256"},
    /* deferred refresh (refresh_delay): sets installed 2 steps after their
     * slow step; installed exactly when the next slow step comes (d =
     * T_max = 4); always dropped (T_max = 2 < d = 3); on the trained model
     * the sentence triggers give each request its own slow steps, some
     * back to back (drops) */
    {"tiny-qwen3 exact sfi refresh_delay=2",
     "tiny-qwen3",
     1,
     1,
     4,
     200,
     1,
     {30, 23, 40, 23},
     "n_recent=32 K=16 T_max=5 refresh_delay=2"},
    {"tiny-qwen3-moe exact sfi refresh_delay=4",
     "tiny-qwen3-moe",
     1,
     1,
     4,
     200,
     0,
     {30, 23, 40, 23},
     "n_recent=32 K=16 T_max=4 refresh_delay=4"},
    {"tiny-qwen3-moe-nonorm exact sfi refresh_delay=3 (all dropped)",
     "tiny-qwen3-moe-nonorm",
     1,
     1,
     2,
     100,
     0,
     {40, 23, 0, 0},
     "n_recent=16 K=8 T_max=2 refresh_delay=3"},
    {"sfi-small-qwen3 exact sfi refresh_delay=2",
     "small",
     1,
     1,
     4,
     256,
     0,
     {700, 900, 1100, 1300},
     "K=256 refresh_delay=2"},
    {"sfi-small-qwen3 exact sfi refresh_delay=2 (quick)",
     "small",
     1,
     1,
     2,
     64,
     1,
     {1000, 700, 0, 0},
     "K=256 T_max=3 refresh_delay=2"},
    {"sfi-small-qwen3 f32 sfi refresh_delay=2",
     "small",
     1,
     0,
     4,
     256,
     0,
     {700, 900, 1100, 1300},
     "K=256 refresh_delay=2"},
};

static char *e2e_path(const char *env, const char *fallback, const char *rel)
{
    const char *base = getenv(env);
    if (!base || !*base)
        base = fallback;
    size_t n = strlen(base) + strlen(rel) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", base, rel);
    return p;
}

/* A "gen:CONFIG" case's checkpoint: written into a new temporary
 * directory, whose path is returned (NULL with the reason in e). */
static char *e2e_generate(const char *config, sfi_error *e)
{
    char *cfg_path = e2e_path("SFI_SRCDIR", ".", config);
    const char *tmp = getenv("TMPDIR");
    size_t n = strlen(tmp && *tmp ? tmp : "/tmp") + 32;
    char *dir = malloc(n);
    sfi_model_config *cfg = malloc(sizeof *cfg);
    if (!cfg_path || !dir || !cfg) {
        sfi_error_set(e, SFI_ENOMEM, "out of memory");
        goto fail;
    }
    snprintf(dir, n, "%s/sfi-gpu-check.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        sfi_error_set(e, SFI_EIO, "%s: cannot create: %s", dir, strerror(errno));
        goto fail;
    }
    if (sfi_model_resolve(cfg_path, cfg, e) || sfi_qwen3_write_random(cfg, dir, 1, SFI_DT_F32, e)) {
        rmdir(dir);
        goto fail;
    }
    free(cfg_path);
    free(cfg);
    return dir;
fail:
    free(cfg_path);
    free(dir);
    free(cfg);
    return NULL;
}

static void e2e_remove_generated(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", dir);
    remove(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    remove(p);
    rmdir(dir);
}

/* 1 pass, 0 fail, -1 skipped */
static int run_e2e(const e2e_case *c)
{
    printf("e2e %s: ", c->name);
    fflush(stdout);
    int small = !strcmp(c->dir, "small");
    int gen = !strncmp(c->dir, "gen:", 4);
    char rel[256];
    snprintf(rel, sizeof rel, small ? "models/sfi-small-qwen3" : "tests/fixtures/hf/%s", c->dir);
    char *dir;
    if (gen) {
        sfi_error ge;
        sfi_error_clear(&ge);
        if (!(dir = e2e_generate(c->dir + 4, &ge))) {
            printf("FAIL: %s: %s\n", c->dir + 4, ge.msg);
            return 0;
        }
    } else {
        dir = small ? e2e_path("SFI_SHARED", "../shared", rel) : e2e_path("SFI_SRCDIR", ".", rel);
    }
    char *ids_path = e2e_path("SFI_SRCDIR", ".", "tests/fixtures/hf/real-4k.ids");
    int result = 0;
    sfi_error e;
    sfi_error_clear(&e);
    sfi_qwen3 *m = NULL;
    sfi_tokenizer *tk = NULL;
    sfi_trigger_set ts;
    int have_ts = 0;
    int32_t *ids[4] = {NULL, NULL, NULL, NULL};
    int32_t *stream = NULL;
    sfi_gpu_engine *eng = NULL;
    sfi_gpu_verify *ver = NULL;
    sfi_gpu_run_result res;
    memset(&res, 0, sizeof res);
    struct stat sb;
    if (!dir || !ids_path || stat(dir, &sb) != 0) {
        printf("SKIP: %s is absent\n", dir ? dir : rel);
        free(dir);
        free(ids_path);
        return -1;
    }
    if (sfi_qwen3_load(dir, &m, &e)) {
        printf("FAIL: %s\n", e.msg);
        goto out;
    }
    const sfi_model_config *cfg = sfi_qwen3_config(m);
    sfi_gpu_engine_opts eo;
    sfi_gpu_engine_opts_default(&eo);
    eo.dtype = SFI_GPU_F32;
    eo.exact = c->exact;
    eo.sfi = c->sfi;
    char pbuf[256];
    snprintf(pbuf, sizeof pbuf, "%s", c->params);
    for (char *tok = strtok(pbuf, " "); tok; tok = strtok(NULL, " "))
        if (sfi_params_set(&eo.params, tok, "e2e case", &e)) {
            printf("FAIL: %s\n", e.msg);
            goto out;
        }
    char vp[4096];
    snprintf(vp, sizeof vp, "%s/vocab.json", dir);
    if (stat(vp, &sb) == 0) {
        if (sfi_tokenizer_load(dir, &tk, &e) ||
            sfi_trigger_set_build(sfi_tokenizer_vocab(tk), eo.params.trigger_chars, &ts, &e)) {
            printf("FAIL: %s\n", e.msg);
            goto out;
        }
        have_ts = 1;
        eo.is_trigger = ts.is_trigger;
        eo.n_trigger_vocab = ts.n_vocab;
    }
    /* prompts: slices of a real text (the trained model) or seeded ids */
    int n_stream = 0;
    if (small) {
        size_t len = 0;
        char *txt = NULL;
        if (sfi_io_read(ids_path, (size_t)1 << 20, "token-id file", &txt, &len, &e)) {
            printf("FAIL: %s\n", e.msg);
            goto out;
        }
        size_t n = 0;
        sfi_status st = sfi_token_ids_parse(txt, len, ids_path, &stream, &n, &e);
        free(txt);
        if (st) {
            printf("FAIL: %s\n", e.msg);
            goto out;
        }
        n_stream = n < 8192 ? (int)n : 8192;
    }
    int maxp = 0;
    const int32_t *pp[4];
    int pn[4];
    sfi_gpu_request rq[4];
    memset(rq, 0, sizeof rq);
    for (int b = 0; b < c->B; b++) {
        int n = c->len[b];
        ids[b] = malloc((size_t)n * sizeof(int32_t));
        if (!ids[b])
            goto out;
        for (int i = 0; i < n; i++) {
            if (small) {
                ids[b][i] = stream[(b * 500 + i) % (n_stream > 0 ? n_stream : 1)];
            } else {
                g_rng = 0x9e3779b97f4a7c15ull * (uint64_t)(b * 1000 + i + 1);
                ids[b][i] = (int32_t)((urand() + 1.0f) * 0.5f * (cfg->vocab_size - 1));
            }
        }
        pp[b] = ids[b];
        pn[b] = n;
        rq[b].prompt = ids[b];
        rq[b].n_prompt = n;
        maxp = n > maxp ? n : maxp;
    }
    eo.max_batch = c->B;
    eo.max_new = c->max_new;
    eo.max_ctx = maxp + c->max_new - 1;
    if (eo.max_ctx > cfg->max_position_embeddings) {
        printf("FAIL: case longer than the model's max_position_embeddings\n");
        goto out;
    }
    if (sfi_gpu_engine_create(cfg, m, 1, &eo, &eng, &e) ||
        sfi_gpu_verify_new(c->B, c->max_new, cfg->vocab_size, pp, pn,
                           c->sfi ? SFI_DECODE_SFI : SFI_DECODE_DENSE, 1, &ver, &e) ||
        sfi_gpu_engine_run(eng, rq, c->B, sfi_gpu_verify_observer(ver), 0, &res, &e)) {
        printf("FAIL: %s\n", e.msg);
        goto out;
    }
    sfi_decode_opts ro;
    sfi_decode_opts_default(&ro);
    ro.mode = c->sfi ? SFI_DECODE_SFI : SFI_DECODE_DENSE;
    ro.params = eo.params;
    ro.is_trigger = eo.is_trigger;
    ro.n_trigger_vocab = eo.n_trigger_vocab;
    ro.max_new = c->max_new;
    sfi_gpu_verify_report rep[4];
    printf("\n");
    int failed = sfi_gpu_verify_reference(ver, m, &ro, &res, c->exact, 1e-4, stdout, rep);
    g_checks += c->B;
    g_fail += failed;
    printf("e2e %s: %s\n", c->name, failed ? "FAILED" : "passed");
    result = failed ? 0 : 1;
out:
    sfi_gpu_run_result_free(&res);
    sfi_gpu_verify_free(ver);
    sfi_gpu_engine_free(eng);
    for (int b = 0; b < 4; b++)
        free(ids[b]);
    free(stream);
    if (have_ts)
        sfi_trigger_set_free(&ts);
    sfi_tokenizer_free(tk);
    sfi_qwen3_free(m);
    if (gen && dir)
        e2e_remove_generated(dir);
    free(dir);
    free(ids_path);
    return result;
}

/* The fused q/k norm, RoPE and KV append (sfi_gpu_attn_fuse) against the
 * separate kernel: a random bf16 model of head_dim 128 in groups of 2 or
 * 4 (the groups the engine fuses), SFI mode, three requests whose slow
 * steps come from T_max alone (no trigger set), so most steps have no
 * slow request. Fused never, in
 * those steps and in every step: each step's logits, each slow step's
 * selected sets, the ids and the step kinds must be the same bits (one
 * digest a run). */
static sfi_status fuse_on_step(void *u, int b, int step, int kind, int reason, int32_t token,
                               const float *lg, int vocab, sfi_error *err)
{
    (void)err;
    const int32_t hdr[5] = {b, step, kind, reason, token};
    sfi_hasher_update_i32(u, hdr, 5);
    sfi_hasher_update_f32(u, lg, (size_t)vocab);
    return SFI_OK;
}

static sfi_status fuse_on_selected(void *u, int b, int step, int layer, const int32_t *sel,
                                   int n_kv, int K, int n_sel, sfi_error *err)
{
    (void)err;
    const int32_t hdr[4] = {b, step, layer, n_sel};
    sfi_hasher_update_i32(u, hdr, 4);
    for (int k = 0; k < n_kv; k++)
        sfi_hasher_update_i32(u, sel + (size_t)k * K, (size_t)n_sel);
    return SFI_OK;
}

static int run_fuse_e2e(int ci, const char *name, const char *config)
{
    enum { B = 3, MAX_NEW = 96 };
    const int len[B] = {300, 190, 257};
    printf("e2e %s: ", name);
    fflush(stdout);
    sfi_error e;
    sfi_error_clear(&e);
    int result = 0;
    sfi_qwen3 *m = NULL;
    int32_t *ids[B] = {NULL, NULL, NULL};
    char dg[3][SFI_DIGEST_HEX_LEN + 1];
    char *dir = e2e_generate(config, &e);
    if (!dir || sfi_qwen3_load(dir, &m, &e)) {
        printf("FAIL: %s\n", e.msg);
        goto out;
    }
    const sfi_model_config *cfg = sfi_qwen3_config(m);
    sfi_gpu_request rq[B];
    memset(rq, 0, sizeof rq);
    for (int b = 0; b < B; b++) {
        if (!(ids[b] = malloc((size_t)len[b] * sizeof(int32_t)))) {
            printf("FAIL: out of memory\n");
            goto out;
        }
        for (int i = 0; i < len[b]; i++) {
            g_rng = 0x9e3779b97f4a7c15ull * (uint64_t)(b * 1000 + i + 1);
            ids[b][i] = (int32_t)((urand() + 1.0f) * 0.5f * (cfg->vocab_size - 1));
        }
        rq[b].prompt = ids[b];
        rq[b].n_prompt = len[b];
    }
    for (int f = 0; f < 3; f++) {
        sfi_gpu_engine_opts eo;
        sfi_gpu_engine_opts_default(&eo);
        eo.dtype = SFI_GPU_BF16;
        eo.sfi = 1;
        eo.qkv_fuse = f;
        eo.max_batch = B;
        eo.max_new = MAX_NEW;
        eo.max_ctx = len[0] + MAX_NEW - 1;
        const char *prm[] = {"n_recent=32", "K=16", "T_max=8"};
        for (int i = 0; i < 3; i++)
            if (sfi_params_set(&eo.params, prm[i], "fuse case", &e)) {
                printf("FAIL: %s\n", e.msg);
                goto out;
            }
        sfi_hasher h = {0};
        sfi_gpu_engine *eng = NULL;
        sfi_gpu_run_result res;
        memset(&res, 0, sizeof res);
        const sfi_gpu_observer obs = {&h, fuse_on_step, fuse_on_selected};
        sfi_status rc = sfi_hasher_init(&h, &e);
        if (!rc)
            rc = sfi_gpu_engine_create(cfg, m, 1, &eo, &eng, &e);
        if (!rc)
            rc = sfi_gpu_engine_run(eng, rq, B, &obs, 0, &res, &e);
        if (!rc)
            rc = sfi_hasher_final_hex(&h, dg[f], NULL, &e);
        else
            sfi_hasher_free(&h);
        sfi_gpu_run_result_free(&res);
        sfi_gpu_engine_free(eng);
        if (rc) {
            printf("FAIL: %s\n", e.msg);
            goto out;
        }
    }
    const int fast_same = !strcmp(dg[0], dg[1]), all_same = !strcmp(dg[0], dg[2]);
    printf("\n");
    report(ci, "fused, fast steps", fast_same, "%s", fast_same ? "bit-identical" : "bits differ");
    report(ci, "fused, every step", all_same, "%s", all_same ? "bit-identical" : "bits differ");
    printf("e2e %s: %s\n", name, fast_same && all_same ? "passed" : "FAILED");
    result = fast_same && all_same;
out:
    for (int b = 0; b < B; b++)
        free(ids[b]);
    sfi_qwen3_free(m);
    if (dir)
        e2e_remove_generated(dir);
    free(dir);
    return result;
}

static void check_usage(FILE *f)
{
    fputs("usage: sfi-gpu check [--bit-exact] [--quick] [--kernels-only] [--seed N]\n"
          "\n"
          "Runs a fixed, seeded suite of cases through the GPU kernels and through the\n"
          "reference (dense attention and logits, Selector, Top-K, reorg, two-segment\n"
          "sparse attention), the decode GEMM's two kernels through a float64 product,\n"
          "the grouped MoE experts of prefill against the per-pair products of decode,\n"
          "and prints one line per case and check; then end-to-end\n"
          "cases: the decode engine of sfi-gpu run against sfi-ref's decode loop on\n"
          "the test fixtures and (from $SFI_SHARED) the trained model, and the fused\n"
          "q/k norm against the separate kernel, bit for bit.\n"
          "\n"
          "  --bit-exact  also run the exact kernels on the f32 cases: outputs, logits,\n"
          "               lambda*, scores and selected sets identical bit for bit\n"
          "  --quick      twelve kernel cases (the first six and those of GQA groups\n"
          "               of 5, 6, 12 and 16), three GEMM cases, two MoE cases and eight\n"
          "               end-to-end cases\n"
          "  --kernels-only  no end-to-end cases\n"
          "  --seed N     seed of the random inputs (default 1)\n"
          "  -h, --help   this help\n"
          "\n"
          "Exit status: 0 all passed, 1 a mismatch or CUDA error, 2 usage error,\n"
          "77 no usable CUDA device. See sfi-gpu(1).\n",
          f);
}

int sfi_gpu_cmd_check(int argc, char **argv)
{
    int bit_exact = 0, quick = 0, no_e2e = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            check_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--bit-exact"))
            bit_exact = 1;
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--kernels-only"))
            no_e2e = 1;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            if (sfi_parse_u64(argv[++i], &seed)) {
                fprintf(stderr, "sfi-gpu check: --seed '%s': not a number\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "sfi-gpu check: unknown or incomplete option '%s' (try --help)\n",
                    argv[i]);
            return 2;
        }
    }
    char msg[256];
    if (!sfi_gpu_device_ok(msg, sizeof msg)) {
        printf("sfi-gpu check: %s\n", msg);
        return SFI_GPU_EXIT_NODEV;
    }
    printf("device: %s\n", msg);
    const int n_cases = (int)(sizeof k_cases / sizeof k_cases[0]);
    int n = 0, passed = 0, skipped = 0;
    /* a case keeps its index (and so its random inputs) under --quick */
    for (int i = 0; i < n_cases; i++) {
        if (quick && i >= N_QUICK && i < n_cases - N_QUICK_TAIL)
            continue;
        passed += run_case(i, &k_cases[i], bit_exact, seed);
        n++;
    }
    const int n_gemm = quick ? N_GEMM_QUICK : (int)(sizeof k_gemm / sizeof k_gemm[0]);
    for (int i = 0; i < n_gemm; i++)
        passed += run_gemm_case(n + i, &k_gemm[i], seed);
    n += n_gemm;
    const int n_moe = quick ? N_MOE_QUICK : (int)(sizeof k_moe / sizeof k_moe[0]);
    for (int i = 0; i < n_moe; i++)
        passed += run_moe_case(n + i, &k_moe[i], seed);
    n += n_moe;
    if (!no_e2e) {
        for (size_t i = 0; i < sizeof k_e2e / sizeof k_e2e[0]; i++) {
            if (quick && !k_e2e[i].quick)
                continue;
            if (!quick && k_e2e[i].quick && strstr(k_e2e[i].name, "(quick)"))
                continue;
            int r = run_e2e(&k_e2e[i]);
            n++;
            if (r < 0)
                skipped++;
            else
                passed += r;
        }
        passed += run_fuse_e2e(n, "d128-g2 bf16 fused q/k norm", "tests/fixtures/gqa/d128.json");
        n++;
        passed += run_fuse_e2e(n, "d128-g4 bf16 fused q/k norm", "tests/fixtures/gqa/d128-g4.json");
        n++;
    }
    if (passed + skipped == n) {
        printf("check: all %d cases passed (%d checks%s)", n - skipped, g_checks,
               bit_exact ? ", bit-exact on f32" : "");
        if (skipped)
            printf("; %d end-to-end case%s skipped (no trained model)", skipped,
                   skipped > 1 ? "s" : "");
        printf("\n");
        return 0;
    }
    printf("check: %d of %d cases FAILED (%d of %d checks)\n", n - skipped - passed, n - skipped,
           g_fail, g_checks);
    return 1;
}
