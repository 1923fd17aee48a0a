/* Tensor-parallel decoding, one thread per GPU; see sfi_gpu_tprun.h. */
#include <config.h>

#include "sfi_gpu_tprun.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "sfi_gpu_nccl.h"
#include "sfi_gpu_status.h"

#define MAX_RANKS 64
/* how long the ranks get to return once their communicators are aborted */
#define ABORT_GRACE_S 60

struct sfi_gpu_tp_group {
    int n;
    void *comm[MAX_RANKS];
    sfi_gpu_engine *eng[MAX_RANKS];
};

/* What the rank threads and the watching thread share (under mu). */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, arrived, create_failed; /* the barrier after creating the engines */
    int n_done, n_failed, first_failed;
} shared;

typedef struct {
    sfi_gpu_tp_group *g;
    const sfi_gpu_tp_job *job;
    shared *sh;
    int rank;
    sfi_gpu_observer obs;
    sfi_gpu_run_result res;
    sfi_status rc;
    sfi_error err;
} rank_ctx;

/* The observer of ranks other than 0: the same callbacks present (the
 * engine's readback is collective), doing nothing. */
static sfi_status noop_step(void *user, int b, int step, int kind, int reason, int32_t token,
                            const float *logits, int vocab, sfi_error *err)
{
    (void)user, (void)b, (void)step, (void)kind, (void)reason, (void)token, (void)logits,
        (void)vocab, (void)err;
    return SFI_OK;
}

static sfi_status noop_selected(void *user, int b, int step, int layer, const int32_t *sel,
                                int n_kv, int K, int n_sel, sfi_error *err)
{
    (void)user, (void)b, (void)step, (void)layer, (void)sel, (void)n_kv, (void)K, (void)n_sel,
        (void)err;
    return SFI_OK;
}

static void *rank_main(void *arg)
{
    rank_ctx *c = arg;
    const sfi_gpu_tp_job *job = c->job;
    shared *sh = c->sh;
    sfi_error_clear(&c->err);
    c->rc = SFI_GPU_STATUS(&c->err, cudaSetDevice(c->rank), "cudaSetDevice(c->rank)");
    if (!c->rc) {
        sfi_gpu_engine_opts o = *job->eo;
        o.tp_size = job->n;
        o.tp_rank = c->rank;
        o.tp_comm = c->g->comm[c->rank];
        c->rc =
            sfi_gpu_engine_create(job->cfg, job->m, job->seed, &o, &c->g->eng[c->rank], &c->err);
    }
    /* no rank decodes unless every rank has its engine: a missing one
     * would leave the others in their first collective */
    pthread_mutex_lock(&sh->mu);
    sh->arrived++;
    sh->create_failed += c->rc != SFI_OK;
    pthread_cond_broadcast(&sh->cv);
    while (sh->arrived < sh->n)
        pthread_cond_wait(&sh->cv, &sh->mu);
    const int go = !sh->create_failed;
    pthread_mutex_unlock(&sh->mu);
    if (go) {
        const sfi_gpu_observer *obs = NULL;
        if (job->obs && c->rank == 0) {
            obs = job->obs;
        } else if (job->obs) {
            c->obs.user = NULL;
            c->obs.on_step = job->obs->on_step ? noop_step : NULL;
            c->obs.on_selected = job->obs->on_selected ? noop_selected : NULL;
            obs = &c->obs;
        }
        c->rc = sfi_gpu_engine_run(c->g->eng[c->rank], job->rq, job->B, obs, job->time_steps,
                                   &c->res, &c->err);
    }
    pthread_mutex_lock(&sh->mu);
    sh->n_done++;
    if (c->rc) {
        sh->n_failed++;
        if (sh->first_failed < 0)
            sh->first_failed = c->rank;
    }
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
    return NULL;
}

