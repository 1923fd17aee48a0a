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
            "usage: sfi-sim analyze TRACE [--policies LIST] [--budget K|RATIO]\n"
            "                       [--layer L --head H] [--format table|csv|json]\n"
            "                       [--png-prefix P] [--threads N] [--request R]\n"
            "                       [--vocab DIR] [--param KEY=VALUE]...\n\n"
            "Replays a full-level trace's dense attention (top-M records) through the\n"
            "comparison policies at one budget and prints, per policy, the mean retained\n"
            "share of the context, the attention-mass recall, the overlap with the oracle\n"
            "top set and, where the trace has q/K/V snapshots, the output error; for SFI\n"
            "the slow-step fraction, recall by steps since the last slow step and around\n"
            "triggers; and the support stability (Jaccard of consecutive top sets within\n"
            "a sentence vs across a boundary) per layer as a distribution.\n\n"
            "  --policies LIST   comma-separated: oracle full streaming h2o snapkv quest\n"
            "                    lfps kascade fasa sfi, or all (default all)\n"
            "  --budget K|RATIO  positions per KV head per step: an integer K >= 1, or a\n"
            "                    share of the context in (0,1) (default 0.06)\n"
            "  --layer L --head H  layer and KV head of the support heatmap (default 0 0)\n"
            "  --format F        table (default), csv or json, on standard output\n"
            "  --png-prefix P    also write P-support.png, P-recall-budget.png (recall at\n"
            "                    budgets 2%%,4%%,6%%,12%%,27%%,50%%) and P-stability.png\n"
            "  --threads N       worker threads, each taking whole layers (default 2)\n"
            "  --request R       analyze only request R (default all)\n"
            "  --vocab DIR       tokenizer directory for sentence ends (trigger set);\n"
            "                    without it they come from the recorded step reasons\n"
            "  --param KEY=VALUE a policy parameter (h2o_recent_frac, snapkv_pool,\n"
            "                    quest_page, lfps_r, lfps_a, lfps_sink_share, lfps_prune,\n"
            "                    kascade_anchors, fasa_tip, fasa_calib_k) or an SFI\n"
            "                    parameter (n_sink, n_recent, T_max, alpha, ...)\n"
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

