/* The one place gpu/'s C modules turn a cudaError_t into an sfi_status
 * (the convention: sfi_gpu.h). C only: the kernels never see sfi_status. */
#ifndef SFI_GPU_STATUS_H
#define SFI_GPU_STATUS_H

#include <cuda_runtime_api.h>

#include "sfi_error.h"

/* SFI_OK for cudaSuccess; else SFI_EIO with "CUDA: CALL: reason
 * (file:line)" in err (may be NULL). */
static inline sfi_status sfi_gpu_status(cudaError_t e, const char *call, const char *file, int line,
                                        sfi_error *err)
{
    if (e == cudaSuccess)
        return SFI_OK;
    return sfi_error_set(err, SFI_EIO, "CUDA: %s: %s (%s:%d)", call, cudaGetErrorString(e), file,
                         line);
}

/* The status of the CUDA call x (a cudaError_t expression, evaluated
 * once), text its source as the message shows it: give #x from the macro
 * that takes x from the caller, since an argument passed on through
 * another macro is expanded before it can be quoted. */
#define SFI_GPU_STATUS(err, x, text) sfi_gpu_status((x), (text), __FILE__, __LINE__, (err))

/* In a function returning sfi_status with an sfi_error *err in scope:
 * return the failure of the CUDA call x (SFI_GPU_RETURN_IF_FAILED), or of
 * the cuBLAS call x (_BLAS_; the file includes cublas_v2.h), with text as
 * the message shows the call (#x from the caller's macro, as above). */
#define SFI_GPU_RETURN_IF_FAILED(x, text)                                                          \
    do {                                                                                           \
        sfi_status ck_ = SFI_GPU_STATUS(err, x, text);                                             \
        if (ck_)                                                                                   \
            return ck_;                                                                            \
    } while (0)
#define SFI_GPU_BLAS_RETURN_IF_FAILED(x, text)                                                     \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return sfi_error_set(err, SFI_EIO, "cuBLAS: %s: status %d (%s:%d)", text, (int)s_,     \
                                 __FILE__, __LINE__);                                              \
    } while (0)

#endif
