/* safetensors reader/writer: round trips, exact widening, sharded index, and
 * every kind of bad file refused with a message naming file and tensor. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sfi_safetensors.h"
#include "sfi_test_util.h"

static char *dir;

static void setup(void)
{
    dir = sfi_test_tmpdir();
}
static void teardown(void)
{
    sfi_test_rmtree(dir);
    free(dir);
}

static char *pathf(const char *name)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* A raw file: 8-byte length + header + data. */
static void write_raw(const char *name, const char *hdr, const void *data, size_t dlen,
                      long long force_len)
{
    size_t hl = strlen(hdr);
    unsigned long long L = force_len >= 0 ? (unsigned long long)force_len : hl;
    unsigned char *buf = malloc(8 + hl + dlen + 1);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(L >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    if (dlen)
        memcpy(buf + 8 + hl, data, dlen);
    ck_assert_int_eq(sfi_test_write_file(pathf(name), buf, 8 + hl + dlen), 0);
    free(buf);
}

static sfi_status open_err(const char *name, sfi_error *e)
{
    sfi_safetensors *st = NULL;
    sfi_status rc = sfi_st_open(pathf(name), &st, e);
    if (rc == SFI_OK)
        sfi_st_close(st);
    else
        ck_assert_ptr_null(st);
    return rc;
}

START_TEST(conversions_exact)
{
    /* bf16 -> f32 is a shift; f32 -> bf16 rounds to nearest even */
    ck_assert(sfi_bf16_to_f32(0x3f80) == 1.0f);
    ck_assert(sfi_bf16_to_f32(0xc000) == -2.0f);
    ck_assert_uint_eq(sfi_f32_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 is half-way between bf16 1.0 and 1+2^-7: ties to even (1.0) */
    ck_assert_uint_eq(sfi_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
    ck_assert_uint_eq(sfi_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
    ck_assert(isnan(sfi_bf16_to_f32(sfi_f32_to_bf16(NAN))));
    /* every bf16 round-trips */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = sfi_bf16_to_f32((uint16_t)h);
        if (!isnan(f))
            ck_assert_uint_eq(sfi_f32_to_bf16(f), h);
    }
    /* f16: normals, subnormals, inf */
    ck_assert(sfi_f16_to_f32(0x3c00) == 1.0f);
    ck_assert(sfi_f16_to_f32(0xc000) == -2.0f);
    ck_assert(sfi_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    ck_assert(sfi_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24));
    ck_assert(sfi_f16_to_f32(0x7bff) == 65504.0f);
    ck_assert(isinf(sfi_f16_to_f32(0x7c00)));
    ck_assert(sfi_f16_to_f32(0x8000) == 0.0f && signbit(sfi_f16_to_f32(0x8000)));
}
END_TEST

START_TEST(write_read_roundtrip)
{
    float a[6] = {1, -2, 3.5f, 1e-3f, -0.0f, 65504};
    float b[3] = {0.1f, 0.2f, 0.3f};
    sfi_st_write_tensor t[2] = {
        {.name = "a", .dtype = SFI_DT_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "b.weight", .dtype = SFI_DT_BF16, .ndim = 1, .shape = {3}, .data = b},
    };
    sfi_error e;
    ck_assert_int_eq(sfi_st_write(pathf("m.safetensors"), t, 2, &e), SFI_OK);
    sfi_safetensors *st;
    ck_assert_int_eq(sfi_st_open(pathf("m.safetensors"), &st, &e), SFI_OK);
    ck_assert_uint_eq(sfi_st_count(st), 2);
    const sfi_st_tensor *ta = sfi_st_find(st, "a");
    ck_assert_ptr_nonnull(ta);
    ck_assert_int_eq(ta->dtype, SFI_DT_F32);
    ck_assert_int_eq(ta->ndim, 2);
    ck_assert_int_eq(ta->shape[1], 3);
    float *x;
    int64_t sh[2] = {2, 3};
    ck_assert_int_eq(sfi_st_load_f32(st, "a", 2, sh, SFI_DT_F32, &x, &e), SFI_OK);
    ck_assert(memcmp(x, a, sizeof a) == 0);
    free(x);
    int64_t sb[1] = {3};
    ck_assert_int_eq(sfi_st_load_f32(st, "b.weight", 1, sb, -1, &x, &e), SFI_OK);
    for (int i = 0; i < 3; i++)
        ck_assert(x[i] == sfi_bf16_to_f32(sfi_f32_to_bf16(b[i])));
    free(x);
    /* wrong shape, wrong dtype, missing: errors name the tensor */
    int64_t bad[2] = {3, 2};
    ck_assert_int_eq(sfi_st_load_f32(st, "a", 2, bad, -1, &x, &e), SFI_EFORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "tensor a has shape [2, 3], the config needs [3, 2]"));
    ck_assert_int_eq(sfi_st_load_f32(st, "b.weight", 1, sb, SFI_DT_F32, &x, &e), SFI_EFORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "b.weight is BF16, expected F32"));
    ck_assert_int_eq(sfi_st_load_f32(st, "c", 1, sb, -1, &x, &e), SFI_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "tensor c is missing"));
    ck_assert_ptr_nonnull(strstr(e.msg, "m.safetensors"));
    sfi_st_close(st);
    /* the directory form finds model.safetensors */
    ck_assert_int_eq(rename(pathf("m.safetensors"), pathf("model.safetensors")), 0);
    ck_assert_int_eq(sfi_st_open(dir, &st, &e), SFI_OK);
    ck_assert_uint_eq(sfi_st_count(st), 2);
    sfi_st_close(st);
    /* no temp file left behind */
    char *out = NULL;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "ls '%s'", dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, NULL), 0);
    ck_assert_str_eq(out, "model.safetensors\n");
    free(out);
}
END_TEST

