/* Reading tests/fixtures/hf/expected.json (written by
 * tests/make_hf_fixtures.py) for the model-layer tests. Header-only: each
 * test program includes it once. */
#ifndef SFI_HF_FIXTURE_H
#define SFI_HF_FIXTURE_H

#include <check.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_test_util.h"

static inline json_t *hf_expected(void)
{
    char path[2048];
    snprintf(path, sizeof path, "%s", sfi_test_src("tests/fixtures/hf/expected.json"));
    json_error_t je;
    json_t *r = json_load_file(path, 0, &je);
    ck_assert_msg(r != NULL, "%s: %s", path, je.text);
    return r;
}

/* Path of a file or model directory inside tests/fixtures/hf (static
 * buffer, rotating among 4). */
static inline const char *hf_path(const char *rel)
{
    static char buf[4][2048];
    static int k;
    k = (k + 1) % 4;
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "tests/fixtures/hf/%s", rel);
    snprintf(buf[k], sizeof buf[k], "%s", sfi_test_src(tmp));
    return buf[k];
}

/* ids of a JSON array, malloc'd. */
static inline int32_t *hf_ids(json_t *arr, int *n)
{
    *n = (int)json_array_size(arr);
    int32_t *v = malloc(((size_t)*n + 1) * sizeof *v);
    for (int i = 0; i < *n; i++)
        v[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return v;
}

static inline float *hf_logits(const char *file, size_t count)
{
    float *v = malloc(count * sizeof(float));
    FILE *f = fopen(hf_path(file), "rb");
    ck_assert_msg(f != NULL, "cannot open %s", file);
    ck_assert_uint_eq(fread(v, sizeof(float), count, f), count);
    fclose(f);
    return v;
}

#endif
