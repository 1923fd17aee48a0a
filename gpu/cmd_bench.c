/* sfi-gpu bench: kernel measurements and the calibration profile.
 *
 * Every ratio the issue asks for is taken within one run on one GPU:
 * a device-to-device copy gives the achievable HBM bandwidth; the dense
 * kernel's bandwidth (K+V bytes read / time) is reported as a fraction of
 * it; the sparse kernel, the Selector + reorg and the two-stream slow step
 * are timed against our dense kernel; --torch CMD runs PyTorch SDPA on the
 * same shapes in the same device session (gpu/bench_torch.py).
 * Times are the mean over repetitions after warm-up, by CUDA events. */
#include <config.h>

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "sfi_gpu.h"
#include "sfi_io.h"
#include "sfi_gpu_cli.h"

#define CK(x) SFI_GPU_CK("bench", x, #x)

/* Shapes of the issue: Qwen3-like heads, batch 16, bf16 KV. */
enum { B = 16, HQ = 32, HKV = 8, D = 128, PAGE = 64, N_SINK = 4, N_RECENT = 256 };

typedef struct {
    cudaEvent_t e0, e1;
    cudaStream_t st;
    int warm, reps;
} timer;

#define TIME_MS(t, out_ms, stmt)                                                        \
    do {                                                                                \
        for (int w_ = 0; w_ < (t)->warm; w_++) CK(stmt);                                \
        CK(cudaEventRecord((t)->e0, (t)->st));                                          \
        for (int r_ = 0; r_ < (t)->reps; r_++) CK(stmt);                                \
        CK(cudaEventRecord((t)->e1, (t)->st));                                          \
        CK(cudaEventSynchronize((t)->e1));                                              \
        float ms_;                                                                      \
        CK(cudaEventElapsedTime(&ms_, (t)->e0, (t)->e1));                               \
        (out_ms) = ms_ / (t)->reps;                                                     \
    } while (0)

typedef struct {
    char kernel[32];
    int batch, context, K, layers;
    double us;
} meas;

static meas g_meas[64];
/* kernel names and shapes as sfi_cost_kernel_predict (sim/sfi_cost.h) reads them */
static int g_nmeas;

static void add_meas(const char *k, int ctx, int K, int layers, double us)
{
    if (g_nmeas >= 64)
        return;
    meas *m = &g_meas[g_nmeas++];
    snprintf(m->kernel, sizeof m->kernel, "%s", k);
    m->batch = B;
    m->context = ctx;
    m->K = K;
    m->layers = layers;
    m->us = us;
}

/* Descriptor for batch B, every request at context ctx. */
static void make_desc(sfi_gpu_step_desc *h, const int32_t *d_bt, int max_blocks, int ctx, int K)
{
    memset(h, 0, sizeof *h);
    h->batch = B;
    h->n_heads = HQ;
    h->n_kv = HKV;
    h->head_dim = D;
    h->page = PAGE;
    h->max_blocks = max_blocks;
    h->ld_logits = ctx;
    h->compact_cap = N_SINK + K;
    h->n_sink = N_SINK;
    h->K = K;
    h->max_ctx = ctx;
    h->max_J = ctx - N_SINK - N_RECENT;
    h->block_table = d_bt;
    for (int b = 0; b < B; b++) {
        h->req[b].ctx_len = ctx;
        h->req[b].recent_begin = ctx - N_RECENT;
        h->req[b].n_compact = N_SINK + K;
        h->req[b].j_begin = N_SINK;
        h->req[b].j_end = ctx - N_RECENT;
    }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* Fisher-Yates shuffle of a block table (a serving engine's blocks are
 * scattered). */
static void shuffle_blocks(int32_t *bt, size_t n)
{
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = rng() % (i + 1);
        int32_t x = bt[i];
        bt[i] = bt[j];
        bt[j] = x;
    }
}

