/* Small helpers shared by sfi-sim's commands. */
#ifndef SFI_SIM_UTIL_H
#define SFI_SIM_UTIL_H

#include <stdint.h>

/* Parses a non-negative integer; with kilo, a K or M suffix multiplies by
 * 1024 or 1024^2 ("32K" = 32768). Returns 0 on success, -1 when the text
 * is not such a number or overflows. */
int sfi_sim_parse_size(const char *s, int kilo, int64_t *out);

#endif
