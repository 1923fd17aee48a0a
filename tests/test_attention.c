/* ref/sfi_attention: hand-computed cases, GQA head mapping, agreement with
 * a double-precision evaluation, sparse == dense bit for bit on the full
 * set, prefill == decode bit for bit, and bad input. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_attention.h"
#include "sfi_math.h"
#include "sfi_test_util.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

/* Uniform in [-1, 1), 24 random bits: exact in float, same on every host. */
static float urand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(int32_t)((rng >> 40) - (1u << 23)) / 8388608.0f;
}

static float *rand_buf(size_t n, float amp)
{
    float *b = malloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++)
        b[i] = urand() * amp;
    return b;
}

START_TEST(hand_two_positions)
{
    /* One head, head_dim 4: scale = 1/sqrt(4) = 0.5 exactly.
     * q = (1,0,0,0), k0 = k1 = (2,0,0,0): both logits 2 * 0.5 = 1, so
     * p = (0.5, 0.5) exactly and out = 0.5 v0 + 0.5 v1 = (2,2,2,2) exactly
     * for v0 = (1,2,3,4), v1 = (3,2,1,0). */
    sfi_attn_shape s = {1, 1, 4};
    float q[4] = {1, 0, 0, 0};
    float k[8] = {2, 0, 0, 0, 2, 0, 0, 0};
    float v[8] = {1, 2, 3, 4, 3, 2, 1, 0};
    float out[4], lg[2];
    sfi_error e;
    ck_assert_int_eq(sfi_attn_dense_decode(&s, q, k, v, 2, out, lg, &e), SFI_OK);
    ck_assert(sfi_attn_scale(4) == 0.5f);
    ck_assert(lg[0] == 1.0f && lg[1] == 1.0f);
    for (int c = 0; c < 4; c++)
        ck_assert(out[c] == 2.0f);
    /* k0 = (2 ln 3, 0, 0, 0), k1 = 0: logits (ln 3, 0), p = (3/4, 1/4):
     * out = 0.75 v0 + 0.25 v1 = (1.5, 2, 2.5, 3). */
    k[0] = 2.0f * 1.09861229f;
    k[4] = 0.0f;
    ck_assert_int_eq(sfi_attn_dense_decode(&s, q, k, v, 2, out, lg, &e), SFI_OK);
    ck_assert_float_eq_tol(lg[0], 1.09861229f, 1e-7f);
    ck_assert(lg[1] == 0.0f);
    const float want[4] = {1.5f, 2.0f, 2.5f, 3.0f};
    for (int c = 0; c < 4; c++)
        ck_assert_float_eq_tol(out[c], want[c], 1e-6f);
}
END_TEST

START_TEST(gqa_mapping)
{
    /* 4 query heads on 2 KV heads, one position: p = 1 exactly, so head h
     * returns v of KV head h / 2. KV head 0 holds 1s, KV head 1 holds 2s. */
    sfi_attn_shape s = {4, 2, 3};
    float q[12], k[6], v[6] = {1, 1, 1, 2, 2, 2}, out[12], lg[4];
    for (int i = 0; i < 12; i++)
        q[i] = (float)i;
    for (int i = 0; i < 6; i++)
        k[i] = 1.0f;
    ck_assert_int_eq(sfi_attn_dense_decode(&s, q, k, v, 1, out, lg, NULL), SFI_OK);
    for (int h = 0; h < 4; h++)
        for (int c = 0; c < 3; c++)
            ck_assert(out[h * 3 + c] == (h < 2 ? 1.0f : 2.0f));
    /* logit of head 3: (9+10+11) * 1/sqrt(3) */
    ck_assert_float_eq_tol(lg[3], 30.0f / sqrtf(3.0f), 1e-5f);
}
END_TEST

START_TEST(matches_double_precision)
{
    sfi_attn_shape s = {8, 2, 64};
    const int n = 777;
    size_t kvn = (size_t)n * 2 * 64;
    float *q = rand_buf(8 * 64, 2.0f), *k = rand_buf(kvn, 2.0f), *v = rand_buf(kvn, 1.0f);
    float *out = malloc(8 * 64 * sizeof *out), *lg = malloc((size_t)8 * n * sizeof *lg);
    ck_assert_int_eq(sfi_attn_dense_decode(&s, q, k, v, n, out, lg, NULL), SFI_OK);
    double *p = malloc((size_t)n * sizeof *p);
    for (int h = 0; h < 8; h++) {
        int kvh = h / 4;
        double mx = -1e300, sum = 0.0;
        for (int j = 0; j < n; j++) {
            double d = 0.0;
            for (int c = 0; c < 64; c++)
                d += (double)q[h * 64 + c] * k[((size_t)j * 2 + kvh) * 64 + c];
            d /= 8.0;
            ck_assert(fabs(d - lg[(size_t)h * n + j]) < 1e-5);
            p[j] = d;
            if (d > mx)
                mx = d;
        }
        for (int j = 0; j < n; j++) {
            p[j] = exp(p[j] - mx);
            sum += p[j];
        }
        for (int c = 0; c < 64; c++) {
            double o = 0.0;
            for (int j = 0; j < n; j++)
                o += p[j] / sum * v[((size_t)j * 2 + kvh) * 64 + c];
            ck_assert_msg(fabs(o - out[h * 64 + c]) < 2e-5, "head %d dim %d: %g vs %g", h, c, o,
                          (double)out[h * 64 + c]);
        }
    }
    free(p);
    free(q);
    free(k);
    free(v);
    free(out);
    free(lg);
}
END_TEST