START_TEST(f16_file)
{
    /* F16 values 1, -2, 2^-24 */
    unsigned char d[6] = {0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00};
    write_raw("h.safetensors", "{\"x\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}}",
              d, 6, -1);
    sfi_safetensors *st;
    sfi_error e;
    ck_assert_int_eq(sfi_st_open(pathf("h.safetensors"), &st, &e), SFI_OK);
    float *x;
    int64_t sh[1] = {3};
    ck_assert_int_eq(sfi_st_load_f32(st, "x", 1, sh, SFI_DT_F16, &x, &e), SFI_OK);
    ck_assert(x[0] == 1.0f && x[1] == -2.0f && x[2] == ldexpf(1.0f, -24));
    free(x);
    sfi_st_close(st);
}
END_TEST

START_TEST(bad_files_refused)
{
    sfi_error e;
    unsigned char d[16] = {0};
    /* missing file */
    ck_assert_int_eq(open_err("none.safetensors", &e), SFI_ENOTFOUND);
    /* A FIFO: refused at once, not waited on for a writer (issue 20). */
    ck_assert_int_eq(mkfifo(pathf("fifo.safetensors"), 0600), 0);
    ck_assert_int_eq(open_err("fifo.safetensors", &e), SFI_EIO);
    ck_assert_msg(strstr(e.msg, "fifo.safetensors: not a regular file"), "%s", e.msg);
    /* Issue 20: trailing bytes and gaps, which the reference safetensors
     * library rejects, were accepted. */
    write_raw("trail", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", d, 12,
              -1);
    ck_assert_int_eq(open_err("trail", &e), SFI_EFORMAT);
    ck_assert_msg(strstr(e.msg, "4 bytes follow the last tensor's data"), "%s", e.msg);
    write_raw("gap",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
              d, 12, -1);
    ck_assert_int_eq(open_err("gap", &e), SFI_EFORMAT);
    ck_assert_msg(strstr(e.msg, "4 unused bytes before tensor b"), "%s", e.msg);
    /* shorter than 8 bytes */
    ck_assert_int_eq(sfi_test_write_file(pathf("t1"), "abc", 3), 0);
    ck_assert_int_eq(open_err("t1", &e), SFI_EFORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "truncated"));
    /* header length past the end */
    write_raw("t2", "{}", NULL, 0, 1000);
    ck_assert_int_eq(open_err("t2", &e), SFI_EFORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "truncated"));
    /* absurd header length: refused before allocating */
    write_raw("t3", "{}", NULL, 0, (long long)1 << 40);
    ck_assert_int_eq(open_err("t3", &e), SFI_EFORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "limit"));
    /* bad JSON */
    write_raw("t4", "{\"x\":{\"dtype\":", NULL, 0, -1);
    ck_assert_int_eq(open_err("t4", &e), SFI_EFORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "not valid JSON"));
    write_raw("t4b", "[1,2]", NULL, 0, -1);
    ck_assert_int_eq(open_err("t4b", &e), SFI_EFORMAT);
    /* unsupported dtype */
    write_raw("t5", "{\"x\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", d, 16, -1);
    ck_assert_int_eq(open_err("t5", &e), SFI_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(e.msg, "x: dtype I64"));
    /* shape does not match the byte span */
    write_raw("t6", "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", d, 16, -1);
    ck_assert_int_eq(open_err("t6", &e), SFI_EFORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "x: data_offsets span 16 bytes"));
    /* offsets past the data (a truncated file) */
    write_raw("t7", "{\"x\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]}}", d, 16, -1);
    ck_assert_int_eq(open_err("t7", &e), SFI_EFORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "run past the data block"));
    /* a 1 TB tensor claimed by a tiny file */
    write_raw("t8",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[262144,1048576],"
              "\"data_offsets\":[0,1099511627776]}}",
              d, 16, -1);
    ck_assert_int_eq(open_err("t8", &e), SFI_EFORMAT);
    /* shape product overflow */
    write_raw("t9",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
              "\"data_offsets\":[0,16]}}",
              d, 16, -1);
    ck_assert_int_eq(open_err("t9", &e), SFI_EFORMAT);
    /* negative / reversed offsets, negative dims */
    write_raw("t10", "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", d, 16, -1);
    ck_assert_int_eq(open_err("t10", &e), SFI_EFORMAT);
    write_raw("t11", "{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", d, 16,
              -1);
    ck_assert_int_eq(open_err("t11", &e), SFI_EFORMAT);
    /* overlapping tensors */
    write_raw("t12",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
              d, 16, -1);
    ck_assert_int_eq(open_err("t12", &e), SFI_EFORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "overlap"));
    /* missing fields */
    write_raw("t13", "{\"x\":{\"shape\":[2],\"data_offsets\":[0,8]}}", d, 16, -1);
    ck_assert_int_eq(open_err("t13", &e), SFI_EFORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "x: missing dtype"));
    /* a directory without a checkpoint */
    sfi_safetensors *st;
    ck_assert_int_eq(sfi_st_open(dir, &st, &e), SFI_ENOTFOUND);
}
END_TEST

