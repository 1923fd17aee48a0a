/* Qwen3 forward pass of the reference; see sfi_qwen3.h.
 *
 * Evaluation order (scalar backend), chosen to follow transformers'
 * Qwen3/Qwen3-MoE modules operation for operation:
 *   matrix-vector y[i] = sfi_dot(W[i], x) (ascending, one accumulator), then
 *     + bias when the config has attention_bias;
 *   RMSNorm y = w * (x * (1 / sqrt(sum_asc(x*x) / n + eps)));
 *   RoPE (rotate-half form) with inv_freq[i] = theta^(-2i/d) and angle
 *     pos * inv_freq[i] rounded to float as transformers does, cos/sin of
 *     that float angle from the double routines below rounded to float;
 *   SiLU x / (1 + exp(-x)) with sfi_expf;
 *   MoE: softmax of router logits (sfi_softmax), top-k by value (ties to
 *     the smaller expert), weights divided by their sum (taken in
 *     descending-value order) when norm_topk_prob, outputs accumulated in
 *     ascending expert order.
 * The double routines (exp, log, sin, cos) are ours, built from IEEE
 * +,-,*,/ only, so the RoPE tables are the same bits on every host. */
#include <config.h>

#include "sfi_qwen3.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_attention.h"
#include "sfi_io.h"
#include "sfi_math.h"
#include "sfi_progress.h"
#include "sfi_rng.h"
#include "sfi_safetensors.h"

#ifdef SFI_HAVE_OPENBLAS
#include <cblas.h>
#endif

typedef struct {
    float *in_norm, *post_norm;
    float *wq, *wk, *wv, *wo;
    float *bq, *bk, *bv, *bo;
    float *q_norm, *k_norm;
    int moe;
    float *w_gate, *w_up, *w_down; /* dense MLP */
    float *router;                 /* [E][H] */
    float **e_gate, **e_up, **e_down;
} qlayer;

struct sfi_qwen3 {
    sfi_model_config cfg;
    float *embed;   /* [V][H] */
    float *lm_head; /* == embed when tied */
    float *final_norm;
    qlayer *layers;
    float *inv_freq; /* [head_dim/2] */
    uint64_t bytes;
};

/* ---- deterministic double-precision elementary functions ---- */

static double d_scale2(double x, int k)
{
    /* x * 2^k for |k| < 1000 through exact power-of-two factors */
    while (k > 1000) {
        x *= 0x1p1000;
        k -= 1000;
    }
    while (k < -1000) {
        x *= 0x1p-1000;
        k += 1000;
    }
    uint64_t bits = (uint64_t)(k + 1023) << 52;
    double p;
    memcpy(&p, &bits, 8);
    return x * p;
}

static double d_exp(double x)
{
    static const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    double kd = x * 1.44269504088896338700 + (x >= 0 ? 0.5 : -0.5);
    int k = (int)kd;
    double r = (x - k * ln2_hi) - k * ln2_lo; /* |r| <= ln2/2 */
    double term = 1.0, sum = 1.0;
    for (int i = 1; i <= 18; i++) {
        term = term * r / i;
        sum += term;
    }
    return d_scale2(sum, k);
}

static double d_log(double x) /* x > 0, finite, normal */
{
    static const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    uint64_t bits;
    memcpy(&bits, &x, 8);
    int e = (int)((bits >> 52) & 0x7ff) - 1023;
    bits = (bits & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL;
    double m;
    memcpy(&m, &bits, 8);
    if (m > 1.41421356237309504880) {
        m *= 0.5;
        e++;
    }
    double s = (m - 1.0) / (m + 1.0), s2 = s * s, term = s, sum = 0.0;
    for (int i = 1; i <= 41; i += 2) {
        sum += term / i;
        term *= s2;
    }
    return (e * ln2_lo + 2.0 * sum) + e * ln2_hi;
}

/* sin and cos of x, 0 <= x < 2^20 */
static void d_sincos(double x, double *s, double *c)
{
    static const double pio2_1 = 1.57079632673412561417e+00, pio2_2 = 6.07710050630396597660e-11,
                        pio2_3 = 2.02226624871116645580e-21, pio2_3t = 8.47842766036889956997e-32;
    double kd = x * 6.36619772367581382433e-01 + 0.5;
    long k = (long)kd;
    /* Cody-Waite: k < 2^21 and each pio2_i has <= 33 significant bits, so
     * every k * pio2_i is exact */
    double r = ((x - k * pio2_1) - k * pio2_2) - k * pio2_3;
    r -= k * pio2_3t;
    double r2 = r * r;
    double sn = 0.0, cs = 0.0, ts = r, tc = 1.0;
    for (int i = 1; i <= 21; i += 2) {
        sn += ts;
        ts = -ts * r2 / ((i + 1) * (i + 2));
    }
    for (int i = 0; i <= 20; i += 2) {
        cs += tc;
        tc = -tc * r2 / ((i + 1) * (i + 2));
    }
    switch (k & 3) {
    case 0:
        *s = sn;
        *c = cs;
        break;
    case 1:
        *s = cs;
        *c = -sn;
        break;
    case 2:
        *s = -sn;
        *c = -cs;
        break;
    default:
        *s = -cs;
        *c = sn;
        break;
    }
}

/* ---- backends ---- */

const char *sfi_backend_name(sfi_backend b)
{
    return b == SFI_BACKEND_BLAS ? "blas" : "scalar";
}

int sfi_backend_available(sfi_backend b)
{
#ifdef SFI_HAVE_OPENBLAS
    (void)b;
    return 1;
#else
    return b == SFI_BACKEND_SCALAR;
#endif
}

sfi_status sfi_backend_parse(const char *s, sfi_backend *b, sfi_error *err)
{
    if (!strcmp(s, "scalar")) {
        *b = SFI_BACKEND_SCALAR;
        return SFI_OK;
    }
    if (!strcmp(s, "blas")) {
        if (!sfi_backend_available(SFI_BACKEND_BLAS))
            return sfi_error_set(err, SFI_EUNSUPPORTED,
                                 "backend blas: this build has no OpenBLAS (configure "
                                 "--with-openblas)");
        *b = SFI_BACKEND_BLAS;
        return SFI_OK;
    }
    return sfi_error_set(err, SFI_EINVAL, "backend '%s': expected scalar or blas", s);
}

/* y[M] = W[M][N] x[N] (+ b) */
static void matvec(sfi_backend be, const float *W, const float *x, const float *b, int M, int N,
                   float *y)
{
#ifdef SFI_HAVE_OPENBLAS
    if (be == SFI_BACKEND_BLAS) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, M, N, 1.0f, W, N, x, 1, 0.0f, y, 1);
        if (b)
            for (int i = 0; i < M; i++)
                y[i] += b[i];
        return;
    }
#else
    (void)be;
