/* sfi-sim analyze TRACE: attention-mass recall, overlap with the oracle,
 * output error, SFI's slow-step statistics and support stability of the
 * comparison policies on a full-level trace (see sfi-sim-analyze(1)). */
#include <config.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_analyze.h"
#include "sfi_io.h"
#include "sfi_analyze_report.h"
#include "sfi_analyze_trace.h"
#include "sfi_sim_cli.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sfi-sim analyze TRACE [--policies LIST] [--budget B]\n"
            "                       [--calib FILE] [--layer L --head H]\n"
            "                       [--format table|csv|json] [--png-prefix P]\n"
            "                       [--threads N] [--request R] [--vocab DIR]\n"
            "                       [--records-only] [--param KEY=VALUE]...\n\n"
            "Replays a full-level trace's dense attention (top-M records) through the\n"
            "comparison policies at one budget and prints, per policy, the mean retained\n"
            "share of the context, the attention-mass recall, the overlap with the oracle\n"
            "top set and, where the trace has q/K/V snapshots, the output error; for SFI\n"
            "the slow-step fraction, recall by steps since the last slow step and around\n"
            "triggers; and the support stability (Jaccard of consecutive top sets within\n"
            "a sentence vs across a boundary) per layer as a distribution. Where the\n"
            "trace has query/key snapshots the policies run their rules on them and\n"
            "recall is exact; each proxy a policy had to use is named in the output.\n\n"
            "  --policies LIST   comma-separated: full oracle streaming h2o snapkv quest\n"
            "                    lfps kascade fasa sfi tmax interval boundary, or all\n"
            "                    (default all)\n"
            "  --budget B        positions per KV head per step, sink and recent\n"
            "                    included: a share (6%%, 0.06), a count (512), or sfi\n"
            "                    = n_sink + K + n_recent (default 6%%)\n"
            "  --calib FILE      Kascade/FASA calibration (sfi-ref calibrate); default:\n"
            "                    the trace's meta peer_calibration, else a stand-in\n"
            "                    measured on the trace itself (reported as a proxy)\n"
            "  --layer L --head H  layer and KV head of the support heatmap (default 0 0)\n"
            "  --format F        table (default), csv or json, on standard output\n"
            "  --png-prefix P    also write P-support.png, P-recall-budget.png (recall at\n"
            "                    budgets 2%%,4%%,6%%,12%%,27%%,50%%) and P-stability.png\n"
            "  --threads N       worker threads, each taking whole layers (default 2)\n"
            "  --request R       analyze only request R (default all)\n"
            "  --vocab DIR       tokenizer directory for sentence ends (trigger set);\n"
            "                    without it they come from the recorded step reasons\n"
            "  --param KEY=VALUE a policy parameter (see sfi-sim presets: h2o_recent_frac,\n"
            "                    snapkv_window, quest_page, lfps_a, kascade_anchors,\n"
            "                    fasa_tip, ...) or an SFI parameter (n_sink, n_recent,\n"
            "                    T_max, alpha, ...)\n"
            "  --records-only    ignore the trace's q/K snapshots and prompt observation:\n"
            "                    every policy on the top-M records, with its proxies\n"
            "  -h, --help        this text\n\n"
            "Exit status: 0 ok, 1 bad trace or failure, 2 usage error.\n");
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static const char *arg_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "sfi-sim analyze: %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

/* The command line. */
typedef struct {
    const char *trace, *budget, *png, *vocab, *calib_path, *policies;
    int layer, head, request, threads;
    sfi_analyze_format fmt;
    sfi_analyze_opts opt;
} analyze_args;

/* The option argv[*i] (and its value, *i moved past it). Returns -1 to go
 * on, else the exit status: 0 after --help, 2 on a usage error. */
