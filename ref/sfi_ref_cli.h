/* Subcommands of sfi-ref; each lives in its own ref/cmd_*.c and returns the
 * process exit status (0 ok, 1 bad input or failure, 2 usage error). */
#ifndef SFI_REF_CLI_H
#define SFI_REF_CLI_H

int sfi_ref_cmd_trigger_set(int argc, char **argv);
int sfi_ref_cmd_run(int argc, char **argv);
int sfi_ref_cmd_encode(int argc, char **argv);
int sfi_ref_cmd_decode(int argc, char **argv);
int sfi_ref_cmd_info(int argc, char **argv);
int sfi_ref_cmd_digest(int argc, char **argv);
int sfi_ref_cmd_make_checkpoint(int argc, char **argv);

#endif