sfi_status sfi_gpu_tp_compare(const sfi_gpu_run_result *a, const sfi_gpu_run_result *b, int rank,
                              sfi_error *err)
{
    if (a->batch != b->batch || a->max_new != b->max_new)
        return sfi_error_set(err, SFI_EINVAL, "tensor parallelism: rank %d ran another batch",
                             rank);
    for (int q = 0; q < a->batch; q++) {
        if (a->n_generated[q] != b->n_generated[q])
            return sfi_error_set(err, SFI_EINVAL,
                                 "tensor parallelism: request %d: rank 0 generated %d tokens, "
                                 "rank %d %d (the ranks must agree: a bug)",
                                 q, a->n_generated[q], rank, b->n_generated[q]);
        for (int t = 0; t < a->n_generated[q]; t++) {
            const size_t i = (size_t)q * a->max_new + t;
            const char *what = a->kinds[i] != b->kinds[i]       ? "step kind"
                               : a->reasons[i] != b->reasons[i] ? "reason"
                               : a->ids[i] != b->ids[i]         ? "generated id"
                                                                : NULL;
            if (what)
                return sfi_error_set(
                    err, SFI_EINVAL,
                    "tensor parallelism: request %d step %d: rank 0 and rank %d differ in the "
                    "%s (kind %d/%d, reason %d/%d, id %d/%d); slow/fast decisions depend on "
                    "the tokens alone and must agree on every rank: a bug",
                    q, t, rank, what, a->kinds[i], b->kinds[i], a->reasons[i], b->reasons[i],
                    (int)a->ids[i], (int)b->ids[i]);
        }
    }
    return SFI_OK;
}

/* Waits for every rank; on a failure or an NCCL asynchronous error aborts
 * the communicators, and exits the process if a rank still hangs. */
static void watch(sfi_gpu_tp_group *g, shared *sh, rank_ctx *ctx)
{
    int aborted = 0;
    time_t abort_at = 0;
    pthread_mutex_lock(&sh->mu);
    while (sh->n_done < sh->n) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        int w = pthread_cond_timedwait(&sh->cv, &sh->mu, &ts);
        if (w != 0 && w != ETIMEDOUT)
            break;
        if (sh->n_done == sh->n)
            break;
        int bad = sh->n_failed > 0;
        const int started = sh->arrived == sh->n && !sh->create_failed;
        pthread_mutex_unlock(&sh->mu);
        char why[SFI_ERROR_MSG_MAX] = "";
        for (int r = 0; r < g->n && !bad && !aborted && started; r++) {
            sfi_error e;
            if (sfi_gpu_nccl_check(g->comm[r], &e)) {
                bad = 1;
                snprintf(why, sizeof why, "rank %d: %.900s", r, e.msg);
            }
        }
        if (bad && !aborted) {
            aborted = 1;
            abort_at = time(NULL);
            if (why[0])
                fprintf(stderr, "sfi-gpu: tensor parallelism: %s; aborting the ranks\n", why);
            for (int r = 0; r < g->n; r++) {
                sfi_gpu_nccl_abort(g->comm[r]);
                g->comm[r] = NULL;
            }
        }
        pthread_mutex_lock(&sh->mu);
        if (aborted && time(NULL) - abort_at > ABORT_GRACE_S && sh->n_done < sh->n) {
            const int f = sh->first_failed;
            fprintf(stderr,
                    "sfi-gpu: tensor parallelism: %s; %d of %d ranks still do not return %d s "
                    "after their communicators were aborted: exiting\n",
                    f >= 0 ? ctx[f].err.msg : "an NCCL error", sh->n - sh->n_done, sh->n,
                    ABORT_GRACE_S);
            fflush(stderr);
            fflush(stdout);
            _exit(1);
        }
    }
    pthread_mutex_unlock(&sh->mu);
}

