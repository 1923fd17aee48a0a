/* NCCL loaded at run time; see sfi_gpu_nccl.h. */
#include <config.h>

#include "sfi_gpu_nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_gpu.h"

#ifdef SFI_HAVE_NCCL

#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>

/* The entry points sfi-gpu uses, resolved from the library. */
static struct {
    int loaded;
    char why[768]; /* why the load failed */
    int version;
    ncclResult_t (*get_version)(int *);
    ncclResult_t (*init_all)(ncclComm_t *, int, const int *);
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*abort_)(ncclComm_t);
    ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                               ncclComm_t, cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                               cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    const char *(*error_string)(ncclResult_t);
    const char *(*last_error)(ncclComm_t); /* NCCL >= 2.13; may be absent */
} nc;

static pthread_once_t nc_once = PTHREAD_ONCE_INIT;

static void *open_lib(char *tried, size_t n)
{
    const char *env = getenv("SFI_NCCL_LIB");
    const char *cand[3] = {env && *env ? env : NULL, "libnccl.so.2",
                           SFI_NCCL_LIBDIR "/libnccl.so.2"};
    size_t used = 0;
    tried[0] = 0;
    for (int i = 0; i < 3; i++) {
        if (!cand[i])
            continue;
        void *h = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
        const char *why = dlerror();
        int k = snprintf(tried + used, n - used, "%s%s (%s)", used ? "; " : "", cand[i],
                         why ? why : "not found");
        if (k > 0 && (size_t)k < n - used)
            used += (size_t)k;
    }
    return NULL;
}

static void load_once(void)
{
    char tried[640];
    void *h = open_lib(tried, sizeof tried);
    if (!h) {
        snprintf(nc.why, sizeof nc.why,
                 "cannot load NCCL: tried %s; set LD_LIBRARY_PATH to the directory of "
                 "libnccl.so.2 (e.g. PyTorch's nvidia/nccl/lib) or SFI_NCCL_LIB to the file",
                 tried);
        return;
    }
#define SYM(field, name)                                                                           \
    do {                                                                                           \
        *(void **)&nc.field = dlsym(h, name);                                                      \
        if (!nc.field) {                                                                           \
            snprintf(nc.why, sizeof nc.why, "the NCCL library has no %s (too old?)", name);        \
            return;                                                                                \
        }                                                                                          \
    } while (0)
    SYM(get_version, "ncclGetVersion");
    SYM(init_all, "ncclCommInitAll");
    SYM(destroy, "ncclCommDestroy");
    SYM(abort_, "ncclCommAbort");
    SYM(async_error, "ncclCommGetAsyncError");
    SYM(all_reduce, "ncclAllReduce");
    SYM(all_gather, "ncclAllGather");
    SYM(group_start, "ncclGroupStart");
    SYM(group_end, "ncclGroupEnd");
    SYM(error_string, "ncclGetErrorString");
#undef SYM
    *(void **)&nc.last_error = dlsym(h, "ncclGetLastError");
    if (nc.get_version(&nc.version) != ncclSuccess)
        nc.version = 0;
    /* bf16 reductions arrived in NCCL 2.10 */
    if (nc.version < 21000) {
        snprintf(nc.why, sizeof nc.why, "NCCL %d is too old: sfi-gpu needs 2.10 or newer",
                 nc.version);
        return;
    }
    nc.loaded = 1; /* the handle stays open for the process */
}

sfi_status sfi_gpu_nccl_load(sfi_error *err)
{
    pthread_once(&nc_once, load_once);
    if (!nc.loaded)
        return sfi_error_set(err, SFI_EUNSUPPORTED, "%s", nc.why);
    return SFI_OK;
}

