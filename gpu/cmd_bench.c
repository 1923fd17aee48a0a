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
#include "sfi_rng.h"
#include "sfi_gpu_cli.h"

#define CK(x) SFI_GPU_CK("bench", x, #x)

/* Shapes of the issue: Qwen3-like heads, batch 16, bf16 KV. */
enum { B = 16, HQ = 32, HKV = 8, D = 128, PAGE = 64, N_SINK = 4, N_RECENT = 256 };

typedef struct {
    cudaEvent_t e0, e1;
    cudaStream_t st;
    int warm, reps;
} timer;

#define TIME_MS(t, out_ms, stmt)                                                                   \
    do {                                                                                           \
        for (int w_ = 0; w_ < (t)->warm; w_++)                                                     \
            CK(stmt);                                                                              \
        CK(cudaEventRecord((t)->e0, (t)->st));                                                     \
        for (int r_ = 0; r_ < (t)->reps; r_++)                                                     \
            CK(stmt);                                                                              \
        CK(cudaEventRecord((t)->e1, (t)->st));                                                     \
        CK(cudaEventSynchronize((t)->e1));                                                         \
        float ms_;                                                                                 \
        CK(cudaEventElapsedTime(&ms_, (t)->e0, (t)->e1));                                          \
        (out_ms) = ms_ / (t)->reps;                                                                \
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

static uint64_t rng_state = 1;

/* Fisher-Yates shuffle of a block table (a serving engine's blocks are
 * scattered). */
static void shuffle_blocks(int32_t *bt, size_t n)
{
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)(sfi_rng_next(&rng_state) % (i + 1));
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
static cudaError_t sel_and_reorg(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dt,
                                 const sfi_gpu_sel_params *prm, const float *logits,
                                 const float *norms, const sfi_gpu_sel_ws *ws, int32_t *sel,
                                 const void *kp, const void *vp, void *ck, void *cv,
                                 cudaStream_t st)
{
    cudaError_t e = sfi_gpu_selector(h, d, prm, logits, norms, ws, NULL, sel, 0, st);
    if (e)
        return e;
    return sfi_gpu_reorg(h, d, dt, kp, vp, sel, ck, cv, NULL, st);
}

/* The main stream's part of a slow step alone: every layer's attention. */
static cudaError_t attn_layers(const sfi_gpu_slow_plan *pl, const sfi_gpu_step_desc *h,
                               const sfi_gpu_step_desc *d, int dt)
{
    for (int i = 0; i < pl->n_layers; i++) {
        cudaError_t e =
            sfi_gpu_attn_dense(h, d, dt, pl->q, pl->k_pool[i], pl->v_pool[i], pl->out,
                               pl->logits[i % SFI_GPU_RING], &pl->attn_ws, 0, pl->main_st);
        if (e)
            return e;
    }
    return cudaSuccess;
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

/* The command line. */
typedef struct {
    const char *profile, *name, *torch_cmd;
    int quick;
} bench_args;

/* Returns -1 to go on, else the exit status (0 for --help). */
static int parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){.profile = "sfi-gpu-profile.json", .name = "measured"};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            bench_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--quick"))
            a->quick = 1;
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc)
            a->profile = argv[++i];
        else if (!strcmp(argv[i], "--name") && i + 1 < argc)
            a->name = argv[++i];
        else if (!strcmp(argv[i], "--torch") && i + 1 < argc)
            a->torch_cmd = argv[++i];
        else {
            fprintf(stderr, "sfi-gpu bench: unknown or incomplete option '%s' (try --help)\n",
                    argv[i]);
            return 2;
        }
    }
    return -1;
}

/* What the phases share: the KV pool and its scattered block table, the
 * query, output, logits and norms buffers, the descriptor (the phases set
 * it in turn; the Selector phase leaves the one the slow step uses), and
 * the numbers the profile is made of. The buffers live until exit. */
typedef struct {
    timer t;
    int dt, esz, n_ctx, max_ctx, max_blocks;
    const int *ctxs;
    size_t n_blocks, pool_elems;
    void *kp, *vp;
    int32_t *bt, *d_bt;
    float *q, *out, *logits, *norms;
    sfi_gpu_attn_ws aws;
    sfi_gpu_step_desc h, *d_desc;
    /* the Selector phase's, used again by the slow step */
    sfi_gpu_sel_params prm;
    sfi_gpu_sel_ws sws[SFI_GPU_RING];
    void *ck2, *cv2;
    int32_t *d_sel2;
    /* results */
    double copy_bw, pk, noop_ms, dense_frac, sparse_eff, sel_ms, topk_ms, reorg_ms, side_ms,
        exposed_ms;
} bench;

