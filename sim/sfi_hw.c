/* GPU descriptions and calibration profiles (see sfi_hw.h). */
#include <config.h>

#include "sfi_hw.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sfi_io.h"

/* Vendor figures, dense (no structured sparsity) tensor throughput:
 * - H100-SXM: NVIDIA H100 Tensor Core GPU datasheet (2023), SXM5 column:
 *   80 GB HBM3, 3.35 TB/s, BF16 989.4 TFLOPS and FP8 1,978.9 TFLOPS (the
 *   datasheet's "with sparsity" figures halved), 132 SMs, 50 MB L2 (H100
 *   whitepaper), NVLink 4 900 GB/s.
 * - H200: NVIDIA H200 Tensor Core GPU datasheet (2024), SXM column: 141 GB
 *   HBM3e, 4.8 TB/s, BF16 989 / FP8 1,979 TFLOPS dense, same GH100 die as
 *   H100 (132 SMs, 50 MB L2), NVLink 900 GB/s.
 * - B200: NVIDIA HGX B200 datasheet (2024), per GPU = HGX totals / 8:
 *   1,440 GB -> 180 GB HBM3e, 64 TB/s -> 8 TB/s, BF16 18 PFLOPS sparse ->
 *   2.25 PFLOPS dense, FP8 36 PFLOPS sparse -> 4.5 PFLOPS dense, NVLink 5
 *   1.8 TB/s per GPU; 148 SMs and 126 MB L2 from the Blackwell
 *   architecture technical brief. */
static const sfi_gpu gpu_presets[] = {
    {"B200", 180e9, 8.0e12, 2250e12, 4500e12, 148, 126e6, 1800e9},
    {"H200", 141e9, 4.8e12, 989e12, 1979e12, 132, 50e6, 900e9},
    {"H100-SXM", 80e9, 3.35e12, 989.4e12, 1978.9e12, 132, 50e6, 900e9},
};
#define N_GPU_PRESETS (sizeof gpu_presets / sizeof gpu_presets[0])

static const char *const kc_names[SFI_KC_COUNT] = {
    "gemm",  "attn_dense", "attn_sparse", "selector", "topk",
    "reorg", "allreduce",  "other",       "logits",   "attn_prefill",
};

const char *sfi_kernel_class_name(sfi_kernel_class c)
{
    return (unsigned)c < SFI_KC_COUNT ? kc_names[c] : "?";
}

size_t sfi_gpu_preset_count(void)
{
    return N_GPU_PRESETS;
}

const sfi_gpu *sfi_gpu_preset_at(size_t i)
{
    return i < N_GPU_PRESETS ? &gpu_presets[i] : NULL;
}

sfi_status sfi_gpu_preset(const char *name, sfi_gpu *out, sfi_error *err)
{
    if (name && !strcasecmp(name, "H100"))
        name = "H100-SXM";
    for (size_t i = 0; name && i < N_GPU_PRESETS; i++)
        if (!strcasecmp(name, gpu_presets[i].name)) {
            *out = gpu_presets[i];
            return SFI_OK;
        }
    return sfi_error_set(err, SFI_ENOTFOUND,
                         "unknown GPU '%s' (built-in: B200, H200, H100-SXM; or a GPU JSON file)",
                         name ? name : "");
}

sfi_status sfi_gpu_validate(const sfi_gpu *g, const char *origin, sfi_error *err)
{
    struct {
        const char *key;
        double v, lo, hi;
    } chk[] = {
        {"hbm_capacity_GB", g->hbm_capacity, 1e8, 1e14},
        {"hbm_bandwidth_TBps", g->hbm_bandwidth, 1e9, 1e15},
        {"bf16_dense_TFLOPS", g->bf16_flops, 1e9, 1e18},
        {"fp8_dense_TFLOPS", g->fp8_flops, 1e9, 1e18},
        {"sm_count", g->sm_count, 1, 100000},
        {"l2_MB", g->l2_bytes, 0, 1e11},
        {"nvlink_GBps", g->nvlink_bandwidth, 0, 1e15},
    };
    for (size_t i = 0; i < sizeof chk / sizeof chk[0]; i++)
        if (!(chk[i].v >= chk[i].lo && chk[i].v <= chk[i].hi))
            return sfi_error_set(err, SFI_ERANGE, "%s: %s: value out of range", origin, chk[i].key);
    if (!g->name[0])
        return sfi_error_set(err, SFI_EFORMAT, "%s: name: empty", origin);
    return SFI_OK;
}

