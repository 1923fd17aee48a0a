/* Every knob of the method (sfi(7), PARAMETERS) in one struct, with sfi(7)'s defaults.
 * Set from "key=value" strings (--param) and from files of such lines. */
#ifndef SFI_PARAMS_H
#define SFI_PARAMS_H

#include <stddef.h>
#include "sfi_error.h"

#define SFI_TRIGGER_CHARS_MAX 32

typedef struct {
    int n_sink;        /* sink positions 0..n_sink-1 (4) */
    int n_recent;      /* recent window, current token included (256) */
    int K;             /* selected positions per KV head (2048) */
    int T_max;         /* max steps between slow steps (64) */
    int W_decode;      /* window queries at a decode slow step (1) */
    int W_prefill;     /* window queries at prefill (16) */
    float alpha;       /* power-mean exponent, (0,1] (0.5) */
    float gamma;       /* key-norm prior exponent, >= 0 (1.0) */
    float beta;        /* position prior decay, >= 0 (1.0) */
    float p;           /* position prior power, > 0 (2) */
    float eta;         /* position prior tail exponent, >= 0 (0.5) */
    float lambda_clip; /* upper clip of lambda*, [0,1] (0.02) */
    int nms_radius;    /* Soft-NMS neighbourhood radius, >= 0 (2) */
    float alpha_soft;  /* Soft-NMS strength, >= 0 (0.5) */
    float T;           /* cross-head softmax temperature, > 0 (1.0) */
    float alpha_cross; /* cross-head exclusivity strength, >= 0 (0.35) */
    float eps;         /* numerical floor, > 0 (1e-8) */
    /* Deferred refresh: the sets a decode slow step t selects take effect
     * at step t + refresh_delay (a later slow step before then drops
     * them); 0 = at once (off), else 2..4 (0) */
    int refresh_delay;
    /* Characters that end a sentence or segment; '\n' included by default.
     * UTF-8, NUL-terminated. As a parameter value, escapes \n \t \r \\ are
     * accepted. */
    char trigger_chars[SFI_TRIGGER_CHARS_MAX];
} sfi_params;

void sfi_params_default(sfi_params *p);

/* Applies one "key=value" (origin names where it came from, e.g. "--param"
 * or "file.conf:3", for the message). Unknown keys, unparsable or
 * out-of-range values are errors and leave *p unchanged. */
SFI_NODISCARD sfi_status sfi_params_set(sfi_params *p, const char *key_value, const char *origin,
                                        sfi_error *err);

/* Applies a file of "key=value" lines; '#' starts a comment, blank lines
 * are ignored. Errors name the file and line. */
SFI_NODISCARD sfi_status sfi_params_load_file(sfi_params *p, const char *path, sfi_error *err);

/* Checks ranges and cross-field constraints (e.g. K >= 1). */
SFI_NODISCARD sfi_status sfi_params_validate(const sfi_params *p, sfi_error *err);

/* A JSON object of every field (malloc'd; caller frees). NULL on ENOMEM. */
char *sfi_params_to_json(const sfi_params *p);

/* The inverse: applies the keys of a JSON object (sfi_params_to_json's
 * form) with the ranges of sfi_params_set, then sfi_params_validate. Keys
 * that are not parameters are ignored (other producers may add theirs);
 * anything else wrong is an error naming origin and leaves *p unchanged. */
SFI_NODISCARD sfi_status sfi_params_from_json(sfi_params *p, const char *json, const char *origin,
                                              sfi_error *err);

/* Number of keys and the i-th key's name and description, for --help. */
size_t sfi_params_key_count(void);
const char *sfi_params_key_name(size_t i);
const char *sfi_params_key_help(size_t i);

#endif