/* Peak HBM bandwidth from the device attributes (bytes/s; 0 if unknown). */
static double peak_bw(void)
{
    int clk_khz = 0, bus = 0;
    if (cudaDeviceGetAttribute(&clk_khz, cudaDevAttrMemoryClockRate, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, 0) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return 2.0 * clk_khz * 1e3 * (bus / 8.0);
}

static int run_torch(const char *cmd, const int *ctxs, int n, double *us_out)
{
    char full[1024];
    snprintf(full, sizeof full, "%s --batch %d --heads %d --kv-heads %d --dim %d --ctx %d,%d,%d,%d",
             cmd, B, HQ, HKV, D, ctxs[0], ctxs[1 % n], ctxs[2 % n], ctxs[3 % n]);
    FILE *p = popen(full, "r");
    if (!p) {
        fprintf(stderr, "sfi-gpu bench: cannot run '%s': %s\n", full, strerror(errno));
        return -1;
    }
    char line[512];
    int got = 0;
    while (fgets(line, sizeof line, p)) {
        fputs(line, stdout);
        int ctx;
        double us;
        if (sscanf(line, "sdpa ctx=%d us=%lf", &ctx, &us) == 2)
            for (int i = 0; i < n; i++)
                if (ctxs[i] == ctx) {
                    us_out[i] = us;
                    got++;
                }
    }
    int rc = pclose(p);
    if (rc != 0)
        fprintf(stderr, "sfi-gpu bench: '%s' exited with status %d\n", full, rc);
    return got;
}

/* Selector then reorg on one stream (the side stream's work for a layer). */
static int sel_and_reorg(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dt,
                         const sfi_gpu_sel_params *prm, const float *logits, const float *norms,
                         const sfi_gpu_sel_ws *ws, int32_t *sel, const void *kp, const void *vp,
                         void *ck, void *cv, cudaStream_t st)
{
    int e = sfi_gpu_selector(h, d, prm, logits, norms, ws, NULL, sel, 0, st);
    if (e)
        return e;
    return sfi_gpu_reorg(h, d, dt, kp, vp, sel, ck, cv, NULL, st);
}

/* The main stream's part of a slow step alone: every layer's attention. */
static int attn_layers(const sfi_gpu_slow_plan *pl, const sfi_gpu_step_desc *h,
                       const sfi_gpu_step_desc *d, int dt)
{
    for (int i = 0; i < pl->n_layers; i++) {
        int e = sfi_gpu_attn_dense(h, d, dt, pl->q, pl->k_pool[i], pl->v_pool[i], pl->out,
                                   pl->logits[i % SFI_GPU_RING], &pl->attn_ws, 0, pl->main_st);
        if (e)
            return e;
    }
    return 0;
}

static void bench_usage(FILE *f)
{
    fputs("usage: sfi-gpu bench [--quick] [--profile FILE] [--name NAME] [--torch CMD]\n"
          "\n"
          "Measures the kernels on one GPU (HBM copy, dense attention with and without\n"
          "logits, sparse fast-step attention warm and L2-cold, Selector + reorg, the\n"
          "two-stream slow step) and writes a calibration profile for sfi-sim.\n"
          "\n"
          "  --quick         contexts up to 32K and fewer repetitions\n"
          "  --profile FILE  the profile written (default sfi-gpu-profile.json)\n"
          "  --name NAME     the profile's \"name\" (default measured)\n"
          "  --torch CMD     also time PyTorch's SDPA by running CMD with the shapes\n"
          "                  appended, e.g. 'python3 gpu/bench_torch.py'\n"
          "  -h, --help      this help\n"
          "\n"
          "Exit status: 0 ok, 1 a CUDA error or an unwritable profile, 2 usage error,\n"
          "77 no usable CUDA device. See sfi-gpu(1).\n",
          f);
}

int sfi_gpu_cmd_bench(int argc, char **argv)
{
    const char *profile = "sfi-gpu-profile.json", *name = "measured", *torch_cmd = NULL;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            bench_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc)
            profile = argv[++i];
        else if (!strcmp(argv[i], "--name") && i + 1 < argc)
            name = argv[++i];
        else if (!strcmp(argv[i], "--torch") && i + 1 < argc)
            torch_cmd = argv[++i];
        else {
            fprintf(stderr, "sfi-gpu bench: unknown or incomplete option '%s' (try --help)\n",
                    argv[i]);
            return 2;
        }
    }
    char msg[256];
    if (!sfi_gpu_device_ok(msg, sizeof msg)) {
        printf("SKIP: %s\n", msg);
        return SFI_GPU_EXIT_NODEV;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s\n", msg);
    const int dt = SFI_GPU_BF16, esz = 2;
    const int ctxs[4] = {16384, 32768, 65536, 131072};
    const int n_ctx = quick ? 2 : 4;
    const int max_ctx = ctxs[n_ctx - 1];
    const int max_blocks = max_ctx / PAGE;
    const size_t n_blocks = (size_t)B * max_blocks;
    const size_t pool_elems = n_blocks * HKV * PAGE * D;

    timer t;
    CK(cudaStreamCreate(&t.st));
    CK(cudaEventCreate(&t.e0));
    CK(cudaEventCreate(&t.e1));
    t.warm = 3;
    t.reps = quick ? 5 : 20;

    void *kp, *vp;
    CK(cudaMalloc(&kp, pool_elems * esz));
    CK(cudaMalloc(&vp, pool_elems * esz));
    CK(sfi_gpu_fill_random(kp, pool_elems, dt, 1, 1.0f, t.st));
    CK(sfi_gpu_fill_random(vp, pool_elems, dt, 2, 1.0f, t.st));
    /* block table: a random permutation of the pool (a serving engine's
     * blocks are scattered) */
    int32_t *bt = malloc(n_blocks * sizeof *bt);
    if (!bt) {
        fprintf(stderr, "sfi-gpu bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n_blocks; i++)
        bt[i] = (int32_t)i;
    shuffle_blocks(bt, n_blocks);
    int32_t *d_bt;
    CK(cudaMalloc((void **)&d_bt, n_blocks * sizeof *bt));
    CK(cudaMemcpy(d_bt, bt, n_blocks * sizeof *bt, cudaMemcpyHostToDevice));

    float *q, *out, *logits, *norms;
    CK(cudaMalloc((void **)&q, (size_t)B * HQ * D * 4));
    CK(cudaMalloc((void **)&out, (size_t)B * HQ * D * 4));
    CK(sfi_gpu_fill_random(q, (size_t)B * HQ * D, SFI_GPU_F32, 3, 1.0f, t.st));
    /* logits: the ring of the two-stream schedule, slot 0 used alone */
    const int ov_ctx = 32768;
    const size_t logit_elems = (size_t)B * HQ * max_ctx;
    CK(cudaMalloc((void **)&logits, logit_elems * 4 > 4 * (size_t)B * HQ * ov_ctx * 4
                                        ? logit_elems * 4
                                        : 4 * (size_t)B * HQ * ov_ctx * 4));
    CK(cudaMalloc((void **)&norms, (size_t)B * HKV * max_ctx * 4));
    void *attn_ws_mem;
    sfi_gpu_attn_ws aws;
    CK(cudaMalloc(&attn_ws_mem, sfi_gpu_attn_ws_bytes(B, HQ, D)));
    sfi_gpu_attn_ws_carve(&aws, attn_ws_mem, B, HQ, D);
    CK(sfi_gpu_attn_ws_init(&aws, 0));
    sfi_gpu_step_desc h, *d_desc;
    CK(cudaMalloc((void **)&d_desc, sizeof h));

    /* 1. copy bandwidth: 2 GiB read + 2 GiB written (less with --quick) */
    size_t cp_bytes = (size_t)2 << 30;
    if (cp_bytes > pool_elems * esz)
        cp_bytes = pool_elems * esz;
    double copy_ms;
    TIME_MS(&t, copy_ms, cudaMemcpyAsync(vp, kp, cp_bytes, cudaMemcpyDeviceToDevice, t.st));
    CK(sfi_gpu_fill_random(vp, pool_elems, dt, 2, 1.0f, t.st));
    const double copy_bw = 2.0 * cp_bytes / (copy_ms * 1e-3);
    const double pk = peak_bw();
    printf("copy D2D: %.3f ms for %zu MiB, %.1f GB/s (read+write); peak from attributes %.1f GB/s\n",
           copy_ms, cp_bytes >> 20, copy_bw / 1e9, pk / 1e9);

    /* 2. launch overhead */
    double noop_ms;
    {
        timer t2 = t;
        t2.reps = 1000;
        TIME_MS(&t2, noop_ms, sfi_gpu_noop(t.st));
    }
    printf("empty kernel: %.2f us per launch (back to back)\n", noop_ms * 1e3);

    /* 3a. pipeline depth at the shortest and longest context (the
     * library default is 3 stages); the fastest in total is used for the
     * rest of the run */
    static const int depth[3] = {2, 3, 4};
    double depth_ms[3] = {0};
    printf("\npipeline stages sweep (us):     2 stages    3 stages    4 stages\n");
    for (int c = 0; c < n_ctx; c += n_ctx - 1) {
        make_desc(&h, d_bt, max_blocks, ctxs[c], 2048);
        CK(cudaMemcpyAsync(d_desc, &h, sizeof h, cudaMemcpyHostToDevice, t.st));
        printf("  context %6d:              ", ctxs[c]);
        for (int k = 0; k < 3; k++) {
            double ms;
            sfi_gpu_attn_set_stages(depth[k]);
            TIME_MS(&t, ms, sfi_gpu_attn_dense(&h, d_desc, dt, q, kp, vp, out, NULL, &aws, 0, t.st));
            printf(" %11.1f", ms * 1e3);
            depth_ms[k] += ms;
        }
        printf("\n");
        if (n_ctx == 1)
            break;
    }
    int best_depth = 1;
    for (int k = 0; k < 3; k++)
        if (depth_ms[k] < depth_ms[best_depth])
            best_depth = k;
    sfi_gpu_attn_set_stages(depth[best_depth]);
    printf("using %d stages for the rest of this run\n", depth[best_depth]);

    /* 3. dense decode */
    double dense_us[4] = {0}, dense_lg_us[4] = {0}, torch_us[4] = {0};
    printf("\ndense decode, batch %d, %d q / %d kv heads, D %d, bf16, page %d\n", B, HQ, HKV, D,
           PAGE);
    printf("%8s %10s %10s %9s %9s %12s\n", "context", "us", "us+logits", "GB/s", "of copy",
           "logits GB/s");
    double frac_sum = 0;
    for (int c = 0; c < n_ctx; c++) {
        const int ctx = ctxs[c];
        make_desc(&h, d_bt, max_blocks, ctx, 2048);
        CK(cudaMemcpyAsync(d_desc, &h, sizeof h, cudaMemcpyHostToDevice, t.st));
        double ms, ms2;
        TIME_MS(&t, ms, sfi_gpu_attn_dense(&h, d_desc, dt, q, kp, vp, out, NULL, &aws, 0, t.st));
        TIME_MS(&t, ms2, sfi_gpu_attn_dense(&h, d_desc, dt, q, kp, vp, out, logits, &aws, 0, t.st));
        const double bytes = 2.0 * B * ctx * HKV * D * esz;
        const double bytes_lg = bytes + 4.0 * B * HQ * ctx;
        dense_us[c] = ms * 1e3;
        dense_lg_us[c] = ms2 * 1e3;
        frac_sum += bytes / (ms * 1e-3) / copy_bw;
        printf("%8d %10.1f %10.1f %9.1f %8.1f%% %12.1f\n", ctx, ms * 1e3, ms2 * 1e3,
               bytes / (ms * 1e-3) / 1e9, 100.0 * bytes / (ms * 1e-3) / copy_bw,
               bytes_lg / (ms2 * 1e-3) / 1e9);
        add_meas("attn_dense_nologits", ctx, 0, 1, ms * 1e3);
        add_meas("attn_dense", ctx, 0, 1, ms2 * 1e3);
    }
    const double dense_frac = frac_sum / n_ctx;
    /* grid-size sweep (waves of one CTA per SM: 2 waves = two splits per
     * pair at batch 16) at the shortest and longest context; the kernels
     * default to 1 wave */
    printf("grid size sweep (us):");
    for (int wv = 1; wv <= 8; wv *= 2)
        printf(" %6d wave%s", wv, wv > 1 ? "s" : " ");
    printf("\n");
    for (int c = 0; c < n_ctx; c += n_ctx - 1) {
        make_desc(&h, d_bt, max_blocks, ctxs[c], 2048);
        CK(cudaMemcpyAsync(d_desc, &h, sizeof h, cudaMemcpyHostToDevice, t.st));
        printf("  context %6d:     ", ctxs[c]);
        for (int wv = 1; wv <= 8; wv *= 2) {
            double ms;
            sfi_gpu_attn_set_waves(wv);
            TIME_MS(&t, ms, sfi_gpu_attn_dense(&h, d_desc, dt, q, kp, vp, out, NULL, &aws, 0, t.st));
            printf(" %11.1f", ms * 1e3);
        }
        printf("\n");
        if (n_ctx == 1)
            break;
    }
    sfi_gpu_attn_set_waves(1);
    printf("dense with logits, mean over contexts: %.1f us at %d\n", dense_lg_us[0], ctxs[0]);
    printf("dense mean fraction of copy bandwidth: %.1f%% (target >= 80%%)\n", 100 * dense_frac);

    if (torch_cmd) {
        printf("\nPyTorch SDPA, same shapes (%s)\n", torch_cmd);
        CK(cudaDeviceSynchronize());
        if (run_torch(torch_cmd, ctxs, n_ctx, torch_us) > 0) {
            printf("%8s %10s %10s %8s\n", "context", "ours us", "torch us", "ratio");
            for (int c = 0; c < n_ctx; c++)
                if (torch_us[c] > 0)
                    printf("%8d %10.1f %10.1f %7.2fx (target <= 1.10x)\n", ctxs[c], dense_us[c],
                           torch_us[c], dense_us[c] / torch_us[c]);
        }
    }

    /* 4. sparse fast step vs dense at 16K. Two timings: back to back on
     * one set of buffers (what the dense row above does; at low retention
     * the sparse working set fits in the 50 MB L2, so this is the warm
     * case), and rotating over N_COLD sets (each its own compact buffers
     * and block table, so its own recent-window pages) whose total is
     * larger than L2: the cold case, as in a model where the other
     * layers' reads flush L2 between two visits of a layer. */
    enum { N_COLD = 8 };
    const int sp_ctx = 16384;
    const double ret[5] = {0.016, 0.063, 0.125, 0.25, 0.50};
    const double tgt[5] = {16, 12, 7.5, 3.9, 2};
    const int maxK = (int)(0.5 * sp_ctx) - N_SINK - N_RECENT + 1;
    const size_t comp_bytes = (size_t)B * HKV * (N_SINK + maxK) * D * esz;
    void *ckc[N_COLD], *cvc[N_COLD];
    int32_t *d_btc[N_COLD];
    sfi_gpu_step_desc *d_descc[N_COLD];
    for (int c = 0; c < N_COLD; c++) {
        CK(cudaMalloc(&ckc[c], comp_bytes));
        CK(cudaMalloc(&cvc[c], comp_bytes));
        CK(cudaMalloc((void **)&d_descc[c], sizeof h));
        shuffle_blocks(bt, n_blocks);
        CK(cudaMalloc((void **)&d_btc[c], n_blocks * sizeof *bt));
        CK(cudaMemcpy(d_btc[c], bt, n_blocks * sizeof *bt, cudaMemcpyHostToDevice));
    }
    void *ck = ckc[0], *cv = cvc[0];
    int32_t *d_sel;
    CK(cudaMalloc((void **)&d_sel, (size_t)B * HKV * maxK * 4));
    int32_t *sel = malloc((size_t)B * HKV * maxK * 4);
    if (!sel) {
        fprintf(stderr, "sfi-gpu bench: out of memory\n");
        return 1;
    }
    double sparse_eff = 0;
    printf("\nsparse fast step (sink %d + selected K + recent %d) vs dense, context %d, batch %d\n",
           N_SINK, N_RECENT, sp_ctx, B);
    /* dense again here, in the same thermal state as the sparse runs (a
     * long run heats the GPU and lowers its clocks; ratios compare
     * neighbouring measurements) */
    double dense16_ms;
    make_desc(&h, d_bt, max_blocks, sp_ctx, 2);
    CK(cudaMemcpyAsync(d_desc, &h, sizeof h, cudaMemcpyHostToDevice, t.st));
    TIME_MS(&t, dense16_ms, sfi_gpu_attn_dense(&h, d_desc, dt, q, kp, vp, out, NULL, &aws, 0, t.st));
    const double dense16_us = dense16_ms * 1e3;
    double sweep_us[5][3];
    double cold_us[5], warm_us[5];
    int Ks[5];
    for (int i = 0; i < 5; i++) {
        int K = (int)(ret[i] * sp_ctx + 0.5) - N_SINK - N_RECENT;
        if (K < 1)
            K = 1;
        Ks[i] = K;
        make_desc(&h, d_bt, max_blocks, sp_ctx, K);
        const int nJ = h.max_J;
        for (int r = 0; r < B * HKV; r++)
            for (int k = 0; k < K; k++)
                sel[(size_t)r * K + k] = N_SINK + (int)((int64_t)k * nJ / K);
        CK(cudaMemcpy(d_sel, sel, (size_t)B * HKV * K * 4, cudaMemcpyHostToDevice));
        for (int c = 0; c < N_COLD; c++) {
            sfi_gpu_step_desc hc = h;
            hc.block_table = d_btc[c];
            CK(cudaMemcpyAsync(d_descc[c], &hc, sizeof hc, cudaMemcpyHostToDevice, t.st));
            CK(sfi_gpu_reorg(&hc, d_descc[c], dt, kp, vp, d_sel, ckc[c], cvc[c], NULL, t.st));
        }
        h.block_table = d_btc[0];
        double ms;
        for (int j = 0; j < 3; j++) {
            sfi_gpu_attn_set_waves(1 << j);
            TIME_MS(&t, ms, sfi_gpu_attn_sparse(&h, d_descc[0], dt, q, kp, vp, ck, cv, NULL, out,
                                                &aws, 0, t.st));
            sweep_us[i][j] = ms * 1e3;
        }
        sfi_gpu_attn_set_waves(1);
        TIME_MS(&t, ms, sfi_gpu_attn_sparse(&h, d_descc[0], dt, q, kp, vp, ck, cv, NULL, out, &aws,
                                            0, t.st));
        warm_us[i] = ms * 1e3;
        int rot = 0;
        TIME_MS(&t, ms, (rot = (rot + 1) % N_COLD,
                         sfi_gpu_attn_sparse(&h, d_descc[rot], dt, q, kp, vp, ckc[rot], cvc[rot],
                                             NULL, out, &aws, 0, t.st)));
        cold_us[i] = ms * 1e3;
    }
    printf("%9s %6s %10s %10s %10s %9s %9s %8s\n", "retention", "K", "warm us", "cold us",
           "dense us", "warm x", "cold x", "target");
    for (int i = 0; i < 5; i++) {
        const int rows = N_SINK + Ks[i] + N_RECENT;
        const double spw = dense16_us / warm_us[i], spc = dense16_us / cold_us[i];
        printf("%8.1f%% %6d %10.1f %10.1f %10.1f %8.1fx %8.1fx %7.1fx%s\n", 100 * ret[i], Ks[i],
               warm_us[i], cold_us[i], dense16_us, spw, spc, tgt[i],
               spc >= tgt[i] ? "" : (spw >= tgt[i] ? "  (cold below target)" : "  (below target)"));
        add_meas("attn_sparse", rows, Ks[i], 1, cold_us[i]); /* context = positions read */
        if (i == 2 && pk > 0)
            sparse_eff = 2.0 * B * rows * HKV * D * esz / (cold_us[i] * 1e-6) / pk;
    }
    printf("grid size sweep (warm us):     1 wave   2 waves   4 waves\n");
    for (int i = 0; i < 5; i++) {
        printf("  retention %5.1f%%:     ", 100 * ret[i]);
        for (int j = 0; j < 3; j++)
            printf(" %9.1f", sweep_us[i][j]);
        printf("\n");
    }

    /* 5. Selector + reorg vs dense attention of one layer at 32K */
    const int s_ctx = 32768, s_K = 2048;
    make_desc(&h, d_bt, max_blocks, s_ctx, s_K);
    CK(cudaMemcpyAsync(d_desc, &h, sizeof h, cudaMemcpyHostToDevice, t.st));
    sfi_gpu_sel_params prm = {.alpha = 0.5f, .gamma = 1.0f, .beta = 1.0f, .p = 2.0f, .eta = 0.5f,
                              .lambda_clip = 0.02f, .alpha_soft = 0.5f, .T = 1.0f,
                              .alpha_cross = 0.35f, .eps = 1e-8f, .nms_radius = 2};
    void *sel_mem;
    const size_t sel_bytes = sfi_gpu_sel_ws_bytes(B, HKV, h.max_J);
    CK(cudaMalloc(&sel_mem, SFI_GPU_RING * sel_bytes));
    sfi_gpu_sel_ws sws[SFI_GPU_RING];
    for (int i = 0; i < SFI_GPU_RING; i++)
        sfi_gpu_sel_ws_carve(&sws[i], (char *)sel_mem + i * sel_bytes, B, HKV, h.max_J);
    void *ck2, *cv2;
    int32_t *d_sel2;
    CK(cudaMalloc(&ck2, (size_t)B * HKV * (N_SINK + s_K) * D * esz));
    CK(cudaMalloc(&cv2, (size_t)B * HKV * (N_SINK + s_K) * D * esz));
    CK(cudaMalloc((void **)&d_sel2, (size_t)B * HKV * s_K * 4));
    h.ld_logits = s_ctx;
    CK(cudaMemcpyAsync(d_desc, &h, sizeof h, cudaMemcpyHostToDevice, t.st));
    CK(sfi_gpu_key_norms(&h, d_desc, dt, kp, norms, t.st));
    double dl_ms, sel_ms, topk_ms, reorg_ms, both_ms;
    TIME_MS(&t, dl_ms, sfi_gpu_attn_dense(&h, d_desc, dt, q, kp, vp, out, logits, &aws, 0, t.st));
    TIME_MS(&t, sel_ms, sfi_gpu_selector(&h, d_desc, &prm, logits, norms, &sws[0], NULL, d_sel2, 0,
                                         t.st));
    TIME_MS(&t, topk_ms, sfi_gpu_topk(&h, d_desc, sws[0].z1, h.max_J, d_sel2, t.st));
    TIME_MS(&t, reorg_ms, sfi_gpu_reorg(&h, d_desc, dt, kp, vp, d_sel2, ck2, cv2, NULL, t.st));
    TIME_MS(&t, both_ms, sel_and_reorg(&h, d_desc, dt, &prm, logits, norms, &sws[0], d_sel2, kp,
                                       vp, ck2, cv2, t.st));
    printf("\nSelector + reorg, %d KV heads, context %d (|J| %d), K %d, batch %d\n", HKV, s_ctx,
           h.max_J, s_K, B);
    printf("  dense attention with logits: %8.1f us\n", dl_ms * 1e3);
    printf("  Selector (steps 1-9):        %8.1f us  (of which Top-K %.1f us)\n", sel_ms * 1e3,
           topk_ms * 1e3);
    printf("  reorg:                       %8.1f us\n", reorg_ms * 1e3);
    printf("  Selector + reorg:            %8.1f us = %.1f%% of dense (target <= 30%%)\n",
           both_ms * 1e3, 100 * both_ms / dl_ms);
    add_meas("selector", s_ctx, s_K, 1, (sel_ms - topk_ms) * 1e3);
    add_meas("topk", s_ctx, s_K, 1, topk_ms * 1e3);
    add_meas("reorg", s_ctx, s_K, 1, reorg_ms * 1e3);
    add_meas("selector_reorg", s_ctx, s_K, 1, both_ms * 1e3);

    /* 6. two-stream slow step over 28 layers at 32K (layers share one KV
     * cache and one compact buffer: same traffic, less memory) */
    const int L = 28;
    int lo, hi;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    sfi_gpu_slow_plan pl;
    memset(&pl, 0, sizeof pl);
    const void *kps[28], *vps[28];
    void *cks[28], *cvs[28];
    int32_t *sels[28];
    const float *nrms[28];
    for (int i = 0; i < L; i++) {
        kps[i] = kp;
        vps[i] = vp;
        cks[i] = ck2;
        cvs[i] = cv2;
        sels[i] = d_sel2;
        nrms[i] = norms;
    }
    pl.n_layers = L;
    pl.k_pool = kps;
    pl.v_pool = vps;
    pl.ck = cks;
    pl.cv = cvs;
    pl.selected = sels;
    pl.key_norms = nrms;
    pl.q = q;
    pl.out = out;
    pl.attn_ws = aws;
    for (int i = 0; i < SFI_GPU_RING; i++) {
        pl.logits[i] = logits + (size_t)i * B * HQ * s_ctx;
        pl.sel_ws[i] = sws[i];
        CK(cudaEventCreateWithFlags(&pl.ev_attn[i], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&pl.ev_free[i], cudaEventDisableTiming));
    }
    CK(cudaEventCreateWithFlags(&pl.ev_done, cudaEventDisableTiming));
    CK(cudaStreamCreateWithPriority(&pl.main_st, cudaStreamNonBlocking, hi));
    CK(cudaStreamCreateWithPriority(&pl.side_st, cudaStreamNonBlocking, lo));
    timer tm = t;
    tm.st = pl.main_st;
    tm.reps = quick ? 2 : 5;
    tm.warm = 1;
    double attn_only_ms, serial_ms, overlap_ms = 0, ov_ms[3];
    int ov_waves = 1;
    TIME_MS(&tm, attn_only_ms, attn_layers(&pl, &h, d_desc, dt));
    TIME_MS(&tm, serial_ms, sfi_gpu_slow_step(&pl, &h, d_desc, dt, &prm, 0));
    /* the overlapped schedule with the attention grid at 1, 2 and 4 waves
     * (see sfi_gpu_attn_ws.waves); the fastest is reported */
    for (int j = 0; j < 3; j++) {
        pl.attn_ws.waves = 1 << j;
        TIME_MS(&tm, ov_ms[j], sfi_gpu_slow_step(&pl, &h, d_desc, dt, &prm, 1));
        if (j == 0 || ov_ms[j] < overlap_ms) {
            overlap_ms = ov_ms[j];
            ov_waves = 1 << j;
        }
    }
    pl.attn_ws.waves = 0;
    add_meas("attn_layers", s_ctx, s_K, L, attn_only_ms * 1e3);
    add_meas("slow_step_serial", s_ctx, s_K, L, serial_ms * 1e3);
    add_meas("slow_step_overlap", s_ctx, s_K, L, overlap_ms * 1e3);
    const double side_ms = serial_ms - attn_only_ms;
    const double exposed_ms = overlap_ms - attn_only_ms;
    printf("\ntwo-stream slow step, %d layers, context %d, batch %d, K %d\n", L, s_ctx, B, s_K);
    printf("  attention only:             %9.1f us\n", attn_only_ms * 1e3);
    printf("  one stream (no overlap):    %9.1f us\n", serial_ms * 1e3);
    printf("  two streams, attention at 1/2/4 waves: %.1f / %.1f / %.1f us\n", ov_ms[0] * 1e3,
           ov_ms[1] * 1e3, ov_ms[2] * 1e3);
    printf("  two streams (overlap):      %9.1f us (attention at %d wave%s)\n", overlap_ms * 1e3,
           ov_waves, ov_waves > 1 ? "s" : "");
    printf("  Selector+reorg exposed:     %9.1f us of %.1f us (%.1f%%)\n", exposed_ms * 1e3,
           side_ms * 1e3, side_ms > 0 ? 100 * exposed_ms / side_ms : 0.0);

    /* 7. calibration profile (format: sim/sfi_hw.h) */
    double eff_dense = pk > 0 ? dense_frac * copy_bw / pk : dense_frac;
    /* Selector bytes model: per (request, KV head) the window logits and
     * the key norms are read once ((G + 1) * |J| * 4 bytes); Top-K reads
     * |J| scores; reorg reads and writes (sink + K) rows of K and V. */
    const double nJ = h.max_J;
    const double sel_bytes_m = (double)B * HKV * (HQ / HKV + 1) * nJ * 4;
    const double topk_bytes = (double)B * HKV * nJ * 4;
    const double reorg_bytes = 2.0 * 2.0 * B * HKV * (N_SINK + s_K) * D * esz;
    const double den_bw = pk > 0 ? pk : copy_bw;
    double eff_sel = sel_bytes_m / den_bw / ((sel_ms - topk_ms) * 1e-3);
    double eff_topk = topk_bytes / den_bw / (topk_ms * 1e-3);
    double eff_reorg = reorg_bytes / den_bw / (reorg_ms * 1e-3);
    if (sparse_eff <= 0)
        sparse_eff = eff_dense;
#define CLAMP01(x) ((x) > 1 ? 1.0 : ((x) < 0.01 ? 0.01 : (x)))
    double contention = side_ms > 0 ? exposed_ms / side_ms : 0;
    /* The output rule of sfi_io.h, like every other output. */
    sfi_out *pout;
    FILE *f;
    sfi_error err;
    if (sfi_out_open(profile, &pout, &f, &err) != SFI_OK) {
        fprintf(stderr, "sfi-gpu bench: %s\n", err.msg);
        return 1;
    }
    /* --name and the device name are user/driver text: JSON-escaped, so a
     * quote or a backslash in them cannot break or extend the profile. */
    const char *gname =
        strstr(prop.name, "H100") ? "H100-SXM" : (strstr(prop.name, "H200") ? "H200" : prop.name);
    json_t *jn = json_string(name), *jg = json_string(gname);
    char *qn = jn ? json_dumps(jn, JSON_ENCODE_ANY) : NULL;
    char *qg = jg ? json_dumps(jg, JSON_ENCODE_ANY) : NULL;
    json_decref(jn);
    json_decref(jg);
    if (!qn || !qg) {
        fprintf(stderr, "sfi-gpu bench: --name '%s' or the device name is not UTF-8 text\n",
                name);
        free(qn);
        free(qg);
        sfi_out_abort(pout);
        return 1;
    }
    fprintf(f, "{ \"sfi_profile\": 1, \"name\": %s, \"gpu\": %s,\n", qn, qg);
    free(qn);
    free(qg);
    fprintf(f, "  \"efficiency\": { \"attn_dense\": %.3f, \"attn_sparse\": %.3f,\n",
            CLAMP01(eff_dense), CLAMP01(sparse_eff));
    fprintf(f, "                  \"selector\": %.3f, \"topk\": %.3f, \"reorg\": %.3f },\n",
            CLAMP01(eff_sel), CLAMP01(eff_topk), CLAMP01(eff_reorg));
    fprintf(f, "  \"launch_us\": %.2f,\n  \"overlap_contention\": %.3f,\n", noop_ms * 1e3,
            CLAMP01(contention));
    fprintf(f, "  \"measurements\": [\n");
    for (int i = 0; i < g_nmeas; i++) {
        const meas *m = &g_meas[i];
        fprintf(f,
                "    { \"kernel\": \"%s\", \"batch\": %d, \"context\": %d, \"q_heads\": %d, "
                "\"kv_heads\": %d, \"head_dim\": %d, \"K\": %d, \"layers\": %d, "
                "\"time_us\": %.2f }%s\n",
                m->kernel, m->batch, m->context, HQ, HKV, D, m->K, m->layers, m->us,
                i + 1 < g_nmeas ? "," : "");
    }
    fprintf(f, "  ] }\n");
    if (sfi_out_commit(pout, 0, &err) != SFI_OK) {
        fprintf(stderr, "sfi-gpu bench: %s\n", err.msg);
        return 1;
    }
    printf("\nprofile written to %s\n", profile);
    return 0;
}