void sfi_gpu_nccl_version(char *buf, size_t n)
{
    int v = nc.version;
    /* codes are major*10000 + minor*100 + patch since 2.9 */
    snprintf(buf, n, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
}

static sfi_status fail(sfi_error *err, const char *what, ncclResult_t r, ncclComm_t comm)
{
    const char *last = nc.last_error ? nc.last_error(comm) : NULL;
    return sfi_error_set(err, SFI_EIO, "NCCL: %s: %s%s%s", what, nc.error_string(r),
                         last && *last ? ": " : "", last && *last ? last : "");
}

#define NC_LOADED()                                                                                \
    do {                                                                                           \
        if (!nc.loaded)                                                                            \
            return sfi_error_set(err, SFI_EUNSUPPORTED, "NCCL is not loaded");                     \
    } while (0)

sfi_status sfi_gpu_nccl_init_all(int n, void **comms, sfi_error *err)
{
    NC_LOADED();
    int dev[64];
    if (n < 1 || n > 64)
        return sfi_error_set(err, SFI_ERANGE, "NCCL: %d ranks: expected 1..64", n);
    for (int i = 0; i < n; i++)
        dev[i] = i;
    ncclComm_t c[64];
    ncclResult_t r = nc.init_all(c, n, dev);
    if (r != ncclSuccess)
        return fail(err, "ncclCommInitAll", r, NULL);
    for (int i = 0; i < n; i++)
        comms[i] = c[i];
    return SFI_OK;
}

void sfi_gpu_nccl_destroy(void *comm)
{
    if (comm && nc.loaded)
        nc.destroy((ncclComm_t)comm);
}

void sfi_gpu_nccl_abort(void *comm)
{
    if (comm && nc.loaded)
        nc.abort_((ncclComm_t)comm);
}

sfi_status sfi_gpu_nccl_check(void *comm, sfi_error *err)
{
    NC_LOADED();
    ncclResult_t a = ncclSuccess;
    ncclResult_t r = nc.async_error((ncclComm_t)comm, &a);
    if (r != ncclSuccess)
        return fail(err, "ncclCommGetAsyncError", r, (ncclComm_t)comm);
    if (a != ncclSuccess && a != ncclInProgress)
        return fail(err, "asynchronous error", a, (ncclComm_t)comm);
    return SFI_OK;
}

sfi_status sfi_gpu_nccl_allreduce(void *comm, const void *send, void *recv, size_t n, int dtype,
                                  cudaStream_t st, sfi_error *err)
{
    NC_LOADED();
    ncclResult_t r =
        nc.all_reduce(send, recv, n, dtype == SFI_GPU_BF16 ? ncclBfloat16 : ncclFloat32, ncclSum,
                      (ncclComm_t)comm, st);
    if (r != ncclSuccess)
        return fail(err, "ncclAllReduce", r, (ncclComm_t)comm);
    return SFI_OK;
}

sfi_status sfi_gpu_nccl_allgather(void *comm, const void *send, void *recv, size_t bytes,
                                  cudaStream_t st, sfi_error *err)
{
    NC_LOADED();
    ncclResult_t r = nc.all_gather(send, recv, bytes, ncclUint8, (ncclComm_t)comm, st);
    if (r != ncclSuccess)
        return fail(err, "ncclAllGather", r, (ncclComm_t)comm);
    return SFI_OK;
}

sfi_status sfi_gpu_nccl_group(int start, sfi_error *err)
{
    NC_LOADED();
    ncclResult_t r = start ? nc.group_start() : nc.group_end();
    if (r != ncclSuccess)
        return fail(err, start ? "ncclGroupStart" : "ncclGroupEnd", r, NULL);
    return SFI_OK;
}

#else /* !SFI_HAVE_NCCL */

sfi_status sfi_gpu_nccl_load(sfi_error *err)
{
    return sfi_error_set(err, SFI_EUNSUPPORTED,
                         "this sfi-gpu was built without NCCL (configure found no nccl.h and "
                         "libnccl; see --with-nccl): --tp > 1 is not available");
}
void sfi_gpu_nccl_version(char *buf, size_t n)
{
    snprintf(buf, n, "none");
}
#define NO_NCCL() return sfi_error_set(err, SFI_EUNSUPPORTED, "built without NCCL")
sfi_status sfi_gpu_nccl_init_all(int n, void **comms, sfi_error *err)
{
    (void)n;
    (void)comms;
    NO_NCCL();
}
void sfi_gpu_nccl_destroy(void *comm)
{
    (void)comm;
}
void sfi_gpu_nccl_abort(void *comm)
{
    (void)comm;
}
sfi_status sfi_gpu_nccl_check(void *comm, sfi_error *err)
{
    (void)comm;
    NO_NCCL();
}
sfi_status sfi_gpu_nccl_allreduce(void *comm, const void *send, void *recv, size_t n, int dtype,
                                  cudaStream_t st, sfi_error *err)
{
    (void)comm, (void)send, (void)recv, (void)n, (void)dtype, (void)st;
    NO_NCCL();
}
sfi_status sfi_gpu_nccl_allgather(void *comm, const void *send, void *recv, size_t bytes,
                                  cudaStream_t st, sfi_error *err)
{
    (void)comm, (void)send, (void)recv, (void)bytes, (void)st;
    NO_NCCL();
}
sfi_status sfi_gpu_nccl_group(int start, sfi_error *err)
{
    (void)start;
    NO_NCCL();
}
#endif