static sfi_status parse_root(const char *json, size_t len, const char *origin, json_t **root,
                             sfi_error *err)
{
    json_error_t je;
    *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!*root)
        return sfi_error_set(err, SFI_EFORMAT, "%s:%d:%d: invalid JSON: %s", origin, je.line,
                             je.column, je.text);
    if (!json_is_object(*root)) {
        json_decref(*root);
        return sfi_error_set(err, SFI_EFORMAT, "%s: not a JSON object", origin);
    }
    return SFI_OK;
}

static sfi_status get_num(json_t *v, const char *origin, const char *key, double *out,
                          sfi_error *err)
{
    /* Written on every path: callers test only the status, and the
     * compiler cannot see that sfi_error_set never returns SFI_OK. */
    *out = 0;
    if (!json_is_number(v))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: not a number", origin, key);
    double d = json_number_value(v);
    if (!isfinite(d))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: not finite", origin, key);
    *out = d;
    return SFI_OK;
}

/* A number in [0, hi] (range: how the message writes it), stored times
 * scale; *out is left alone on error. */
static sfi_status get_scaled(json_t *v, const char *origin, const char *key, double hi,
                             const char *range, double scale, double *out, sfi_error *err)
{
    double d = 0;
    sfi_status st = get_num(v, origin, key, &d, err);
    if (st)
        return st;
    if (!(d >= 0 && d <= hi))
        return sfi_error_set(err, SFI_ERANGE, "%s: %s: must be in %s", origin, key, range);
    *out = d * scale;
    return SFI_OK;
}

static sfi_status get_str(json_t *v, const char *origin, const char *key, char *out, size_t cap,
                          sfi_error *err)
{
    if (!json_is_string(v))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: not a string", origin, key);
    const char *s = json_string_value(v);
    if (strlen(s) >= cap)
        return sfi_error_set(err, SFI_ERANGE, "%s: %s: longer than %zu bytes", origin, key,
                             cap - 1);
    memcpy(out, s, strlen(s) + 1);
    return SFI_OK;
}

static sfi_status check_version(json_t *root, const char *key, const char *origin, sfi_error *err)
{
    json_t *v = json_object_get(root, key);
    if (!v)
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: missing (expected %s: 1)", origin, key,
                             key);
    if (!json_is_integer(v))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: not an integer", origin, key);
    if (json_integer_value(v) != 1)
        return sfi_error_set(err, json_integer_value(v) > 1 ? SFI_EVERSION : SFI_EFORMAT,
                             "%s: %s: version %lld not supported (this sfi-sim reads 1)", origin,
                             key, (long long)json_integer_value(v));
    return SFI_OK;
}