int sfi_sim_cmd_analyze(int argc, char **argv)
{
    const char *trace = NULL, *budget = "0.06", *png = NULL, *vocab = NULL;
    const char *policies = "all";
    int layer = 0, head = 0, request = -1, threads = 2;
    sfi_analyze_format fmt = SFI_ANALYZE_TABLE;
    sfi_analyze_opts opt;
    sfi_analyze_opts_default(&opt);
    sfi_error err;
    sfi_error_clear(&err);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--policies")) {
            if (!(v = arg_value(argc, argv, &i)))
                return 2;
            policies = v;
        } else if (!strcmp(a, "--budget")) {
            if (!(v = arg_value(argc, argv, &i)))
                return 2;
            budget = v;
        } else if (!strcmp(a, "--layer") || !strcmp(a, "--head") || !strcmp(a, "--threads") ||
                   !strcmp(a, "--request")) {
            if (!(v = arg_value(argc, argv, &i)))
                return 2;
            int *dst = !strcmp(a, "--layer") ? &layer : !strcmp(a, "--head") ? &head
                       : !strcmp(a, "--threads") ? &threads : &request;
            if (parse_int(v, !strcmp(a, "--threads") ? 1 : 0, !strcmp(a, "--threads") ? 64
                                                                                     : INT_MAX,
                          dst)) {
                fprintf(stderr, "sfi-sim analyze: %s: bad value '%s'\n", a, v);
                return 2;
            }
        } else if (!strcmp(a, "--format")) {
            if (!(v = arg_value(argc, argv, &i)))
                return 2;
            if (!strcmp(v, "table"))
                fmt = SFI_ANALYZE_TABLE;
            else if (!strcmp(v, "csv"))
                fmt = SFI_ANALYZE_CSV;
            else if (!strcmp(v, "json"))
                fmt = SFI_ANALYZE_JSON;
            else {
                fprintf(stderr, "sfi-sim analyze: --format: '%s' is not table, csv or json\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--png-prefix")) {
            if (!(v = arg_value(argc, argv, &i)))
                return 2;
            png = v;
        } else if (!strcmp(a, "--vocab")) {
            if (!(v = arg_value(argc, argv, &i)))
                return 2;
            vocab = v;
        } else if (!strcmp(a, "--param")) {
            if (!(v = arg_value(argc, argv, &i)))
                return 2;
            if (sfi_peer_config_set(&opt.cfg, v, &err)) {
                fprintf(stderr, "sfi-sim analyze: %s\n", err.msg);
                return 2;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "sfi-sim analyze: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!trace) {
            trace = a;
        } else {
            fprintf(stderr, "sfi-sim analyze: one trace at a time ('%s' and '%s')\n", trace, a);
            return 2;
        }
    }
    if (!trace) {
        fprintf(stderr, "sfi-sim analyze: no trace given\n");
        usage(stderr);
        return 2;
    }
    if (sfi_peer_set_parse_list(policies, &opt.policies, &err)) {
        fprintf(stderr, "sfi-sim analyze: --policies: %s\n", err.msg);
        return 2;
    }
    if (sfi_params_validate(&opt.cfg.prm, &err)) {
        fprintf(stderr, "sfi-sim analyze: %s\n", err.msg);
        return 2;
    }
    {
        char *end;
        errno = 0;
        double b = strtod(budget, &end);
        int is_int = strspn(budget, "0123456789") == strlen(budget);
        if (errno || end == budget || *end || !(b > 0) || (!is_int && b >= 1.0) ||
            (is_int && b > INT_MAX)) {
            fprintf(stderr, "sfi-sim analyze: --budget: '%s' is neither a count >= 1 nor a "
                            "share in (0,1)\n", budget);
            return 2;
        }
        if (is_int) {
            opt.budget_abs = (int)b;
            opt.budget_ratio = 0;
        } else {
            opt.budget_ratio = b;
        }
    }
    opt.n_threads = threads;
    if (png) { /* before the analysis, not after it */
        char path[4200];
        snprintf(path, sizeof path, "%s-support.png", png);
        if (sfi_out_check(path, &err)) {
            fprintf(stderr, "sfi-sim analyze: --png-prefix: %s\n", err.msg);
            return 1;
        }
    }
    sfi_analyze_trace *t = NULL;
    if (sfi_analyze_trace_open(trace, vocab, opt.cfg.prm.trigger_chars, request, &t, &err)) {
        fprintf(stderr, "sfi-sim analyze: %s\n", err.msg);
        return 1;
    }
    const sfi_analyze_source *src = sfi_analyze_trace_source(t);
    if (layer >= src->n_layers || head >= src->n_kv_heads) {
        fprintf(stderr, "sfi-sim analyze: --layer %d --head %d: the trace has %d layers x %d KV "
                        "heads\n", layer, head, src->n_layers, src->n_kv_heads);
        sfi_analyze_trace_free(t);
        return 2;
    }
    sfi_analyze_result res;
    if (sfi_analyze_run(src, &opt, &res, &err)) {
        fprintf(stderr, "sfi-sim analyze: %s: %s\n", trace, err.msg);
        sfi_analyze_trace_free(t);
        return 1;
    }
    int rc = 0;
    if (png) {
        static const double ratios[] = {0.02, 0.04, 0.06, 0.12, 0.27, 0.5};
        enum { NR = sizeof ratios / sizeof ratios[0] };
        sfi_analyze_result sweep[NR];
        int ok = 1, done = 0;
        sfi_analyze_opts o2 = opt;
        o2.keep_jaccard = 0;
        for (int i = 0; i < NR && ok; i++, done++) {
            o2.budget_ratio = ratios[i];
            o2.budget_abs = 0;
            ok = sfi_analyze_run(src, &o2, &sweep[i], &err) == SFI_OK;
        }
        if (!ok)
            done--;
        char path[4096];
        if (ok) {
            snprintf(path, sizeof path, "%s-recall-budget.png", png);
            ok = sfi_analyze_png_budget(path, ratios, sweep, NR, &err) == SFI_OK;
        }
        if (ok) {
            snprintf(path, sizeof path, "%s-support.png", png);
            ok = sfi_analyze_png_support(path, src, layer, head, &err) == SFI_OK;
        }
        if (ok) {
            snprintf(path, sizeof path, "%s-stability.png", png);
            ok = sfi_analyze_png_stability(path, &res, &err) == SFI_OK;
        }
        for (int i = 0; i < done; i++)
            sfi_analyze_result_free(&sweep[i]);
        if (!ok) {
            fprintf(stderr, "sfi-sim analyze: %s\n", err.msg);
            rc = 1;
        }
    }
    if (!rc) {
        sfi_analyze_report_info info = {
            .trace = trace, .budget = budget, .n_steps = src->n_steps,
            .n_layers = src->n_layers, .n_kv_heads = src->n_kv_heads,
            .n_snapshots = sfi_analyze_trace_n_snapshots(t),
        };
        if (sfi_analyze_report_write(stdout, fmt, &info, &res) || fflush(stdout)) {
            fprintf(stderr, "sfi-sim analyze: writing the report failed\n");
            rc = 1;
        }
    }
    sfi_analyze_result_free(&res);
    sfi_analyze_trace_free(t);
    return rc;
}
