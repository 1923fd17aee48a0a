/* NCCL for sfi-gpu's tensor parallelism (`sfi-gpu run --tp N`), loaded
 * at run time.
 *
 * Why dlopen: sfi-gpu is linked against the static CUDA runtime so that
 * one file runs on a GPU machine without our build's libraries; linking
 * libnccl.so.2 (there is no static libnccl) would make every run, --tp 1
 * and `sfi-gpu check` included, fail to start where NCCL is absent or
 * elsewhere (the device machines carry PyTorch's NCCL, found through
 * LD_LIBRARY_PATH). So only nccl.h is used at build time (configure's
 * --with-nccl) and the library is opened on the first use: $SFI_NCCL_LIB
 * (a file), else libnccl.so.2 by the loader's search (LD_LIBRARY_PATH),
 * else the directory configure found it in. A process that never asks
 * for --tp > 1 never opens it.
 *
 * Communicators are handed around as void * so that callers need not
 * include nccl.h. Every function returns SFI_OK or an error naming the
 * call and NCCL's reason; collectives are enqueued on the given stream
 * (capturable into a CUDA graph) and do not wait. */
#ifndef SFI_GPU_NCCL_H
#define SFI_GPU_NCCL_H

#include <stddef.h>
#include <cuda_runtime_api.h>

#include "sfi_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Loads the library (once; thread-safe). SFI_EUNSUPPORTED when sfi-gpu
 * was built without NCCL or the library cannot be opened (the message
 * says which and where it looked). */
sfi_status sfi_gpu_nccl_load(sfi_error *err);
/* "2.28.9" style version of the loaded library (after a successful load). */
void sfi_gpu_nccl_version(char *buf, size_t n);

/* One communicator per device 0..n-1 (ncclCommInitAll from this thread),
 * comms[r] for rank r = device r. */
sfi_status sfi_gpu_nccl_init_all(int n, void **comms, sfi_error *err);
/* Destroy (after the streams are idle) or abort (pending operations are
 * dropped: the way out when another rank failed). NULL is ignored. */
void sfi_gpu_nccl_destroy(void *comm);
void sfi_gpu_nccl_abort(void *comm);
/* The communicator's asynchronous error, SFI_OK when none. */
sfi_status sfi_gpu_nccl_check(void *comm, sfi_error *err);

/* Sum over the ranks, element by element: recv = sum of every rank's
 * send (n elements of dtype SFI_GPU_F32 or SFI_GPU_BF16; send == recv:
 * in place). */
sfi_status sfi_gpu_nccl_allreduce(void *comm, const void *send, void *recv, size_t n, int dtype,
                                  cudaStream_t st, sfi_error *err);
/* recv = every rank's `bytes` bytes of send, rank 0's first. */
sfi_status sfi_gpu_nccl_allgather(void *comm, const void *send, void *recv, size_t bytes,
                                  cudaStream_t st, sfi_error *err);
/* ncclGroupStart / ncclGroupEnd around calls for several devices made by
 * one thread (sfi-gpu bench-allreduce). */
sfi_status sfi_gpu_nccl_group(int start, sfi_error *err);

#ifdef __cplusplus
}
#endif
#endif
