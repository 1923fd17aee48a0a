/* Replaced by the work stream that owns this command. */
#include "sfi_sim_cli.h"
#include <stdio.h>
int sfi_sim_cmd_analyze(int argc, char **argv)
{
    (void)argc;
    fprintf(stderr, "%s: not available in this build yet\n", argv[0]);
    return 1;
}