#endif
    /* Eight rows at a time: each row still sums its products in ascending
     * order into one float accumulator from 0.0f (exactly sfi_dot), but the
     * eight independent sums overlap in the pipeline (and may share SIMD
     * lanes), which does not change a single bit. */
    int i = 0;
    for (; i + 8 <= M; i += 8) {
        const float *w0 = W + (size_t)i * N;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f, a4 = 0.0f, a5 = 0.0f, a6 = 0.0f,
              a7 = 0.0f;
        for (int j = 0; j < N; j++) {
            float xj = x[j];
            a0 += w0[j] * xj;
            a1 += w0[(size_t)N + j] * xj;
            a2 += w0[2 * (size_t)N + j] * xj;
            a3 += w0[3 * (size_t)N + j] * xj;
            a4 += w0[4 * (size_t)N + j] * xj;
            a5 += w0[5 * (size_t)N + j] * xj;
            a6 += w0[6 * (size_t)N + j] * xj;
            a7 += w0[7 * (size_t)N + j] * xj;
        }
        float a[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
        for (int r = 0; r < 8; r++)
            y[i + r] = b ? a[r] + b[i + r] : a[r];
    }
    for (; i < M; i++) {
        float d = sfi_dot(W + (size_t)i * N, x, (size_t)N);
        y[i] = b ? d + b[i] : d;
    }
}

static void rmsnorm(const float *x, const float *w, int n, float eps, float *y)
{
    float ss = 0.0f;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    float r = 1.0f / sfi_sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++)
        y[i] = w[i] * (x[i] * r);
}

static float silu(float x)
{
    return x / (1.0f + sfi_expf(-x));
}

/* ---- loading ---- */

static void layer_free(qlayer *L, int n_experts)
{
    free(L->in_norm);
    free(L->post_norm);
    free(L->wq);
    free(L->wk);
    free(L->wv);
    free(L->wo);
    free(L->bq);
    free(L->bk);
    free(L->bv);
    free(L->bo);
    free(L->q_norm);
    free(L->k_norm);
    free(L->w_gate);
    free(L->w_up);
    free(L->w_down);
    free(L->router);
    for (int e = 0; e < n_experts; e++) {
        if (L->e_gate)
            free(L->e_gate[e]);
        if (L->e_up)
            free(L->e_up[e]);
        if (L->e_down)
            free(L->e_down[e]);
    }
    free(L->e_gate);
    free(L->e_up);
    free(L->e_down);
}

void sfi_qwen3_free(sfi_qwen3 *m)
{
    if (!m)
        return;
    if (m->layers)
        for (int l = 0; l < m->cfg.num_hidden_layers; l++)
            layer_free(&m->layers[l], m->cfg.num_experts);
    free(m->layers);
    if (m->lm_head != m->embed)
        free(m->lm_head);
    free(m->embed);
    free(m->final_norm);
    free(m->inv_freq);
    free(m);
}

const sfi_model_config *sfi_qwen3_config(const sfi_qwen3 *m)
{
    return &m->cfg;
}
uint64_t sfi_qwen3_weight_bytes(const sfi_qwen3 *m)
{
    return m->bytes;
}

typedef struct {
    sfi_safetensors *st;
    unsigned char *used; /* per tensor of st */
    sfi_qwen3 *m;
    sfi_error *err;
} loader;

static sfi_status get(loader *ld, float **out, int ndim, int64_t d0, int64_t d1, const char *fmt,
                      ...) __attribute__((format(printf, 6, 7)));

static sfi_status get(loader *ld, float **out, int ndim, int64_t d0, int64_t d1, const char *fmt,
                      ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t shape[2] = {d0, d1};
    sfi_status rc = sfi_st_load_f32(ld->st, name, ndim, shape, -1, out, ld->err);
    if (rc)
        return rc;
    const sfi_st_tensor *t = sfi_st_find(ld->st, name);
    ld->used[t - sfi_st_tensor_at(ld->st, 0)] = 1;
    ld->m->bytes += t->numel * 4;
    return SFI_OK;
}

static sfi_status load_layer(loader *ld, int l)
{
    const sfi_model_config *c = &ld->m->cfg;
    qlayer *L = &ld->m->layers[l];
    int H = c->hidden_size, hd = c->head_dim;
    int64_t nq = (int64_t)c->num_attention_heads * hd, nkv = (int64_t)c->num_key_value_heads * hd;
    const char *p = "model.layers";
    sfi_status rc;
#define GET(dst, nd, a, b, suffix)                                                                 \
    do {                                                                                           \
        if ((rc = get(ld, &(dst), nd, a, b, "%s.%d.%s", p, l, suffix)))                            \
            return rc;                                                                             \
    } while (0)
    GET(L->in_norm, 1, H, 0, "input_layernorm.weight");
    GET(L->post_norm, 1, H, 0, "post_attention_layernorm.weight");
    GET(L->wq, 2, nq, H, "self_attn.q_proj.weight");
    GET(L->wk, 2, nkv, H, "self_attn.k_proj.weight");
    GET(L->wv, 2, nkv, H, "self_attn.v_proj.weight");
    GET(L->wo, 2, H, nq, "self_attn.o_proj.weight");
    GET(L->q_norm, 1, hd, 0, "self_attn.q_norm.weight");
    GET(L->k_norm, 1, hd, 0, "self_attn.k_norm.weight");
    if (c->attention_bias) {
        GET(L->bq, 1, nq, 0, "self_attn.q_proj.bias");
        GET(L->bk, 1, nkv, 0, "self_attn.k_proj.bias");
        GET(L->bv, 1, nkv, 0, "self_attn.v_proj.bias");
        GET(L->bo, 1, H, 0, "self_attn.o_proj.bias");
    }
    L->moe = c->arch == SFI_ARCH_QWEN3_MOE && sfi_model_layer_is_moe(c, l);
    if (!L->moe) {
        int NI = c->intermediate_size;
        GET(L->w_gate, 2, NI, H, "mlp.gate_proj.weight");
        GET(L->w_up, 2, NI, H, "mlp.up_proj.weight");
        GET(L->w_down, 2, H, NI, "mlp.down_proj.weight");
    } else {
        int E = c->num_experts, NI = c->moe_intermediate_size;
        GET(L->router, 2, E, H, "mlp.gate.weight");
        L->e_gate = calloc((size_t)E, sizeof(float *));
        L->e_up = calloc((size_t)E, sizeof(float *));
        L->e_down = calloc((size_t)E, sizeof(float *));
        if (!L->e_gate || !L->e_up || !L->e_down)
            return sfi_error_set(ld->err, SFI_ENOMEM, "out of memory");
        for (int e = 0; e < E; e++) {
            char s[96];
            snprintf(s, sizeof s, "mlp.experts.%d.gate_proj.weight", e);
            GET(L->e_gate[e], 2, NI, H, s);
            snprintf(s, sizeof s, "mlp.experts.%d.up_proj.weight", e);
            GET(L->e_up[e], 2, NI, H, s);
            snprintf(s, sizeof s, "mlp.experts.%d.down_proj.weight", e);
            GET(L->e_down[e], 2, H, NI, s);
        }
    }
#undef GET
    return SFI_OK;
}

