/* sfi-sim validate: compares the cost model's kernel predictions with the
 * times a calibration profile's "measurements" recorded on a real GPU. */
#include <config.h>

#include "sfi_sim_cli.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sfi_cost.h"
#include "sfi_hw.h"
#include "sfi_io.h"
#include "sfi_stepval.h"

#define DEFAULT_PROFILE "gpu/profiles/h100.json"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: sfi-sim validate [--profile FILE] [--gpu NAME|FILE] [--tolerance PCT]\n"
        "                        [--fit OUT.json]\n"
        "       sfi-sim validate [--profile FILE] [--steps FILE] [--fit-subset SPEC ...]\n"
        "                        [--select SPEC ...] [--fit-params LIST]\n"
        "                        [--fit OUT.json] [--moe-reads distinct|pairs]\n"
        "                        [--tokenizer DIR] [--gpu NAME|FILE]\n\n"
        "Kernels: predicts every kernel time listed under \"measurements\" in a\n"
        "calibration profile (all-reduces of sfi-gpu bench-allreduce too), once with\n"
        "the built-in default calibration and once with the profile's own, and\n"
        "prints measured vs predicted with the relative error.\n"
        "Whole decode steps (--steps, --fit-subset, or a profile with only\n"
        "\"step_measurements\"): predicts each measured configuration's step time per\n"
        "class (dense, SFI fast, SFI slow) and tokens/s with the profile, after\n"
        "fitting its physical parameters on the --fit-subset configurations, and\n"
        "reports the errors in-sample and out-of-sample.\n\n"
        "  --profile FILE   profile (calibration; with --steps the fit's prior)\n"
        "                   [" DEFAULT_PROFILE " in the source tree]\n"
        "  --gpu NAME|FILE  GPU the measurements ran on [the profile's \"gpu\", else H100-SXM]\n"
        "  --tolerance PCT  error counted as agreement (kernels) [10]\n"
        "  --fit OUT.json   kernels: fit efficiencies (and fixed costs where a kernel has\n"
        "                   several sizes) and write them, with the measurements, as a\n"
        "                   new profile; steps: write the fitted step-level profile\n"
        "  --steps FILE     whole-step measurements (\"step_measurements\" of FILE,\n"
        "                   e.g. gpu/profiles/h100-steps.json) [the --profile file]\n"
        "  --fit-subset SPEC  fit on the configurations SPEC selects: KEY=V[,V...]\n"
        "                   joined by ':' (all must hold), keys model, batch, context\n"
        "                   (8K = 8192), mode, tp; repeat the option for alternatives\n"
        "  --fit-params LIST  fit only these parameters (comma-separated keys: attn_dense,\n"
        "                   attn_sparse, gemm, launch_us, launch_pdl_us, overlap_contention,\n"
        "                   cta_GBps, cta_GFLOPS, serial_step_ns, step_overhead_us,\n"
        "                   allreduce_step_us, sel_pre_us, gemm_fixed_us); the others\n"
        "                   keep the profile's values [all]\n"
        "  --select SPEC    read only the configurations SPEC selects (syntax of\n"
        "                   --fit-subset; repeat for alternatives)\n"
        "  --moe-reads HOW  an MoE layer reads each distinct expert the batch touches\n"
        "                   once (distinct) or once per (token, expert) pair, as\n"
        "                   sfi-gpu's expert GEMV does [pairs]\n"
        "  --tokenizer DIR  vocabulary of the SFI trigger set for the trace replay\n"
        "                   [tests/fixtures/qwen3-tokenizer in the source tree]\n"
        "  -h, --help       this help\n\n"
        "Exit status: 0 report printed, 1 bad input, 2 usage error. See sfi-sim-validate(1).\n");
}

/* ---- --fit ---- */

static void setup_for(const sfi_hw_measurement *m, const sfi_gpu *gpu, sfi_model_config *mc,
                      sfi_cost_setup *s)
{
    memset(mc, 0, sizeof *mc);
    snprintf(mc->name, sizeof mc->name, "measurement");
    mc->arch = SFI_ARCH_QWEN3;
    mc->num_attention_heads = m->q_heads ? m->q_heads : 32;
    mc->num_key_value_heads = m->kv_heads ? m->kv_heads : 8;
    mc->head_dim = m->head_dim ? m->head_dim : 128;
    mc->hidden_size = mc->num_attention_heads * mc->head_dim;
    mc->intermediate_size = 1;
    mc->num_hidden_layers = 1;
    mc->vocab_size = 1;
    mc->weight_bytes = 2;
    sfi_cost_setup_init(s);
    s->model = mc;
    s->gpu = *gpu;
    s->batch = m->batch ? m->batch : 1;
    s->context = m->context;
    if (m->K)
        s->pol.prm.K = m->K;
}

/* Roofline time at efficiency 1 (x) and launch count of a measurement's
 * kernel: predictions under a unit profile. */
static int unit_terms(const sfi_hw_measurement *m, const sfi_gpu *gpu, const char *kernel,
                      double *x, double *launches)
{
    sfi_model_config mc;
    sfi_cost_setup s;
    setup_for(m, gpu, &mc, &s);
    for (int c = 0; c < SFI_KC_COUNT; c++) {
        s.prof.efficiency[c] = 1;
        s.prof.fixed_s[c] = 0;
    }
    s.prof.launch_s = 0;
    double t0, t1;
    if (sfi_cost_kernel_predict(&s, kernel, &t0, NULL) != SFI_OK)
        return -1;
    s.prof.launch_s = 1;
    if (sfi_cost_kernel_predict(&s, kernel, &t1, NULL) != SFI_OK)
        return -1;
    *x = t0;
    *launches = t1 - t0;
    return 0;
}

/* Least squares t = a + b x over the measurements of one kernel name;
 * with one size (or a non-positive slope), b from the mean with a = 0. */
static int fit_class(const sfi_hw_measurement *ms, size_t nm, const sfi_gpu *gpu,
                     const char *kernel, const sfi_hw_profile *p, double *eff, double *fixed)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0, n = 0, ratio = 0;
    for (size_t i = 0; i < nm; i++) {
        if (strcmp(ms[i].kernel, kernel))
            continue;
        double x, l;
        if (unit_terms(&ms[i], gpu, kernel, &x, &l) != 0 || x <= 0)
            continue;
        double layers = ms[i].layers > 0 ? ms[i].layers : 1;
        double y = ms[i].time_s / layers - l * p->launch_s;
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
        ratio += x / y;
        n++;
    }
    if (n == 0)
        return 0;
    double den = n * sxx - sx * sx, b = den > 0 ? (n * sxy - sx * sy) / den : 0;
    double a = n > 1 && b > 0 ? (sy - b * sx) / n : 0;
    if (n > 1 && b > 0 && a >= 0) {
        *eff = 1 / b;
        *fixed = a;
    } else {
        *eff = ratio / n;
        *fixed = 0;
    }
    if (*eff > 1)
        *eff = 1;
    return *eff > 0;
}

/* ---- collectives (kernels "allreduce" and "allgather", sfi-gpu
 * bench-allreduce [--op allgather]) ---- */

static int is_allgather(const sfi_hw_measurement *m)
{
    return !strcmp(m->kernel, "allgather");
}

static int is_collective(const sfi_hw_measurement *m)
{
    return !strcmp(m->kernel, "allreduce") || is_allgather(m);
}

/* A collective's predicted time under profile p (0 on success). */
static int collective_predict(const sfi_hw_measurement *m, const sfi_gpu *gpu,
                              const sfi_hw_profile *p, double *t)
{
    if (m->gpus < 2 || m->gpus > 64 || !(m->bytes > 0))
        return -1;
    sfi_cost_setup s;
    sfi_cost_setup_init(&s);
    s.gpu = *gpu;
    s.prof = *p;
    s.tp = m->gpus;
    *t = is_allgather(m) ? sfi_cost_allgather_time(&s, m->bytes)
                         : sfi_cost_allreduce_time(&s, m->bytes);
    return 0;
}