static int parse_option(int argc, char **argv, int *i, analyze_args *x, sfi_error *err)
{
    const char *a = argv[*i], *v;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
        usage(stdout);
        return 0;
    } else if (!strcmp(a, "--policies")) {
        if (!(v = arg_value(argc, argv, i)))
            return 2;
        x->policies = v;
    } else if (!strcmp(a, "--budget")) {
        if (!(v = arg_value(argc, argv, i)))
            return 2;
        x->budget = v;
    } else if (!strcmp(a, "--records-only")) {
        x->opt.records_only = 1;
    } else if (!strcmp(a, "--calib")) {
        if (!(v = arg_value(argc, argv, i)))
            return 2;
        x->calib_path = v;
    } else if (!strcmp(a, "--layer") || !strcmp(a, "--head") || !strcmp(a, "--threads") ||
               !strcmp(a, "--request")) {
        if (!(v = arg_value(argc, argv, i)))
            return 2;
        int *dst = !strcmp(a, "--layer") ? &x->layer : !strcmp(a, "--head") ? &x->head
                   : !strcmp(a, "--threads") ? &x->threads : &x->request;
        if (parse_int(v, !strcmp(a, "--threads") ? 1 : 0, !strcmp(a, "--threads") ? 64
                                                                                 : INT_MAX,
                      dst)) {
            fprintf(stderr, "sfi-sim analyze: %s: bad value '%s'\n", a, v);
            return 2;
        }
    } else if (!strcmp(a, "--format")) {
        if (!(v = arg_value(argc, argv, i)))
            return 2;
        if (!strcmp(v, "table"))
            x->fmt = SFI_ANALYZE_TABLE;
        else if (!strcmp(v, "csv"))
            x->fmt = SFI_ANALYZE_CSV;
        else if (!strcmp(v, "json"))
            x->fmt = SFI_ANALYZE_JSON;
        else {
            fprintf(stderr, "sfi-sim analyze: --format: '%s' is not table, csv or json\n", v);
            return 2;
        }
    } else if (!strcmp(a, "--png-prefix")) {
        if (!(v = arg_value(argc, argv, i)))
            return 2;
        x->png = v;
    } else if (!strcmp(a, "--vocab")) {
        if (!(v = arg_value(argc, argv, i)))
            return 2;
        x->vocab = v;
    } else if (!strcmp(a, "--param")) {
        if (!(v = arg_value(argc, argv, i)))
            return 2;
        if (sfi_policy_config_set(&x->opt.cfg, v, err)) {
            fprintf(stderr, "sfi-sim analyze: %s\n", err->msg);
            return 2;
        }
    } else if (a[0] == '-' && a[1]) {
        fprintf(stderr, "sfi-sim analyze: unknown option '%s'\n", a);
        usage(stderr);
        return 2;
    } else if (!x->trace) {
        x->trace = a;
    } else {
        fprintf(stderr, "sfi-sim analyze: one trace at a time ('%s' and '%s')\n", x->trace, a);
        return 2;
    }
    return -1;
}

/* The command line into x, its policies, parameters and budget checked, and
 * the figures' path before the analysis rather than after it. Returns -1 to
 * go on, else the exit status. */
static int parse_args(int argc, char **argv, analyze_args *x)
{
    memset(x, 0, sizeof *x);
    x->budget = "6%";
    x->policies = "all";
    x->request = -1;
    x->threads = 2;
    x->fmt = SFI_ANALYZE_TABLE;
    sfi_analyze_opts_default(&x->opt);
    sfi_error err;
    sfi_error_clear(&err);
    for (int i = 1; i < argc; i++) {
        int rc = parse_option(argc, argv, &i, x, &err);
        if (rc >= 0)
            return rc;
    }
    if (!x->trace) {
        fprintf(stderr, "sfi-sim analyze: no trace given\n");
        usage(stderr);
        return 2;
    }
    if (sfi_policy_parse_list(x->policies, &x->opt.policies, &err)) {
        fprintf(stderr, "sfi-sim analyze: --policies: %s\n", err.msg);
        return 2;
    }
    if (sfi_params_validate(&x->opt.cfg.prm, &err)) {
        fprintf(stderr, "sfi-sim analyze: %s\n", err.msg);
        return 2;
    }
    if (sfi_budget_parse(x->budget, &x->opt.budget, &err)) {
        fprintf(stderr, "sfi-sim analyze: --budget: %s\n", err.msg);
        return 2;
    }
    x->opt.n_threads = x->threads;
    if (x->png) {
        char path[4200];
        snprintf(path, sizeof path, "%s-support.png", x->png);
        if (sfi_out_check(path, &err)) {
            fprintf(stderr, "sfi-sim analyze: --png-prefix: %s\n", err.msg);
            return 1;
        }
    }
    return -1;
}

/* --png-prefix's figures: recall against the budget (the analysis again
 * at six budgets), the support heatmap of --layer/--head, the stability of
 * res. Returns 0 or 1. */