sfi_status sfi_qwen3_load(const char *dir, sfi_qwen3 **out, sfi_error *err)
{
    *out = NULL;
    sfi_qwen3 *m = calloc(1, sizeof *m);
    if (!m)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    sfi_status rc = sfi_model_config_load(dir, &m->cfg, err);
    if (rc) {
        free(m);
        return rc;
    }
    const sfi_model_config *c = &m->cfg;
    /* (An odd head_dim is refused by the config's validation.) */
    if (c->arch == SFI_ARCH_QWEN3_MOE &&
        (c->num_experts < 1 || c->num_experts > 1024 || c->num_experts_per_tok < 1 ||
         c->num_experts_per_tok > 64 || c->num_experts_per_tok > c->num_experts))
        rc = sfi_error_set(err, SFI_EUNSUPPORTED,
                           "%s/config.json: %d experts, %d per token: sfi-ref handles 1..1024 "
                           "experts and 1..64 (at most num_experts) per token",
                           dir, c->num_experts, c->num_experts_per_tok);
    if (rc) {
        free(m);
        return rc;
    }
    loader ld = {.m = m, .err = err};
    rc = sfi_st_open(dir, &ld.st, err);
    if (rc) {
        free(m);
        return rc;
    }
    ld.used = calloc(sfi_st_count(ld.st) + 1, 1);
    m->layers = calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    m->inv_freq = malloc((size_t)(c->head_dim / 2) * sizeof(float));
    if (!ld.used || !m->layers || !m->inv_freq) {
        rc = sfi_error_set(err, SFI_ENOMEM, "out of memory");
        goto done;
    }
    int H = c->hidden_size, V = c->vocab_size;
    if ((rc = get(&ld, &m->embed, 2, V, H, "model.embed_tokens.weight")))
        goto done;
    if ((rc = get(&ld, &m->final_norm, 1, H, 0, "model.norm.weight")))
        goto done;
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
        /* some writers store the tied copy anyway: accept, ignore */
        const sfi_st_tensor *t = sfi_st_find(ld.st, "lm_head.weight");
        if (t)
            ld.used[t - sfi_st_tensor_at(ld.st, 0)] = 1;
    } else if ((rc = get(&ld, &m->lm_head, 2, V, H, "lm_head.weight"))) {
        goto done;
    }
    for (int l = 0; l < c->num_hidden_layers; l++)
        if ((rc = load_layer(&ld, l)))
            goto done;
    for (size_t i = 0; i < sfi_st_count(ld.st); i++)
        if (!ld.used[i]) {
            const sfi_st_tensor *t = sfi_st_tensor_at(ld.st, i);
            rc = sfi_error_set(err, SFI_EFORMAT,
                               "%s: tensor %s is not part of the model config.json describes "
                               "(config/checkpoint mismatch?)",
                               t->file, t->name);
            goto done;
        }
    /* inv_freq[i] = theta^(-2i/d), rounded to float as transformers keeps it */
    double lt = d_log(c->rope_theta);
    for (int i = 0; i < c->head_dim / 2; i++)
        m->inv_freq[i] = (float)d_exp(-lt * (2.0 * i / c->head_dim));
done:
    free(ld.used);
    sfi_st_close(ld.st);
    if (rc) {
        sfi_qwen3_free(m);
        return rc;
    }
    *out = m;
    return SFI_OK;
}

/* ---- KV cache ---- */

/* scratch layout inside the cache's allocation: see step() */
static size_t scratch_floats(const sfi_model_config *c)
{
    size_t H = (size_t)c->hidden_size, nq = (size_t)c->num_attention_heads * c->head_dim;
    size_t nkv = (size_t)c->num_key_value_heads * c->head_dim;
    size_t NI = (size_t)c->intermediate_size;
    if ((size_t)c->moe_intermediate_size > NI)
        NI = (size_t)c->moe_intermediate_size;
    /* one token's block layout (forward_block), then the MoE extras */
    return 3 * H + 2 * nq + 2 * nkv + 2 * NI + (size_t)c->head_dim + (size_t)c->num_experts +
           2 * H + 2 * NI;
}

sfi_status sfi_kv_cache_init(sfi_kv_cache *c, const sfi_model_config *cfg, int capacity,
                             sfi_error *err)
{
    memset(c, 0, sizeof *c);
    if (capacity < 1)
        return sfi_error_set(err, SFI_EINVAL, "KV cache capacity %d < 1", capacity);
    c->n_layers = cfg->num_hidden_layers;
    c->n_kv_heads = cfg->num_key_value_heads;
    c->head_dim = cfg->head_dim;
    c->capacity = capacity;
    size_t per = (size_t)c->n_layers * (size_t)capacity * (size_t)c->n_kv_heads;
    c->k = malloc(per * (size_t)c->head_dim * sizeof(float));
    c->v = malloc(per * (size_t)c->head_dim * sizeof(float));
    c->key_norms = malloc(per * sizeof(float));
    c->scratch = malloc(scratch_floats(cfg) * sizeof(float));
    if (!c->k || !c->v || !c->key_norms || !c->scratch) {
        sfi_kv_cache_free(c);
        return sfi_error_set(err, SFI_ENOMEM, "KV cache of %d positions: out of memory (%.1f GiB)",
                             capacity, (double)per * c->head_dim * 8 / (1024.0 * 1024 * 1024));
    }
    return SFI_OK;
}

void sfi_kv_cache_free(sfi_kv_cache *c)
{
    free(c->k);
    free(c->v);
    free(c->key_norms);
    free(c->scratch);
    memset(c, 0, sizeof *c);
}

sfi_status sfi_kv_cache_copy(sfi_kv_cache *dst, const sfi_kv_cache *src, sfi_error *err)
{
    if (dst->n_layers != src->n_layers || dst->n_kv_heads != src->n_kv_heads ||
        dst->head_dim != src->head_dim || dst->capacity < src->n)
        return sfi_error_set(err, SFI_EINVAL,
                             "KV cache copy: shapes differ or %d positions do not fit in %d",
                             src->n, dst->capacity);
    size_t row = (size_t)src->n_kv_heads * src->head_dim;
    for (int l = 0; l < src->n_layers; l++) {
        memcpy(sfi_kv_k(dst, l), sfi_kv_k(src, l), (size_t)src->n * row * sizeof(float));
        memcpy(sfi_kv_v(dst, l), sfi_kv_v(src, l), (size_t)src->n * row * sizeof(float));
        for (int h = 0; h < src->n_kv_heads; h++)
            memcpy(dst->key_norms + ((size_t)l * dst->n_kv_heads + h) * dst->capacity,
                   src->key_norms + ((size_t)l * src->n_kv_heads + h) * src->capacity,
                   (size_t)src->n * sizeof(float));
    }
    dst->n = src->n;
    return SFI_OK;
}