sfi_status sfi_gpu_parse(const char *json, size_t len, const char *origin, sfi_gpu *out,
                         sfi_error *err)
{
    json_t *root;
    sfi_status st = parse_root(json, len, origin, &root, err);
    if (st)
        return st;
    sfi_gpu g;
    memset(&g, 0, sizeof g);
    unsigned seen = 0;
    static const char *const keys[] = {"name",
                                       "hbm_capacity_GB",
                                       "hbm_bandwidth_TBps",
                                       "bf16_dense_TFLOPS",
                                       "fp8_dense_TFLOPS",
                                       "sm_count",
                                       "l2_MB",
                                       "nvlink_GBps"};
    const size_t nkeys = sizeof keys / sizeof keys[0];
    st = check_version(root, "sfi_gpu", origin, err);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (st)
            break;
        if (!strcmp(key, "sfi_gpu"))
            continue;
        size_t k = 0;
        while (k < nkeys && strcmp(key, keys[k]))
            k++;
        if (k == nkeys) {
            st = sfi_error_set(err, SFI_EFORMAT, "%s: %s: unknown key", origin, key);
            break;
        }
        seen |= 1u << k;
        double d = 0;
        if (k == 0) {
            st = get_str(v, origin, key, g.name, sizeof g.name, err);
            continue;
        }
        if ((st = get_num(v, origin, key, &d, err)))
            break;
        switch (k) {
        case 1: g.hbm_capacity = d * 1e9; break;
        case 2: g.hbm_bandwidth = d * 1e12; break;
        case 3: g.bf16_flops = d * 1e12; break;
        case 4: g.fp8_flops = d * 1e12; break;
        case 5:
            if (d != floor(d) || d < 1 || d > 100000)
                st = sfi_error_set(err, SFI_ERANGE, "%s: %s: not a positive integer", origin, key);
            g.sm_count = (int)(d >= 1 && d <= 100000 ? d : 0);
            break;
        case 6: g.l2_bytes = d * 1e6; break;
        case 7: g.nvlink_bandwidth = d * 1e9; break;
        }
    }
    json_decref(root);
    if (st)
        return st;
    for (size_t k = 0; k < nkeys; k++)
        if (!(seen & (1u << k)))
            return sfi_error_set(err, SFI_EFORMAT, "%s: %s: missing", origin, keys[k]);
    if ((st = sfi_gpu_validate(&g, origin, err)))
        return st;
    *out = g;
    return SFI_OK;
}

sfi_status sfi_gpu_load(const char *path, sfi_gpu *out, sfi_error *err)
{
    char *buf;
    size_t len;
    sfi_status st = sfi_io_read(path, SFI_HW_FILE_MAX, "a GPU description", &buf, &len, err);
    if (st)
        return st;
    st = sfi_gpu_parse(buf, len, path, out, err);
    free(buf);
    return st;
}

sfi_status sfi_gpu_resolve(const char *name_or_path, sfi_gpu *out, sfi_error *err)
{
    if (!name_or_path || !name_or_path[0])
        return sfi_error_set(err, SFI_EINVAL, "empty GPU name");
    if (sfi_gpu_preset(name_or_path, out, NULL) == SFI_OK)
        return SFI_OK;
    if (!strchr(name_or_path, '/') && !strstr(name_or_path, ".json"))
        return sfi_gpu_preset(name_or_path, out, err);
    return sfi_gpu_load(name_or_path, out, err);
}

/* Default calibration. Kernel classes that sfi-gpu bench measures take the
 * straight-line fit (sfi-sim validate --fit, rounded) through its H100-SXM
 * run of 2026-11-23 (gpu/profiles/h100-bench.txt: batch 16, 32 q / 8 KV
 * heads, bf16): dense decode attention at 88.7% of peak HBM bandwidth plus
 * 9.5 us per kernel; sparse (two-segment) attention 87.2% plus 4.5 us; the
 * Selector 28%, Top-K 27.1% and reorg 84.5% of peak for the bytes
 * sfi_cost.c counts; logits writes add one byte per 0.315 bytes of peak
 * bandwidth; an empty kernel 2.2 us; overlapped side-stream work still
 * costs the main stream 93.9% of itself (the measured two-stream test).
 * Unmeasured classes keep public figures for tuned bf16 decode on Hopper:
 * weight GEMV ~80% of bandwidth, all-reduce ~70% of one NVLink direction
 * + 8 us, 40 us per step of sampling and scheduling. Keep
 * sim/profiles/default.json equal (a test checks). */
