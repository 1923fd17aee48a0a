/* sfi-gpu bench-allreduce: ncclAllReduce latency and bus bandwidth over
 * GPUs 0..N-1, for the messages a tensor-parallel decode step sends
 * (batch x hidden, f32 as the engine sends them, and bf16) and a sweep of
 * sizes, each timed as the engine issues it: from one thread per GPU,
 * inside a CUDA graph (also eagerly, for the launch cost). What sfi-sim's
 * all-reduce term (sfi_cost_allreduce_time) is compared with. --op
 * allgather|both times ncclAllGather the same ways, over the Selector
 * scores' messages of a slow step (rows x positions f32 per GPU), the
 * argmax keys (8 bytes a token) and a sweep: what sfi_cost_allgather_time
 * is compared with. See sfi-gpu(1). */
#include <config.h>

#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "sfi_cli.h"
#include "sfi_gpu.h"
#include "sfi_gpu_cli.h"
#include "sfi_gpu_nccl.h"
#include "sfi_parse.h"

#define CMD "sfi-gpu bench-allreduce"
#define MAX_MSGS 256

static void usage(FILE *out)
{
    fprintf(out, "usage: sfi-gpu bench-allreduce [--gpus N] [--op allreduce|allgather|both]\n"
                 "                               [--hidden H,...] [--batch B,...]\n"
                 "                               [--gather-rows R,...] [--gather-len L,...]\n"
                 "                               [--max-bytes N] [--iters N] [--json]\n\n"
                 "ncclAllReduce (sum, in place) over GPUs 0..N-1, one thread per GPU: for every\n"
                 "batch x hidden message in f32 (what sfi-gpu run --tp sends twice per layer)\n"
                 "and bf16, then for sizes 4 KiB, 8 KiB, ... up to --max-bytes (f32). Each is\n"
                 "timed as --iters all-reduces captured in a CUDA graph (the engine's way) and\n"
                 "as many eager calls: microseconds per all-reduce, and the bus bandwidth\n"
                 "bytes x 2 (N - 1) / N / time (NCCL's busbw).\n\n"
                 "--op allgather times ncclAllGather (out of place, as the engine's Selector\n"
                 "scores) the same ways: for every rows x len f32 message (the scores of a\n"
                 "slow step, each GPU's rows of its KV heads x len positions), the argmax\n"
                 "keys of each batch (8 bytes a token), then the size sweep; bytes are what\n"
                 "each GPU sends, busbw N x bytes x (N - 1) / N / time (NCCL's all-gather\n"
                 "busbw). --op both: the all-reduces, then the all-gathers.\n\n"
                 "  --gpus N        GPUs (default: all, at least 2)\n"
                 "  --op OP         allreduce (default), allgather or both\n"
                 "  --hidden LIST   hidden sizes (default 2560,2048,4096: Qwen3-4B,\n"
                 "                  Qwen3-30B-A3B, Qwen3-8B)\n"
                 "  --batch LIST    batch sizes (default 1,4,16,64), of the all-reduces and\n"
                 "                  the argmax all-gathers\n"
                 "  --gather-rows LIST\n"
                 "                  all-gather rows per GPU (default 4,8,16,64: 1, 2, 4, 16\n"
                 "                  slow requests x 4 KV heads, Qwen3-4B at --tp 2)\n"
                 "  --gather-len LIST\n"
                 "                  positions a row (default 8320,32900: the Selector's\n"
                 "                  capacity at 8K and 32K)\n"
                 "  --max-bytes N   end of the size sweep (default 268435456)\n"
                 "  --iters N       collectives per timing (default 50)\n"
                 "  --json          one JSON object on standard output (all-gathers as\n"
                 "                  profile measurements: \"kernel\": \"allgather\")\n"
                 "  -h, --help      print this help\n\n"
                 "Exit status: 0 ok, 1 failure, 2 usage error, 77 fewer than 2 GPUs or no\n"
                 "NCCL.\n");
}

enum { OP_ALLREDUCE = 1, OP_ALLGATHER = 2 };

typedef struct {
    int op;       /* OP_ALLREDUCE or OP_ALLGATHER */
    size_t bytes; /* an all-gather's: what each GPU sends */
    /* all-reduce: batch x hidden; all-gather: rows x len scores, or the
     * argmax keys of batch tokens (rows 0); batch and rows 0: a sweep size */
    int dtype, batch, hidden, rows, len;
    double graph_us, eager_us;
} msg;