float *sfi_kv_k(const sfi_kv_cache *c, int layer)
{
    return c->k + (size_t)layer * c->capacity * c->n_kv_heads * c->head_dim;
}

float *sfi_kv_v(const sfi_kv_cache *c, int layer)
{
    return c->v + (size_t)layer * c->capacity * c->n_kv_heads * c->head_dim;
}

/* ---- attention through the backend ---- */

sfi_status sfi_qwen3_attn_dense(const sfi_qwen3 *m, sfi_backend be, int layer, const float *q,
                                const sfi_kv_cache *kv, int n_ctx, float *out, float *logits,
                                sfi_error *err)
{
    const sfi_model_config *c = &m->cfg;
    const float *K = sfi_kv_k(kv, layer), *V = sfi_kv_v(kv, layer);
#ifdef SFI_HAVE_OPENBLAS
    if (be == SFI_BACKEND_BLAS) {
        int nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim;
        int G = nh / nkv, ld = nkv * hd;
        float scale = 1.0f / sfi_sqrtf((float)hd);
        float *P = logits;
        float *own = NULL;
        if (!P) {
            own = malloc((size_t)nh * n_ctx * sizeof(float));
            if (!own)
                return sfi_error_set(err, SFI_ENOMEM, "attention: out of memory");
            P = own;
        }
        for (int g = 0; g < nkv; g++) {
            /* S[G][n_ctx] = scale * Q_g[G][hd] K_g^T, K_g rows strided by ld */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, G, n_ctx, hd, scale,
                        q + (size_t)g * G * hd, hd, K + (size_t)g * hd, ld, 0.0f,
                        P + (size_t)g * G * n_ctx, n_ctx);
        }
        float *probs = P;
        float *tmp = NULL;
        if (logits) {
            /* keep the caller's logits; softmax a copy */
            tmp = malloc((size_t)nh * n_ctx * sizeof(float));
            if (!tmp) {
                free(own);
                return sfi_error_set(err, SFI_ENOMEM, "attention: out of memory");
            }
            memcpy(tmp, P, (size_t)nh * n_ctx * sizeof(float));
            probs = tmp;
        }
        for (int h = 0; h < nh; h++)
            sfi_softmax(probs + (size_t)h * n_ctx, (size_t)n_ctx);
        for (int g = 0; g < nkv; g++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, G, hd, n_ctx, 1.0f,
                        probs + (size_t)g * G * n_ctx, n_ctx, V + (size_t)g * hd, ld, 0.0f,
                        out + (size_t)g * G * hd, hd);
        free(tmp);
        free(own);
        return SFI_OK;
    }
#else
    (void)be;
#endif
    sfi_attn_shape s = {c->num_attention_heads, c->num_key_value_heads, c->head_dim};
    return sfi_attn_dense_decode(&s, q, K, V, n_ctx, out, logits, err);
}

sfi_status sfi_qwen3_attn_sparse(const sfi_qwen3 *m, sfi_backend be, int layer, const float *q,
                                 const sfi_kv_cache *kv, int n_ctx, const int32_t *const *idx,
                                 const int *n_idx, float *out, sfi_error *err)
{
    const sfi_model_config *c = &m->cfg;
    const float *K = sfi_kv_k(kv, layer), *V = sfi_kv_v(kv, layer);
#ifdef SFI_HAVE_OPENBLAS
    if (be == SFI_BACKEND_BLAS) {
        int nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim;
        int G = nh / nkv, ld = nkv * hd, nmax = 0;
        for (int g = 0; g < nkv; g++) {
            if (n_idx[g] < 1)
                return sfi_error_set(err, SFI_EINVAL, "sparse attention: empty set of KV head %d",
                                     g);
            for (int i = 0; i < n_idx[g]; i++)
                if (idx[g][i] < 0 || idx[g][i] >= n_ctx)
                    return sfi_error_set(err, SFI_EINVAL,
                                         "sparse attention: position %d outside 0..%d",
                                         (int)idx[g][i], n_ctx - 1);
            if (n_idx[g] > nmax)
                nmax = n_idx[g];
        }
        float *kg = malloc((size_t)nmax * hd * sizeof(float));
        float *vg = malloc((size_t)nmax * hd * sizeof(float));
        float *S = malloc((size_t)G * nmax * sizeof(float));
        if (!kg || !vg || !S) {
            free(kg);
            free(vg);
            free(S);
            return sfi_error_set(err, SFI_ENOMEM, "sparse attention: out of memory");
        }
        float scale = 1.0f / sfi_sqrtf((float)hd);
        for (int g = 0; g < nkv; g++) {
            int n = n_idx[g];
            /* gather the set's rows, then the same two products as dense */
            for (int i = 0; i < n; i++) {
                memcpy(kg + (size_t)i * hd, K + (size_t)idx[g][i] * ld + (size_t)g * hd,
                       (size_t)hd * sizeof(float));
                memcpy(vg + (size_t)i * hd, V + (size_t)idx[g][i] * ld + (size_t)g * hd,
                       (size_t)hd * sizeof(float));
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, G, n, hd, scale,
                        q + (size_t)g * G * hd, hd, kg, hd, 0.0f, S, n);
            for (int i = 0; i < G; i++)
                sfi_softmax(S + (size_t)i * n, (size_t)n);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, G, hd, n, 1.0f, S, n, vg, hd,
                        0.0f, out + (size_t)g * G * hd, hd);
        }
        free(kg);
        free(vg);
        free(S);
        return SFI_OK;
    }
#else
    (void)be;
#endif
    sfi_attn_shape s = {c->num_attention_heads, c->num_key_value_heads, c->head_dim};
    return sfi_attn_sparse_decode(&s, q, K, V, n_ctx, idx, n_idx, out, err);
}

/* ---- one token ---- */

int32_t sfi_argmax(const float *logits, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

static void rope(float *x, const float *cs, const float *sn, int hd)
{
    int h2 = hd / 2;
    for (int i = 0; i < h2; i++) {
        float a = x[i], b = x[i + h2];
        x[i] = a * cs[i] - b * sn[i];
        x[i + h2] = b * cs[i] + a * sn[i];
    }
}

static void mlp(sfi_backend be, const float *wg, const float *wu, const float *wd, int H, int NI,
                const float *x, float *g, float *u, float *y)
{
    matvec(be, wg, x, NULL, NI, H, g);
    matvec(be, wu, x, NULL, NI, H, u);
    for (int i = 0; i < NI; i++)
        g[i] = silu(g[i]) * u[i];
    matvec(be, wd, g, NULL, H, NI, y);
}

/* Y[T][M] = X[T][N] W[M][N]^T (+ b): per token exactly matvec's sums */
static void matmul(sfi_backend be, const float *W, const float *X, const float *b, int T, int M,
                   int N, float *Y)
{
#ifdef SFI_HAVE_OPENBLAS
    if (be == SFI_BACKEND_BLAS && T > 1) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, M, N, 1.0f, X, N, W, N, 0.0f, Y, M);
        if (b)
            for (int t = 0; t < T; t++)
                for (int i = 0; i < M; i++)
                    Y[(size_t)t * M + i] += b[i];
        return;
    }