void sfi_hw_profile_default(sfi_hw_profile *p)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "default");
    p->efficiency[SFI_KC_GEMM] = 0.80;
    p->efficiency[SFI_KC_ATTN_DENSE] = 0.887;
    p->efficiency[SFI_KC_ATTN_SPARSE] = 0.872;
    p->efficiency[SFI_KC_SELECTOR] = 0.28;
    p->efficiency[SFI_KC_TOPK] = 0.271;
    p->efficiency[SFI_KC_REORG] = 0.845;
    p->efficiency[SFI_KC_ALLREDUCE] = 0.70;
    p->efficiency[SFI_KC_OTHER] = 0.50;
    p->efficiency[SFI_KC_LOGITS] = 0.315;
    /* Causal prefill attention (FLOP-bound): FlashAttention-3 reaches
     * 600-750 of H100's 989 bf16 TFLOP/s at long sequences (Shah et al.
     * 2024, fig. 5 causal); our prefill is not measured, take 0.60. */
    p->efficiency[SFI_KC_ATTN_PREFILL] = 0.60;
    p->fixed_s[SFI_KC_ATTN_DENSE] = 9.5e-6;
    p->fixed_s[SFI_KC_ATTN_SPARSE] = 4.5e-6;
    p->launch_s = 2.2e-6;
    p->step_overhead_s = 40.0e-6;
    p->allreduce_latency_s = 8.0e-6;
    p->overlap_contention = 0.939;
}

double sfi_hw_attn_dense_efficiency(const sfi_hw_profile *p, double context)
{
    int n = p->n_attn_curve;
    if (n < 1)
        return p->efficiency[SFI_KC_ATTN_DENSE];
    if (context <= p->attn_curve_ctx[0])
        return p->attn_curve_eff[0];
    if (context >= p->attn_curve_ctx[n - 1])
        return p->attn_curve_eff[n - 1];
    int i = 1;
    while (p->attn_curve_ctx[i] < context)
        i++;
    double x0 = log2(p->attn_curve_ctx[i - 1]), x1 = log2(p->attn_curve_ctx[i]);
    double f = (log2(context) - x0) / (x1 - x0);
    return p->attn_curve_eff[i - 1] + f * (p->attn_curve_eff[i] - p->attn_curve_eff[i - 1]);
}

/* "attn_dense_by_context": [[context, efficiency], ...], contexts strictly
 * increasing. */
static sfi_status parse_curve(json_t *v, const char *origin, sfi_hw_profile *p, sfi_error *err)
{
    const char *key = "attn_dense_by_context";
    if (!json_is_array(v))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: not an array of [context, efficiency]",
                             origin, key);
    size_t n = json_array_size(v);
    if (n < 2 || n > SFI_HW_CURVE_MAX)
        return sfi_error_set(err, SFI_ERANGE, "%s: %s: needs 2..%d points, has %zu", origin, key,
                             SFI_HW_CURVE_MAX, n);
    for (size_t i = 0; i < n; i++) {
        json_t *pt = json_array_get(v, i);
        char where[96];
        snprintf(where, sizeof where, "%s[%zu]", key, i);
        if (!json_is_array(pt) || json_array_size(pt) != 2)
            return sfi_error_set(err, SFI_EFORMAT, "%s: %s: not a [context, efficiency] pair",
                                 origin, where);
        double c, e;
        sfi_status st = get_num(json_array_get(pt, 0), origin, where, &c, err);
        if (!st)
            st = get_num(json_array_get(pt, 1), origin, where, &e, err);
        if (st)
            return st;
        if (!(c >= 1 && c <= 1e9))
            return sfi_error_set(err, SFI_ERANGE, "%s: %s: context must be in 1..1e9", origin,
                                 where);
        if (!(e > 0 && e <= 1))
            return sfi_error_set(err, SFI_ERANGE, "%s: %s: efficiency must be in (0, 1]", origin,
                                 where);
        if (i > 0 && !(c > p->attn_curve_ctx[i - 1]))
            return sfi_error_set(err, SFI_EFORMAT, "%s: %s: contexts must increase", origin, where);
        p->attn_curve_ctx[i] = c;
        p->attn_curve_eff[i] = e;
    }
    p->n_attn_curve = (int)n;
    return SFI_OK;
}