/* The latency and efficiency that fit the measurements of `kernel`
 * ("allreduce" or "allgather") of `gpus` GPUs best in relative error
 * (least squares of (lat + x / eff) / t - 1, x the ring transfer at
 * efficiency 1). Returns the measurements used (0: none, or fewer than two
 * sizes: *lat and *eff untouched). */
static int fit_collective(const sfi_hw_measurement *ms, size_t nm, const sfi_gpu *gpu,
                          const char *kernel, int gpus, double *lat, double *eff)
{
    sfi_hw_profile unit;
    sfi_hw_profile_default(&unit);
    unit.efficiency[SFI_KC_ALLREDUCE] = 1;
    unit.allreduce_latency_s = 0;
    double suu = 0, suv = 0, svv = 0, su = 0, sv = 0, x0 = -1;
    int n = 0, sizes = 0;
    for (size_t i = 0; i < nm; i++) {
        double x;
        if (strcmp(ms[i].kernel, kernel) || ms[i].gpus != gpus || !(ms[i].time_s > 0) ||
            collective_predict(&ms[i], gpu, &unit, &x))
            continue;
        double u = 1 / ms[i].time_s, v = x / ms[i].time_s;
        suu += u * u;
        suv += u * v;
        svv += v * v;
        su += u;
        sv += v;
        sizes += x0 >= 0 && x != x0;
        if (x0 < 0)
            x0 = x;
        n++;
    }
    double det = suu * svv - suv * suv;
    if (!n || !sizes || !(det > 0))
        return 0;
    double a = (su * svv - sv * suv) / det, b = (suu * sv - suv * su) / det;
    if (a < 0) { /* no latency: the transfer alone */
        a = 0;
        b = sv / svv;
    }
    if (!(b > 0))
        return 0;
    *lat = a;
    *eff = 1 / b > 1 ? 1 : 1 / b;
    return n;
}

/* The collectives' fits, one per group size measured: all-reduces (n,
 * lat, eff) and all-gathers (ag_*). */
typedef struct {
    int n[SFI_HW_AR_GROUPS]; /* measurements used (0: no fit for that size) */
    double lat[SFI_HW_AR_GROUPS], eff[SFI_HW_AR_GROUPS];
    int total, groups;
    int ag_n[SFI_HW_AR_GROUPS];
    double ag_lat[SFI_HW_AR_GROUPS], ag_eff[SFI_HW_AR_GROUPS];
    int ag_total;
} ar_fits;

static void fit_collectives(const sfi_hw_measurement *ms, size_t nm, const sfi_gpu *gpu, ar_fits *f)
{
    memset(f, 0, sizeof *f);
    for (int g = 2; g < SFI_HW_AR_GROUPS; g++) {
        f->n[g] = fit_collective(ms, nm, gpu, "allreduce", g, &f->lat[g], &f->eff[g]);
        f->total += f->n[g];
        f->groups += f->n[g] > 0;
        f->ag_n[g] = fit_collective(ms, nm, gpu, "allgather", g, &f->ag_lat[g], &f->ag_eff[g]);
        f->ag_total += f->ag_n[g];
    }
}

/* Each fitted group size's parameters into p, and the smallest size's
 * all-reduce as the profile's own (what other group sizes and their
 * all-gathers get). All-gathers only ever price their own group size. */
static void apply_collectives(const ar_fits *f, sfi_hw_profile *p)
{
    int first = 1;
    for (int g = 2; g < SFI_HW_AR_GROUPS; g++) {
        if (f->ag_n[g]) {
            p->ag_by_gpus_lat[g] = f->ag_lat[g];
            p->ag_by_gpus_eff[g] = f->ag_eff[g];
        }
        if (!f->n[g])
            continue;
        p->ar_by_gpus_lat[g] = f->lat[g];
        p->ar_by_gpus_eff[g] = f->eff[g];
        if (first) {
            p->allreduce_latency_s = f->lat[g];
            p->efficiency[SFI_KC_ALLREDUCE] = f->eff[g];
            first = 0;
        }
    }
}

/* {"G": [latency_us, efficiency], ...} of the group sizes with eff > 0,
 * as root's `key`, where there are any. */
static void json_groups(json_t *root, const char *key, const double *lat, const double *eff)
{
    json_t *o = NULL;
    for (int g = 2; g < SFI_HW_AR_GROUPS; g++) {
        if (!(eff[g] > 0))
            continue;
        if (!o)
            o = json_object();
        char k[16]; /* any int: the -O1 sanitizer build cannot bound g */
        snprintf(k, sizeof k, "%d", g);
        json_t *e = json_array();
        json_array_append_new(e, json_real(floor(lat[g] * 1e8 + 0.5) / 100));
        json_array_append_new(e, json_real(floor(eff[g] * 1e4 + 0.5) / 1e4));
        json_object_set_new(o, k, e);
    }
    if (o)
        json_object_set_new(root, key, o);
}

/* The collectives' parameters of a profile written: "allreduce_latency_us",
 * "allreduce_step_us" and "sel_pre_us" (where set), "allreduce_by_gpus" and
 * "allgather_by_gpus". */
static void json_collectives(json_t *root, const sfi_hw_profile *p)
{
    json_object_set_new(root, "allreduce_latency_us",
                        json_real(floor(p->allreduce_latency_s * 1e8 + 0.5) / 100));
    if (p->allreduce_step_s > 0)
        json_object_set_new(root, "allreduce_step_us",
                            json_real(floor(p->allreduce_step_s * 1e8 + 0.5) / 100));
    if (p->sel_pre_s > 0)
        json_object_set_new(root, "sel_pre_us", json_real(floor(p->sel_pre_s * 1e8 + 0.5) / 100));
    json_groups(root, "allreduce_by_gpus", p->ar_by_gpus_lat, p->ar_by_gpus_eff);
    json_groups(root, "allgather_by_gpus", p->ag_by_gpus_lat, p->ag_by_gpus_eff);
}

