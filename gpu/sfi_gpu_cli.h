/* Subcommands of sfi-gpu (gpu/main.c dispatches). */
#ifndef SFI_GPU_CLI_H
#define SFI_GPU_CLI_H

/* Exit status when no CUDA device is usable (automake's skip status, so a
 * test or CI job can tell "not run" from "failed"). */
#define SFI_GPU_EXIT_NODEV 77

/* A CUDA call that must succeed: on an error, print where and what
 * ("sfi-gpu CMD: file:line: TEXT: message", TEXT the call as written)
 * and exit 1. */
#define SFI_GPU_CK(cmd, x, text)                                                                   \
    do {                                                                                           \
        int e_ = (int)(x);                                                                         \
        if (e_) {                                                                                  \
            fprintf(stderr, "sfi-gpu %s: %s:%d: %s: %s\n", cmd, __FILE__, __LINE__, text,          \
                    cudaGetErrorString((cudaError_t)e_));                                          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

int sfi_gpu_cmd_run(int argc, char **argv);
int sfi_gpu_cmd_check(int argc, char **argv);
int sfi_gpu_cmd_bench(int argc, char **argv);
int sfi_gpu_cmd_allreduce(int argc, char **argv);

#endif