START_TEST(sparse_full_set_equals_dense_bitwise)
{
    const int shapes[][4] = {{1, 1, 8, 1}, {4, 2, 16, 37}, {8, 8, 32, 300}, {16, 4, 64, 1025}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        sfi_attn_shape s = {shapes[t][0], shapes[t][1], shapes[t][2]};
        int n = shapes[t][3];
        size_t kvn = (size_t)n * s.n_kv_heads * s.head_dim, qn = (size_t)s.n_heads * s.head_dim;
        float *q = rand_buf(qn, 3.0f), *k = rand_buf(kvn, 3.0f), *v = rand_buf(kvn, 1.0f);
        float *od = malloc(qn * sizeof *od), *os = malloc(qn * sizeof *os),
              *os2 = malloc(qn * sizeof *os2);
        int32_t **idx = malloc((size_t)s.n_kv_heads * sizeof *idx);
        int32_t **rev = malloc((size_t)s.n_kv_heads * sizeof *rev);
        int *cnt = malloc((size_t)s.n_kv_heads * sizeof *cnt);
        for (int h = 0; h < s.n_kv_heads; h++) {
            idx[h] = malloc((size_t)n * sizeof **idx);
            rev[h] = malloc((size_t)n * sizeof **rev);
            for (int j = 0; j < n; j++) {
                idx[h][j] = j;
                rev[h][j] = n - 1 - j; /* unsorted input: the function sorts a copy */
            }
            cnt[h] = n;
        }
        ck_assert_int_eq(sfi_attn_dense_decode(&s, q, k, v, n, od, NULL, NULL), SFI_OK);
        ck_assert_int_eq(
            sfi_attn_sparse_decode(&s, q, k, v, n, (const int32_t *const *)idx, cnt, os, NULL),
            SFI_OK);
        ck_assert_int_eq(
            sfi_attn_sparse_decode(&s, q, k, v, n, (const int32_t *const *)rev, cnt, os2, NULL),
            SFI_OK);
        ck_assert(memcmp(od, os, qn * sizeof *od) == 0);
        ck_assert(memcmp(od, os2, qn * sizeof *od) == 0);
        for (int h = 0; h < s.n_kv_heads; h++) {
            free(idx[h]);
            free(rev[h]);
        }
        free(idx);
        free(rev);
        free(cnt);
        free(q);
        free(k);
        free(v);
        free(od);
        free(os);
        free(os2);
    }
}
END_TEST

START_TEST(sparse_subset_equals_dense_on_gathered_cache)
{
    /* Attending to a subset must equal dense attention over a cache that
     * holds only those positions, in the same order (same numerics). */
    sfi_attn_shape s = {4, 1, 16};
    const int n = 200;
    float *q = rand_buf(64, 2.0f), *k = rand_buf((size_t)n * 16, 2.0f),
          *v = rand_buf((size_t)n * 16, 1.0f);
    int32_t sel[60];
    int m = 0;
    for (int j = 0; j < n && m < 60; j += 3)
        sel[m++] = j;
    float *gk = malloc((size_t)m * 16 * sizeof *gk), *gv = malloc((size_t)m * 16 * sizeof *gv);
    for (int i = 0; i < m; i++) {
        memcpy(gk + i * 16, k + (size_t)sel[i] * 16, 16 * sizeof *gk);
        memcpy(gv + i * 16, v + (size_t)sel[i] * 16, 16 * sizeof *gv);
    }
    float os[64], od[64];
    const int32_t *ix[1] = {sel};
    ck_assert_int_eq(sfi_attn_sparse_decode(&s, q, k, v, n, ix, &m, os, NULL), SFI_OK);
    ck_assert_int_eq(sfi_attn_dense_decode(&s, q, gk, gv, m, od, NULL, NULL), SFI_OK);
    ck_assert(memcmp(os, od, sizeof os) == 0);
    free(q);
    free(k);
    free(v);
    free(gk);
    free(gv);
}
END_TEST