sfi_status sfi_gpu_tp_run(const sfi_gpu_tp_job *job, sfi_gpu_tp_group **out,
                          sfi_gpu_run_result *res, sfi_error *err)
{
    *out = NULL;
    memset(res, 0, sizeof *res);
    const int n = job->n;
    if (n < 2 || n > MAX_RANKS)
        return sfi_error_set(err, SFI_ERANGE, "--tp %d: expected 2..%d", n, MAX_RANKS);
    int ndev = 0;
    if (SFI_GPU_STATUS(err, cudaGetDeviceCount(&ndev), "cudaGetDeviceCount(&ndev)")) {
        /* no driver or no device: a missing GPU (the caller's skip), not
         * an I/O error */
        sfi_error_prefix(err, "--tp %d needs %d GPUs", n, n);
        if (err)
            err->code = SFI_ENODEVICE;
        return SFI_ENODEVICE;
    }
    if (ndev < n)
        return sfi_error_set(err, SFI_ENODEVICE, "--tp %d needs %d GPUs; this machine has %d", n, n,
                             ndev);
    sfi_status rc = sfi_gpu_nccl_load(err);
    if (rc)
        return rc;
    sfi_gpu_tp_group *g = calloc(1, sizeof *g);
    rank_ctx *ctx = calloc((size_t)n, sizeof *ctx);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    if (!g || !ctx || !th) {
        free(g);
        free(ctx);
        free(th);
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    }
    g->n = n;
    if ((rc = sfi_gpu_nccl_init_all(n, g->comm, err))) {
        free(ctx);
        free(th);
        free(g);
        return rc;
    }
    shared sh;
    memset(&sh, 0, sizeof sh);
    pthread_mutex_init(&sh.mu, NULL);
    pthread_cond_init(&sh.cv, NULL);
    sh.n = n;
    sh.first_failed = -1;
    int started = 0;
    for (int r = 0; r < n; r++) {
        ctx[r].g = g;
        ctx[r].job = job;
        ctx[r].sh = &sh;
        ctx[r].rank = r;
        if (pthread_create(&th[r], NULL, rank_main, &ctx[r]) != 0)
            break;
        started++;
    }
    if (started < n) {
        /* the barrier would never open: let the started ranks through it
         * as failed */
        pthread_mutex_lock(&sh.mu);
        sh.arrived += n - started;
        sh.create_failed++;
        sh.n_done += n - started;
        pthread_cond_broadcast(&sh.cv);
        pthread_mutex_unlock(&sh.mu);
    }
    watch(g, &sh, ctx);
    for (int r = 0; r < started; r++)
        pthread_join(th[r], NULL);
    pthread_mutex_destroy(&sh.mu);
    pthread_cond_destroy(&sh.cv);
    if (started < n) {
        rc = sfi_error_set(err, SFI_EIO, "tensor parallelism: cannot start a thread per GPU");
    } else if (sh.first_failed >= 0 || sh.create_failed) {
        int f = sh.first_failed;
        for (int r = 0; r < n && f < 0; r++)
            if (ctx[r].rc)
                f = r;
        rc = sfi_error_set(err, ctx[f].rc ? ctx[f].rc : SFI_EIO, "GPU %d of %d: %s", f, n,
                           ctx[f].err.msg);
    } else {
        for (int r = 1; r < n && !rc; r++)
            rc = sfi_gpu_tp_compare(&ctx[0].res, &ctx[r].res, r, err);
    }
    for (int r = 1; r < n; r++)
        sfi_gpu_run_result_free(&ctx[r].res);
    if (rc) {
        sfi_gpu_run_result_free(&ctx[0].res);
        sfi_gpu_tp_free(g);
    } else {
        *res = ctx[0].res;
        *out = g;
    }
    free(ctx);
    free(th);
    return rc;
}

sfi_gpu_engine *sfi_gpu_tp_engine(sfi_gpu_tp_group *g, int rank)
{
    return g && rank >= 0 && rank < g->n ? g->eng[rank] : NULL;
}

void sfi_gpu_tp_free(sfi_gpu_tp_group *g)
{
    if (!g)
        return;
    for (int r = 0; r < g->n; r++) {
        if (!g->eng[r])
            continue;
        /* the engine's streams, graphs and memory are its device's */
        if (cudaSetDevice(r) == cudaSuccess)
            sfi_gpu_engine_free(g->eng[r]);
    }
    for (int r = 0; r < g->n; r++)
        sfi_gpu_nccl_destroy(g->comm[r]);
    (void)cudaSetDevice(0); /* the caller's device again */
    free(g);
}