START_TEST(sharded_index)
{
    float a[2] = {1, 2}, b[3] = {3, 4, 5};
    sfi_st_write_tensor ta = {.name = "a", .dtype = SFI_DT_F32, .ndim = 1, .shape = {2}, .data = a};
    sfi_st_write_tensor tb = {
        .name = "b", .dtype = SFI_DT_BF16, .ndim = 1, .shape = {3}, .data = b};
    sfi_error e;
    ck_assert_int_eq(sfi_st_write(pathf("s-1.safetensors"), &ta, 1, &e), SFI_OK);
    ck_assert_int_eq(sfi_st_write(pathf("s-2.safetensors"), &tb, 1, &e), SFI_OK);
    const char *idx = "{\"metadata\":{},\"weight_map\":{\"a\":\"s-1.safetensors\","
                      "\"b\":\"s-2.safetensors\"}}";
    ck_assert_int_eq(sfi_test_write_file(pathf("model.safetensors.index.json"), idx, strlen(idx)),
                     0);
    sfi_safetensors *st;
    ck_assert_int_eq(sfi_st_open(dir, &st, &e), SFI_OK);
    ck_assert_uint_eq(sfi_st_count(st), 2);
    ck_assert_ptr_nonnull(strstr(sfi_st_find(st, "b")->file, "s-2.safetensors"));
    sfi_st_close(st);
    /* index naming a tensor the shard lacks */
    const char *bad = "{\"weight_map\":{\"a\":\"s-1.safetensors\",\"c\":\"s-2.safetensors\"}}";
    ck_assert_int_eq(sfi_test_write_file(pathf("model.safetensors.index.json"), bad, strlen(bad)),
                     0);
    ck_assert_int_eq(sfi_st_open(dir, &st, &e), SFI_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "tensor c"));
    /* index pointing at the wrong shard */
    const char *wrong = "{\"weight_map\":{\"a\":\"s-2.safetensors\",\"b\":\"s-1.safetensors\"}}";
    ck_assert_int_eq(
        sfi_test_write_file(pathf("model.safetensors.index.json"), wrong, strlen(wrong)), 0);
    ck_assert_int_eq(sfi_st_open(dir, &st, &e), SFI_EFORMAT);
    /* shard escaping the directory */
    const char *esc = "{\"weight_map\":{\"a\":\"../s-1.safetensors\"}}";
    ck_assert_int_eq(sfi_test_write_file(pathf("model.safetensors.index.json"), esc, strlen(esc)),
                     0);
    ck_assert_int_eq(sfi_st_open(dir, &st, &e), SFI_EFORMAT);
    /* a missing shard */
    const char *miss = "{\"weight_map\":{\"a\":\"s-9.safetensors\"}}";
    ck_assert_int_eq(sfi_test_write_file(pathf("model.safetensors.index.json"), miss, strlen(miss)),
                     0);
    ck_assert_int_eq(sfi_st_open(dir, &st, &e), SFI_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "s-9.safetensors"));
}
END_TEST

START_TEST(writer_unwritable_and_abort)
{
    float a[1] = {1};
    sfi_st_write_tensor ta = {.name = "a", .dtype = SFI_DT_F32, .ndim = 1, .shape = {1}, .data = a};
    sfi_error e;
    ck_assert_int_ne(sfi_st_write("/nonexistent-dir/x.safetensors", &ta, 1, &e), SFI_OK);
    ck_assert_ptr_nonnull(strstr(e.msg, "/nonexistent-dir/x.safetensors"));
    /* an aborted streaming write leaves nothing */
    sfi_st_writer *w;
    ck_assert_int_eq(sfi_st_writer_open(pathf("p.safetensors"), &ta, 1, &w, &e), SFI_OK);
    ck_assert_int_eq(sfi_st_writer_commit(w, &e), SFI_EINVAL);
    sfi_st_writer_abort(w);
    struct stat sb;
    ck_assert_int_ne(stat(pathf("p.safetensors"), &sb), 0);
    char *out = NULL;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "ls -A '%s'", dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, NULL), 0);
    ck_assert_str_eq(out, "");
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, conversions_exact);
    tcase_add_test(tc, write_read_roundtrip);
    tcase_add_test(tc, f16_file);
    tcase_add_test(tc, bad_files_refused);
    tcase_add_test(tc, sharded_index);
    tcase_add_test(tc, writer_unwritable_and_abort);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