static int write_pngs(const analyze_args *x, const sfi_analyze_source *src,
                      sfi_analyze_result *res)
{
    static const double ratios[] = {0.02, 0.04, 0.06, 0.12, 0.27, 0.5};
    enum { NR = sizeof ratios / sizeof ratios[0] };
    sfi_analyze_result sweep[NR];
    sfi_error err;
    sfi_error_clear(&err);
    int ok = 1, done = 0;
    sfi_analyze_opts o2 = x->opt;
    o2.keep_jaccard = 0;
    for (int i = 0; i < NR && ok; i++, done++) {
        o2.budget.ratio = ratios[i];
        o2.budget.positions = 0;
        ok = sfi_analyze_run(src, &o2, &sweep[i], &err) == SFI_OK;
    }
    if (!ok)
        done--;
    char path[4096];
    if (ok) {
        snprintf(path, sizeof path, "%s-recall-budget.png", x->png);
        ok = sfi_analyze_png_budget(path, ratios, sweep, NR, &err) == SFI_OK;
    }
    if (ok) {
        snprintf(path, sizeof path, "%s-support.png", x->png);
        ok = sfi_analyze_png_support(path, src, x->layer, x->head, &err) == SFI_OK;
    }
    if (ok) {
        snprintf(path, sizeof path, "%s-stability.png", x->png);
        ok = sfi_analyze_png_stability(path, res, &err) == SFI_OK;
    }
    for (int i = 0; i < done; i++)
        sfi_analyze_result_free(&sweep[i]);
    if (!ok) {
        fprintf(stderr, "sfi-sim analyze: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* The report on standard output. Returns 0 or 1. */
static int write_report(const analyze_args *x, const sfi_analyze_trace *t,
                        const char *calib_from, sfi_analyze_result *res)
{
    const sfi_analyze_source *src = sfi_analyze_trace_source(t);
    sfi_analyze_report_info info = {
        .trace = x->trace, .budget = x->budget, .n_steps = src->n_steps,
        .n_layers = src->n_layers, .n_kv_heads = src->n_kv_heads,
        .n_snapshots = sfi_analyze_trace_n_snapshots(t),
        .calib = calib_from,
        .has_prompt = src->prompt != NULL,
    };
    if (sfi_analyze_report_write(stdout, x->fmt, &info, res) || fflush(stdout)) {
        fprintf(stderr, "sfi-sim analyze: writing the report failed\n");
        return 1;
    }
    return 0;
}

int sfi_sim_cmd_analyze(int argc, char **argv)
{
    analyze_args x;
    int rc = parse_args(argc, argv, &x);
    if (rc >= 0)
        return rc;
    sfi_error err;
    sfi_error_clear(&err);
    sfi_policy_calib calib = {0};
    const char *calib_from = NULL;
    if (x.calib_path) {
        if (sfi_policy_calib_load(x.calib_path, &calib, &err)) {
            fprintf(stderr, "sfi-sim analyze: --calib: %s\n", err.msg);
            return 1;
        }
        calib_from = x.calib_path;
    }
    sfi_analyze_trace *t = NULL;
    if (sfi_analyze_trace_open(x.trace, x.vocab, x.opt.cfg.prm.trigger_chars, x.request, &t,
                               &err)) {
        fprintf(stderr, "sfi-sim analyze: %s\n", err.msg);
        sfi_policy_calib_free(&calib);
        return 1;
    }
    if (!x.calib_path && sfi_analyze_trace_calib(t)) {
        calib_from = "the trace's meta peer_calibration";
        x.opt.calib = sfi_analyze_trace_calib(t);
    } else if (x.calib_path) {
        x.opt.calib = &calib;
    }
    const sfi_analyze_source *src = sfi_analyze_trace_source(t);
    if (x.layer >= src->n_layers || x.head >= src->n_kv_heads) {
        fprintf(stderr, "sfi-sim analyze: --layer %d --head %d: the trace has %d layers x %d KV "
                        "heads\n", x.layer, x.head, src->n_layers, src->n_kv_heads);
        sfi_analyze_trace_free(t);
        sfi_policy_calib_free(&calib);
        return 2;
    }
    sfi_analyze_result res;
    if (sfi_analyze_run(src, &x.opt, &res, &err)) {
        fprintf(stderr, "sfi-sim analyze: %s: %s\n", x.trace, err.msg);
        sfi_analyze_trace_free(t);
        sfi_policy_calib_free(&calib);
        return 1;
    }
    rc = x.png ? write_pngs(&x, src, &res) : 0;
    if (!rc)
        rc = write_report(&x, t, calib_from, &res);
    sfi_analyze_result_free(&res);
    sfi_analyze_trace_free(t);
    sfi_policy_calib_free(&calib);
    return rc;
}
