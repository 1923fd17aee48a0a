/* Subcommands of sfi-gpu (gpu/main.c dispatches). */
#ifndef SFI_GPU_CLI_H
#define SFI_GPU_CLI_H

/* Exit status when no CUDA device is usable (automake's skip status, so a
 * test or CI job can tell "not run" from "failed"). */
#define SFI_GPU_EXIT_NODEV 77

int sfi_gpu_cmd_check(int argc, char **argv);
int sfi_gpu_cmd_bench(int argc, char **argv);

#endif