/* Sets h for batch B at context ctx and copies it to the device. */
static void set_desc(bench *b, int ctx, int K)
{
    make_desc(&b->h, b->d_bt, b->max_blocks, ctx, K);
    CK(cudaMemcpyAsync(b->d_desc, &b->h, sizeof b->h, cudaMemcpyHostToDevice, b->t.st));
}

/* The shared buffers, filled with random values. Returns 0 or 1. */
static int setup(bench *b, int quick)
{
    static const int ctxs[4] = {16384, 32768, 65536, 131072};
    b->dt = SFI_GPU_BF16;
    b->esz = 2;
    b->ctxs = ctxs;
    b->n_ctx = quick ? 2 : 4;
    b->max_ctx = ctxs[b->n_ctx - 1];
    b->max_blocks = b->max_ctx / PAGE;
    b->n_blocks = (size_t)B * b->max_blocks;
    b->pool_elems = b->n_blocks * HKV * PAGE * D;
    timer *t = &b->t;
    CK(cudaStreamCreate(&t->st));
    CK(cudaEventCreate(&t->e0));
    CK(cudaEventCreate(&t->e1));
    t->warm = 3;
    t->reps = quick ? 5 : 20;

    CK(cudaMalloc(&b->kp, b->pool_elems * b->esz));
    CK(cudaMalloc(&b->vp, b->pool_elems * b->esz));
    CK(sfi_gpu_fill_random(b->kp, b->pool_elems, b->dt, 1, 1.0f, t->st));
    CK(sfi_gpu_fill_random(b->vp, b->pool_elems, b->dt, 2, 1.0f, t->st));
    /* block table: a random permutation of the pool (a serving engine's
     * blocks are scattered) */
    b->bt = malloc(b->n_blocks * sizeof *b->bt);
    if (!b->bt) {
        fprintf(stderr, "sfi-gpu bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < b->n_blocks; i++)
        b->bt[i] = (int32_t)i;
    shuffle_blocks(b->bt, b->n_blocks);
    CK(cudaMalloc((void **)&b->d_bt, b->n_blocks * sizeof *b->bt));
    CK(cudaMemcpy(b->d_bt, b->bt, b->n_blocks * sizeof *b->bt, cudaMemcpyHostToDevice));

    CK(cudaMalloc((void **)&b->q, (size_t)B * HQ * D * 4));
    CK(cudaMalloc((void **)&b->out, (size_t)B * HQ * D * 4));
    CK(sfi_gpu_fill_random(b->q, (size_t)B * HQ * D, SFI_GPU_F32, 3, 1.0f, t->st));
    /* logits: the ring of the two-stream schedule, slot 0 used alone */
    const int ov_ctx = 32768;
    const size_t logit_elems = (size_t)B * HQ * b->max_ctx;
    CK(cudaMalloc((void **)&b->logits, logit_elems * 4 > 4 * (size_t)B * HQ * ov_ctx * 4
                                           ? logit_elems * 4
                                           : 4 * (size_t)B * HQ * ov_ctx * 4));
    CK(cudaMalloc((void **)&b->norms, (size_t)B * HKV * b->max_ctx * 4));
    void *attn_ws_mem;
    CK(cudaMalloc(&attn_ws_mem, sfi_gpu_attn_ws_bytes(B, HQ, D)));
    sfi_gpu_attn_ws_carve(&b->aws, attn_ws_mem, B, HQ, D);
    CK(sfi_gpu_attn_ws_init(&b->aws, 0));
    CK(cudaMalloc((void **)&b->d_desc, sizeof b->h));
    return 0;
}

/* 1. copy bandwidth: 2 GiB read + 2 GiB written (less with --quick);
 * 2. launch overhead. */
static void bench_copy_and_launch(bench *b)
{
    size_t cp_bytes = (size_t)2 << 30;
    if (cp_bytes > b->pool_elems * b->esz)
        cp_bytes = b->pool_elems * b->esz;
    double copy_ms;
    TIME_MS(&b->t, copy_ms,
            cudaMemcpyAsync(b->vp, b->kp, cp_bytes, cudaMemcpyDeviceToDevice, b->t.st));
    CK(sfi_gpu_fill_random(b->vp, b->pool_elems, b->dt, 2, 1.0f, b->t.st));
    b->copy_bw = 2.0 * cp_bytes / (copy_ms * 1e-3);
    b->pk = peak_bw();
    printf(
        "copy D2D: %.3f ms for %zu MiB, %.1f GB/s (read+write); peak from attributes %.1f GB/s\n",
        copy_ms, cp_bytes >> 20, b->copy_bw / 1e9, b->pk / 1e9);

    timer t2 = b->t;
    t2.reps = 1000;
    TIME_MS(&t2, b->noop_ms, sfi_gpu_noop(b->t.st));
    printf("empty kernel: %.2f us per launch (back to back)\n", b->noop_ms * 1e3);
}

/* 3a. pipeline depth at the shortest and longest context (the library
 * default is 3 stages); the fastest in total is used for the rest of the
 * run. */
static void bench_depth(bench *b)
{
    static const int depth[3] = {2, 3, 4};
    double depth_ms[3] = {0};
    printf("\npipeline stages sweep (us):     2 stages    3 stages    4 stages\n");
    for (int c = 0; c < b->n_ctx; c += b->n_ctx - 1) {
        set_desc(b, b->ctxs[c], 2048);
        printf("  context %6d:              ", b->ctxs[c]);
        for (int k = 0; k < 3; k++) {
            double ms;
            sfi_gpu_attn_set_stages(depth[k]);
            TIME_MS(&b->t, ms,
                    sfi_gpu_attn_dense(&b->h, b->d_desc, b->dt, b->q, b->kp, b->vp, b->out, NULL,
                                       &b->aws, 0, b->t.st));
            printf(" %11.1f", ms * 1e3);
            depth_ms[k] += ms;
        }
        printf("\n");
        if (b->n_ctx == 1)
            break;
    }
    int best_depth = 1;
    for (int k = 0; k < 3; k++)
        if (depth_ms[k] < depth_ms[best_depth])
            best_depth = k;
    sfi_gpu_attn_set_stages(depth[best_depth]);
    printf("using %d stages for the rest of this run\n", depth[best_depth]);
}

/* Grid-size sweep (waves of one CTA per SM: 2 waves = two splits per pair
 * at batch 16) at the shortest and longest context; the kernels default
 * to 1 wave. */
static void bench_dense_waves(bench *b)
{
    printf("grid size sweep (us):");
    for (int wv = 1; wv <= 8; wv *= 2)
        printf(" %6d wave%s", wv, wv > 1 ? "s" : " ");
    printf("\n");
    for (int c = 0; c < b->n_ctx; c += b->n_ctx - 1) {
        set_desc(b, b->ctxs[c], 2048);
        printf("  context %6d:     ", b->ctxs[c]);
        for (int wv = 1; wv <= 8; wv *= 2) {
            double ms;
            sfi_gpu_attn_set_waves(wv);
            TIME_MS(&b->t, ms,
                    sfi_gpu_attn_dense(&b->h, b->d_desc, b->dt, b->q, b->kp, b->vp, b->out, NULL,
                                       &b->aws, 0, b->t.st));
            printf(" %11.1f", ms * 1e3);
        }
        printf("\n");
        if (b->n_ctx == 1)
            break;
    }
    sfi_gpu_attn_set_waves(1);
}

/* PyTorch's SDPA on the same shapes, against our dense times. */
static void bench_torch(const bench *b, const char *torch_cmd, const double *dense_us)
{
    double torch_us[4] = {0};
    printf("\nPyTorch SDPA, same shapes (%s)\n", torch_cmd);
    CK(cudaDeviceSynchronize());
    if (run_torch(torch_cmd, b->ctxs, b->n_ctx, torch_us) > 0) {
        printf("%8s %10s %10s %8s\n", "context", "ours us", "torch us", "ratio");
        for (int c = 0; c < b->n_ctx; c++)
            if (torch_us[c] > 0)
                printf("%8d %10.1f %10.1f %7.2fx (target <= 1.10x)\n", b->ctxs[c], dense_us[c],
                       torch_us[c], dense_us[c] / torch_us[c]);
    }
}

/* 3. dense decode with and without logits at every context, as a
 * fraction of the copy bandwidth. */
static void bench_dense(bench *b, const char *torch_cmd)
{
    double dense_us[4] = {0}, dense_lg_us[4] = {0};
    printf("\ndense decode, batch %d, %d q / %d kv heads, D %d, bf16, page %d\n", B, HQ, HKV, D,
           PAGE);
    printf("%8s %10s %10s %9s %9s %12s\n", "context", "us", "us+logits", "GB/s", "of copy",
           "logits GB/s");
    double frac_sum = 0;
    for (int c = 0; c < b->n_ctx; c++) {
        const int ctx = b->ctxs[c];
        set_desc(b, ctx, 2048);
        double ms, ms2;
        TIME_MS(&b->t, ms,
                sfi_gpu_attn_dense(&b->h, b->d_desc, b->dt, b->q, b->kp, b->vp, b->out, NULL,
                                   &b->aws, 0, b->t.st));
        TIME_MS(&b->t, ms2,
                sfi_gpu_attn_dense(&b->h, b->d_desc, b->dt, b->q, b->kp, b->vp, b->out, b->logits,
                                   &b->aws, 0, b->t.st));
        const double bytes = 2.0 * B * ctx * HKV * D * b->esz;
        const double bytes_lg = bytes + 4.0 * B * HQ * ctx;
        dense_us[c] = ms * 1e3;
        dense_lg_us[c] = ms2 * 1e3;
        frac_sum += bytes / (ms * 1e-3) / b->copy_bw;
        printf("%8d %10.1f %10.1f %9.1f %8.1f%% %12.1f\n", ctx, ms * 1e3, ms2 * 1e3,
               bytes / (ms * 1e-3) / 1e9, 100.0 * bytes / (ms * 1e-3) / b->copy_bw,
               bytes_lg / (ms2 * 1e-3) / 1e9);
        add_meas("attn_dense_nologits", ctx, 0, 1, ms * 1e3);
        add_meas("attn_dense", ctx, 0, 1, ms2 * 1e3);
    }
    b->dense_frac = frac_sum / b->n_ctx;
    bench_dense_waves(b);
    printf("dense with logits, mean over contexts: %.1f us at %d\n", dense_lg_us[0], b->ctxs[0]);
    printf("dense mean fraction of copy bandwidth: %.1f%% (target >= 80%%)\n", 100 * b->dense_frac);
    if (torch_cmd)
        bench_torch(b, torch_cmd, dense_us);
}

/* 4. sparse fast step vs dense at 16K. Two timings: back to back on one
 * set of buffers (what the dense row above does; at low retention the
 * sparse working set fits in the 50 MB L2, so this is the warm case), and
 * rotating over N_COLD sets (each its own compact buffers and block table,
 * so its own recent-window pages) whose total is larger than L2: the cold
 * case, as in a model where the other layers' reads flush L2 between two
 * visits of a layer. */
enum { N_COLD = 8, N_RET = 5 };

typedef struct {
    void *ckc[N_COLD], *cvc[N_COLD];
    int32_t *d_btc[N_COLD];
    sfi_gpu_step_desc *d_descc[N_COLD];
    int32_t *d_sel, *sel;
} cold_sets;

/* The N_COLD sets, each with its own shuffle of the block table. Returns
 * 0 or 1. */
static int cold_sets_make(bench *b, int maxK, cold_sets *cs)
{
    const size_t comp_bytes = (size_t)B * HKV * (N_SINK + maxK) * D * b->esz;
    for (int c = 0; c < N_COLD; c++) {
        CK(cudaMalloc(&cs->ckc[c], comp_bytes));
        CK(cudaMalloc(&cs->cvc[c], comp_bytes));
        CK(cudaMalloc((void **)&cs->d_descc[c], sizeof b->h));
        shuffle_blocks(b->bt, b->n_blocks);
        CK(cudaMalloc((void **)&cs->d_btc[c], b->n_blocks * sizeof *b->bt));
        CK(cudaMemcpy(cs->d_btc[c], b->bt, b->n_blocks * sizeof *b->bt, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc((void **)&cs->d_sel, (size_t)B * HKV * maxK * 4));
    cs->sel = malloc((size_t)B * HKV * maxK * 4);
    if (!cs->sel) {
        fprintf(stderr, "sfi-gpu bench: out of memory\n");
        return 1;
    }
    return 0;
}

/* One retention of the sparse phase at context ctx with K selected: evenly
 * spread selections gathered into every cold set, then the warm time at 1,
 * 2 and 4 waves (sweep_us), warm at 1 wave and cold. */
static void bench_sparse_one(bench *b, cold_sets *cs, int ctx, int K, double *sweep_us,
                             double *warm_us, double *cold_us)
{
    sfi_gpu_step_desc *h = &b->h;
    make_desc(h, b->d_bt, b->max_blocks, ctx, K);
    const int nJ = h->max_J;
    for (int r = 0; r < B * HKV; r++)
        for (int k = 0; k < K; k++)
            cs->sel[(size_t)r * K + k] = N_SINK + (int)((int64_t)k * nJ / K);
    CK(cudaMemcpy(cs->d_sel, cs->sel, (size_t)B * HKV * K * 4, cudaMemcpyHostToDevice));
    for (int c = 0; c < N_COLD; c++) {
        sfi_gpu_step_desc hc = *h;
        hc.block_table = cs->d_btc[c];
        CK(cudaMemcpyAsync(cs->d_descc[c], &hc, sizeof hc, cudaMemcpyHostToDevice, b->t.st));
        CK(sfi_gpu_reorg(&hc, cs->d_descc[c], b->dt, b->kp, b->vp, cs->d_sel, cs->ckc[c],
                         cs->cvc[c], NULL, b->t.st));
    }
    h->block_table = cs->d_btc[0];
    void *ck = cs->ckc[0], *cv = cs->cvc[0];
    double ms;
    for (int j = 0; j < 3; j++) {
        sfi_gpu_attn_set_waves(1 << j);
        TIME_MS(&b->t, ms,
                sfi_gpu_attn_sparse(h, cs->d_descc[0], b->dt, b->q, b->kp, b->vp, ck, cv, NULL,
                                    b->out, &b->aws, 0, b->t.st));
        sweep_us[j] = ms * 1e3;
    }
    sfi_gpu_attn_set_waves(1);
    TIME_MS(&b->t, ms,
            sfi_gpu_attn_sparse(h, cs->d_descc[0], b->dt, b->q, b->kp, b->vp, ck, cv, NULL, b->out,
                                &b->aws, 0, b->t.st));
    *warm_us = ms * 1e3;
    int rot = 0;
    TIME_MS(&b->t, ms,
            (rot = (rot + 1) % N_COLD,
             sfi_gpu_attn_sparse(h, cs->d_descc[rot], b->dt, b->q, b->kp, b->vp, cs->ckc[rot],
                                 cs->cvc[rot], NULL, b->out, &b->aws, 0, b->t.st)));
    *cold_us = ms * 1e3;
}

/* 4. (see above) Returns 0 or 1. */
static int bench_sparse(bench *b)
{
    const int sp_ctx = 16384;
    const double ret[N_RET] = {0.016, 0.063, 0.125, 0.25, 0.50};
    const double tgt[N_RET] = {16, 12, 7.5, 3.9, 2};
    const int maxK = (int)(0.5 * sp_ctx) - N_SINK - N_RECENT + 1;
    cold_sets cs;
    if (cold_sets_make(b, maxK, &cs))
        return 1;
    b->sparse_eff = 0;
    printf("\nsparse fast step (sink %d + selected K + recent %d) vs dense, context %d, batch %d\n",
           N_SINK, N_RECENT, sp_ctx, B);
    /* dense again here, in the same thermal state as the sparse runs (a
     * long run heats the GPU and lowers its clocks; ratios compare
     * neighbouring measurements) */
    double dense16_ms;
    set_desc(b, sp_ctx, 2);
    TIME_MS(&b->t, dense16_ms,
            sfi_gpu_attn_dense(&b->h, b->d_desc, b->dt, b->q, b->kp, b->vp, b->out, NULL, &b->aws,
                               0, b->t.st));
    const double dense16_us = dense16_ms * 1e3;
    double sweep_us[N_RET][3], cold_us[N_RET], warm_us[N_RET];
    int Ks[N_RET];
    for (int i = 0; i < N_RET; i++) {
        int K = (int)(ret[i] * sp_ctx + 0.5) - N_SINK - N_RECENT;
        Ks[i] = K < 1 ? 1 : K;
        bench_sparse_one(b, &cs, sp_ctx, Ks[i], sweep_us[i], &warm_us[i], &cold_us[i]);
    }
    printf("%9s %6s %10s %10s %10s %9s %9s %8s\n", "retention", "K", "warm us", "cold us",
           "dense us", "warm x", "cold x", "target");
    for (int i = 0; i < N_RET; i++) {
        const int rows = N_SINK + Ks[i] + N_RECENT;
        const double spw = dense16_us / warm_us[i], spc = dense16_us / cold_us[i];
        printf("%8.1f%% %6d %10.1f %10.1f %10.1f %8.1fx %8.1fx %7.1fx%s\n", 100 * ret[i], Ks[i],
               warm_us[i], cold_us[i], dense16_us, spw, spc, tgt[i],
               spc >= tgt[i] ? "" : (spw >= tgt[i] ? "  (cold below target)" : "  (below target)"));
        add_meas("attn_sparse", rows, Ks[i], 1, cold_us[i]); /* context = positions read */
        if (i == 2 && b->pk > 0)
            b->sparse_eff = 2.0 * B * rows * HKV * D * b->esz / (cold_us[i] * 1e-6) / b->pk;
    }
    printf("grid size sweep (warm us):     1 wave   2 waves   4 waves\n");
    for (int i = 0; i < N_RET; i++) {
        printf("  retention %5.1f%%:     ", 100 * ret[i]);
        for (int j = 0; j < 3; j++)
            printf(" %9.1f", sweep_us[i][j]);
        printf("\n");
    }
    return 0;
}

/* 5. Selector + reorg vs dense attention of one layer at 32K; leaves h,
 * the Selector workspaces and the compact buffers to the slow step. */
static void bench_selector(bench *b)
{
    const int s_ctx = 32768, s_K = 2048;
    sfi_gpu_step_desc *h = &b->h;
    set_desc(b, s_ctx, s_K);
    b->prm = (sfi_gpu_sel_params){.alpha = 0.5f,
                                  .gamma = 1.0f,
                                  .beta = 1.0f,
                                  .p = 2.0f,
                                  .eta = 0.5f,
                                  .lambda_clip = 0.02f,
                                  .alpha_soft = 0.5f,
                                  .T = 1.0f,
                                  .alpha_cross = 0.35f,
                                  .eps = 1e-8f,
                                  .nms_radius = 2};
    void *sel_mem;
    const size_t sel_bytes = sfi_gpu_sel_ws_bytes(B, HKV, h->max_J);
    CK(cudaMalloc(&sel_mem, SFI_GPU_RING * sel_bytes));
    for (int i = 0; i < SFI_GPU_RING; i++)
        sfi_gpu_sel_ws_carve(&b->sws[i], (char *)sel_mem + i * sel_bytes, B, HKV, h->max_J);
    CK(cudaMalloc(&b->ck2, (size_t)B * HKV * (N_SINK + s_K) * D * b->esz));
    CK(cudaMalloc(&b->cv2, (size_t)B * HKV * (N_SINK + s_K) * D * b->esz));
    CK(cudaMalloc((void **)&b->d_sel2, (size_t)B * HKV * s_K * 4));
    h->ld_logits = s_ctx;
    CK(cudaMemcpyAsync(b->d_desc, h, sizeof *h, cudaMemcpyHostToDevice, b->t.st));
    CK(sfi_gpu_key_norms(h, b->d_desc, b->dt, b->kp, b->norms, b->t.st));
    double dl_ms, both_ms;
    TIME_MS(&b->t, dl_ms,
            sfi_gpu_attn_dense(h, b->d_desc, b->dt, b->q, b->kp, b->vp, b->out, b->logits, &b->aws,
                               0, b->t.st));
    TIME_MS(&b->t, b->sel_ms,
            sfi_gpu_selector(h, b->d_desc, &b->prm, b->logits, b->norms, &b->sws[0], NULL,
                             b->d_sel2, 0, b->t.st));
    TIME_MS(&b->t, b->topk_ms,
            sfi_gpu_topk(h, b->d_desc, b->sws[0].z1, h->max_J, b->d_sel2, b->t.st));
    TIME_MS(
        &b->t, b->reorg_ms,
        sfi_gpu_reorg(h, b->d_desc, b->dt, b->kp, b->vp, b->d_sel2, b->ck2, b->cv2, NULL, b->t.st));
    TIME_MS(&b->t, both_ms,
            sel_and_reorg(h, b->d_desc, b->dt, &b->prm, b->logits, b->norms, &b->sws[0], b->d_sel2,
                          b->kp, b->vp, b->ck2, b->cv2, b->t.st));
    printf("\nSelector + reorg, %d KV heads, context %d (|J| %d), K %d, batch %d\n", HKV, s_ctx,
           h->max_J, s_K, B);
    printf("  dense attention with logits: %8.1f us\n", dl_ms * 1e3);
    printf("  Selector (steps 1-9):        %8.1f us  (of which Top-K %.1f us)\n", b->sel_ms * 1e3,
           b->topk_ms * 1e3);
    printf("  reorg:                       %8.1f us\n", b->reorg_ms * 1e3);
    printf("  Selector + reorg:            %8.1f us = %.1f%% of dense (target <= 30%%)\n",
           both_ms * 1e3, 100 * both_ms / dl_ms);
    add_meas("selector", s_ctx, s_K, 1, (b->sel_ms - b->topk_ms) * 1e3);
    add_meas("topk", s_ctx, s_K, 1, b->topk_ms * 1e3);
    add_meas("reorg", s_ctx, s_K, 1, b->reorg_ms * 1e3);
    add_meas("selector_reorg", s_ctx, s_K, 1, both_ms * 1e3);
}

enum { SLOW_LAYERS = 28 };

/* The slow-step plan over SLOW_LAYERS layers that share one KV cache and
 * one compact buffer (same traffic, less memory); the arrays are the
 * caller's. */
static void slow_plan_make(bench *b, sfi_gpu_slow_plan *pl, const void **kps, const void **vps,
                           void **cks, void **cvs, int32_t **sels, const float **nrms, int s_ctx)
{
    int lo, hi;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    memset(pl, 0, sizeof *pl);
    for (int i = 0; i < SLOW_LAYERS; i++) {
        kps[i] = b->kp;
        vps[i] = b->vp;
        cks[i] = b->ck2;
        cvs[i] = b->cv2;
        sels[i] = b->d_sel2;
        nrms[i] = b->norms;
    }
    pl->n_layers = SLOW_LAYERS;
    pl->k_pool = kps;
    pl->v_pool = vps;
    pl->ck = cks;
    pl->cv = cvs;
    pl->selected = sels;
    pl->key_norms = nrms;
    pl->q = b->q;
    pl->out = b->out;
    pl->attn_ws = b->aws;
    for (int i = 0; i < SFI_GPU_RING; i++) {
        pl->logits[i] = b->logits + (size_t)i * B * HQ * s_ctx;
        pl->sel_ws[i] = b->sws[i];
        CK(cudaEventCreateWithFlags(&pl->ev_attn[i], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&pl->ev_free[i], cudaEventDisableTiming));
    }
    CK(cudaEventCreateWithFlags(&pl->ev_done, cudaEventDisableTiming));
    CK(cudaStreamCreateWithPriority(&pl->main_st, cudaStreamNonBlocking, hi));
    CK(cudaStreamCreateWithPriority(&pl->side_st, cudaStreamNonBlocking, lo));
}

/* 6. two-stream slow step over SLOW_LAYERS layers at 32K, on the
 * Selector phase's descriptor. */
static void bench_slow_step(bench *b, int quick)
{
    const int L = SLOW_LAYERS, s_ctx = 32768, s_K = 2048;
    const sfi_gpu_step_desc *h = &b->h;
    const int dt = b->dt;
    sfi_gpu_slow_plan pl;
    const void *kps[SLOW_LAYERS], *vps[SLOW_LAYERS];
    void *cks[SLOW_LAYERS], *cvs[SLOW_LAYERS];
    int32_t *sels[SLOW_LAYERS];
    const float *nrms[SLOW_LAYERS];
    slow_plan_make(b, &pl, kps, vps, cks, cvs, sels, nrms, s_ctx);
    timer tm = b->t;
    tm.st = pl.main_st;
    tm.reps = quick ? 2 : 5;
    tm.warm = 1;
    double attn_only_ms, serial_ms, overlap_ms = 0, ov_ms[3];
    int ov_waves = 1;
    TIME_MS(&tm, attn_only_ms, attn_layers(&pl, h, b->d_desc, dt));
    TIME_MS(&tm, serial_ms, sfi_gpu_slow_step(&pl, h, b->d_desc, dt, &b->prm, 0));
    /* the overlapped schedule with the attention grid at 1, 2 and 4 waves
     * (see sfi_gpu_attn_ws.waves); the fastest is reported */
    for (int j = 0; j < 3; j++) {
        pl.attn_ws.waves = 1 << j;
        TIME_MS(&tm, ov_ms[j], sfi_gpu_slow_step(&pl, h, b->d_desc, dt, &b->prm, 1));
        if (j == 0 || ov_ms[j] < overlap_ms) {
            overlap_ms = ov_ms[j];
            ov_waves = 1 << j;
        }
    }
    pl.attn_ws.waves = 0;
    add_meas("attn_layers", s_ctx, s_K, L, attn_only_ms * 1e3);
    add_meas("slow_step_serial", s_ctx, s_K, L, serial_ms * 1e3);
    add_meas("slow_step_overlap", s_ctx, s_K, L, overlap_ms * 1e3);
    b->side_ms = serial_ms - attn_only_ms;
    b->exposed_ms = overlap_ms - attn_only_ms;
    printf("\ntwo-stream slow step, %d layers, context %d, batch %d, K %d\n", L, s_ctx, B, s_K);
    printf("  attention only:             %9.1f us\n", attn_only_ms * 1e3);
    printf("  one stream (no overlap):    %9.1f us\n", serial_ms * 1e3);
    printf("  two streams, attention at 1/2/4 waves: %.1f / %.1f / %.1f us\n", ov_ms[0] * 1e3,
           ov_ms[1] * 1e3, ov_ms[2] * 1e3);
    printf("  two streams (overlap):      %9.1f us (attention at %d wave%s)\n", overlap_ms * 1e3,
           ov_waves, ov_waves > 1 ? "s" : "");
    printf("  Selector+reorg exposed:     %9.1f us of %.1f us (%.1f%%)\n", b->exposed_ms * 1e3,
           b->side_ms * 1e3, b->side_ms > 0 ? 100 * b->exposed_ms / b->side_ms : 0.0);
}

#define CLAMP01(x) ((x) > 1 ? 1.0 : ((x) < 0.01 ? 0.01 : (x)))

/* 7. the calibration profile (format: sim/sfi_hw.h), under the output rule
 * of sfi_io.h like every other output. Returns 0 or 1. */
static int write_profile(const bench *b, const bench_args *a, const char *device_name)
{
    const int s_K = 2048;
    double eff_dense = b->pk > 0 ? b->dense_frac * b->copy_bw / b->pk : b->dense_frac;
    /* Selector bytes model: per (request, KV head) the window logits and
     * the key norms are read once ((G + 1) * |J| * 4 bytes); Top-K reads
     * |J| scores; reorg reads and writes (sink + K) rows of K and V. */
    const double nJ = b->h.max_J;
    const double sel_bytes_m = (double)B * HKV * (HQ / HKV + 1) * nJ * 4;
    const double topk_bytes = (double)B * HKV * nJ * 4;
    const double reorg_bytes = 2.0 * 2.0 * B * HKV * (N_SINK + s_K) * D * b->esz;
    const double den_bw = b->pk > 0 ? b->pk : b->copy_bw;
    double eff_sel = sel_bytes_m / den_bw / ((b->sel_ms - b->topk_ms) * 1e-3);
    double eff_topk = topk_bytes / den_bw / (b->topk_ms * 1e-3);
    double eff_reorg = reorg_bytes / den_bw / (b->reorg_ms * 1e-3);
    double sparse_eff = b->sparse_eff <= 0 ? eff_dense : b->sparse_eff;
    double contention = b->side_ms > 0 ? b->exposed_ms / b->side_ms : 0;
    sfi_out *pout;
    FILE *f;
    sfi_error err;
    if (sfi_out_open(a->profile, &pout, &f, &err) != SFI_OK) {
        fprintf(stderr, "sfi-gpu bench: %s\n", err.msg);
        return 1;
    }
    /* --name and the device name are user/driver text: JSON-escaped, so a
     * quote or a backslash in them cannot break or extend the profile. */
    const char *gname = strstr(device_name, "H100")   ? "H100-SXM"
                        : strstr(device_name, "H200") ? "H200"
                                                      : device_name;
    json_t *jn = json_string(a->name), *jg = json_string(gname);
    char *qn = jn ? json_dumps(jn, JSON_ENCODE_ANY) : NULL;
    char *qg = jg ? json_dumps(jg, JSON_ENCODE_ANY) : NULL;
    json_decref(jn);
    json_decref(jg);
    if (!qn || !qg) {
        fprintf(stderr, "sfi-gpu bench: --name '%s' or the device name is not UTF-8 text\n",
                a->name);
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
    fprintf(f, "  \"launch_us\": %.2f,\n  \"overlap_contention\": %.3f,\n", b->noop_ms * 1e3,
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
    printf("\nprofile written to %s\n", a->profile);
    return 0;
}

/* parse, set up, measure phase by phase, write the profile. */
int sfi_gpu_cmd_bench(int argc, char **argv)
{
    bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    char msg[256];
    if (!sfi_gpu_device_ok(msg, sizeof msg)) {
        printf("SKIP: %s\n", msg);
        return SFI_GPU_EXIT_NODEV;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s\n", msg);
    static bench b; /* large; the buffers it points to live until exit */
    if (setup(&b, a.quick))
        return 1;
    bench_copy_and_launch(&b);
    bench_depth(&b);
    bench_dense(&b, a.torch_cmd);
    if (bench_sparse(&b))
        return 1;
    bench_selector(&b);
    bench_slow_step(&b, a.quick);
    return write_profile(&b, &a, prop.name);
}
