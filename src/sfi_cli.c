/* Refused command-line options (see sfi_cli.h). */
#include <config.h>

#include "sfi_cli.h"

#include <getopt.h>
#include <string.h>

int sfi_cli_bad_option(const char *cmd, char *const argv[], const char *valued,
                       void (*usage)(FILE *out))
{
    if (valued && optopt && optopt < 256)
        fprintf(stderr, "%s: option -%c: %s\n", cmd, optopt,
                strchr(valued, optopt) ? "needs a value" : "unknown");
    else
        fprintf(stderr, "%s: %s: unknown option or missing value\n", cmd, argv[optind - 1]);
    usage(stderr);
    return 2;
}
