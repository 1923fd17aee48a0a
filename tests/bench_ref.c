/* Benchmark of the scalar reference core (not a test; `make bench`):
 * the Selector for 8 KV heads x 32K positions x K = 2048 (decode, one
 * window query per head, and prefill-like 16 window queries), and dense
 * and sparse decode attention at 32K (32 query heads, 8 KV heads, head_dim
 * 128, the Qwen3-4B layer shape). Prints the best of a few calls in CPU
 * ms (wall ms in brackets) and CPU ns per position. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_attention.h"
#include "sfi_clock.h"
#include "sfi_selector.h"

static uint64_t rng = 7;
static float urand(float lo, float hi)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * ((float)(rng >> 40) / 16777216.0f);
}

static float *rand_buf(size_t n, float lo, float hi)
{
    float *b = malloc(n * sizeof *b);
    if (!b) {
        fprintf(stderr, "bench_ref: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        b[i] = urand(lo, hi);
    return b;
}

/* The bench times the method at its defaults; it pins nothing, so it
 * takes them from libsfi rather than writing them out again. */
static sfi_params defaults(void)
{
    sfi_params p;
    sfi_params_default(&p);
    return p;
}

static int bench_selector(int n_win, int reps)
{
    const int H = 8, n_pos = 32768;
    sfi_params p = defaults();
    const int jb = p.n_sink, je = n_pos - p.n_recent, nJ = je - jb;
    float *lg = rand_buf((size_t)H * n_win * n_pos, -8.0f, 8.0f);
    float *kn = rand_buf((size_t)H * n_pos, 0.5f, 30.0f);
    int32_t *sel = malloc((size_t)H * p.K * sizeof *sel);
    sfi_selector_input in = {H, n_win, n_pos, jb, je, lg, kn};
    double best = 1e30, bw = 1e30;
    sfi_error e;
    for (int r = 0; r < reps; r++) {
        int n;
        double w0 = sfi_clock_wall(), t0 = sfi_clock_cpu();
        if (sfi_selector_run(&p, &in, sel, &n, NULL, &e) != SFI_OK) {
            fprintf(stderr, "bench_ref: %s\n", e.msg);
            return 1;
        }
        double t = sfi_clock_cpu() - t0, w = sfi_clock_wall() - w0;
        best = t < best ? t : best;
        bw = w < bw ? w : bw;
    }
    printf("selector  %d kv heads x %d positions (|J| %d) x K %d, %2d window queries/head: "
           "%8.2f ms [wall %8.2f], %7.2f ns per (head, position)\n",
           H, n_pos, nJ, p.K, n_win, best * 1e3, bw * 1e3, best * 1e9 / ((double)H * nJ));
    free(lg);
    free(kn);
    free(sel);
    return 0;
}

static int bench_attention(int reps)
{
    const int n = 32768;
    sfi_attn_shape s = {32, 8, 128};
    size_t kvn = (size_t)n * 8 * 128;
    float *q = rand_buf(32 * 128, -1.0f, 1.0f), *k = rand_buf(kvn, -1.0f, 1.0f),
          *v = rand_buf(kvn, -1.0f, 1.0f);
    float *out = malloc(32 * 128 * sizeof *out), *lg = malloc((size_t)32 * n * sizeof *lg);
    sfi_error e;
    double best = 1e30, bw = 1e30;
    for (int r = 0; r < reps; r++) {
        double w0 = sfi_clock_wall(), t0 = sfi_clock_cpu();
        if (sfi_attn_dense_decode(&s, q, k, v, n, out, lg, &e) != SFI_OK) {
            fprintf(stderr, "bench_ref: %s\n", e.msg);
            return 1;
        }
        double t = sfi_clock_cpu() - t0, w = sfi_clock_wall() - w0;
        best = t < best ? t : best;
        bw = w < bw ? w : bw;
    }
    printf("dense     32q/8kv/128d decode attention, n_ctx %d (+logits):     %8.2f ms [wall "
           "%8.2f], %7.0f ns per position\n",
           n, best * 1e3, bw * 1e3, best * 1e9 / n);
    /* Sparse over sink 4 + K 2048 + recent 256 (every 15th position). */
    int32_t *idx[8];
    int cnt[8];
    for (int h = 0; h < 8; h++) {
        idx[h] = malloc((4 + 2048 + 256) * sizeof **idx);
        int c = 0;
        for (int j = 0; j < 4; j++)
            idx[h][c++] = j;
        for (int j = 4 + h; j < n - 256 && c < 4 + 2048; j += 15)
            idx[h][c++] = j;
        for (int j = n - 256; j < n; j++)
            idx[h][c++] = j;
        cnt[h] = c;
    }
    best = 1e30;
    bw = 1e30;
    for (int r = 0; r < reps; r++) {
        double w0 = sfi_clock_wall(), t0 = sfi_clock_cpu();
        if (sfi_attn_sparse_decode(&s, q, k, v, n, (const int32_t *const *)idx, cnt, out, &e) !=
            SFI_OK) {
            fprintf(stderr, "bench_ref: %s\n", e.msg);
            return 1;
        }
        double t = sfi_clock_cpu() - t0, w = sfi_clock_wall() - w0;
        best = t < best ? t : best;
        bw = w < bw ? w : bw;
    }
    printf("sparse    32q/8kv/128d decode attention, %d of %d positions: %8.2f ms [wall %8.2f], "
           "%7.0f ns per attended position\n",
           cnt[0], n, best * 1e3, bw * 1e3, best * 1e9 / cnt[0]);
    for (int h = 0; h < 8; h++)
        free(idx[h]);
    free(q);
    free(k);
    free(v);
    free(out);
    free(lg);
    return 0;
}

int main(void)
{
    if (bench_selector(1, 5) || bench_selector(16, 3) || bench_attention(3))
        return 1;
    return 0;
}