#endif
    for (int t = 0; t < T; t++)
        matvec(be, W, X + (size_t)t * N, b, M, N, Y + (size_t)t * M);
}

static void moe_token(const sfi_qwen3 *m, sfi_backend be, const qlayer *L, const float *x,
                      float *rp, float *g, float *u, float *tmp, float *acc)
{
    const sfi_model_config *c = &m->cfg;
    int H = c->hidden_size, E = c->num_experts, top = c->num_experts_per_tok;
    int Im = c->moe_intermediate_size;
    matvec(be, L->router, x, NULL, E, H, rp);
    sfi_softmax(rp, (size_t)E);
    /* top-k by selection: descending value, ties to the smaller expert */
    int sel[64];
    float w[64];
    unsigned char taken[1024];
    memset(taken, 0, (size_t)E);
    for (int t = 0; t < top; t++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || rp[e] > rp[best]))
                best = e;
        taken[best] = 1;
        sel[t] = best;
        w[t] = rp[best];
    }
    if (c->norm_topk_prob) {
        float s = 0.0f;
        for (int t = 0; t < top; t++)
            s += w[t];
        for (int t = 0; t < top; t++)
            w[t] /= s;
    }
    for (int i = 0; i < H; i++)
        acc[i] = 0.0f;
    for (int e = 0; e < E; e++) {
        if (!taken[e])
            continue;
        float we = 0.0f;
        for (int t = 0; t < top; t++)
            if (sel[t] == e)
                we = w[t];
        mlp(be, L->e_gate[e], L->e_up[e], L->e_down[e], H, Im, x, g, u, tmp);
        for (int i = 0; i < H; i++)
            acc[i] += tmp[i] * we;
    }
}

#ifdef SFI_HAVE_OPENBLAS
/* Dense causal attention of a block of T queries (q [T][n_heads][hd]) at
 * positions pos0.. over the cache, with two matrix products per KV head
 * for the whole block (the block's T*G queries at once), instead of T
 * products of G rows: the blas prefill's attention. Rows past a query's
 * own position are masked (probability 0). Returns SFI_ENOMEM (nothing
 * written) when the block's score matrix would exceed 256 MiB: the caller
 * then goes token by token. */
static sfi_status attn_block_blas(const sfi_qwen3 *m, int layer, const float *q,
                                  const sfi_kv_cache *kv, int pos0, int T, float *out)
{
    const sfi_model_config *c = &m->cfg;
    int nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim;
    int G = nh / nkv, ld = nkv * hd, nq = nh * hd, n_keys = pos0 + T, R = T * G;
    if ((double)R * n_keys * sizeof(float) > 256.0 * 1024 * 1024)
        return SFI_ENOMEM;
    const float *K = sfi_kv_k(kv, layer), *V = sfi_kv_v(kv, layer);
    float *Qg = malloc((size_t)R * hd * sizeof(float));
    float *Og = malloc((size_t)R * hd * sizeof(float));
    float *S = malloc((size_t)R * n_keys * sizeof(float));
    if (!Qg || !Og || !S) {
        free(Qg);
        free(Og);
        free(S);
        return SFI_ENOMEM;
    }
    float scale = 1.0f / sfi_sqrtf((float)hd);
    for (int g = 0; g < nkv; g++) {
        for (int t = 0; t < T; t++)
            memcpy(Qg + (size_t)t * G * hd, q + (size_t)t * nq + (size_t)g * G * hd,
                   (size_t)G * hd * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, n_keys, hd, scale, Qg, hd,
                    K + (size_t)g * hd, ld, 0.0f, S, n_keys);
        for (int r = 0; r < R; r++) {
            int n = pos0 + r / G + 1;
            float *row = S + (size_t)r * n_keys;
            sfi_softmax(row, (size_t)n);
            memset(row + n, 0, (size_t)(n_keys - n) * sizeof(float));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, hd, n_keys, 1.0f, S, n_keys,
                    V + (size_t)g * hd, ld, 0.0f, Og, hd);
        for (int t = 0; t < T; t++)
            memcpy(out + (size_t)t * nq + (size_t)g * G * hd, Og + (size_t)t * G * hd,
                   (size_t)G * hd * sizeof(float));
    }
    free(Qg);
    free(Og);
    free(S);
    return SFI_OK;
}
#endif

/* T tokens at positions kv->n .. kv->n+T-1. Every token goes through the
 * same operations in the same order as a one-token step (the matrix
 * products are merely batched), so with the scalar backend a block gives
 * the bits of T single steps. logits: of the last token (may be NULL). */
