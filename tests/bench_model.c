/* Benchmark (make bench): decode tokens/s of the scalar and OpenBLAS
 * backends on a Qwen3-0.6B-shaped random-weight checkpoint at 4K and 16K
 * context, dense steps (full KV) and SFI fast steps (sink + K selected +
 * recent, the defaults of sfi(7)).
 *
 * The checkpoint is written by sfi_qwen3_write_random (no download). The
 * KV cache is filled with random keys/values instead of a prefill: a decode
 * step costs the same whatever the cached values are, and a scalar prefill
 * of 16K tokens would take hours.
 *
 * Environment: SFI_BENCH_PRESET (Qwen3-0.6B), SFI_BENCH_LAYERS (all),
 * SFI_BENCH_CONTEXTS (4096,16384), SFI_BENCH_STEPS_SCALAR (2),
 * SFI_BENCH_STEPS_BLAS (8). */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_clock.h"
#include "sfi_math.h"
#include "sfi_model.h"
#include "sfi_qwen3.h"
#include "sfi_test_util.h"

static int env_int(const char *k, int d)
{
    const char *v = getenv(k);
    return v && *v ? atoi(v) : d;
}

typedef struct {
    const sfi_qwen3 *m;
    sfi_backend be;
    int32_t *idx; /* [n_kv][n] */
    int n;
} fast_ctx;

static sfi_status fast_attend(void *u, int layer, const float *q, const sfi_kv_cache *kv, int n_ctx,
                              float *out, sfi_error *err)
{
    fast_ctx *f = u;
    const int32_t *ix[256];
    int nn[256];
    for (int h = 0; h < kv->n_kv_heads; h++) {
        ix[h] = f->idx + (size_t)h * f->n;
        nn[h] = f->n;
    }
    return sfi_qwen3_attn_sparse(f->m, f->be, layer, q, kv, n_ctx, ix, nn, out, err);
}

/* Wall seconds per decode step, averaged over `steps` steps from context
 * ctx; *cpu gets the process CPU seconds per step (all threads). */
static double time_steps(const sfi_qwen3 *m, sfi_backend be, sfi_kv_cache *kv, int ctx, int steps,
                         fast_ctx *fast, float *logits, double *cpu)
{
    sfi_error e;
    kv->n = ctx;
    double t0 = sfi_clock_wall(), c0 = sfi_clock_cpu();
    for (int s = 0; s < steps; s++) {
        if (fast)
            fast->be = be;
        if (sfi_qwen3_step(m, be, kv, (int32_t)(1000 + s), fast ? fast_attend : NULL, fast, logits,
                           &e)) {
            fprintf(stderr, "bench_model: %s\n", e.msg);
            exit(1);
        }
    }
    if (cpu)
        *cpu = (sfi_clock_cpu() - c0) / steps;
    return (sfi_clock_wall() - t0) / steps;
}