static int fit_profile(const sfi_hw_profile *in, const sfi_gpu *gpu, const sfi_hw_measurement *ms,
                       size_t nm, const char *out_path)
{
    sfi_hw_profile p = *in;
    static const struct {
        const char *kernel;
        sfi_kernel_class c;
    } map[] = {{"attn_dense_nologits", SFI_KC_ATTN_DENSE},
               {"attn_sparse", SFI_KC_ATTN_SPARSE},
               {"selector", SFI_KC_SELECTOR},
               {"topk", SFI_KC_TOPK},
               {"reorg", SFI_KC_REORG}};
    printf("# fit (%s):\n", out_path);
    for (size_t k = 0; k < sizeof map / sizeof map[0]; k++) {
        double eff, fixed;
        if (fit_class(ms, nm, gpu, map[k].kernel, &p, &eff, &fixed)) {
            p.efficiency[map[k].c] = eff;
            p.fixed_s[map[k].c] = fixed;
            printf("#   %-12s efficiency %.3f, fixed %.1f us (from %s)\n",
                   sfi_kernel_class_name(map[k].c), eff, fixed * 1e6, map[k].kernel);
        }
    }
    /* Logits: what attn_dense (with logits) takes beyond the dense kernel
     * the profile now predicts, per logit byte. */
    double lb = 0, lt = 0;
    for (size_t i = 0; i < nm; i++) {
        if (strcmp(ms[i].kernel, "attn_dense"))
            continue;
        sfi_model_config mc;
        sfi_cost_setup s;
        setup_for(&ms[i], gpu, &mc, &s);
        s.prof = p;
        double bare, xl, xb, l;
        if (sfi_cost_kernel_predict(&s, "attn_dense_nologits", &bare, NULL) != SFI_OK ||
            unit_terms(&ms[i], gpu, "attn_dense", &xl, &l) != 0 ||
            unit_terms(&ms[i], gpu, "attn_dense_nologits", &xb, &l) != 0)
            continue;
        double layers = ms[i].layers > 0 ? ms[i].layers : 1;
        double extra = ms[i].time_s / layers - bare;
        if (extra > 0 && xl > xb) {
            lb += xl - xb;
            lt += extra;
        }
    }
    if (lt > 0) {
        p.efficiency[SFI_KC_LOGITS] = lb / lt > 1 ? 1 : lb / lt;
        printf("#   %-12s efficiency %.3f (from attn_dense minus the dense kernel)\n", "logits",
               p.efficiency[SFI_KC_LOGITS]);
    }
    /* Contention: the two-stream slow step between contention 0 and 1. */
    for (size_t i = 0; i < nm; i++) {
        if (strcmp(ms[i].kernel, "slow_step_overlap"))
            continue;
        sfi_model_config mc;
        sfi_cost_setup s;
        setup_for(&ms[i], gpu, &mc, &s);
        s.prof = p;
        double t0, t1;
        s.prof.overlap_contention = 0;
        int layers = ms[i].layers > 0 ? ms[i].layers : 1;
        if (sfi_cost_pipeline_predict(&s, "slow_step_overlap", layers, &t0, NULL) != SFI_OK)
            continue;
        s.prof.overlap_contention = 1;
        if (sfi_cost_pipeline_predict(&s, "slow_step_overlap", layers, &t1, NULL) != SFI_OK ||
            t1 <= t0)
            continue;
        double c = (ms[i].time_s - t0) / (t1 - t0);
        p.overlap_contention = c < 0 ? 0 : c > 1 ? 1 : c;
        printf("#   %-12s %.3f (from slow_step_overlap)\n", "contention", p.overlap_contention);
        break;
    }
    ar_fits af;
    fit_collectives(ms, nm, gpu, &af);
    apply_collectives(&af, &p);
    for (int g = 2; g < SFI_HW_AR_GROUPS; g++)
        if (af.n[g])
            printf("#   %-12s efficiency %.3f, latency %.2f us (from %d all-reduces of %d GPUs)\n",
                   "allreduce", af.eff[g], af.lat[g] * 1e6, af.n[g], g);
    for (int g = 2; g < SFI_HW_AR_GROUPS; g++)
        if (af.ag_n[g])
            printf("#   %-12s efficiency %.3f, latency %.2f us (from %d all-gathers of %d GPUs)\n",
                   "allgather", af.ag_eff[g], af.ag_lat[g] * 1e6, af.ag_n[g], g);
    /* Write: temp file + rename. */
    json_t *root = json_object(), *eff = json_object(), *fx = json_object(), *arr = json_array();
    char name[SFI_HW_NAME_MAX + 8];
    snprintf(name, sizeof name, "%.*s-fit", SFI_HW_NAME_MAX - 5, p.name);
    json_object_set_new(root, "sfi_profile", json_integer(1));
    json_object_set_new(root, "name", json_string(name));
    json_object_set_new(root, "gpu", json_string(gpu->name));
    json_object_set_new(root, "note", json_string("written by sfi-sim validate --fit"));
    for (int c = 0; c < SFI_KC_COUNT; c++) {
        json_object_set_new(eff, sfi_kernel_class_name((sfi_kernel_class)c),
                            json_real(floor(p.efficiency[c] * 1e4 + 0.5) / 1e4));
        if (p.fixed_s[c] > 0)
            json_object_set_new(fx, sfi_kernel_class_name((sfi_kernel_class)c),
                                json_real(floor(p.fixed_s[c] * 1e7 + 0.5) / 10));
    }
    json_object_set_new(root, "efficiency", eff);
    json_object_set_new(root, "fixed_us", fx);
    json_object_set_new(root, "launch_us", json_real(p.launch_s * 1e6));
    json_object_set_new(root, "step_overhead_us", json_real(p.step_overhead_s * 1e6));
    json_collectives(root, &p);
    json_object_set_new(root, "overlap_contention",
                        json_real(floor(p.overlap_contention * 1e4 + 0.5) / 1e4));
    for (size_t i = 0; i < nm; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "kernel", json_string(ms[i].kernel));
        if (is_collective(&ms[i])) {
            json_object_set_new(o, "gpus", json_integer(ms[i].gpus));
            json_object_set_new(o, "bytes", json_integer((json_int_t)ms[i].bytes));
            json_object_set_new(o, "time_us", json_real(ms[i].time_s * 1e6));
            json_array_append_new(arr, o);
            continue;
        }
        json_object_set_new(o, "batch", json_integer(ms[i].batch));
        json_object_set_new(o, "context", json_integer(ms[i].context));
        json_object_set_new(o, "q_heads", json_integer(ms[i].q_heads));
        json_object_set_new(o, "kv_heads", json_integer(ms[i].kv_heads));
        json_object_set_new(o, "head_dim", json_integer(ms[i].head_dim));
        json_object_set_new(o, "K", json_integer(ms[i].K));
        json_object_set_new(o, "layers", json_integer(ms[i].layers));
        json_object_set_new(o, "time_us", json_real(ms[i].time_s * 1e6));
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "measurements", arr);
    int rc = 1;
    sfi_out *o;
    FILE *f;
    sfi_error err;
    if (sfi_out_open(out_path, &o, &f, &err) == SFI_OK) {
        if (json_dumpf(root, f, JSON_INDENT(2) | JSON_REAL_PRECISION(6)) != 0 ||
            fputc('\n', f) == EOF) {
            sfi_error_set(&err, SFI_EIO, "%s: cannot write: %s", out_path, strerror(errno));
            sfi_out_abort(o);
        } else if (sfi_out_commit(o, 0, &err) == SFI_OK) {
            rc = 0;
        }
    }
    json_decref(root);
    if (rc)
        fprintf(stderr, "sfi-sim validate: cannot write the fitted profile: %s\n", err.msg);
    else
        printf("# wrote %s; check it with: sfi-sim validate --profile %s\n", out_path, out_path);
    return rc;
}

/* The kernel class whose efficiency and fixed cost price a measured
 * kernel, or -1 (pipelines and unknown names). */
static int class_of(const char *kernel)
{
    if (!strncmp(kernel, "attn_dense", 10))
        return SFI_KC_ATTN_DENSE;
    if (!strcmp(kernel, "attn_sparse"))
        return SFI_KC_ATTN_SPARSE;
    if (!strcmp(kernel, "selector"))
        return SFI_KC_SELECTOR;
    if (!strcmp(kernel, "topk"))
        return SFI_KC_TOPK;
    if (!strcmp(kernel, "reorg"))
        return SFI_KC_REORG;
    return -1;
}

/* Which calibration to trust for this GPU, and why: the one that agrees
 * with more measurements (then the smaller worst error); the loser's worst
 * case is named, and when its class has no fixed per-kernel cost while
 * the winner's has one, that is the likely reason (short kernels are then
 * underestimated). */
static void print_verdict(const char *prof_path, const sfi_hw_profile *prof,
                          const sfi_hw_profile *def, const sfi_hw_measurement *ms, double tol,
                          int n_cmp, int ok_def, double max_def, size_t w_def, int ok_prof,
                          double max_prof, size_t w_prof)
{
    int prof_wins = ok_prof > ok_def || (ok_prof == ok_def && max_prof < max_def);
    int tie = ok_prof == ok_def && fabs(max_prof - max_def) < 0.05;
    if (tie) {
        printf("# verdict: the profile and the built-in default agree equally well with these "
               "measurements (%d of %d within %.0f%%, max |err| %.1f%%): either will do\n",
               ok_prof, n_cmp, tol, max_prof);
        return;
    }
    const sfi_hw_profile *win = prof_wins ? prof : def, *lose = prof_wins ? def : prof;
    const sfi_hw_measurement *wm = &ms[prof_wins ? w_def : w_prof];
    char where[64];
    if (is_collective(wm))
        snprintf(where, sizeof where, "of %.0f bytes", wm->bytes);
    else
        snprintf(where, sizeof where, "at context %d", wm->context);
    printf("# verdict: trust %s%s for this GPU: within %.0f%% on %d of %d measurements "
           "(max |err| %.1f%%), against %d (max |err| %.1f%%, worst %s %s) for %s",
           prof_wins ? "the profile " : "the built-in default", prof_wins ? prof_path : "", tol,
           prof_wins ? ok_prof : ok_def, n_cmp, prof_wins ? max_prof : max_def,
           prof_wins ? ok_def : ok_prof, prof_wins ? max_def : max_prof, wm->kernel, where,
           prof_wins ? "the default" : "the profile");
    int c = class_of(wm->kernel);
    if (c >= 0 && lose->fixed_s[c] == 0 && win->fixed_s[c] > 0)
        printf(", which has no fixed per-kernel cost (fixed_us) for %s and so underestimates "
               "its shortest kernels; 'sfi-sim validate --fit OUT.json' fits efficiency and "
               "fixed cost together",
               sfi_kernel_class_name((sfi_kernel_class)c));
    printf(". %s\n", prof_wins ? "Use it with sfi-sim sweep --profile."
                               : "sfi-sim sweep uses it when --profile is not given.");
}

