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
int sfi_ref_cmd_eval(int argc, char **argv);
int sfi_ref_cmd_calibrate(int argc, char **argv);

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include "sfi_error.h"
#include "sfi_model.h"
#include "sfi_tokenizer.h"

/* encode/decode: parses --tokenizer DIR and --help, and loads the
 * tokenizer into *out. Returns -1 when *out is ready, else the exit
 * status the command should return (messages already printed). */
int sfi_ref_tokenizer_cli(const char *cmd, int argc, char **argv, void (*usage)(FILE *),
                          sfi_tokenizer **out);
/* Prompt files (--prompt-file, --prompt-ids) and the standard input of
 * encode/decode are refused beyond this size (a 128K-token prompt is
 * under 1 MB of text). */
#define SFI_REF_PROMPT_FILE_MAX ((size_t)256 << 20)
/* Whitespace-separated non-negative decimal token ids of s[0..len) (read
 * from path, named in messages) into *ids (malloc'd), at least one; a NUL
 * byte is an error, not the end of the list (sfi_token_ids_parse). */
SFI_NODISCARD sfi_status sfi_ref_parse_ids(const char *path, const char *s, size_t len,
                                           int32_t **ids, int *n, sfi_error *err);

/* A tokenizer whose ids reach past the model's vocab_size (embedding
 * rows) is not the model's: refused, naming tok_dir. */
SFI_NODISCARD sfi_status sfi_ref_tokenizer_fits(const sfi_tokenizer *tk, const char *tok_dir,
                                                const sfi_model_config *cfg, sfi_error *err);

#endif
