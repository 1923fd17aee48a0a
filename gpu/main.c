/* sfi-gpu: the CUDA path's checker and benchmarks (man sfi-gpu). */
#include <config.h>

#include <stdio.h>
#include <string.h>

#include "sfi_gpu_cli.h"
#include "sfi_io.h"

static void usage(FILE *f)
{
    fputs("Usage: sfi-gpu COMMAND [OPTIONS]\n"
          "\n"
          "The CUDA path of SFI: a GPU decode engine, and kernels checked against the\n"
          "reference and measured.\n"
          "\n"
          "Commands:\n"
          "  run (--model DIR | --synthetic PRESET) (--prompt T | --prompt-file F |\n"
          "      --prompt-ids F | --replay TRACE) --max-new N [--batch B] [...]\n"
          "        the whole SFI decode loop on the GPU (run --help for every option)\n"
          "  check [--bit-exact] [--quick] [--kernels-only] [--seed N]\n"
          "        run the seeded GPU-vs-reference suite (kernels, then the engine end\n"
          "        to end); exit 1 on any mismatch\n"
          "  bench [--quick] [--profile FILE] [--name NAME] [--torch CMD]\n"
          "        measure the kernels; write a calibration profile for sfi-sim\n"
          "  bench-allreduce [--gpus N] [--hidden H,...] [--batch B,...] [--json]\n"
          "        ncclAllReduce latency and bus bandwidth over N GPUs for the\n"
          "        messages of a tensor-parallel decode step (run --tp N)\n"
          "  --help, --version\n"
          "\n"
          "Exit status: 0 success, 1 mismatch or CUDA error, 2 usage error,\n"
          "77 no CUDA device (or, for --tp and bench-allreduce, too few GPUs or no\n"
          "NCCL).\n",
          f);
}

int main(int argc, char **argv)
{
    /* Interrupted outputs leave no temporary files; ulimit -f is an error. */
    sfi_io_cleanup_on_signals();
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("sfi-gpu %s\n", PACKAGE_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "run"))
        return sfi_gpu_cmd_run(argc - 1, argv + 1);
    if (!strcmp(argv[1], "check"))
        return sfi_gpu_cmd_check(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench"))
        return sfi_gpu_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench-allreduce"))
        return sfi_gpu_cmd_allreduce(argc - 1, argv + 1);
    fprintf(stderr, "sfi-gpu: unknown command '%s' (try --help)\n", argv[1]);
    return 2;
}