static sfi_status forward_block(const sfi_qwen3 *m, sfi_backend be, sfi_kv_cache *kv,
                                const int32_t *tokens, int T, sfi_qwen3_attend_fn attend,
                                void *user, sfi_qwen3_layer_fn layer_fn, void *layer_user,
                                float *logits, sfi_error *err)
{
    const sfi_model_config *c = &m->cfg;
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
            return sfi_error_set(err, SFI_ERANGE, "token id %d outside the vocabulary [0, %d)",
                                 (int)tokens[t], c->vocab_size);
    if (kv->n + T > kv->capacity)
        return sfi_error_set(err, SFI_ERANGE, "KV cache full (%d positions)", kv->capacity);
    if (!sfi_backend_available(be))
        return sfi_error_set(err, SFI_EUNSUPPORTED, "backend %s not built", sfi_backend_name(be));
    int H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads;
    int nkvh = c->num_key_value_heads;
    int nq = nh * hd, nkv = nkvh * hd, pos0 = kv->n;
    int NI = c->intermediate_size > c->moe_intermediate_size ? c->intermediate_size
                                                             : c->moe_intermediate_size;
    size_t per = (size_t)3 * H + 2 * (size_t)nq + 2 * (size_t)nkv + 2 * (size_t)NI + (size_t)hd;
    float *buf = T == 1 ? kv->scratch : malloc((size_t)T * per * sizeof(float));
    if (!buf)
        return sfi_error_set(err, SFI_ENOMEM, "forward: out of memory (%d tokens)", T);
    float *h = buf, *x = h + (size_t)T * H, *tmp = x + (size_t)T * H;
    float *q = tmp + (size_t)T * H, *att = q + (size_t)T * nq, *k = att + (size_t)T * nq;
    float *v = k + (size_t)T * nkv, *g = v + (size_t)T * nkv, *u = g + (size_t)T * NI;
    float *cs = u + (size_t)T * NI, *sn = cs + (size_t)T * hd / 2;
    /* per-token extras (MoE router, expert accumulator) live in the cache's
     * scratch, which one token's layout does not otherwise use here */
    float *rp = T == 1 ? kv->scratch + per : kv->scratch;
    float *acc = rp + c->num_experts;
    float *eg = acc + H, *eu = eg + NI, *et = eu + NI;
    sfi_status rc = SFI_OK;

    for (int t = 0; t < T; t++)
        for (int i = 0; i < hd / 2; i++) {
            float ang = (float)(pos0 + t) * m->inv_freq[i];
            double s, co;
            d_sincos((double)ang, &s, &co);
            cs[(size_t)t * hd / 2 + i] = (float)co;
            sn[(size_t)t * hd / 2 + i] = (float)s;
        }
    for (int t = 0; t < T; t++)
        memcpy(h + (size_t)t * H, m->embed + (size_t)tokens[t] * H, (size_t)H * sizeof(float));
    float eps = (float)c->rms_norm_eps;
    float *h_in = NULL;
    if (layer_fn && !(h_in = malloc(sizeof(float) * (size_t)T * H))) {
        if (T != 1)
            free(buf);
        return sfi_error_set(err, SFI_ENOMEM, "forward: out of memory (%d tokens)", T);
    }
    for (int l = 0; l < c->num_hidden_layers && !rc; l++) {
        const qlayer *L = &m->layers[l];
        if (h_in)
            memcpy(h_in, h, sizeof(float) * (size_t)T * H);
        for (int t = 0; t < T; t++)
            rmsnorm(h + (size_t)t * H, L->in_norm, H, eps, x + (size_t)t * H);
        matmul(be, L->wq, x, L->bq, T, nq, H, q);
        matmul(be, L->wk, x, L->bk, T, nkv, H, k);
        matmul(be, L->wv, x, L->bv, T, nkv, H, v);
        for (int t = 0; t < T; t++) {
            int pos = pos0 + t;
            const float *ct = cs + (size_t)t * hd / 2, *st = sn + (size_t)t * hd / 2;
            float *qt = q + (size_t)t * nq;
            for (int i = 0; i < nh; i++) {
                rmsnorm(qt + i * hd, L->q_norm, hd, eps, tmp);
                memcpy(qt + i * hd, tmp, (size_t)hd * sizeof(float));
                rope(qt + i * hd, ct, st, hd);
            }
            float *kc = sfi_kv_k(kv, l) + (size_t)pos * nkv;
            float *vc = sfi_kv_v(kv, l) + (size_t)pos * nkv;
            for (int j = 0; j < nkvh; j++) {
                rmsnorm(k + (size_t)t * nkv + j * hd, L->k_norm, hd, eps, kc + j * hd);
                rope(kc + j * hd, ct, st, hd);
                memcpy(vc + j * hd, v + (size_t)t * nkv + j * hd, (size_t)hd * sizeof(float));
                kv->key_norms[((size_t)l * nkvh + j) * kv->capacity + pos] =
                    sfi_sqrtf(sfi_dot(kc + j * hd, kc + j * hd, (size_t)hd));
            }
        }
        /* causal: token t sees positions 0..pos0+t */
        int done = 0;
#ifdef SFI_HAVE_OPENBLAS
        if (!attend && be == SFI_BACKEND_BLAS && T > 1)
            done = attn_block_blas(m, l, q, kv, pos0, T, att) == SFI_OK;
#endif
        for (int t = 0; t < T && !rc && !done; t++) {
            int n_ctx = pos0 + t + 1;
            rc = attend ? attend(user, l, q + (size_t)t * nq, kv, n_ctx, att + (size_t)t * nq, err)
                        : sfi_qwen3_attn_dense(m, be, l, q + (size_t)t * nq, kv, n_ctx,
                                               att + (size_t)t * nq, NULL, err);
        }
        if (rc)
            break;
        matmul(be, L->wo, att, L->bo, T, H, nq, tmp);
        for (size_t i = 0; i < (size_t)T * H; i++)
            h[i] += tmp[i];
        for (int t = 0; t < T; t++)
            rmsnorm(h + (size_t)t * H, L->post_norm, H, eps, x + (size_t)t * H);
        if (!L->moe) {
            int Id = c->intermediate_size;
            matmul(be, L->w_gate, x, NULL, T, Id, H, g);
            matmul(be, L->w_up, x, NULL, T, Id, H, u);
            for (size_t i = 0; i < (size_t)T * Id; i++)
                g[i] = silu(g[i]) * u[i];
            matmul(be, L->w_down, g, NULL, T, H, Id, tmp);
            for (size_t i = 0; i < (size_t)T * H; i++)
                h[i] += tmp[i];
        } else {
            for (int t = 0; t < T; t++) {
                moe_token(m, be, L, x + (size_t)t * H, rp, eg, eu, et, acc);
                for (int i = 0; i < H; i++)
                    h[(size_t)t * H + i] += acc[i];
            }
        }
        if (layer_fn)
            layer_fn(layer_user, l, T, h_in, h);
    }
    free(h_in);
    if (!rc) {
        kv->n = pos0 + T;
        if (logits) {
            float *hl = h + (size_t)(T - 1) * H;
            rmsnorm(hl, m->final_norm, H, eps, x);
            matvec(be, m->lm_head, x, NULL, c->vocab_size, H, logits);
        }
    }
    if (T != 1)
        free(buf);
    return rc;
}

sfi_status sfi_qwen3_step(const sfi_qwen3 *m, sfi_backend be, sfi_kv_cache *kv, int32_t token,
                          sfi_qwen3_attend_fn attend, void *user, float *logits, sfi_error *err)
{
    return forward_block(m, be, kv, &token, 1, attend, user, NULL, NULL, logits, err);
}

sfi_status sfi_qwen3_prefill(const sfi_qwen3 *m, sfi_backend be, sfi_kv_cache *kv,
                             const int32_t *tokens, int n, sfi_qwen3_attend_fn attend, void *user,
                             float *logits, sfi_error *err)
{
    return sfi_qwen3_prefill_observed(m, be, kv, tokens, n, attend, user, NULL, NULL, logits, err);
}

