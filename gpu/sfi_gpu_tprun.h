/* Tensor-parallel decoding for `sfi-gpu run --tp N`: one engine per GPU
 * (sfi_gpu_engine.h, opts.tp_*), driven together from this process.
 *
 * Why one process with a thread per GPU rather than a process per GPU
 * (torchrun / mpirun style): sfi-gpu run is one command that reads the
 * checkpoint, prompts and tokenizer once, prints one report and compares
 * with the reference in-process (--check, --check-tp); threads share all
 * of that and the host results, need no launcher and no exchange of an
 * NCCL id between processes, and the ranks' step-kind histories can be
 * compared directly in memory. Each thread binds its device
 * (cudaSetDevice), creates its engine and captures its own CUDA graphs;
 * the engines only talk through NCCL. The communicators come from
 * ncclCommInitAll over devices 0..N-1.
 *
 * Failure: every rank reaches a barrier after creating its engine, and
 * none starts decoding unless all were created. A rank that fails while
 * decoding would leave the others waiting in a collective forever, so the
 * calling thread watches: on a rank's error (or an NCCL asynchronous
 * error) it aborts every communicator (ncclCommAbort, NCCL's documented
 * way out), waits for the ranks to return and reports the first error;
 * if a rank still does not return within 60 s the process exits with the
 * message (status 1) rather than hang. */
#ifndef SFI_GPU_TPRUN_H
#define SFI_GPU_TPRUN_H

#include <stdint.h>

#include "sfi_error.h"
#include "sfi_gpu_engine.h"
#include "sfi_model.h"
#include "sfi_qwen3.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sfi_gpu_tp_group sfi_gpu_tp_group;

typedef struct {
    int n; /* ranks: GPUs 0..n-1 */
    const sfi_model_config *cfg;
    const sfi_qwen3 *m; /* NULL: random weights from seed */
    uint64_t seed;
    const sfi_gpu_engine_opts *eo; /* tp_* fields are set per rank */
    const sfi_gpu_request *rq;
    int B;
    const sfi_gpu_observer *obs; /* rank 0's, or NULL; the others get no-op twins */
    int time_steps;
} sfi_gpu_tp_job;

/* Checks that n GPUs and NCCL are there (SFI_ENODEVICE: fewer GPUs;
 * SFI_EUNSUPPORTED: no NCCL), makes the communicators and the engines and
 * decodes the batch on all ranks together. Then checks that every rank
 * generated the same ids and decided the same step kinds and reasons (they
 * depend on the tokens alone; a difference is a bug and an error naming
 * the first one). *res: rank 0's result; *out keeps the engines (rank 0's
 * for the bench's figures) until sfi_gpu_tp_free. */
sfi_status sfi_gpu_tp_run(const sfi_gpu_tp_job *job, sfi_gpu_tp_group **out,
                          sfi_gpu_run_result *res, sfi_error *err);
sfi_gpu_engine *sfi_gpu_tp_engine(sfi_gpu_tp_group *g, int rank);
/* Frees the engines (each on its device) and the communicators. */
void sfi_gpu_tp_free(sfi_gpu_tp_group *g);

/* Where the first difference between two ranks' results lies: request b,
 * step t and what (ids, kinds, reasons, count); SFI_OK when equal. */
sfi_status sfi_gpu_tp_compare(const sfi_gpu_run_result *a, const sfi_gpu_run_result *b, int rank,
                              sfi_error *err);

#ifdef __cplusplus
}
#endif
#endif