/* "allreduce_by_gpus" or "allgather_by_gpus" (key): {"G": [latency_us,
 * efficiency], ...}, G in 2..SFI_HW_AR_GROUPS - 1, into lat_s and eff. */
static sfi_status parse_ar_groups(json_t *v, const char *origin, const char *key, double *lat_s,
                                  double *eff_out, sfi_error *err)
{
    if (!json_is_object(v))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: not an object", origin, key);
    const char *k;
    json_t *e;
    json_object_foreach(v, k, e)
    {
        char *end;
        long g = strtol(k, &end, 10);
        if (*end || g < 2 || g >= SFI_HW_AR_GROUPS)
            return sfi_error_set(err, SFI_ERANGE, "%s: %s: '%s' is not a GPU count in 2..%d",
                                 origin, key, k, SFI_HW_AR_GROUPS - 1);
        double lat, eff;
        if (!json_is_array(e) || json_array_size(e) != 2 ||
            get_num(json_array_get(e, 0), origin, key, &lat, err) ||
            get_num(json_array_get(e, 1), origin, key, &eff, err) || !(lat >= 0 && lat <= 1e6) ||
            !(eff > 0 && eff <= 1))
            return sfi_error_set(err, SFI_ERANGE,
                                 "%s: %s: \"%s\" needs [latency_us in 0..1e6, "
                                 "efficiency in (0, 1]]",
                                 origin, key, k);
        lat_s[g] = lat * 1e-6;
        eff_out[g] = eff;
    }
    return SFI_OK;
}

/* One entry of "step_measurements": what sfi-gpu run --bench measured for
 * a model, context, batch and mode. Checked for shape and ranges. */
static sfi_status check_step_measurement(json_t *m, const char *origin, size_t idx, sfi_error *err)
{
    if (!json_is_object(m))
        return sfi_error_set(err, SFI_EFORMAT, "%s: step_measurements[%zu]: not an object", origin,
                             idx);
    json_t *model = json_object_get(m, "model"), *mode = json_object_get(m, "mode");
    json_t *ctx = json_object_get(m, "context"), *batch = json_object_get(m, "batch");
    json_t *tps = json_object_get(m, "decode_tokens_per_s");
    if (!json_is_string(model) || !json_is_string(mode) ||
        (strcmp(json_string_value(mode), "dense") && strcmp(json_string_value(mode), "sfi")))
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: step_measurements[%zu]: needs \"model\" and \"mode\" "
                             "(dense or sfi)",
                             origin, idx);
    if (!json_is_integer(ctx) || json_integer_value(ctx) < 1 ||
        json_integer_value(ctx) > 16777216 || !json_is_integer(batch) ||
        json_integer_value(batch) < 1 || json_integer_value(batch) > 65536)
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: step_measurements[%zu]: context (1..2^24) and batch "
                             "(1..65536) must be integers",
                             origin, idx);
    if (!json_is_number(tps) || !(json_number_value(tps) >= 0 && json_number_value(tps) < 1e9))
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: step_measurements[%zu]: decode_tokens_per_s must be a number "
                             "in [0, 1e9)",
                             origin, idx);
    json_t *steps = json_object_get(m, "steps");
    if (steps) {
        const char *k;
        json_t *c;
        if (!json_is_object(steps))
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: step_measurements[%zu]: steps: not an "
                                 "object",
                                 origin, idx);
        json_object_foreach(steps, k, c)
        {
            if (strcmp(k, "dense") && strcmp(k, "slow") && strcmp(k, "fast") &&
                strcmp(k, "fast+sel"))
                return sfi_error_set(err, SFI_EFORMAT,
                                     "%s: step_measurements[%zu]: steps: "
                                     "unknown class '%s' (dense, slow, fast, fast+sel)",
                                     origin, idx, k);
            json_t *mean = json_object_get(c, "mean_ms");
            if (!json_is_number(mean) ||
                !(json_number_value(mean) > 0 && json_number_value(mean) < 1e7))
                return sfi_error_set(err, SFI_EFORMAT,
                                     "%s: step_measurements[%zu]: steps.%s: "
                                     "mean_ms must be a positive number",
                                     origin, idx, k);
        }
    }
    return SFI_OK;
}