sfi_status sfi_qwen3_prefill_observed(const sfi_qwen3 *m, sfi_backend be, sfi_kv_cache *kv,
                                      const int32_t *tokens, int n, sfi_qwen3_attend_fn attend,
                                      void *user, sfi_qwen3_layer_fn layer_fn, void *layer_user,
                                      float *logits, sfi_error *err)
{
    enum { BLOCK = 64 };
    if (n < 1)
        return sfi_error_set(err, SFI_EINVAL, "prefill: no tokens");
    if (kv->n + n > kv->capacity || n > kv->capacity)
        return sfi_error_set(err, SFI_ERANGE, "KV cache full (%d positions)", kv->capacity);
    sfi_progress pg;
    sfi_progress_begin(&pg, "prefill", "tokens", n);
    sfi_status rc = SFI_OK;
    for (int i = 0; i < n && !rc; i += BLOCK) {
        int T = n - i < BLOCK ? n - i : BLOCK;
        rc = forward_block(m, be, kv, tokens + i, T, attend, user, layer_fn, layer_user,
                           i + T == n ? logits : NULL, err);
        sfi_progress_update(&pg, i + T);
    }
    sfi_progress_end(&pg);
    return rc;
}

/* ---- views for other back ends ---- */

const float *sfi_qwen3_weight(const sfi_qwen3 *m, sfi_qwen3_wid id, int layer, int expert)
{
    const sfi_model_config *c = &m->cfg;
    if (id == SFI_W_EMBED)
        return m->embed;
    if (id == SFI_W_LM_HEAD)
        return m->lm_head;
    if (id == SFI_W_FINAL_NORM)
        return m->final_norm;
    if (layer < 0 || layer >= c->num_hidden_layers)
        return NULL;
    const qlayer *L = &m->layers[layer];
    int e_ok = L->moe && expert >= 0 && expert < c->num_experts;
    switch (id) {
    case SFI_W_IN_NORM: return L->in_norm;
    case SFI_W_POST_NORM: return L->post_norm;
    case SFI_W_Q: return L->wq;
    case SFI_W_K: return L->wk;
    case SFI_W_V: return L->wv;
    case SFI_W_O: return L->wo;
    case SFI_W_BQ: return L->bq;
    case SFI_W_BK: return L->bk;
    case SFI_W_BV: return L->bv;
    case SFI_W_BO: return L->bo;
    case SFI_W_Q_NORM: return L->q_norm;
    case SFI_W_K_NORM: return L->k_norm;
    case SFI_W_GATE: return L->moe ? NULL : L->w_gate;
    case SFI_W_UP: return L->moe ? NULL : L->w_up;
    case SFI_W_DOWN: return L->moe ? NULL : L->w_down;
    case SFI_W_ROUTER: return L->moe ? L->router : NULL;
    case SFI_W_E_GATE: return e_ok ? L->e_gate[expert] : NULL;
    case SFI_W_E_UP: return e_ok ? L->e_up[expert] : NULL;
    case SFI_W_E_DOWN: return e_ok ? L->e_down[expert] : NULL;
    default: return NULL;
    }
}

void sfi_qwen3_rope_table(const sfi_model_config *c, int pos0, int n, float *cs, float *sn)
{
    int h2 = c->head_dim / 2;
    double lt = d_log(c->rope_theta);
    for (int i = 0; i < h2; i++) {
        /* inv_freq exactly as sfi_qwen3_load computes it */
        float inv = (float)d_exp(-lt * (2.0 * i / c->head_dim));
        for (int t = 0; t < n; t++) {
            float ang = (float)(pos0 + t) * inv;
            double s, co;
            d_sincos((double)ang, &s, &co);
            cs[(size_t)t * h2 + i] = (float)co;
            sn[(size_t)t * h2 + i] = (float)s;
        }
    }
}

/* ---- random-weight checkpoints ---- */

/* uniform in [-1, 1), 24 random bits: exact in float */
static float unif(uint64_t *s)
{
    return (float)(int32_t)((sfi_rng_next(s) >> 40) - (1u << 23)) * (1.0f / (1u << 23));
}

typedef struct {
    char name[128];
    int kind; /* 0 matrix (scale 1/sqrt(fan_in)), 1 norm (around 1), 2 embedding */
} rtensor;

