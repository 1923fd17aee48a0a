/* Subcommands of sfi-gpu (gpu/main.c dispatches). */
#ifndef SFI_GPU_CLI_H
#define SFI_GPU_CLI_H

#include "sfi_gpu_status.h"

/* Exit status when no CUDA device is usable (automake's skip status, so a
 * test or CI job can tell "not run" from "failed"). */
#define SFI_GPU_EXIT_NODEV 77

/* A CUDA call a command cannot go on without: on an error, prints
 * "sfi-gpu CMD: " and SFI_GPU_STATUS's message ("CUDA: TEXT: reason
 * (file:line)", TEXT the call as written), and exits 1. */
#define SFI_GPU_CK(cmd, x, text)                                                                   \
    do {                                                                                           \
        sfi_error ck_err_;                                                                         \
        if (SFI_GPU_STATUS(&ck_err_, x, text)) {                                                   \
            fprintf(stderr, "sfi-gpu %s: %s\n", cmd, ck_err_.msg);                                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

int sfi_gpu_cmd_run(int argc, char **argv);
int sfi_gpu_cmd_check(int argc, char **argv);
int sfi_gpu_cmd_bench(int argc, char **argv);
int sfi_gpu_cmd_allreduce(int argc, char **argv);

#endif
