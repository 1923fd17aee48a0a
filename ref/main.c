/* sfi-ref: the bit-exact reference of SFI decoding. Dispatches to the
 * subcommands in ref/cmd_*.c. */
#include <config.h>

#include <stdio.h>
#include <string.h>

#include "sfi_ref_cli.h"
#include "sfi_io.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"run", sfi_ref_cmd_run, "decode a prompt with a Qwen3 checkpoint (SFI or dense)"},
    {"info", sfi_ref_cmd_info, "shapes, sizes and KV bytes per token of a checkpoint or preset"},
    {"encode", sfi_ref_cmd_encode, "print the token ids of standard input's text"},
    {"decode", sfi_ref_cmd_decode, "print the text of token ids read from standard input"},
    {"trigger-set", sfi_ref_cmd_trigger_set, "print the trigger set of a tokenizer vocabulary"},
    {"digest", sfi_ref_cmd_digest, "print the SHA-256 digest of files"},
    {"make-checkpoint", sfi_ref_cmd_make_checkpoint,
     "write a random-weight checkpoint of a preset's shape"},
    {"eval", sfi_ref_cmd_eval, "teacher-forced quality of every KV policy at equal budget"},
    {"calibrate", sfi_ref_cmd_calibrate, "Kascade's and FASA's calibration from a text"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out)
{
    fprintf(out, "usage: sfi-ref COMMAND [OPTIONS]\n\n"
                 "The bit-exact scalar reference of Slow-Fast Inference.\n\n"
                 "commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-16s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'sfi-ref COMMAND --help' describes a command; see sfi-ref(1).\n");
}

int main(int argc, char **argv)
{
    /* Interrupted outputs leave no temporary files; ulimit -f is an error. */
    sfi_io_cleanup_on_signals();
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("sfi-ref %s\n", PACKAGE_VERSION);
        return 0;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "sfi-ref: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
