/* What a command of sfi-ref and sfi-gpu prints when getopt_long refuses an
 * option: one message naming the command, the usage on stderr, exit code
 * 2. Private to the sfi programs (not installed). */
#ifndef SFI_CLI_H
#define SFI_CLI_H

#include <stdio.h>

/* Call when getopt_long (run with opterr = 0) has returned '?' or ':'.
 * Prints on stderr, cmd being the command's name ("sfi-ref run"),
 *   CMD: ARG: unknown option or missing value
 * with ARG the argument getopt_long stopped at (argv[optind - 1]). Where
 * valued is not NULL it lists the short options that take a value ("mpn"),
 * and an option whose optopt is a character (a short option, or a long one
 * whose value is one) is named by that letter instead:
 *   CMD: option -X: needs a value      (X in valued)
 *   CMD: option -X: unknown            (otherwise)
 * Then usage(stderr). Returns 2, the exit code of a usage error. */
int sfi_cli_bad_option(const char *cmd, char *const argv[], const char *valued,
                       void (*usage)(FILE *out));

#endif
