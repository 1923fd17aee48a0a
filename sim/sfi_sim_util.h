/* Small helpers shared by sfi-sim's commands. */
#ifndef SFI_SIM_UTIL_H
#define SFI_SIM_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include "sfi_cost.h"
#include "sfi_error.h"
#include "sfi_params.h"

/* Parses a non-negative integer; with kilo, a K or M suffix multiplies by
 * 1024 or 1024^2 ("32K" = 32768). Returns 0 on success, -1 when the text
 * is not such a number or overflows. */
int sfi_sim_parse_size(const char *s, int kilo, int64_t *out);

/* Splits a comma-separated list into malloc'd strings (*out, n returned;
 * -1 out of memory). Free with sfi_sim_free_list. */
int sfi_sim_split_list(const char *arg, char ***out);
void sfi_sim_free_list(char **v, int n);
/* A policy list: commas that start a new policy name split it, so
 * "quest:page=32,k=1024,sfi" gives two policies. */
int sfi_sim_split_policies(const char *arg, char ***out);
/* A policy spec "NAME[:key=value,...]": K, n_sink, n_recent and T_max go
 * to the policy's own copy of the SFI parameters (*prm, starting from
 * global: e.g. "sfi:T_max=32"), the other keys to the policy
 * (sfi_sim_policy_parse); the Selector's own knobs are refused there (they
 * do not change what a step costs; --param sets them). */
sfi_status sfi_sim_policy_spec_parse(const char *spec, const sfi_params *global,
                                     sfi_sim_policy *pol, sfi_params *prm, sfi_error *err);
/* Writes s as a CSV field (quoted when it holds a comma, quote or
 * newline). */
void sfi_sim_csv_str(FILE *f, const char *s);

#endif