typedef struct {
    int n, iters;
    msg *m;
    int n_msgs;
    size_t max_bytes;  /* the buffer: all-reduces in place, all-gathers' receive */
    size_t send_bytes; /* all-gathers' send buffer (0: none) */
    void **comm;
    pthread_barrier_t bar;
} job;

typedef struct {
    job *j;
    int rank;
    sfi_status rc;
    sfi_error err;
} rank_ctx;

/* A CUDA call this rank cannot go on without: the status and message
 * (SFI_GPU_STATUS) go to c, and the rank stops at out. */
#define RK(x)                                                                                      \
    do {                                                                                           \
        if ((c->rc = SFI_GPU_STATUS(&c->err, x, #x)))                                              \
            goto out;                                                                              \
    } while (0)

/* iters collectives of m's kind and size on st */
static sfi_status enqueue(rank_ctx *c, void *buf, void *sbuf, const msg *m, cudaStream_t st)
{
    const size_t esz = m->dtype == SFI_GPU_BF16 ? 2 : 4;
    for (int i = 0; i < c->j->iters; i++) {
        void *comm = c->j->comm[c->rank];
        sfi_status rc =
            m->op == OP_ALLGATHER
                ? sfi_gpu_nccl_allgather(comm, sbuf, buf, m->bytes, st, &c->err)
                : sfi_gpu_nccl_allreduce(comm, buf, buf, m->bytes / esz, m->dtype, st, &c->err);
        if (rc)
            return rc;
    }
    return SFI_OK;
}

static void *rank_main(void *arg)
{
    rank_ctx *c = arg;
    job *j = c->j;
    void *buf = NULL, *sbuf = NULL;
    cudaStream_t st = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaGraphExec_t ge = NULL;
    RK(cudaSetDevice(c->rank));
    RK(cudaMalloc(&buf, j->max_bytes));
    RK(cudaMemset(buf, 0, j->max_bytes));
    if (j->send_bytes) {
        RK(cudaMalloc(&sbuf, j->send_bytes));
        RK(cudaMemset(sbuf, 0, j->send_bytes));
    }
    RK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    RK(cudaEventCreate(&e0));
    RK(cudaEventCreate(&e1));
    for (int k = 0; k < j->n_msgs; k++) {
        msg *m = &j->m[k];
        /* eager: a warm-up round, then timed */
        if ((c->rc = enqueue(c, buf, sbuf, m, st)))
            goto out;
        RK(cudaEventRecord(e0, st));
        if ((c->rc = enqueue(c, buf, sbuf, m, st)))
            goto out;
        RK(cudaEventRecord(e1, st));
        RK(cudaEventSynchronize(e1));
        float ms = 0;
        RK(cudaEventElapsedTime(&ms, e0, e1));
        const double eager = ms * 1e3 / j->iters;
        /* captured, as the engine's decode steps */
        cudaGraph_t g;
        RK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        sfi_status rc = enqueue(c, buf, sbuf, m, st);
        cudaError_t ce = cudaStreamEndCapture(st, &g);
        if ((c->rc = rc))
            goto out;
        RK(ce);
        ce = cudaGraphInstantiate(&ge, g, 0);
        cudaGraphDestroy(g);
        RK(ce);
        RK(cudaGraphLaunch(ge, st));
        RK(cudaEventRecord(e0, st));
        for (int r = 0; r < 4; r++)
            RK(cudaGraphLaunch(ge, st));
        RK(cudaEventRecord(e1, st));
        RK(cudaEventSynchronize(e1));
        RK(cudaEventElapsedTime(&ms, e0, e1));
        RK(cudaGraphExecDestroy(ge));
        ge = NULL;
        if (c->rank == 0) {
            m->eager_us = eager;
            m->graph_us = ms * 1e3 / (4.0 * j->iters);
        }
        pthread_barrier_wait(&j->bar); /* the next size starts together */
    }
out:
    if (c->rc) {
        /* the other ranks wait in a collective or the barrier for this
         * one: end the process with the message rather than hang */
        fprintf(stderr, CMD ": GPU %d: %s\n", c->rank, c->err.msg);
        fflush(stderr);
        _exit(1);
    }
    if (ge)
        cudaGraphExecDestroy(ge);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (st)
        cudaStreamDestroy(st);
    cudaFree(buf);
    cudaFree(sbuf);
    return NULL;
}

/* "a,b,c" into v (positive ints); returns the count or -1 */
/* The next message of m (the caller checks room): op, dtype, bytes, the
 * rest zero. */
static msg *add_msg(msg *m, int *nm, int op, int dtype, size_t bytes)
{
    msg *x = &m[(*nm)++];
    memset(x, 0, sizeof *x);
    x->op = op;
    x->dtype = dtype;
    x->bytes = bytes;
    return x;
}

/* The size sweep of op: 4 KiB, 8 KiB, .. up to max (f32). */
static void add_sweep(msg *m, int *nm, int op, size_t max)
{
    for (size_t s = 4096; s <= max && *nm < MAX_MSGS; s *= 2)
        add_msg(m, nm, op, SFI_GPU_F32, s);
}

static int parse_list(const char *s, int *v, int cap)
{
    int n = 0;
    char tmp[256];
    if (strlen(s) >= sizeof tmp)
        return -1;
    strcpy(tmp, s);
    for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == cap || sfi_parse_int(t, 1, 1 << 20, &v[n]))
            return -1;
        n++;
    }
    return n;
}

/* One timed message's text row or JSON entry. f: the bus bandwidth's
 * factor on bytes (NCCL's: all-reduce 2 (n-1)/n, all-gather n-1 on what
 * one GPU sends). An all-gather's entry has a profile measurement's keys
 * ("kernel": "allgather", ...), as sfi-sim validate reads them; an
 * all-reduce's keeps this command's own (and a "kernel" under --op both). */
static void report(const msg *x, int gpus, int op, json_t *ja)
{
    const double f = x->op == OP_ALLGATHER ? gpus - 1.0 : 2.0 * (gpus - 1) / gpus;
    const double bus = x->graph_us > 0 ? x->bytes * f / (x->graph_us * 1e-6) / 1e9 : 0;
    char what[48] = "sweep";
    if (x->op == OP_ALLGATHER && x->rows)
        snprintf(what, sizeof what, "%d x %d", x->rows, x->len);
    else if (x->op == OP_ALLGATHER && x->batch)
        snprintf(what, sizeof what, "argmax %d", x->batch);
    else if (x->batch)
        snprintf(what, sizeof what, "%d x %d", x->batch, x->hidden);
    const char *dt = x->dtype == SFI_GPU_BF16 ? "bf16" : "f32";
    if (!ja) {
        printf("%12zu %5s %-14s %10.2f %10.2f %12.2f\n", x->bytes,
               x->op == OP_ALLGATHER && !x->rows && x->batch ? "u64" : dt, what, x->graph_us,
               x->eager_us, bus);
        return;
    }
    json_t *o = json_object();
    if (x->op == OP_ALLGATHER) {
        json_object_set_new(o, "kernel", json_string("allgather"));
        json_object_set_new(o, "gpus", json_integer(gpus));
        json_object_set_new(o, "bytes", json_integer((json_int_t)x->bytes));
        json_object_set_new(o, "message", json_string(what));
        json_object_set_new(o, "time_us", json_real(x->graph_us));
        json_object_set_new(o, "eager_us", json_real(x->eager_us));
        json_object_set_new(o, "busbw_GB_per_s", json_real(bus));
        json_array_append_new(ja, o);
        return;
    }
    if (op != OP_ALLREDUCE)
        json_object_set_new(o, "kernel", json_string("allreduce"));
    json_object_set_new(o, "bytes", json_integer((json_int_t)x->bytes));
    json_object_set_new(o, "dtype", json_string(dt));
    if (x->batch) {
        json_object_set_new(o, "batch", json_integer(x->batch));
        json_object_set_new(o, "hidden", json_integer(x->hidden));
    }
    json_object_set_new(o, "graph_us", json_real(x->graph_us));
    json_object_set_new(o, "eager_us", json_real(x->eager_us));
    json_object_set_new(o, "busbw_gb_per_s", json_real(bus));
    json_array_append_new(ja, o);
}

int sfi_gpu_cmd_allreduce(int argc, char **argv)
{
    static const struct option opts[] = {
        {"gpus", required_argument, NULL, 'g'},
        {"hidden", required_argument, NULL, 'H'},
        {"batch", required_argument, NULL, 'b'},
        {"max-bytes", required_argument, NULL, 'M'},
        {"iters", required_argument, NULL, 'i'},
        {"json", no_argument, NULL, 'j'},
        {"op", required_argument, NULL, 'o'},
        {"gather-rows", required_argument, NULL, 'r'},
        {"gather-len", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int gpus = 0, iters = 50, json = 0, max_mb = 256, op = OP_ALLREDUCE;
    int hidden[16] = {2560, 2048, 4096}, n_hidden = 3, batch[16] = {1, 4, 16, 64}, n_batch = 4;
    int rows[16] = {4, 8, 16, 64}, n_rows = 4, glen[16] = {8320, 32900}, n_glen = 2;
    int c, li = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, &li)) != -1) {
        int bad = 0;
        switch (c) {
        case 'h': usage(stdout); return 0;
        case 'g': bad = sfi_parse_int(optarg, 2, 64, &gpus) != 0; break;
        case 'i': bad = sfi_parse_int(optarg, 1, 10000, &iters) != 0; break;
        case 'j': json = 1; break;
        case 'M': {
            long long x = atoll(optarg);
            bad = x < 4096 || x > ((long long)4 << 30);
            max_mb = bad ? 0 : (int)((x + (1 << 20) - 1) >> 20);
            break;
        }
        case 'o':
            op = !strcmp(optarg, "allreduce")   ? OP_ALLREDUCE
                 : !strcmp(optarg, "allgather") ? OP_ALLGATHER
                 : !strcmp(optarg, "both")      ? OP_ALLREDUCE | OP_ALLGATHER
                                                : 0;
            bad = !op;
            break;
        case 'H': bad = (n_hidden = parse_list(optarg, hidden, 16)) < 1; break;
        case 'b': bad = (n_batch = parse_list(optarg, batch, 16)) < 1; break;
        case 'r': bad = (n_rows = parse_list(optarg, rows, 16)) < 1; break;
        case 'l': bad = (n_glen = parse_list(optarg, glen, 16)) < 1; break;
        default: return sfi_cli_bad_option(CMD, argv, NULL, usage);
        }
        if (bad) {
            fprintf(stderr, CMD ": --%s '%s': bad value (see --help)\n", opts[li].name, optarg);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, CMD ": unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    /* an all-gather message each GPU sends: at most what --max-bytes may be */
    for (int r = 0; r < n_rows && (op & OP_ALLGATHER); r++)
        for (int l = 0; l < n_glen; l++)
            if ((long long)rows[r] * glen[l] * 4 > ((long long)4 << 30)) {
                fprintf(stderr,
                        CMD ": --gather-rows %d x --gather-len %d: %lld bytes a GPU, more than "
                            "4 GiB\n",
                        rows[r], glen[l], (long long)rows[r] * glen[l] * 4);
                return 2;
            }
    char why[256];
    if (!sfi_gpu_device_ok(why, sizeof why)) {
        fprintf(stderr, CMD ": skipped: %s\n", why);
        return SFI_GPU_EXIT_NODEV;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess)
        ndev = 0;
    if (!gpus)
        gpus = ndev;
    if (gpus < 2 || ndev < gpus) {
        fprintf(stderr, CMD ": skipped: needs %d GPUs (at least 2); this machine has %d\n",
                gpus < 2 ? 2 : gpus, ndev);
        return SFI_GPU_EXIT_NODEV;
    }
    sfi_error e;
    if (sfi_gpu_nccl_load(&e)) {
        fprintf(stderr, CMD ": skipped: %s\n", e.msg);
        return SFI_GPU_EXIT_NODEV;
    }
    /* the messages: the decode steps', then the sweep; all-reduces first */
    static msg m[MAX_MSGS];
    int nm = 0;
    const size_t sweep_max = (size_t)max_mb << 20;
    size_t max_bytes = 0, send_bytes = 0;
    if (op & OP_ALLREDUCE) {
        max_bytes = sweep_max;
        for (int d = 0; d < 2; d++)
            for (int h = 0; h < n_hidden; h++)
                for (int b = 0; b < n_batch && nm < MAX_MSGS; b++) {
                    msg *x = add_msg(m, &nm, OP_ALLREDUCE, d ? SFI_GPU_BF16 : SFI_GPU_F32,
                                     (size_t)batch[b] * hidden[h] * (d ? 2 : 4));
                    x->batch = batch[b];
                    x->hidden = hidden[h];
                    if (x->bytes > max_bytes)
                        max_bytes = x->bytes;
                }
        add_sweep(m, &nm, OP_ALLREDUCE, sweep_max);
    }
    if (op & OP_ALLGATHER) {
        send_bytes = sweep_max;
        for (int r = 0; r < n_rows; r++)
            for (int l = 0; l < n_glen && nm < MAX_MSGS; l++) {
                msg *x = add_msg(m, &nm, OP_ALLGATHER, SFI_GPU_F32, (size_t)rows[r] * glen[l] * 4);
                x->rows = rows[r];
                x->len = glen[l];
                if (x->bytes > send_bytes)
                    send_bytes = x->bytes;
            }
        /* the vocab-split LM head's argmax: a (value, id) key a token */
        for (int b = 0; b < n_batch && nm < MAX_MSGS; b++) {
            msg *x = add_msg(m, &nm, OP_ALLGATHER, SFI_GPU_F32, (size_t)batch[b] * 8);
            x->batch = batch[b];
            if (x->bytes > send_bytes)
                send_bytes = x->bytes;
        }
        add_sweep(m, &nm, OP_ALLGATHER, sweep_max);
        if (send_bytes * gpus > max_bytes)
            max_bytes = send_bytes * gpus;
    }
    void *comm[64] = {0};
    if (sfi_gpu_nccl_init_all(gpus, comm, &e)) {
        fprintf(stderr, CMD ": %s\n", e.msg);
        return 1;
    }
    job j = {.n = gpus,
             .iters = iters,
             .m = m,
             .n_msgs = nm,
             .max_bytes = max_bytes,
             .send_bytes = send_bytes,
             .comm = comm};
    pthread_barrier_init(&j.bar, NULL, (unsigned)gpus);
    rank_ctx ctx[64];
    pthread_t th[64];
    memset(ctx, 0, sizeof ctx);
    int started = 0;
    for (int r = 0; r < gpus; r++) {
        ctx[r].j = &j;
        ctx[r].rank = r;
        if (pthread_create(&th[r], NULL, rank_main, &ctx[r]))
            break;
        started++;
    }
    if (started < gpus) { /* the barrier would never open */
        fprintf(stderr, CMD ": cannot start a thread per GPU\n");
        fflush(stderr);
        _exit(1);
    }
    for (int r = 0; r < started; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&j.bar);
    int rc = 0;
    for (int r = 0; r < gpus; r++)
        sfi_gpu_nccl_destroy(comm[r]);
    if (rc)
        return 1;
    char ver[32], dev[256] = "";
    sfi_gpu_nccl_version(ver, sizeof ver);
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
        snprintf(dev, sizeof dev, "%s", p.name);
    json_t *jo = json ? json_object() : NULL, *ja = json ? json_array() : NULL;
    for (int k = 0; k < nm; k++) {
        if (!json && (k == 0 || m[k].op != m[k - 1].op)) {
            const int ag = m[k].op == OP_ALLGATHER;
            if (!ag)
                printf("bench-allreduce: %d x %s, NCCL %s, %d all-reduces per timing\n", gpus, dev,
                       ver, iters);
            else
                printf("%sbench-allreduce --op allgather: %d x %s, NCCL %s, %d all-gathers per "
                       "timing (bytes: each GPU's)\n",
                       k ? "\n" : "", gpus, dev, ver, iters);
            printf("%12s %5s %-14s %10s %10s %12s\n", "bytes", "dtype", "message", "graph_us",
                   "eager_us", "busbw_GB/s");
        }
        report(&m[k], gpus, op, ja);
    }
    if (json) {
        json_object_set_new(jo, "gpus", json_integer(gpus));
        json_object_set_new(jo, "device", json_string(dev));
        json_object_set_new(jo, "nccl", json_string(ver));
        json_object_set_new(jo, "iters", json_integer(iters));
        json_object_set_new(jo, "messages", ja);
        char *s = json_dumps(jo, JSON_PRESERVE_ORDER);
        json_decref(jo);
        if (!s) {
            fprintf(stderr, CMD ": cannot encode the JSON output\n");
            return 1;
        }
        printf("%s\n", s);
        free(s);
    }
    if (fflush(stdout) || ferror(stdout)) {
        fprintf(stderr, CMD ": writing standard output failed\n");
        return 1;
    }
    return 0;
}
