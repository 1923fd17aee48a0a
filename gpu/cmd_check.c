/* placeholder until the reference lands */
#include <config.h>
#include <stdio.h>
#include <string.h>
#include "sfi_gpu.h"
#include "sfi_gpu_cli.h"
int sfi_gpu_cmd_check(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--quick") && strcmp(argv[i], "--bit-exact")) {
            fprintf(stderr, "sfi-gpu check: unknown option '%s'\n", argv[i]);
            return 2;
        }
    char msg[256];
    if (!sfi_gpu_device_ok(msg, sizeof msg)) {
        printf("sfi-gpu check: %s\n", msg);
        return SFI_GPU_EXIT_NODEV;
    }
    return 1;
}