START_TEST(prefill_equals_decode_bitwise)
{
    sfi_attn_shape s = {4, 2, 8};
    const int T = 20, pos0 = 5, W = 16, nk = pos0 + T;
    size_t qn = (size_t)s.n_heads * s.head_dim;
    float *q = rand_buf((size_t)T * qn, 3.0f);
    float *k = rand_buf((size_t)nk * 2 * 8, 3.0f), *v = rand_buf((size_t)nk * 2 * 8, 1.0f);
    float *out = malloc((size_t)T * qn * sizeof *out);
    float *tail = malloc((size_t)W * s.n_heads * nk * sizeof *tail);
    sfi_error e;
    ck_assert_int_eq(sfi_attn_prefill(&s, q, T, pos0, k, v, out, W, tail, &e), SFI_OK);
    float od[32], lg[4 * 25];
    for (int t = 0; t < T; t++) {
        int n = pos0 + t + 1;
        ck_assert_int_eq(sfi_attn_dense_decode(&s, q + (size_t)t * qn, k, v, n, od, lg, NULL),
                         SFI_OK);
        ck_assert(memcmp(od, out + (size_t)t * qn, qn * sizeof *od) == 0);
        int w = t - (T - W);
        if (w < 0)
            continue;
        for (int h = 0; h < 4; h++) {
            const float *row = tail + ((size_t)w * 4 + h) * nk;
            ck_assert(memcmp(row, lg + (size_t)h * n, (size_t)n * sizeof *row) == 0);
            for (int j = n; j < nk; j++)
                ck_assert(row[j] == -INFINITY);
        }
    }
    /* W = 0 needs no buffer. */
    ck_assert_int_eq(sfi_attn_prefill(&s, q, T, pos0, k, v, out, 0, NULL, &e), SFI_OK);
    free(q);
    free(k);
    free(v);
    free(out);
    free(tail);
}
END_TEST

START_TEST(bad_input)
{
    float q[64] = {0}, k[64] = {0}, v[64] = {0}, out[64];
    sfi_error e;
    sfi_attn_shape bad = {6, 4, 8};
    ck_assert_int_eq(sfi_attn_dense_decode(&bad, q, k, v, 1, out, NULL, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "not a multiple"));
    sfi_attn_shape zero = {4, 2, 0};
    ck_assert_int_eq(sfi_attn_shape_check(&zero, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "head_dim=0"));
    sfi_attn_shape s = {2, 1, 8};
    ck_assert_int_eq(sfi_attn_dense_decode(&s, q, k, v, 0, out, NULL, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_attn_dense_decode(&s, NULL, k, v, 1, out, NULL, &e), SFI_EINVAL);
    int32_t set[3] = {0, 2, 2};
    const int32_t *ix[1] = {set};
    int n = 0;
    ck_assert_int_eq(sfi_attn_sparse_decode(&s, q, k, v, 4, ix, &n, out, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "0 positions"));
    n = 3;
    ck_assert_int_eq(sfi_attn_sparse_decode(&s, q, k, v, 4, ix, &n, out, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "twice"));
    set[2] = 4;
    ck_assert_int_eq(sfi_attn_sparse_decode(&s, q, k, v, 4, ix, &n, out, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "outside"));
    set[2] = -1;
    ck_assert_int_eq(sfi_attn_sparse_decode(&s, q, k, v, 4, ix, &n, out, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_attn_prefill(&s, q, 2, 0, k, v, out, 3, out, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_attn_prefill(&s, q, 2, 0, k, v, out, 1, NULL, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_attn_prefill(&s, q, 0, 0, k, v, out, 0, NULL, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_attn_prefill(&s, q, 1, -1, k, v, out, 0, NULL, &e), SFI_EINVAL);
    /* NaN in the cache is not an error for attention (the model's job to
     * avoid); it propagates into the output instead of crashing. */
    k[0] = NAN;
    ck_assert_int_eq(sfi_attn_dense_decode(&s, q, k, v, 1, out, NULL, &e), SFI_OK);
    ck_assert(isnan(out[0]));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attention");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, hand_two_positions);
    tcase_add_test(tc, gqa_mapping);
    tcase_add_test(tc, matches_double_precision);
    tcase_add_test(tc, sparse_full_set_equals_dense_bitwise);
    tcase_add_test(tc, sparse_subset_equals_dense_on_gathered_cache);
    tcase_add_test(tc, prefill_equals_decode_bitwise);
    tcase_add_test(tc, bad_input);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