int main(void)
{
    const char *preset = getenv("SFI_BENCH_PRESET");
    if (!preset || !*preset)
        preset = "Qwen3-0.6B";
    sfi_model_config cfg;
    sfi_error e;
    if (sfi_model_preset(preset, &cfg, &e)) {
        fprintf(stderr, "bench_model: %s\n", e.msg);
        return 1;
    }
    int layers = env_int("SFI_BENCH_LAYERS", cfg.num_hidden_layers);
    if (layers >= 1 && layers < cfg.num_hidden_layers)
        cfg.num_hidden_layers = layers;
    int steps_s = env_int("SFI_BENCH_STEPS_SCALAR", 2),
        steps_b = env_int("SFI_BENCH_STEPS_BLAS", 8);
    const char *ctxs = getenv("SFI_BENCH_CONTEXTS");
    if (!ctxs || !*ctxs)
        ctxs = "4096,16384";
    int have_blas = sfi_backend_available(SFI_BACKEND_BLAS);

    char *dir = sfi_test_tmpdir();
    if (!dir) {
        fprintf(stderr, "bench_model: no temporary directory\n");
        return 1;
    }
    printf("load average at start: ");
    FILE *la = fopen("/proc/loadavg", "r");
    char lbuf[128] = "?";
    if (la) {
        if (!fgets(lbuf, sizeof lbuf, la))
            snprintf(lbuf, sizeof lbuf, "?\n");
        fclose(la);
    }
    printf("%s", lbuf);
    double t0 = sfi_clock_wall();
    if (sfi_qwen3_write_random(&cfg, dir, 1, SFI_DT_BF16, &e)) {
        fprintf(stderr, "bench_model: %s\n", e.msg);
        sfi_test_rmtree(dir);
        return 1;
    }
    double t1 = sfi_clock_wall();
    sfi_qwen3 *m;
    if (sfi_qwen3_load(dir, &m, &e)) {
        fprintf(stderr, "bench_model: %s\n", e.msg);
        sfi_test_rmtree(dir);
        return 1;
    }
    double t2 = sfi_clock_wall();
    sfi_test_rmtree(dir);
    free(dir);
    printf("model: %s-shaped random weights, %d layers, %llu params; wrote bf16 checkpoint in "
           "%.1f s, loaded (f32, %.2f GB) in %.1f s\n",
           preset, cfg.num_hidden_layers, (unsigned long long)sfi_model_param_count(&cfg), t1 - t0,
           sfi_qwen3_weight_bytes(m) / 1e9, t2 - t1);
    printf("OpenBLAS backend: %s\n", have_blas ? "built" : "not built (blas rows skipped)");

    float *logits = malloc((size_t)cfg.vocab_size * sizeof(float));
    const char *p = ctxs;
    while (*p) {
        int ctx = atoi(p);
        const char *comma = strchr(p, ',');
        p = comma ? comma + 1 : p + strlen(p);
        if (ctx < 2308 + 64) {
            printf("context %d: skipped, the SFI fast set alone has 2308 positions\n", ctx);
            continue;
        }
        sfi_kv_cache kv;
        int cap = ctx + (steps_s > steps_b ? steps_s : steps_b) + 1;
        if (sfi_kv_cache_init(&kv, &cfg, cap, &e)) {
            fprintf(stderr, "bench_model: %s\n", e.msg);
            return 1;
        }
        /* random keys/values of unit scale, like post-norm keys */
        uint64_t s = 12345;
        size_t per = (size_t)kv.capacity * kv.n_kv_heads * kv.head_dim;
        for (int l = 0; l < kv.n_layers; l++) {
            float *k = sfi_kv_k(&kv, l), *v = sfi_kv_v(&kv, l);
            for (size_t i = 0; i < per; i++) {
                s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                k[i] = (float)((int)(s >> 40) - (1 << 23)) / (float)(1 << 23);
                v[i] = -k[i] * 0.5f;
            }
            for (int h = 0; h < kv.n_kv_heads; h++)
                for (int j = 0; j < kv.capacity; j++)
                    kv.key_norms[((size_t)l * kv.n_kv_heads + h) * kv.capacity + j] = 1.0f;
        }
        /* the SFI fast set at the defaults of sfi(7): 4 sink, K = 2048 selected
         * (spread over J), 256 recent (the current token included) */
        fast_ctx fc = {.m = m};
        int n_sink = 4, K = 2048, n_recent = 256;
        fc.n = n_sink + K + n_recent;
        fc.idx = malloc((size_t)kv.n_kv_heads * fc.n * sizeof(int32_t));
        for (int h = 0; h < kv.n_kv_heads; h++) {
            int32_t *ix = fc.idx + (size_t)h * fc.n, k = 0;
            for (int j = 0; j < n_sink; j++)
                ix[k++] = j;
            int jb = n_sink, je = ctx + 1 - n_recent;
            for (int i = 0; i < K; i++)
                ix[k++] = jb + (int32_t)((long long)i * (je - jb) / K);
            for (int j = 0; j < n_recent; j++)
                ix[k++] = je + j;
        }
        double csd, csf, cbd = 0, cbf = 0;
        double sd = time_steps(m, SFI_BACKEND_SCALAR, &kv, ctx, steps_s, NULL, logits, &csd);
        double sf = time_steps(m, SFI_BACKEND_SCALAR, &kv, ctx, steps_s, &fc, logits, &csf);
        printf("context %6d  scalar: dense %8.1f ms/token wall (%6.2f tokens/s), %8.1f ms CPU; "
               "SFI fast step %8.1f ms wall (%6.2f tokens/s), %8.1f ms CPU\n",
               ctx, sd * 1e3, 1 / sd, csd * 1e3, sf * 1e3, 1 / sf, csf * 1e3);
        if (have_blas) {
            time_steps(m, SFI_BACKEND_BLAS, &kv, ctx, 1, NULL, logits, NULL); /* warm up */
            double bd = time_steps(m, SFI_BACKEND_BLAS, &kv, ctx, steps_b, NULL, logits, &cbd);
            double bf = time_steps(m, SFI_BACKEND_BLAS, &kv, ctx, steps_b, &fc, logits, &cbf);
            printf("context %6d  blas:   dense %8.1f ms/token wall (%6.2f tokens/s), %8.1f ms CPU; "
                   "SFI fast step %8.1f ms wall (%6.2f tokens/s), %8.1f ms CPU\n",
                   ctx, bd * 1e3, 1 / bd, cbd * 1e3, bf * 1e3, 1 / bf, cbf * 1e3);
            printf("context %6d  blas/scalar speedup, wall: dense %.1fx, fast step %.1fx; CPU "
                   "time: dense %.1fx, fast step %.1fx (target 10x)\n",
                   ctx, sd / bd, sf / bf, csd / cbd, csf / cbf);
        }
        fflush(stdout);
        free(fc.idx);
        sfi_kv_cache_free(&kv);
    }
    free(logits);
    sfi_qwen3_free(m);
    return 0;
}