static sfi_status write_config(const sfi_model_config *c, const char *dir, sfi_st_dtype dt,
                               sfi_error *err)
{
    int moe = c->arch == SFI_ARCH_QWEN3_MOE;
    json_t *o = json_object();
    json_t *arch = json_array();
    json_array_append_new(arch, json_string(moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"));
    json_object_set_new(o, "architectures", arch);
    json_object_set_new(o, "model_type", json_string(moe ? "qwen3_moe" : "qwen3"));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(o, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->num_hidden_layers));
    json_object_set_new(o, "num_attention_heads", json_integer(c->num_attention_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->num_key_value_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(o, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(o, "attention_bias", json_boolean(c->attention_bias));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "torch_dtype", json_string(dt == SFI_DT_F32 ? "float32" : "bfloat16"));
    if (c->bos_token_id >= 0)
        json_object_set_new(o, "bos_token_id", json_integer(c->bos_token_id));
    if (c->n_eos > 1) {
        json_t *eos = json_array();
        for (int i = 0; i < c->n_eos; i++)
            json_array_append_new(eos, json_integer(c->eos_token_ids[i]));
        json_object_set_new(o, "eos_token_id", eos);
    } else if (c->eos_token_id >= 0) {
        json_object_set_new(o, "eos_token_id", json_integer(c->eos_token_id));
    }
    if (moe) {
        json_object_set_new(o, "num_experts", json_integer(c->num_experts));
        json_object_set_new(o, "num_experts_per_tok", json_integer(c->num_experts_per_tok));
        json_object_set_new(o, "moe_intermediate_size", json_integer(c->moe_intermediate_size));
        json_object_set_new(o, "norm_topk_prob", json_boolean(c->norm_topk_prob));
        json_object_set_new(o, "decoder_sparse_step", json_integer(c->decoder_sparse_step));
        json_t *ml = json_array();
        for (int i = 0; i < c->n_mlp_only_layers; i++)
            json_array_append_new(ml, json_integer(c->mlp_only_layers[i]));
        json_object_set_new(o, "mlp_only_layers", ml);
    }
    json_object_set_new(o, "generator", json_string("sfi-ref make-checkpoint (random weights)"));
    char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_INDENT(2));
    json_decref(o);
    if (!s)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    sfi_out *out;
    FILE *f;
    sfi_status st = sfi_out_open(path, &out, &f, err);
    if (!st) {
        if (fputs(s, f) < 0 || fputc('\n', f) == EOF) {
            st = sfi_error_set(err, SFI_EIO, "%s: cannot write: %s", path, strerror(errno));
            sfi_out_abort(out);
        } else {
            st = sfi_out_commit(out, 0, err);
        }
    }
    free(s);
    return st;
}

/* A directory may receive a random checkpoint when it holds none, or one
 * that make-checkpoint wrote (its config.json names the generator): a
 * user's trained checkpoint there would otherwise be lost to random
 * weights. */
static sfi_status replaceable_checkpoint(const char *dir, sfi_error *err)
{
    char p[4200];
    struct stat sb;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    if (lstat(p, &sb) == 0)
        return sfi_error_set(err, SFI_EIO,
                             "%s: holds a sharded checkpoint "
                             "(model.safetensors.index.json); not writing a random one over it "
                             "(choose a new or empty directory)",
                             dir);
    snprintf(p, sizeof p, "%s/config.json", dir);
    int has_config = lstat(p, &sb) == 0;
    int ours = 0;
    if (has_config) {
        char *text = NULL;
        size_t len = 0;
        if (sfi_io_read(p, 16u << 20, "a config.json", &text, &len, NULL) == SFI_OK) {
            json_t *o = json_loadb(text, len, 0, NULL);
            json_t *g = json_object_get(o, "generator");
            ours =
                json_is_string(g) && !strncmp(json_string_value(g), "sfi-ref make-checkpoint", 23);
            json_decref(o);
        }
        free(text);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    int has_weights = lstat(p, &sb) == 0;
    if ((has_config || has_weights) && !ours)
        return sfi_error_set(err, SFI_EIO,
                             "%s: holds a checkpoint that sfi-ref make-checkpoint "
                             "did not write (%s); not replacing it with random weights (choose "
                             "a new or empty directory)",
                             dir,
                             has_config ? "its config.json names no make-checkpoint generator"
                                        : "model.safetensors without config.json");
    return SFI_OK;
}

sfi_status sfi_qwen3_write_random(const sfi_model_config *c, const char *dir, uint64_t seed,
                                  sfi_st_dtype dt, sfi_error *err)
{
    sfi_status rc = sfi_model_config_validate(c, dir, err);
    if (rc)
        return rc;
    if (dt != SFI_DT_F32 && dt != SFI_DT_BF16)
        return sfi_error_set(err, SFI_EINVAL, "random checkpoint: dtype must be F32 or BF16");
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        if (mkdir(dir, 0777) != 0)
            return sfi_error_set(err, SFI_EIO, "%s: cannot create the directory: %s", dir,
                                 strerror(errno));
    } else if (!S_ISDIR(sb.st_mode)) {
        return sfi_error_set(err, SFI_EIO, "%s: exists and is not a directory", dir);
    } else if ((rc = replaceable_checkpoint(dir, err))) {
        return rc;
    }
    int H = c->hidden_size, hd = c->head_dim, L = c->num_hidden_layers;
    int64_t nq = (int64_t)c->num_attention_heads * hd, nkv = (int64_t)c->num_key_value_heads * hd;
    size_t cap = 16 + (size_t)L * (12 + 3 * (size_t)(c->num_experts + 1));
    sfi_st_write_tensor *decl = calloc(cap, sizeof *decl);
    rtensor *rt = calloc(cap, sizeof *rt);
    if (!decl || !rt) {
        free(decl);
        free(rt);
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    }
    size_t n = 0;
#define ADD(kind_, d0, d1, ...)                                                                    \
    do {                                                                                           \
        snprintf(rt[n].name, sizeof rt[n].name, __VA_ARGS__);                                      \
        rt[n].kind = kind_;                                                                        \
        decl[n].name = rt[n].name;                                                                 \
        decl[n].dtype = dt;                                                                        \
        decl[n].ndim = (d1) > 0 ? 2 : 1;                                                           \
        decl[n].shape[0] = d0;                                                                     \
        decl[n].shape[1] = d1;                                                                     \
        n++;                                                                                       \
    } while (0)
    ADD(2, c->vocab_size, H, "model.embed_tokens.weight");
    for (int l = 0; l < L; l++) {
        ADD(1, H, 0, "model.layers.%d.input_layernorm.weight", l);
        ADD(0, nq, H, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(0, nkv, H, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(0, nkv, H, "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(0, H, nq, "model.layers.%d.self_attn.o_proj.weight", l);
        if (c->attention_bias) {
            ADD(1, nq, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            ADD(1, nkv, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            ADD(1, nkv, 0, "model.layers.%d.self_attn.v_proj.bias", l);
            ADD(1, H, 0, "model.layers.%d.self_attn.o_proj.bias", l);
        }
        ADD(1, hd, 0, "model.layers.%d.self_attn.q_norm.weight", l);
        ADD(1, hd, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        ADD(1, H, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        if (c->arch == SFI_ARCH_QWEN3_MOE && sfi_model_layer_is_moe(c, l)) {
            int NI = c->moe_intermediate_size;
            ADD(0, c->num_experts, H, "model.layers.%d.mlp.gate.weight", l);
            for (int e = 0; e < c->num_experts; e++) {
                ADD(0, NI, H, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
                ADD(0, NI, H, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
                ADD(0, H, NI, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            }
        } else {
            int NI = c->intermediate_size;
            ADD(0, NI, H, "model.layers.%d.mlp.gate_proj.weight", l);
            ADD(0, NI, H, "model.layers.%d.mlp.up_proj.weight", l);
            ADD(0, H, NI, "model.layers.%d.mlp.down_proj.weight", l);
        }
    }
    ADD(1, H, 0, "model.norm.weight");
    if (!c->tie_word_embeddings)
        ADD(0, c->vocab_size, H, "lm_head.weight");
#undef ADD
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    sfi_st_writer *w = NULL;
    rc = sfi_st_writer_open(path, decl, n, &w, err);
    enum { CHUNK = 1 << 20 };
    float *buf = rc ? NULL : malloc(CHUNK * sizeof(float));
    if (!rc && !buf)
        rc = sfi_error_set(err, SFI_ENOMEM, "out of memory");
    uint64_t state = seed;
    for (size_t i = 0; !rc && i < n; i++) {
        uint64_t numel =
            (uint64_t)decl[i].shape[0] * (decl[i].ndim == 2 ? (uint64_t)decl[i].shape[1] : 1);
        int fan_in = decl[i].ndim == 2 ? (int)decl[i].shape[1] : 1;
        float a = rt[i].kind == 0 ? sfi_sqrtf(3.0f / (float)fan_in)
                  : rt[i].kind == 2
                      ? (c->tie_word_embeddings ? sfi_sqrtf(3.0f / (float)H) : sfi_sqrtf(3.0f))
                      : 0.2f;
        for (uint64_t done = 0; !rc && done < numel;) {
            size_t m = numel - done < CHUNK ? (size_t)(numel - done) : CHUNK;
            for (size_t j = 0; j < m; j++)
                buf[j] = rt[i].kind == 1 ? 1.0f + a * unif(&state) : a * unif(&state);
            rc = sfi_st_writer_put(w, buf, m, err);
            done += m;
        }
    }
    if (!rc)
        rc = sfi_st_writer_commit(w, err);
    sfi_st_writer_abort(w);
    free(buf);
    free(decl);
    free(rt);
    if (!rc) {
        rc = write_config(c, dir, dt, err);
        if (rc)
            unlink(path); /* no checkpoint without its config */
    }
    return rc;
}
