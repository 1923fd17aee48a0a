/* sfi-sim: trace-driven cost model and analyzer of SFI decoding. With no
 * command it runs the default sweep. */
#include <config.h>

#include <stdio.h>
#include <string.h>

#include "sfi_sim_cli.h"
#include "sfi_io.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"sweep", sfi_sim_cmd_sweep,
     "simulate decoding over lists of models, GPUs, contexts, batches, policies"},
    {"serve", sfi_sim_cmd_serve,
     "run a workload through a simulated serving engine (admission, queueing, prefill)"},
    {"analyze", sfi_sim_cmd_analyze,
     "attention-mass recall and support stability of policies on a trace"},
    {"trace", sfi_sim_cmd_trace, "check or summarize a trace database (trace check|info FILE)"},
    {"presets", sfi_sim_cmd_presets, "list built-in GPUs, models and policies"},
    {"validate", sfi_sim_cmd_validate, "compare predicted with measured kernel times of a profile"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out)
{
    fprintf(out, "usage: sfi-sim [COMMAND] [OPTIONS]\n\n"
                 "Replays decode traces through a GPU cost model and analyzes them.\n"
                 "Without a command, runs the default sweep (see 'sfi-sim sweep --help').\n\n"
                 "commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'sfi-sim COMMAND --help' describes a command; see sfi-sim(1).\n");
}

int main(int argc, char **argv)
{
    /* Interrupted outputs leave no temporary files; ulimit -f is an error. */
    sfi_io_cleanup_on_signals();
    if (argc < 2 || argv[1][0] == '-') {
        if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
            usage(stdout);
            return 0;
        }
        if (argc >= 2 && !strcmp(argv[1], "--version")) {
            printf("sfi-sim %s\n", PACKAGE_VERSION);
            return 0;
        }
        /* No command: the default sweep, options passed through. */
        return sfi_sim_cmd_sweep(argc, argv);
    }
    if (!strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "sfi-sim: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