static sfi_status parse_measurement(json_t *m, const char *origin, size_t idx,
                                    sfi_hw_measurement *out, sfi_error *err)
{
    char where[64];
    snprintf(where, sizeof where, "measurements[%zu]", idx);
    if (!json_is_object(m))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: not an object", origin, where);
    memset(out, 0, sizeof *out);
    out->layers = 1;
    const char *key;
    json_t *v;
    int have_kernel = 0, have_time = 0;
    json_object_foreach(m, key, v)
    {
        char full[128];
        snprintf(full, sizeof full, "%s.%s", where, key);
        if (!strcmp(key, "kernel")) {
            sfi_status st = get_str(v, origin, full, out->kernel, sizeof out->kernel, err);
            if (st)
                return st;
            have_kernel = 1;
            continue;
        }
        int known = !strcmp(key, "time_us") || !strcmp(key, "batch") || !strcmp(key, "context") ||
                    !strcmp(key, "q_heads") || !strcmp(key, "kv_heads") ||
                    !strcmp(key, "head_dim") || !strcmp(key, "K") || !strcmp(key, "layers") ||
                    !strcmp(key, "gpus") || !strcmp(key, "bytes");
        if (!known) /* extra descriptive keys (notes, units) are allowed here */
            continue;
        double d = 0;
        sfi_status st = get_num(v, origin, full, &d, err);
        if (st)
            return st;
        if (!strcmp(key, "time_us")) {
            if (!(d > 0 && d < 1e9))
                return sfi_error_set(err, SFI_ERANGE, "%s: %s: must be in (0, 1e9)", origin, full);
            out->time_s = d * 1e-6;
            have_time = 1;
            continue;
        }
        if (!strcmp(key, "bytes")) {
            if (!(d >= 0 && d <= 1e15 && d == floor(d)))
                return sfi_error_set(err, SFI_ERANGE, "%s: %s: not a byte count in 0..1e15", origin,
                                     full);
            out->bytes = d;
            continue;
        }
        int *dst = !strcmp(key, "batch")      ? &out->batch
                   : !strcmp(key, "gpus")     ? &out->gpus
                   : !strcmp(key, "context")  ? &out->context
                   : !strcmp(key, "q_heads")  ? &out->q_heads
                   : !strcmp(key, "kv_heads") ? &out->kv_heads
                   : !strcmp(key, "head_dim") ? &out->head_dim
                   : !strcmp(key, "K")        ? &out->K
                   : !strcmp(key, "layers")   ? &out->layers
                                              : NULL;
        if (d != floor(d) || d < 0 || d > 1e9)
            return sfi_error_set(err, SFI_ERANGE, "%s: %s: not a non-negative integer", origin,
                                 full);
        *dst = (int)d;
    }
    if (!have_kernel || !have_time)
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: needs \"kernel\" and \"time_us\"", origin,
                             where);
    return SFI_OK;
}

/* A profile object keyed by kernel class ("efficiency", "fixed_us"): each
 * value must lie in [0, hi] ((0, hi] when lo_closed is 0; range is that
 * interval as the message prints it) and is stored times scale; the
 * classes given are marked in *set. */