/* ---- whole decode steps (step_measurements) ---- */

#define MAX_SUBSETS 16

typedef struct {
    double sum, max;
    int n;
} errstat;

static void es_add(errstat *e, double pct)
{
    e->sum += fabs(pct);
    e->max = fabs(pct) > e->max ? fabs(pct) : e->max;
    e->n++;
}

static void es_print(const char *what, const errstat *e)
{
    if (e->n)
        printf("  %-26s %5.1f %6.1f %4d", what, e->sum / e->n, e->max, e->n);
    else
        printf("  %-26s %5s %6s %4d", what, "-", "-", 0);
}

/* The trace a measurement replayed: as given, else under the source tree. */
static const char *trace_path(const sfi_step_meas *m, char *buf, size_t cap)
{
    struct stat sb;
    if (!m->replay[0])
        return NULL;
    if (m->replay[0] == '/' || stat(m->replay, &sb) == 0)
        return m->replay;
    snprintf(buf, cap, "%s/%s", SFI_SIM_SRCDIR, m->replay);
    return stat(buf, &sb) == 0 ? buf : NULL;
}

static int write_step_fit(const char *out_path, const sfi_hw_profile *p, const sfi_gpu *gpu,
                          const char *steps_path, char **subsets, int n_sub, const sfi_sv_fit *f,
                          int n_ar, int n_ag)
{
    json_t *root = json_object(), *eff = json_object(), *fx = json_object();
    char note[1024];
    int o = snprintf(note, sizeof note,
                     "written by sfi-sim validate: whole-step parameters fitted on %s, subset",
                     steps_path);
    for (int i = 0; i < n_sub && o < (int)sizeof note; i++)
        o += snprintf(note + o, sizeof note - (size_t)o, "%s %s", i ? " or" : "", subsets[i]);
    if (o < (int)sizeof note)
        o += snprintf(note + o, sizeof note - (size_t)o, "; held at the prior:");
    int held = 0;
    for (int j = 0; j < SFI_SV_NPARAM && o < (int)sizeof note; j++)
        if (!f->identified[j]) {
            o += snprintf(note + o, sizeof note - (size_t)o, " %s%s", sfi_sv_param_name(j),
                          f->asked_held[j] ? " (not in --fit-params)" : "");
            held++;
        }
    if (!held && o < (int)sizeof note)
        o += snprintf(note + o, sizeof note - (size_t)o, " none");
    if (n_ar && o < (int)sizeof note)
        o += snprintf(note + o, sizeof note - (size_t)o,
                      "; all-reduce latency and efficiency fitted to the %d all-reduce "
                      "measurements of %s",
                      n_ar, steps_path);
    if (n_ag && o < (int)sizeof note)
        snprintf(note + o, sizeof note - (size_t)o,
                 "; all-gather latency and efficiency fitted to the %d all-gather measurements "
                 "of %s",
                 n_ag, steps_path);
    json_object_set_new(root, "sfi_profile", json_integer(1));
    /* named for the GPU: "h100-step-fit" for H100-SXM */
    char name[SFI_HW_NAME_MAX + 16];
    size_t nl = strcspn(gpu->name, "-");
    if (nl > SFI_HW_NAME_MAX)
        nl = SFI_HW_NAME_MAX;
    for (size_t i = 0; i < nl; i++)
        name[i] = (char)tolower((unsigned char)gpu->name[i]);
    snprintf(name + nl, sizeof name - nl, "-step-fit");
    json_object_set_new(root, "name", json_string(name));
    json_object_set_new(root, "gpu", json_string(gpu->name));
    json_object_set_new(root, "note", json_string(note));
    for (int c = 0; c < SFI_KC_COUNT; c++) {
        json_object_set_new(eff, sfi_kernel_class_name((sfi_kernel_class)c),
                            json_real(floor(p->efficiency[c] * 1e4 + 0.5) / 1e4));
        if (p->fixed_s[c] > 0)
            json_object_set_new(fx, sfi_kernel_class_name((sfi_kernel_class)c),
                                json_real(floor(p->fixed_s[c] * 1e7 + 0.5) / 10));
    }
    json_object_set_new(root, "efficiency", eff);
    json_object_set_new(root, "fixed_us", fx);
    json_object_set_new(root, "launch_us", json_real(floor(p->launch_s * 1e8 + 0.5) / 100));
    if (p->launch_pdl_s > 0)
        json_object_set_new(root, "launch_pdl_us",
                            json_real(floor(p->launch_pdl_s * 1e8 + 0.5) / 100));
    if (p->moe_efficiency > 0)
        json_object_set_new(root, "moe_efficiency",
                            json_real(floor(p->moe_efficiency * 1e4 + 0.5) / 1e4));
    /* a bandwidth limit beyond what a profile may hold (1e5 GB/s) limits
     * nothing: written as none, so that the file reads back */
    if (p->moe_pair_bandwidth > 0 && p->moe_pair_bandwidth <= 1e14)
        json_object_set_new(root, "moe_pair_GBps",
                            json_real(floor(p->moe_pair_bandwidth * 1e-7 + 0.5) / 100));
    if (p->cta_bandwidth > 0 && p->cta_bandwidth <= 1e14)
        json_object_set_new(root, "cta_GBps",
                            json_real(floor(p->cta_bandwidth * 1e-7 + 0.5) / 100));
    if (p->cta_flops > 0)
        json_object_set_new(root, "cta_GFLOPS", json_real(floor(p->cta_flops * 1e-7 + 0.5) / 100));
    if (p->serial_step_s > 0)
        json_object_set_new(root, "serial_step_ns",
                            json_real(floor(p->serial_step_s * 1e11 + 0.5) / 100));

    json_object_set_new(root, "step_overhead_us",
                        json_real(floor(p->step_overhead_s * 1e8 + 0.5) / 100));
    json_collectives(root, p);
    json_object_set_new(root, "overlap_contention",
                        json_real(floor(p->overlap_contention * 1e4 + 0.5) / 1e4));
    int rc = 1;
    sfi_out *out;
    FILE *fp;
    sfi_error err;
    if (sfi_out_open(out_path, &out, &fp, &err) == SFI_OK) {
        if (json_dumpf(root, fp, JSON_INDENT(2) | JSON_REAL_PRECISION(6)) != 0 ||
            fputc('\n', fp) == EOF) {
            sfi_error_set(&err, SFI_EIO, "%s: cannot write: %s", out_path, strerror(errno));
            sfi_out_abort(out);
        } else if (sfi_out_commit(out, 0, &err) == SFI_OK) {
            rc = 0;
        }
    }
    json_decref(root);
    if (rc)
        fprintf(stderr, "sfi-sim validate: cannot write the fitted profile: %s\n", err.msg);
    else
        printf("# wrote %s; predict with it: sfi-sim validate --profile %s --steps %s\n", out_path,
               out_path, steps_path);
    return rc;
}

static double pct_err(double pred, double meas)
{
    return (pred / meas - 1) * 100;
}

/* A step-level validation: the measurements, what each is predicted
 * with, and the error statistics (validate_steps' phases share it). */
typedef struct {
    const char *prof_path, *steps_path;
    const sfi_hw_profile *prof;
    sfi_step_meas *ms;
    size_t n;
    sfi_gpu gpu;
    sfi_model_config *mcs; /* [n] */
    sfi_sv_mix *mixes;     /* [n] */
    int *in_fit;           /* [n] */
    sfi_trigger_set ts;
    int n_replayed, n_sfi;
    int n_ar;               /* all-reduce measurements of the steps file (their fits
                   price the collectives), 0: none */
    int n_ag;               /* all-gather measurements of it (fits of their own) */
    ar_fits ar;             /* per group size */
    sfi_hw_profile p;       /* the profile predicted with: prof, fitted when fitted */
    const int *free_params; /* [SFI_SV_NPARAM] the parameters --fit-params frees
                               (NULL: all) */
    sfi_sv_fit fit;
    int fitted;
    sfi_sv_pred *pr; /* [n] */
    errstat st_t[2][2], st_tps[2][2], st_sp[2];
} step_val;

