/* Small helpers shared by sfi-sim's commands. */
#ifndef SFI_SIM_UTIL_H
#define SFI_SIM_UTIL_H

#include <stdint.h>
#include <stdio.h>

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
/* Writes s as a CSV field (quoted when it holds a comma, quote or
 * newline). */
void sfi_sim_csv_str(FILE *f, const char *s);

#endif