static sfi_status get_class_map(json_t *v, const char *origin, const char *key, int lo_closed,
                                double hi, const char *range, double scale, double *out,
                                unsigned *set, sfi_error *err)
{
    if (!json_is_object(v))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: not an object", origin, key);
    const char *ek;
    json_t *ev;
    json_object_foreach(v, ek, ev)
    {
        int c = 0;
        while (c < SFI_KC_COUNT && strcmp(ek, kc_names[c]))
            c++;
        char full[96];
        snprintf(full, sizeof full, "%s.%s", key, ek);
        if (c == SFI_KC_COUNT)
            return sfi_error_set(err, SFI_EFORMAT, "%s: %s: unknown kernel class", origin, full);
        double d;
        sfi_status st = get_num(ev, origin, full, &d, err);
        if (st)
            return st;
        if (!((lo_closed ? d >= 0 : d > 0) && d <= hi))
            return sfi_error_set(err, SFI_ERANGE, "%s: %s: must be in %s", origin, full, range);
        out[c] = d * scale;
        *set |= 1u << c;
    }
    return SFI_OK;
}

sfi_status sfi_hw_profile_parse(const char *json, size_t len, const char *origin,
                                sfi_hw_profile *out, sfi_hw_measurement **meas, size_t *n_meas,
                                sfi_error *err)
{
    if (meas)
        *meas = NULL;
    if (n_meas)
        *n_meas = 0;
    json_t *root;
    sfi_status st = parse_root(json, len, origin, &root, err);
    if (st)
        return st;
    sfi_hw_profile p;
    sfi_hw_profile_default(&p);
    sfi_hw_measurement *ms = NULL;
    size_t nms = 0;
    unsigned eff_set = 0, fixed_set = 0;
    st = check_version(root, "sfi_profile", origin, err);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (st)
            break;
        if (!strcmp(key, "sfi_profile"))
            continue;
        if (!strcmp(key, "name")) {
            st = get_str(v, origin, key, p.name, sizeof p.name, err);
        } else if (!strcmp(key, "gpu")) {
            st = get_str(v, origin, key, p.gpu, sizeof p.gpu, err);
        } else if (!strcmp(key, "note") || !strcmp(key, "source")) {
            if (!json_is_string(v))
                st = sfi_error_set(err, SFI_EFORMAT, "%s: %s: not a string", origin, key);
        } else if (!strcmp(key, "efficiency")) {
            st = get_class_map(v, origin, key, 0, 1, "(0, 1]", 1, p.efficiency, &eff_set, err);
        } else if (!strcmp(key, "fixed_us")) {
            st =
                get_class_map(v, origin, key, 1, 1e6, "[0, 1e6]", 1e-6, p.fixed_s, &fixed_set, err);
        } else if (!strcmp(key, "launch_us") || !strcmp(key, "step_overhead_us") ||
                   !strcmp(key, "allreduce_latency_us") || !strcmp(key, "request_overhead_us")) {
            double *dst = key[0] == 'l'   ? &p.launch_s
                          : key[0] == 's' ? &p.step_overhead_s
                          : key[0] == 'r' ? &p.request_overhead_s
                                          : &p.allreduce_latency_s;
            st = get_scaled(v, origin, key, 1e6, "[0, 1e6]", 1e-6, dst, err);
        } else if (!strcmp(key, "allreduce_step_us")) {
            st = get_scaled(v, origin, key, 1e6, "[0, 1e6]", 1e-6, &p.allreduce_step_s, err);
        } else if (!strcmp(key, "sel_pre_us")) {
            st = get_scaled(v, origin, key, 1e6, "[0, 1e6]", 1e-6, &p.sel_pre_s, err);
        } else if (!strcmp(key, "reserved_GB")) {
            st = get_scaled(v, origin, key, 1e5, "[0, 1e5]", 1e9, &p.reserved_bytes, err);
        } else if (!strcmp(key, "allreduce_by_gpus")) {
            st = parse_ar_groups(v, origin, key, p.ar_by_gpus_lat, p.ar_by_gpus_eff, err);
        } else if (!strcmp(key, "allgather_by_gpus")) {
            st = parse_ar_groups(v, origin, key, p.ag_by_gpus_lat, p.ag_by_gpus_eff, err);
        } else if (!strcmp(key, "attn_dense_by_context")) {
            st = parse_curve(v, origin, &p, err);
        } else if (!strcmp(key, "launch_pdl_us")) {
            st = get_scaled(v, origin, key, 1e6, "[0, 1e6]", 1e-6, &p.launch_pdl_s, err);
        } else if (!strcmp(key, "moe_efficiency")) {
            st = get_scaled(v, origin, key, 1, "[0, 1]", 1, &p.moe_efficiency, err);
        } else if (!strcmp(key, "moe_pair_GBps")) {
            st = get_scaled(v, origin, key, 1e5, "[0, 1e5]", 1e9, &p.moe_pair_bandwidth, err);
        } else if (!strcmp(key, "cta_GBps")) {
            st = get_scaled(v, origin, key, 1e5, "[0, 1e5]", 1e9, &p.cta_bandwidth, err);
        } else if (!strcmp(key, "cta_GFLOPS")) {
            st = get_scaled(v, origin, key, 1e6, "[0, 1e6]", 1e9, &p.cta_flops, err);
        } else if (!strcmp(key, "serial_step_ns")) {
            st = get_scaled(v, origin, key, 1e6, "[0, 1e6]", 1e-9, &p.serial_step_s, err);
        } else if (!strcmp(key, "overlap_contention")) {
            st = get_scaled(v, origin, key, 1, "[0, 1]", 1, &p.overlap_contention, err);
        } else if (!strcmp(key, "step_measurements")) {
            if (!json_is_array(v) || json_array_size(v) > 100000) {
                st = sfi_error_set(err, SFI_EFORMAT,
                                   "%s: step_measurements: not an array of at "
                                   "most 100000",
                                   origin);
                break;
            }
            for (size_t i = 0; i < json_array_size(v) && !st; i++)
                st = check_step_measurement(json_array_get(v, i), origin, i, err);
            p.n_step_measurements = (int)json_array_size(v);
        } else if (!strcmp(key, "transformers_baseline")) {
            if (!json_is_array(v))
                st = sfi_error_set(err, SFI_EFORMAT, "%s: transformers_baseline: not an array",
                                   origin);
        } else if (!strcmp(key, "measurements")) {
            if (!json_is_array(v)) {
                st = sfi_error_set(err, SFI_EFORMAT, "%s: measurements: not an array", origin);
                break;
            }
            size_t n = json_array_size(v);
            if (n > 100000) {
                st = sfi_error_set(err, SFI_ERANGE, "%s: measurements: more than 100000", origin);
                break;
            }
            if (n) {
                ms = calloc(n, sizeof *ms);
                if (!ms) {
                    st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", origin);
                    break;
                }
            }
            for (size_t i = 0; i < n && !st; i++)
                st = parse_measurement(json_array_get(v, i), origin, i, &ms[i], err);
            nms = n;
        } else {
            st = sfi_error_set(err, SFI_EFORMAT, "%s: %s: unknown key", origin, key);
        }
    }
    json_decref(root);
    if (st) {
        free(ms);
        return st;
    }
    /* An efficiency measured without a fixed cost describes the class
     * alone: the default's fixed cost (fitted with the default's
     * efficiency) does not carry over. */
    for (int c = 0; c < SFI_KC_COUNT; c++)
        if ((eff_set & (1u << c)) && !(fixed_set & (1u << c)))
            p.fixed_s[c] = 0;
    *out = p;
    if (meas) {
        *meas = ms;
        *n_meas = nms;
    } else {
        free(ms);
    }
    return SFI_OK;
}

sfi_status sfi_hw_profile_load(const char *path, sfi_hw_profile *out, sfi_hw_measurement **meas,
                               size_t *n_meas, sfi_error *err)
{
    char *buf;
    size_t len;
    sfi_status st = sfi_io_read(path, SFI_HW_FILE_MAX, "a calibration profile", &buf, &len, err);
    if (st)
        return st;
    st = sfi_hw_profile_parse(buf, len, path, out, meas, n_meas, err);
    free(buf);
    return st;
}