/* The measurements of steps_path (at least one). Returns 0 or the exit
 * code, as every phase below does. */
static int load_steps(step_val *sv)
{
    sfi_step_meas *ms = NULL;
    size_t n = 0;
    sfi_error err;
    if (sfi_step_meas_load(sv->steps_path, &ms, &n, &err)) {
        fprintf(stderr, "sfi-sim validate: %s\n", err.msg);
        return 1;
    }
    sv->ms = ms;
    sv->n = n;
    if (!n) {
        fprintf(stderr, "sfi-sim validate: %s: no \"step_measurements\" to compare with\n",
                sv->steps_path);
        return 1;
    }
    return 0;
}

/* The GPU the steps ran on: --gpu, else the steps file's, else the
 * profile's. */
static int steps_gpu(step_val *sv, const char *gpu_name)
{
    sfi_error err;
    sfi_hw_profile sp;
    const char *gname = gpu_name;
    if (!gname && sfi_hw_profile_load(sv->steps_path, &sp, NULL, NULL, &err) == SFI_OK && sp.gpu[0])
        gname = sp.gpu;
    if (!gname)
        gname = sv->prof->gpu[0] ? sv->prof->gpu : "H100-SXM";
    if (sfi_gpu_resolve(gname, &sv->gpu, &err)) {
        fprintf(stderr, "sfi-sim validate: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* The steps file's all-reduce measurements (sfi-gpu bench-allreduce of
 * the run's GPUs): the latency and efficiency that fit them price the
 * steps' collectives, in place of the profile's. */
static int steps_collectives(step_val *sv)
{
    sfi_hw_profile sp;
    sfi_hw_measurement *meas = NULL;
    size_t nm = 0;
    sfi_error err;
    if (sfi_hw_profile_load(sv->steps_path, &sp, &meas, &nm, &err) != SFI_OK) {
        fprintf(stderr, "sfi-sim validate: %s\n", err.msg);
        return 1;
    }
    fit_collectives(meas, nm, &sv->gpu, &sv->ar);
    sv->n_ar = sv->ar.total;
    sv->n_ag = sv->ar.ag_total;
    free(meas);
    for (int g = 2; g < SFI_HW_AR_GROUPS; g++) {
        if (sv->ar.n[g])
            printf("# collectives: %d all-reduce measurements of %s (%d GPUs) fit latency %.2f us, "
                   "efficiency %.3f of %s's NVLink (%.1f GB/s per direction): they price the "
                   "steps' all-reduces%s of %d GPUs\n",
                   sv->ar.n[g], sv->steps_path, g, sv->ar.lat[g] * 1e6, sv->ar.eff[g], sv->gpu.name,
                   sv->gpu.nvlink_bandwidth / 2e9, sv->ar.ag_n[g] ? "" : " and all-gathers", g);
        if (sv->ar.ag_n[g])
            printf("# collectives: %d all-gather measurements of %s (%d GPUs) fit latency %.2f us, "
                   "efficiency %.3f of %s's NVLink: they price the steps' all-gathers of %d "
                   "GPUs\n",
                   sv->ar.ag_n[g], sv->steps_path, g, sv->ar.ag_lat[g] * 1e6, sv->ar.ag_eff[g],
                   sv->gpu.name, g);
    }
    return 0;
}

/* The bytes each configuration's GPUs sent into collectives per step, as
 * the engine reported them, against the cost model's account. */
static void check_comm_bytes(const step_val *sv)
{
    int n = 0, same = 0;
    for (size_t i = 0; i < sv->n; i++) {
        const sfi_step_meas *m = &sv->ms[i];
        if (m->tp < 2 || (m->allreduce_bytes < 0 && m->gather_bytes < 0))
            continue;
        double ar, ga;
        sfi_sv_comm_bytes(m, &sv->mcs[i], &ar, &ga);
        int ok = (m->allreduce_bytes < 0 || fabs(ar - m->allreduce_bytes) < 0.5) &&
                 (m->gather_bytes < 0 || fabs(ga - m->gather_bytes) < 0.5);
        n++;
        same += ok;
        if (!ok)
            printf("# note: step_measurements[%zu]: the engine reported %.0f bytes of all-reduces "
                   "and %.0f of all-gathers per step and GPU; the model counts %.0f and %.0f\n",
                   i, m->allreduce_bytes, m->gather_bytes, ar, ga);
    }
    if (n)
        printf("# collective bytes per step and GPU: the model's count equals the engine's report "
               "in %d of %d tensor-parallel configurations\n",
               same, n);
}

/* --select: only the configurations it selects are read. */
static int select_steps(step_val *sv, char **selects, int n_sel)
{
    if (!n_sel)
        return 0;
    sfi_error err;
    size_t k = 0;
    for (size_t i = 0; i < sv->n; i++) {
        int keep = 0;
        for (int q = 0; q < n_sel; q++) {
            int h = sfi_sv_subset_match(selects[q], &sv->ms[i], &err);
            if (h < 0) {
                fprintf(stderr, "sfi-sim validate: --select: %s\n", err.msg);
                return 2;
            }
            keep |= h;
        }
        if (keep)
            sv->ms[k++] = sv->ms[i];
    }
    sv->n = k;
    if (!sv->n) {
        fprintf(stderr, "sfi-sim validate: --select leaves no configuration of %s\n",
                sv->steps_path);
        return 1;
    }
    return 0;
}

/* Per configuration: its model, whether it is in the fit subset, and the
 * SFI step mix (the trace replayed, else the measured counts). */
static int plan_steps(step_val *sv, char **subsets, int n_sub, const char *tok_dir)
{
    const size_t n = sv->n;
    sfi_step_meas *ms = sv->ms;
    sfi_error err;
    sv->mcs = calloc(n, sizeof *sv->mcs);
    sv->mixes = calloc(n, sizeof *sv->mixes);
    sv->in_fit = calloc(n, sizeof *sv->in_fit);
    if (!sv->mcs || !sv->mixes || !sv->in_fit) {
        fprintf(stderr, "sfi-sim validate: out of memory\n");
        return 1;
    }
    int have_ts = 0;
    for (size_t i = 0; i < n; i++) {
        if (sfi_sv_model(&ms[i], &sv->mcs[i], &err)) {
            fprintf(stderr, "sfi-sim validate: %s: step_measurements[%zu]: %s\n", sv->steps_path, i,
                    err.msg);
            return 1;
        }
        for (int s = 0; s < n_sub; s++) {
            int h = sfi_sv_subset_match(subsets[s], &ms[i], &err);
            if (h < 0) {
                fprintf(stderr, "sfi-sim validate: %s\n", err.msg);
                return 2;
            }
            sv->in_fit[i] |= h;
        }
        if (!ms[i].sfi)
            continue;
        sv->n_sfi++;
        char buf[1024];
        const char *tp = trace_path(&ms[i], buf, sizeof buf);
        if (tp && !have_ts) {
            if (sfi_sv_trigger_set(tok_dir, &sv->ts, &err)) {
                fprintf(stderr, "sfi-sim validate: trigger set (--tokenizer): %s\n", err.msg);
                return 1;
            }
            have_ts = 1;
        }
        if (tp && sfi_sv_replay(&ms[i], tp, &sv->ts, &sv->mixes[i], &err) == SFI_OK) {
            sv->n_replayed++;
            continue;
        }
        if (tp)
            fprintf(stderr, "sfi-sim validate: note: step_measurements[%zu]: replay: %s\n", i,
                    err.msg);
        /* the measured counts, one slow request per slow step */
        sfi_sv_mix *mx = &sv->mixes[i];
        mx->batch = ms[i].batch;
        mx->hist[0] = ms[i].cls[SFI_SV_FAST].n;
        mx->hist[1] = ms[i].cls[SFI_SV_SLOW].n;
        if (!mx->hist[0] && !mx->hist[1])
            mx->hist[0] = 1;
    }
    return 0;
}

/* The report's header, then the fit on the subset when there is one. */
static int fit_steps(step_val *sv, char **subsets, int n_sub)
{
    sfi_error err;
    int n_in = 0;
    for (size_t i = 0; i < sv->n; i++)
        n_in += sv->in_fit[i] && !sv->ms[i].variant;
    sv->p = *sv->prof;
    if (sv->n_ar || sv->n_ag)
        apply_collectives(&sv->ar, &sv->p);
    printf("# sfi-sim validate: whole decode steps of %s (%zu configurations) against profile "
           "%s ('%s') on %s\n",
           sv->steps_path, sv->n, sv->prof_path, sv->prof->name, sv->gpu.name);
    printf("# SFI step mix: %s (%d of %d SFI configurations)\n",
           sv->n_replayed ? "sfi-sim's trigger replay of the trace each run replayed (sfi policy, "
                            "default parameters, Qwen3 trigger set), timed steps 3..new_tokens-1"
                          : "the measured step counts",
           sv->n_replayed, sv->n_sfi);
    printf("# engine (sfi-gpu): one attention launch per layer for slow and fast requests "
           "together, fast requests split finer at small batches, a CTA bound by its rows' bytes "
           "or FLOPs; an MoE layer: 11 launches, routing by one thread per token (E x top "
           "serial steps), expert weights read once per %s and streamed like attention's K/V\n",
           sfi_sv_moe_pair_reads ? "(token, expert) pair" : "distinct expert the batch touches");
    if (!n_sub)
        return 0;
    const sfi_sv_fit *fit = &sv->fit;
    if (sfi_sv_fit_run_some(sv->ms, sv->mcs, sv->mixes, sv->in_fit, sv->n, &sv->gpu,
                            sv->free_params, &sv->p, &sv->fit, &err)) {
        fprintf(stderr, "sfi-sim validate: fit: %s\n", err.msg);
        return 1;
    }
    sv->fitted = 1;
    printf("# fit subset:");
    for (int s = 0; s < n_sub; s++)
        printf("%s %s", s ? " or" : "", subsets[s]);
    printf(" (%d configurations, %d measured values; RMS error %.2f%%)\n", n_in, fit->n_resid,
           fit->rms * 100);
    for (int j = 0; j < SFI_SV_NPARAM; j++) {
        if (fit->asked_held[j]) { /* not judged: no standard error */
            printf("#   %-24s %9.4g held: not in --fit-params\n", sfi_sv_param_name(j),
                   fit->value[j]);
            continue;
        }
        printf("#   %-24s %9.4g %s (prior %.4g; standard error %s%.0f%%)\n", sfi_sv_param_name(j),
               fit->value[j],
               fit->identified[j] ? "fitted" : "held: the subset cannot determine it",
               fit->prior[j], fit->se[j] > 9.99 ? ">" : "",
               fit->se[j] > 9.99 ? 999 : fit->se[j] * 100);
    }
    return 0;
}

/* One row: predicted vs measured step times per class and tokens/s. */
static void report_step(step_val *sv, size_t i)
{
    const sfi_step_meas *m = &sv->ms[i];
    const sfi_sv_pred *pr = &sv->pr[i];
    const char *set = m->variant ? "var" : !sv->fitted ? "-" : sv->in_fit[i] ? "in" : "out";
    int oos = !sv->fitted || !sv->in_fit[i];
    printf("%-14s %3d %2d %5d %7d %-5s %-4s", m->model, sv->mcs[i].num_hidden_layers, m->tp,
           m->batch, m->context, m->sfi ? "sfi" : "dense", set);
    static const int order[2][2] = {{SFI_SV_DENSE, -1}, {SFI_SV_FAST, SFI_SV_SLOW}};
    for (int k = 0; k < 2; k++) {
        int c = order[m->sfi][k];
        if (c < 0) {
            printf(" %-5s %9s %9s %7s", "", "", "", "");
            continue;
        }
        const char *cn = c == SFI_SV_DENSE ? "dense" : c == SFI_SV_FAST ? "fast" : "slow";
        if (!m->cls[c].have) {
            printf(" %-5s %9s %9.3f %7s", cn, "-", pr->t[c] * 1e3, "-");
            continue;
        }
        double e = pct_err(pr->t[c], m->cls[c].mean_s);
        printf(" %-5s %9.3f %9.3f %+7.1f", cn, m->cls[c].mean_s * 1e3, pr->t[c] * 1e3, e);
        if (!m->variant)
            es_add(&sv->st_t[oos][m->sfi], e);
    }
    double et = pct_err(pr->tps, m->tps);
    printf(" %9.1f %9.1f %+7.1f", m->tps, pr->tps, et);
    if (!m->variant)
        es_add(&sv->st_tps[oos][m->sfi], et);
    if (m->sfi) {
        int64_t sl = 0;
        for (int k = 1; k <= m->batch; k++)
            sl += sv->mixes[i].hist[k];
        printf(" %4d/%-4lld", m->cls[SFI_SV_SLOW].n, (long long)sl);
    }
    if (m->variant)
        printf("  (%s: not compared)", m->variant_why);
    printf("\n");
}

/* The table: every configuration predicted with the profile (or fit). */
static int report_steps(step_val *sv)
{
    sfi_error err;
    printf("%-14s %3s %2s %5s %7s %-5s %-4s %-5s %9s %9s %7s %-5s %9s %9s %7s %9s %9s %7s %9s\n",
           "model", "L", "tp", "batch", "context", "mode", "set", "class", "meas_ms", "pred_ms",
           "err%", "class", "meas_ms", "pred_ms", "err%", "meas_tps", "pred_tps", "err%",
           "slow_steps");
    sv->pr = calloc(sv->n, sizeof *sv->pr);
    if (!sv->pr) {
        fprintf(stderr, "sfi-sim validate: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < sv->n; i++) {
        if (sfi_sv_predict(&sv->ms[i], &sv->mcs[i], &sv->p, &sv->gpu, &sv->mixes[i], &sv->pr[i],
                           &err)) {
            fprintf(stderr, "sfi-sim validate: %s: step_measurements[%zu]: %s\n", sv->steps_path, i,
                    err.msg);
            return 1;
        }
        report_step(sv, i);
    }
    return 0;
}

/* SFI over dense at the same model, layers, GPUs, batch, context, dtype. */
static void report_speedups(step_val *sv)
{
    const sfi_step_meas *ms = sv->ms;
    printf("# speedup (SFI tokens/s over dense):\n");
    for (size_t i = 0; i < sv->n; i++) {
        if (!ms[i].sfi || ms[i].variant)
            continue;
        for (size_t j = 0; j < sv->n; j++) {
            const sfi_step_meas *a = &ms[i], *b = &ms[j];
            if (b->sfi || b->variant || strcmp(a->model, b->model) || a->layers != b->layers ||
                a->tp != b->tp || a->batch != b->batch || a->context != b->context ||
                a->dtype_bytes != b->dtype_bytes)
                continue;
            double sm = a->tps / b->tps, sp = sv->pr[i].tps / sv->pr[j].tps, e = pct_err(sp, sm);
            int oos = !sv->fitted || !sv->in_fit[i] || !sv->in_fit[j];
            printf("#   %-14s %3d %2d %5d %7d  %-4s measured %6.3f predicted %6.3f err %+6.1f%%\n",
                   a->model, sv->mcs[i].num_hidden_layers, a->tp, a->batch, a->context,
                   !sv->fitted ? "-"
                   : oos       ? "out"
                               : "in",
                   sm, sp, e);
            es_add(&sv->st_sp[oos], e);
            break;
        }
    }
}

/* The error summary, in and out of sample apart when fitted. */
static void report_summary(const step_val *sv)
{
    printf("# |error| %%: mean, max, count (variants left out); targets out-of-sample: step "
           "time and tokens/s within 5%% mean, 10%% max; speedup within 5%%\n");
    for (int o = sv->fitted ? 0 : 1; o < 2; o++) {
        const char *w = !sv->fitted ? "all" : o ? "out-of-sample" : "in-sample";
        char lab[64];
        printf("# %-14s", w);
        snprintf(lab, sizeof lab, "dense step time");
        es_print(lab, &sv->st_t[o][0]);
        snprintf(lab, sizeof lab, "dense tok/s");
        es_print(lab, &sv->st_tps[o][0]);
        printf("\n# %-14s", "");
        snprintf(lab, sizeof lab, "SFI step time (fast+slow)");
        es_print(lab, &sv->st_t[o][1]);
        snprintf(lab, sizeof lab, "SFI tok/s");
        es_print(lab, &sv->st_tps[o][1]);
        printf("\n# %-14s", "");
        es_print("speedup", &sv->st_sp[o]);
        printf("\n");
    }
}

/* Step-level validation: predicted vs measured whole decode steps, after a
 * fit on the declared subsets when there are any. Returns the exit code. */
static int validate_steps(const char *prof_path, const char *steps_path, const sfi_hw_profile *prof,
                          const char *gpu_name, char **subsets, int n_sub, char **selects,
                          int n_sel, const char *fit_path, const char *tok_dir, double tol,
                          const int *free_params)
{
    if (free_params && !n_sub) {
        fprintf(stderr, "sfi-sim validate: --fit-params needs --fit-subset (the configurations "
                        "to fit on)\n");
        return 2;
    }
    if (fit_path && !n_sub) {
        fprintf(stderr, "sfi-sim validate: --fit with whole-step measurements needs "
                        "--fit-subset (the configurations to fit on)\n");
        return 2;
    }
    step_val sv;
    memset(&sv, 0, sizeof sv);
    sv.prof_path = prof_path;
    sv.steps_path = steps_path;
    sv.prof = prof;
    sv.free_params = free_params;
    int rc = load_steps(&sv);
    if (!rc)
        rc = steps_gpu(&sv, gpu_name);
    if (!rc)
        rc = select_steps(&sv, selects, n_sel);
    if (!rc)
        rc = plan_steps(&sv, subsets, n_sub, tok_dir);
    if (!rc)
        rc = steps_collectives(&sv);
    if (!rc)
        rc = fit_steps(&sv, subsets, n_sub);
    if (!rc)
        check_comm_bytes(&sv);
    if (!rc)
        rc = report_steps(&sv);
    if (!rc) {
        report_speedups(&sv);
        report_summary(&sv);
    }
    (void)tol;
    if (!rc && sv.fitted && fit_path)
        rc = write_step_fit(fit_path, &sv.p, &sv.gpu, steps_path, subsets, n_sub, &sv.fit, sv.n_ar,
                            sv.n_ag);
    sfi_trigger_set_free(&sv.ts);
    free(sv.pr);
    free(sv.ms);
    free(sv.mcs);
    free(sv.mixes);
    free(sv.in_fit);
    return rc;
}

/* sfi-sim validate's command line. */
typedef struct {
    const char *prof_path, *gpu_name, *fit_path, *steps_path, *tok_dir;
    char *subsets[MAX_SUBSETS], *selects[MAX_SUBSETS];
    int n_sub, n_sel;
    double tol;
    int have_free;                  /* --fit-params given */
    int free_params[SFI_SV_NPARAM]; /* with have_free: the parameters it frees */
} validate_args;

/* --fit-params LIST: free[j] = 1 for each key of LIST. Returns 0, or 1
 * after a message. */
static int parse_fit_params(const char *list, int *free_params)
{
    char buf[256];
    if (!*list || strlen(list) >= sizeof buf) {
        fprintf(stderr, "sfi-sim validate: --fit-params: empty or too long\n");
        return 1;
    }
    /* strtok_r would pass over an empty item: a list such as "gemm,,"
     * is more likely a mistyped one than a meant one */
    if (*list == ',' || list[strlen(list) - 1] == ',' || strstr(list, ",,")) {
        fprintf(stderr, "sfi-sim validate: --fit-params: empty item in '%s'\n", list);
        return 1;
    }
    snprintf(buf, sizeof buf, "%s", list);
    memset(free_params, 0, sizeof(int) * SFI_SV_NPARAM);
    char *save = NULL;
    for (char *k = strtok_r(buf, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
        int j = sfi_sv_param_lookup(k);
        if (j < 0) {
            fprintf(stderr, "sfi-sim validate: --fit-params: unknown parameter '%s'\n", k);
            return 1;
        }
        free_params[j] = 1;
    }
    return 0;
}

/* Returns -1 to go on, else the exit code. */
static int parse_validate_args(int argc, char **argv, validate_args *a)
{
    static const struct option opts[] = {{"profile", required_argument, NULL, 'p'},
                                         {"gpu", required_argument, NULL, 'g'},
                                         {"tolerance", required_argument, NULL, 't'},
                                         {"fit", required_argument, NULL, 'f'},
                                         {"fit-subset", required_argument, NULL, 's'},
                                         {"steps", required_argument, NULL, 'S'},
                                         {"tokenizer", required_argument, NULL, 'T'},
                                         {"moe-reads", required_argument, NULL, 'M'},
                                         {"select", required_argument, NULL, 'L'},
                                         {"fit-params", required_argument, NULL, 'P'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    memset(a, 0, sizeof *a);
    a->prof_path = SFI_SIM_SRCDIR "/" DEFAULT_PROFILE;
    a->tok_dir = SFI_SIM_SRCDIR "/tests/fixtures/qwen3-tokenizer";
    a->tol = 10;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'p': a->prof_path = optarg; break;
        case 'g': a->gpu_name = optarg; break;
        case 'f': a->fit_path = optarg; break;
        case 'S': a->steps_path = optarg; break;
        case 'T': a->tok_dir = optarg; break;
        case 'P':
            if (parse_fit_params(optarg, a->free_params))
                return 2;
            a->have_free = 1;
            break;
        case 'L':
            if (a->n_sel == MAX_SUBSETS) {
                fprintf(stderr, "sfi-sim validate: more than %d --select\n", MAX_SUBSETS);
                return 2;
            }
            a->selects[a->n_sel++] = optarg;
            break;
        case 'M':
            if (strcmp(optarg, "distinct") && strcmp(optarg, "pairs")) {
                fprintf(stderr, "sfi-sim validate: --moe-reads: '%s' is not distinct or pairs\n",
                        optarg);
                return 2;
            }
            sfi_sv_moe_pair_reads = !strcmp(optarg, "pairs");
            break;
        case 's':
            if (a->n_sub == MAX_SUBSETS) {
                fprintf(stderr, "sfi-sim validate: more than %d --fit-subset\n", MAX_SUBSETS);
                return 2;
            }
            a->subsets[a->n_sub++] = optarg;
            break;
        case 't': {
            char *end;
            a->tol = strtod(optarg, &end);
            if (*end || !(a->tol > 0 && a->tol < 1000)) {
                fprintf(stderr, "sfi-sim validate: --tolerance: '%s' is not in (0, 1000)\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "sfi-sim validate: unknown or incomplete option '%s'\n",
                    argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "sfi-sim validate: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    return -1;
}

/* Kernel-level agreement counts of a profile and of the defaults. */
typedef struct {
    int n_ok_def, n_ok_prof, n_cmp;
    double max_def, max_prof;
    size_t worst_def, worst_prof;
} kernel_tally;

/* A tally's agreement counts and worst cases, with one more comparison. */
static void tally_add(kernel_tally *k, size_t i, double e_def, double e_prof, double tol)
{
    k->n_cmp++;
    k->n_ok_def += fabs(e_def) <= tol;
    k->n_ok_prof += fabs(e_prof) <= tol;
    if (fabs(e_def) > k->max_def) {
        k->max_def = fabs(e_def);
        k->worst_def = i;
    }
    if (fabs(e_prof) > k->max_prof) {
        k->max_prof = fabs(e_prof);
        k->worst_prof = i;
    }
}

/* One measurement's row: predicted by the defaults (def) and by the
 * profile, against the measured time. */
static void validate_kernel(const sfi_hw_measurement *m, size_t i, const sfi_gpu *gpu,
                            const sfi_hw_profile *prof, const sfi_hw_profile *def, double tol,
                            kernel_tally *k)
{
    sfi_error err;
    sfi_model_config mc;
    memset(&mc, 0, sizeof mc);
    snprintf(mc.name, sizeof mc.name, "measurement %zu", i);
    mc.arch = SFI_ARCH_QWEN3;
    mc.num_attention_heads = m->q_heads ? m->q_heads : 32;
    mc.num_key_value_heads = m->kv_heads ? m->kv_heads : 8;
    mc.head_dim = m->head_dim ? m->head_dim : 128;
    mc.hidden_size = mc.num_attention_heads * mc.head_dim;
    mc.intermediate_size = 1;
    mc.num_hidden_layers = 1;
    mc.vocab_size = 1;
    mc.weight_bytes = 2;
    sfi_cost_setup s;
    sfi_cost_setup_init(&s);
    s.model = &mc;
    s.gpu = *gpu;
    s.batch = m->batch ? m->batch : 1;
    s.context = m->context;
    if (m->K)
        s.pol.prm.K = m->K;
    double layers = m->layers > 0 ? m->layers : 1;
    double t_def, t_prof;
    s.prof = *def;
    /* Multi-layer pipelines are predicted whole; single kernels are
     * per layer, times the measurement's layer count. */
    int pipeline = !strcmp(m->kernel, "attn_layers") || !strcmp(m->kernel, "slow_step_serial") ||
                   !strcmp(m->kernel, "slow_step_overlap");
    sfi_status st = pipeline ? sfi_cost_pipeline_predict(&s, m->kernel, (int)layers, &t_def, &err)
                             : sfi_cost_kernel_predict(&s, m->kernel, &t_def, &err);
    if (!st) {
        s.prof = *prof;
        st = pipeline ? sfi_cost_pipeline_predict(&s, m->kernel, (int)layers, &t_prof, &err)
                      : sfi_cost_kernel_predict(&s, m->kernel, &t_prof, &err);
    }
    if (pipeline)
        layers = 1;
    printf("%-18s %5d %7d %5d %4d %4d %5d %11.1f ", m->kernel, s.batch, m->context,
           mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim, s.pol.prm.K,
           m->time_s * 1e6);
    if (st) {
        printf("%11s %8s %11s %8s  (%s)\n", "-", "-", "-", "-", err.msg);
        return;
    }
    t_def *= layers;
    t_prof *= layers;
    double e_def = (t_def - m->time_s) / m->time_s * 100,
           e_prof = (t_prof - m->time_s) / m->time_s * 100;
    printf("%11.1f %+8.1f %11.1f %+8.1f\n", t_def * 1e6, e_def, t_prof * 1e6, e_prof);
    tally_add(k, i, e_def, e_prof, tol);
}

/* One collective's row: the ring model (sfi-sim-sweep(1)) under the
 * defaults and under the profile. */
static void validate_collective(const sfi_hw_measurement *m, size_t i, const sfi_gpu *gpu,
                                const sfi_hw_profile *prof, const sfi_hw_profile *def, double tol,
                                kernel_tally *k)
{
    double t_def, t_prof;
    printf("%-18s %4d %12.0f %11.2f ", m->kernel, m->gpus, m->bytes, m->time_s * 1e6);
    if (collective_predict(m, gpu, def, &t_def) || collective_predict(m, gpu, prof, &t_prof)) {
        printf("%11s %8s %11s %8s  (needs gpus in 2..64 and bytes > 0)\n", "-", "-", "-", "-");
        return;
    }
    double e_def = (t_def - m->time_s) / m->time_s * 100,
           e_prof = (t_prof - m->time_s) / m->time_s * 100;
    printf("%11.2f %+8.1f %11.2f %+8.1f\n", t_def * 1e6, e_def, t_prof * 1e6, e_prof);
    tally_add(k, i, e_def, e_prof, tol);
}

/* Kernel-level validation: every measurement of the profile predicted by
 * the defaults and by the profile; then the fit when asked. */
static int validate_kernels(const validate_args *a, const sfi_hw_profile *prof,
                            const sfi_hw_measurement *ms, size_t nm)
{
    const char *prof_path = a->prof_path;
    const double tol = a->tol;
    sfi_error err;
    if (nm == 0) {
        fprintf(stderr, "sfi-sim validate: %s: no \"measurements\" to compare with\n", prof_path);
        return 1;
    }
    sfi_hw_profile def;
    sfi_hw_profile_default(&def);
    sfi_gpu gpu;
    const char *gname = a->gpu_name ? a->gpu_name : prof->gpu[0] ? prof->gpu : "H100-SXM";
    if (sfi_gpu_resolve(gname, &gpu, &err) != SFI_OK) {
        fprintf(stderr, "sfi-sim validate: %s\n", err.msg);
        return 1;
    }
    printf("# sfi-sim validate: %s (profile '%s') on %s; agreement = within %.0f%%\n", prof_path,
           prof->name, gpu.name, tol);
    kernel_tally k;
    memset(&k, 0, sizeof k);
    size_t n_coll = 0;
    for (size_t i = 0; i < nm; i++)
        n_coll += is_collective(&ms[i]);
    if (n_coll < nm)
        printf("%-18s %5s %7s %5s %4s %4s %5s %11s %11s %8s %11s %8s\n", "kernel", "batch",
               "context", "heads", "kv", "hd", "K", "measured_us", "default_us", "err%",
               "profile_us", "err%");
    for (size_t i = 0; i < nm; i++)
        if (!is_collective(&ms[i]))
            validate_kernel(&ms[i], i, &gpu, prof, &def, tol, &k);
    if (n_coll)
        printf("%-18s %4s %12s %11s %11s %8s %11s %8s\n", "collective", "gpus", "bytes",
               "measured_us", "default_us", "err%", "profile_us", "err%");
    for (size_t i = 0; i < nm; i++)
        if (is_collective(&ms[i]))
            validate_collective(&ms[i], i, &gpu, prof, &def, tol, &k);
    printf("# compared %d of %zu; within %.0f%%: default %d (max |err| %.1f%%), profile %d (max "
           "|err| %.1f%%)\n",
           k.n_cmp, nm, tol, k.n_ok_def, k.max_def, k.n_ok_prof, k.max_prof);
    if (k.n_cmp > 0)
        print_verdict(prof_path, prof, &def, ms, tol, k.n_cmp, k.n_ok_def, k.max_def, k.worst_def,
                      k.n_ok_prof, k.max_prof, k.worst_prof);
    if (prof->n_step_measurements)
        printf("# %d whole-step measurements (sfi-gpu run --bench) too: compare them with "
               "sfi-sim validate --steps %s\n",
               prof->n_step_measurements, prof_path);
    if (a->fit_path)
        return fit_profile(prof, &gpu, ms, nm, a->fit_path);
    return 0;
}

int sfi_sim_cmd_validate(int argc, char **argv)
{
    validate_args a;
    int rc = parse_validate_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    sfi_hw_profile prof;
    sfi_hw_measurement *ms = NULL;
    size_t nm = 0;
    sfi_error err;
    if (sfi_hw_profile_load(a.prof_path, &prof, &ms, &nm, &err) != SFI_OK) {
        fprintf(stderr, "sfi-sim validate: %s\n", err.msg);
        if (err.code == SFI_ENOTFOUND)
            fprintf(stderr,
                    "sfi-sim validate: run the GPU benchmarks (sfi-gpu bench) to write one, "
                    "or pass --profile\n");
        return 1;
    }
    if (a.steps_path || a.n_sub || a.n_sel || (nm == 0 && prof.n_step_measurements > 0)) {
        free(ms);
        return validate_steps(a.prof_path, a.steps_path ? a.steps_path : a.prof_path, &prof,
                              a.gpu_name, a.subsets, a.n_sub, a.selects, a.n_sel, a.fit_path,
                              a.tok_dir, a.tol, a.have_free ? a.free_params : NULL);
    }
    rc = validate_kernels(&a, &prof, ms, nm);
    free(ms);
    return rc;
}
