/* Analyzer reports (see sfi_analyze_report.h). */
#include <config.h>

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_analyze_report.h"
#include "sfi_plot.h"

static double div0(double a, double b)
{
    return b > 0 ? a / b : NAN;
}

/* Distribution summary of a set of Jaccard values (sorts v). */
typedef struct {
    long n;
    double mean, p10, p25, p50, p75, p90;
} dist;

static dist summarize(float *v, long n, double sum)
{
    dist d = {n, div0(sum, (double)n), NAN, NAN, NAN, NAN, NAN};
    if (v && n > 0) {
        d.p10 = sfi_analyze_quantile(v, n, 0.10);
        d.p25 = sfi_analyze_quantile(v, n, 0.25);
        d.p50 = sfi_analyze_quantile(v, n, 0.50);
        d.p75 = sfi_analyze_quantile(v, n, 0.75);
        d.p90 = sfi_analyze_quantile(v, n, 0.90);
    }
    return d;
}

/* All layers pooled (a copy, so per-layer arrays stay usable). */
static dist summarize_all(sfi_analyze_result *r, int across)
{
    long n = 0;
    double sum = 0;
    for (int l = 0; l < r->n_layers; l++) {
        n += across ? r->ja_n[l] : r->jw_n[l];
        sum += across ? r->ja_sum[l] : r->jw_sum[l];
    }
    float *all = NULL;
    if ((across ? r->ja : r->jw) && n > 0 && (all = malloc(sizeof(float) * (size_t)n))) {
        long k = 0;
        for (int l = 0; l < r->n_layers; l++) {
            long m = across ? r->ja_n[l] : r->jw_n[l];
            memcpy(all + k, across ? r->ja[l] : r->jw[l], sizeof(float) * (size_t)m);
            k += m;
        }
    }
    dist d = summarize(all, n, sum);
    free(all);
    return d;
}

/* Buckets of "steps since the last slow step". */
static const int since_lo[] = {1, 2, 4, 8, 16, 32, 64};
static const int since_hi[] = {1, 3, 7, 15, 31, 63, SFI_ANALYZE_SINCE_MAX};
#define N_SINCE 7

static void since_bucket(const sfi_analyze_policy *p, int b, double *n, double *rec)
{
    *n = 0;
    double s = 0;
    for (int i = since_lo[b]; i <= since_hi[b]; i++)
        *n += p->since_n[i], s += p->since_recall[i];
    *rec = div0(s, *n);
}

static void fmt(char *buf, size_t n, double v, const char *f)
{
    if (isnan(v))
        snprintf(buf, n, "-");
    else
        snprintf(buf, n, f, v);
}

static int write_table(FILE *out, const sfi_analyze_report_info *info, sfi_analyze_result *r)
{
    fprintf(out, "trace %s: %d steps, %d layers x %d KV heads; budget %s (mean %.1f%% of the "
                 "context)\n", info->trace, info->n_steps, info->n_layers, info->n_kv_heads,
            info->budget, 100.0 * div0(r->budget_sum, r->ctx_sum));
    fprintf(out, "\n%-10s %8s %9s %8s %8s %8s %9s %6s\n", "policy", "ratio", "recall",
            "rec_lo", "overlap", "out_err", "n", "exact");
    int any_exact = 0;
    for (int k = 0; k < SFI_POLICY_N_KINDS; k++) {
        sfi_analyze_policy *p = &r->pol[k];
        if (!p->used)
            continue;
        if (!p->available) {
            fprintf(out, "%-10s %s\n", sfi_policy_kind_name((sfi_policy_kind)k),
                    "n/a: needs q/K snapshots, the trace has none");
            continue;
        }
        char e[32];
        fmt(e, sizeof e, div0(p->out_err, p->n_err), "%8.4f");
        any_exact |= p->exact > 0;
        fprintf(out, "%-10s %7.2f%% %9.4f %8.4f %8.4f %8s %9.0f %5.0f%%\n",
                sfi_policy_kind_name((sfi_policy_kind)k), 100.0 * p->ratio / p->n, p->recall / p->n,
                p->recall_lo / p->n, p->overlap / p->n, e, p->n, 100.0 * p->exact / p->n);
    }
    fprintf(out, "(ratio: mean retained share of the context; recall: dense attention mass in the "
                 "set%s; rec_lo: recorded entries only; overlap: share of the oracle top set "
                 "kept; exact: share measured on q/K snapshots with the policy's own rule)\n",
            any_exact ? " (exact on q/K snapshots, else the tail spread evenly)"
                      : ", tail spread evenly");
    /* What each policy stood on: its paper's rule, or a named proxy. */
    fprintf(out, "\nproxies (a policy not listed ran its paper's rule on what it needed):\n");
    int n_notes = 0;
    for (int k = 0; k < SFI_POLICY_N_KINDS; k++) {
        sfi_analyze_policy *p = &r->pol[k];
        if (!p->used || !p->available)
            continue;
        const char *nm = sfi_policy_kind_name((sfi_policy_kind)k);
        if (p->proxy)
            fprintf(out, "  %-10s %s\n", nm, p->proxy), n_notes++;
        if (p->exact < p->n && k != SFI_POLICY_FULL && k != SFI_POLICY_STREAMING)
            fprintf(out, "  %-10s %.0f%% of head-steps on the recorded top-M attention instead "
                         "of q/K\n", nm, 100.0 * (1.0 - p->exact / p->n)), n_notes++;
    }
    if (!n_notes)
        fprintf(out, "  none\n");
    if (r->n_kascade_anchors > 0 && r->pol[SFI_POLICY_KASCADE].used) {
        fprintf(out, "kascade anchors (layer 0 dense):");
        for (int i = 0; i < r->n_kascade_anchors; i++)
            fprintf(out, " %d", r->kascade_anchors[i]);
        fprintf(out, "; calibration: %s\n",
                r->kascade_proxy ? "a stand-in from the trace's first steps (leaks)"
                                 : info->calib ? info->calib : "given");
    }
    sfi_analyze_policy *lf = &r->pol[SFI_POLICY_LFPS];
    if (lf->used && lf->available && lf->n > 0)
        fprintf(out, "lfps candidates: %.2f%% of the context on average (sfi-sim sweep "
                     "--param lfps_cand=%.4f prices them)\n", 100.0 * lf->cand / lf->n,
                lf->cand / lf->n);
    sfi_analyze_policy *s = &r->pol[SFI_POLICY_SFI];
    if (s->used && s->n_steps > 0) {
        char a[32], b[32], c[32];
        fmt(a, sizeof a, div0(s->fast_recall, s->fast_n), "%.4f");
        fmt(b, sizeof b, div0(s->before_recall, s->before_n), "%.4f");
        fmt(c, sizeof c, div0(s->after_recall, s->after_n), "%.4f");
        fprintf(out, "\nsfi: slow steps %.2f%%, recall on fast steps %s; around a trigger: "
                     "before %s (n=%.0f), after %s (n=%.0f)\n", 100.0 * s->n_slow / s->n_steps, a,
                b, s->before_n, c, s->after_n);
        fprintf(out, "sfi recall by steps since the last slow step:");
        for (int i = 0; i < N_SINCE; i++) {
            double n, rec;
            since_bucket(s, i, &n, &rec);
            if (n > 0)
                fprintf(out, "  %d-%d: %.4f", since_lo[i], since_hi[i], rec);
        }
        fprintf(out, "\n");
    }
    fprintf(out, "\nsupport stability (Jaccard of consecutive top sets)\n");
    fprintf(out, "%-6s %8s %7s %7s %7s %7s | %8s %7s %7s %7s %7s\n", "layer", "n_within", "mean",
            "p10", "p50", "p90", "n_across", "mean", "p10", "p50", "p90");
    for (int l = -1; l < r->n_layers; l++) {
        dist w, a;
        if (l < 0) {
            w = summarize_all(r, 0);
            a = summarize_all(r, 1);
        } else {
            w = summarize(r->jw ? r->jw[l] : NULL, r->jw_n[l], r->jw_sum[l]);
            a = summarize(r->ja ? r->ja[l] : NULL, r->ja_n[l], r->ja_sum[l]);
        }
        char lb[16], c[8][16];
        snprintf(lb, sizeof lb, l < 0 ? "all" : "%d", l);
        double v[8] = {w.mean, w.p10, w.p50, w.p90, a.mean, a.p10, a.p50, a.p90};
        for (int i = 0; i < 8; i++)
            fmt(c[i], sizeof c[i], v[i], "%.4f");
        fprintf(out, "%-6s %8ld %7s %7s %7s %7s | %8ld %7s %7s %7s %7s\n", lb, w.n, c[0], c[1],
                c[2], c[3], a.n, c[4], c[5], c[6], c[7]);
    }
    return ferror(out) ? -1 : 0;
}

static void csv_row(FILE *out, const char *sec, const char *name, int layer, const char *metric,
                    double v)
{
    if (layer >= 0)
        fprintf(out, "%s,%s,%d,%s,%.9g\n", sec, name, layer, metric, v);
    else
        fprintf(out, "%s,%s,,%s,%.9g\n", sec, name, metric, v);
}

static int write_csv(FILE *out, const sfi_analyze_report_info *info, sfi_analyze_result *r)
{
    fprintf(out, "section,name,layer,metric,value\n");
    csv_row(out, "trace", "budget_ratio", -1, "mean", div0(r->budget_sum, r->ctx_sum));
    csv_row(out, "trace", "steps", -1, "count", info->n_steps);
    for (int k = 0; k < SFI_POLICY_N_KINDS; k++) {
        sfi_analyze_policy *p = &r->pol[k];
        const char *nm = sfi_policy_kind_name((sfi_policy_kind)k);
        if (!p->used || !p->available)
            continue;
        csv_row(out, "policy", nm, -1, "ratio", p->ratio / p->n);
        csv_row(out, "policy", nm, -1, "recall", p->recall / p->n);
        csv_row(out, "policy", nm, -1, "recall_lo", p->recall_lo / p->n);
        csv_row(out, "policy", nm, -1, "overlap", p->overlap / p->n);
        if (p->n_err > 0)
            csv_row(out, "policy", nm, -1, "out_err", p->out_err / p->n_err);
        csv_row(out, "policy", nm, -1, "n", p->n);
        csv_row(out, "policy", nm, -1, "exact_share", p->exact / p->n);
        if (k == SFI_POLICY_LFPS)
            csv_row(out, "policy", nm, -1, "candidates", p->cand / p->n);
        for (int l = 0; l < r->n_layers; l++) {
            size_t i = (size_t)k * r->n_layers + l;
            if (r->layer_n[i] > 0)
                csv_row(out, "policy", nm, l, "recall", r->layer_recall[i] / r->layer_n[i]);
        }
    }
    sfi_analyze_policy *s = &r->pol[SFI_POLICY_SFI];
    if (s->used && s->n_steps > 0) {
        csv_row(out, "sfi", "slow_fraction", -1, "value", s->n_slow / s->n_steps);
        csv_row(out, "sfi", "fast_recall", -1, "value", div0(s->fast_recall, s->fast_n));
        csv_row(out, "sfi", "before_trigger_recall", -1, "value",
                div0(s->before_recall, s->before_n));
        csv_row(out, "sfi", "after_trigger_recall", -1, "value", div0(s->after_recall, s->after_n));
        for (int i = 1; i <= SFI_ANALYZE_SINCE_MAX; i++)
            if (s->since_n[i] > 0) {
                char nm[32];
                snprintf(nm, sizeof nm, "since_%d", i);
                csv_row(out, "sfi", nm, -1, "recall", s->since_recall[i] / s->since_n[i]);
            }
    }
    for (int l = -1; l < r->n_layers; l++)
        for (int a = 0; a < 2; a++) {
            dist d = l < 0 ? summarize_all(r, a)
                           : a ? summarize(r->ja ? r->ja[l] : NULL, r->ja_n[l], r->ja_sum[l])
                               : summarize(r->jw ? r->jw[l] : NULL, r->jw_n[l], r->jw_sum[l]);
            const char *nm = a ? "across" : "within";
            int lay = l < 0 ? -1 : l;
            csv_row(out, "stability", nm, lay, "n", (double)d.n);
            csv_row(out, "stability", nm, lay, "mean", d.mean);
            csv_row(out, "stability", nm, lay, "p10", d.p10);
            csv_row(out, "stability", nm, lay, "p25", d.p25);
            csv_row(out, "stability", nm, lay, "p50", d.p50);
            csv_row(out, "stability", nm, lay, "p75", d.p75);
            csv_row(out, "stability", nm, lay, "p90", d.p90);
        }
    return ferror(out) ? -1 : 0;
}

static json_t *jnum(double v)
{
    return isnan(v) ? json_null() : json_real(v);
}

static json_t *jdist(dist d)
{
    json_t *o = json_object();
    json_object_set_new(o, "n", json_integer(d.n));
    json_object_set_new(o, "mean", jnum(d.mean));
    json_object_set_new(o, "p10", jnum(d.p10));
    json_object_set_new(o, "p25", jnum(d.p25));
    json_object_set_new(o, "p50", jnum(d.p50));
    json_object_set_new(o, "p75", jnum(d.p75));
    json_object_set_new(o, "p90", jnum(d.p90));
    return o;
}

static int write_json(FILE *out, const sfi_analyze_report_info *info, sfi_analyze_result *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "trace", json_string(info->trace));
    json_object_set_new(o, "budget", json_string(info->budget));
    json_object_set_new(o, "mean_budget_ratio", jnum(div0(r->budget_sum, r->ctx_sum)));
    json_object_set_new(o, "steps", json_integer(info->n_steps));
    json_object_set_new(o, "layers", json_integer(info->n_layers));
    json_object_set_new(o, "kv_heads", json_integer(info->n_kv_heads));
    json_object_set_new(o, "snapshots", json_integer(info->n_snapshots));
    json_t *pols = json_array();
    for (int k = 0; k < SFI_POLICY_N_KINDS; k++) {
        sfi_analyze_policy *p = &r->pol[k];
        if (!p->used)
            continue;
        json_t *j = json_object();
        json_object_set_new(j, "name", json_string(sfi_policy_kind_name((sfi_policy_kind)k)));
        json_object_set_new(j, "available", json_boolean(p->available));
        json_object_set_new(j, "proxy", p->proxy ? json_string(p->proxy) : json_null());
        if (p->available) {
            json_object_set_new(j, "n", json_real(p->n));
            json_object_set_new(j, "ratio", json_real(p->ratio / p->n));
            json_object_set_new(j, "recall", json_real(p->recall / p->n));
            json_object_set_new(j, "recall_lo", json_real(p->recall_lo / p->n));
            json_object_set_new(j, "overlap", json_real(p->overlap / p->n));
            json_object_set_new(j, "out_err", jnum(div0(p->out_err, p->n_err)));
            json_object_set_new(j, "exact_share", json_real(p->exact / p->n));
            if (k == SFI_POLICY_LFPS)
                json_object_set_new(j, "candidates", json_real(p->cand / p->n));
            json_t *lr = json_array();
            for (int l = 0; l < r->n_layers; l++) {
                size_t i = (size_t)k * r->n_layers + l;
                json_array_append_new(lr, jnum(div0(r->layer_recall[i], r->layer_n[i])));
            }
            json_object_set_new(j, "layer_recall", lr);
        }
        json_array_append_new(pols, j);
    }
    json_object_set_new(o, "policies", pols);
    sfi_analyze_policy *s = &r->pol[SFI_POLICY_SFI];
    if (s->used && s->n_steps > 0) {
        json_t *j = json_object();
        json_object_set_new(j, "slow_fraction", json_real(s->n_slow / s->n_steps));
        json_object_set_new(j, "fast_recall", jnum(div0(s->fast_recall, s->fast_n)));
        json_object_set_new(j, "before_trigger_recall", jnum(div0(s->before_recall, s->before_n)));
        json_object_set_new(j, "after_trigger_recall", jnum(div0(s->after_recall, s->after_n)));
        json_t *since = json_array();
        for (int i = 1; i <= SFI_ANALYZE_SINCE_MAX; i++)
            if (s->since_n[i] > 0) {
                json_t *e = json_object();
                json_object_set_new(e, "steps", json_integer(i));
                json_object_set_new(e, "n", json_real(s->since_n[i]));
                json_object_set_new(e, "recall", json_real(s->since_recall[i] / s->since_n[i]));
                json_array_append_new(since, e);
            }
        json_object_set_new(j, "recall_since_slow", since);
        json_object_set_new(o, "sfi", j);
    }
    if (r->n_kascade_anchors > 0 && r->pol[SFI_POLICY_KASCADE].used) {
        json_t *a = json_array();
        for (int i = 0; i < r->n_kascade_anchors; i++)
            json_array_append_new(a, json_integer(r->kascade_anchors[i]));
        json_object_set_new(o, "kascade_anchors", a);
    }
    json_t *st = json_object();
    json_object_set_new(st, "within", jdist(summarize_all(r, 0)));
    json_object_set_new(st, "across", jdist(summarize_all(r, 1)));
    json_t *layers = json_array();
    for (int l = 0; l < r->n_layers; l++) {
        json_t *e = json_object();
        json_object_set_new(e, "layer", json_integer(l));
        json_object_set_new(e, "within",
                            jdist(summarize(r->jw ? r->jw[l] : NULL, r->jw_n[l], r->jw_sum[l])));
        json_object_set_new(e, "across",
                            jdist(summarize(r->ja ? r->ja[l] : NULL, r->ja_n[l], r->ja_sum[l])));
        json_array_append_new(layers, e);
    }
    json_object_set_new(st, "layers", layers);
    json_object_set_new(o, "stability", st);
    int rc = json_dumpf(o, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    fputc('\n', out);
    json_decref(o);
    return rc || ferror(out) ? -1 : 0;
}

int sfi_analyze_report_write(FILE *out, sfi_analyze_format f, const sfi_analyze_report_info *info,
                             sfi_analyze_result *r)
{
    switch (f) {
    case SFI_ANALYZE_CSV:
        return write_csv(out, info, r);
    case SFI_ANALYZE_JSON:
        return write_json(out, info, r);
    default:
        return write_table(out, info, r);
    }
}

sfi_status sfi_analyze_png_support(const char *path, const sfi_analyze_source *src, int layer,
                                   int kvh, sfi_error *err)
{
    int S = src->n_steps, NY = src->max_ctx < 200 ? src->max_ctx : 200;
    if (S > 2000)
        S = 2000;  /* the picture shows the first 2000 steps */
    double *z = calloc((size_t)S * NY, sizeof(double));
    int32_t *pb = malloc(sizeof(int32_t) * (size_t)src->max_top);
    float *qb = malloc(sizeof(float) * (size_t)src->max_top);
    sfi_plot *p = sfi_plot_new(1200, 700, 1, 1);
    sfi_status st = SFI_OK;
    if (!z || !pb || !qb || !p) {
        st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    double ymax = src->max_ctx;
    for (int t = 0; t < S; t++) {
        sfi_policy_obs o;
        if (src->get(src->ctx, t, layer, kvh, &o, pb, qb, err)) {
            st = err ? err->code : SFI_EFORMAT;
            goto out;
        }
        for (int i = 0; i < o.n_top; i++) {
            int y = (int)((double)o.pos[i] * NY / ymax);
            if (y >= NY)
                y = NY - 1;
            z[(size_t)y * S + t] += o.prob[i];
        }
    }
    char title[128];
    snprintf(title, sizeof title, "attention support, layer %d KV head %d (lines: sentence ends)",
             layer, kvh);
    if ((st = sfi_plot_axes(p, 0, title, "decode step", "position", 0, err)) ||
        (st = sfi_plot_heatmap(p, 0, z, S, NY, 0, S, 0, ymax, "attention mass", err)))
        goto out;
    for (int t = 0; t < S; t++)
        if (src->trigger[t]) {
            double x[2] = {t + 1, t + 1}, y[2] = {0, ymax};
            if ((st = sfi_plot_line(p, 0, "sentence end", x, y, 2, 0, err)))
                goto out;
        }
    st = sfi_plot_write_png(p, path, err);
out:
    free(z);
    free(pb);
    free(qb);
    sfi_plot_free(p);
    return st;
}

sfi_status sfi_analyze_png_budget(const char *path, const double *ratios, sfi_analyze_result *res,
                                  int n, sfi_error *err)
{
    sfi_plot *p = sfi_plot_new(1000, 650, 1, 1);
    if (!p)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    sfi_status st = sfi_plot_axes(p, 0, "attention-mass recall vs budget",
                                  "budget (share of the context)", "recall", SFI_PLOT_XLOG10, err);
    double x[64], y[64];
    for (int k = 0; !st && k < SFI_POLICY_N_KINDS; k++) {
        int m = 0;
        for (int i = 0; i < n && m < 64; i++) {
            sfi_analyze_policy *q = &res[i].pol[k];
            if (q->used && q->available && q->n > 0) {
                x[m] = ratios[i];
                y[m] = q->recall / q->n;
                m++;
            }
        }
        /* SFI stands out, full KV (recall 1) is the reference line. */
        if (m > 0)
            st = sfi_plot_line_styled(p, 0, sfi_policy_kind_name((sfi_policy_kind)k), x, y, (size_t)m,
                                      1,
                                      k == SFI_POLICY_SFI    ? SFI_PLOT_PRIMARY
                                      : k == SFI_POLICY_FULL ? SFI_PLOT_REFERENCE
                                                           : SFI_PLOT_PLAIN,
                                      err);
    }
    if (!st)
        st = sfi_plot_write_png(p, path, err);
    sfi_plot_free(p);
    return st;
}

sfi_status sfi_analyze_png_stability(const char *path, sfi_analyze_result *r, sfi_error *err)
{
    int L = r->n_layers;
    sfi_plot *p = sfi_plot_new(1000, 650, 1, 1);
    double *x = malloc(sizeof(double) * (size_t)L * 7);
    if (!p || !x) {
        sfi_plot_free(p);
        free(x);
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    }
    double *wm = x + L, *w10 = wm + L, *w90 = w10 + L, *am = w90 + L, *a10 = am + L, *a90 = a10 + L;
    for (int l = 0; l < L; l++) {
        dist w = summarize(r->jw ? r->jw[l] : NULL, r->jw_n[l], r->jw_sum[l]);
        dist a = summarize(r->ja ? r->ja[l] : NULL, r->ja_n[l], r->ja_sum[l]);
        x[l] = l;
        wm[l] = w.mean, w10[l] = w.p10, w90[l] = w.p90;
        am[l] = a.mean, a10[l] = a.p10, a90[l] = a.p90;
    }
    /* Mean as a line, 10th-90th percentile as a band of the same colour. */
    static const char *const within = "within a sentence", *const across = "across a boundary";
    sfi_status st = sfi_plot_axes(p, 0,
                                  "support stability: Jaccard of consecutive top sets "
                                  "(line: mean; band: 10th-90th percentile)",
                                  "layer", "Jaccard", SFI_PLOT_YZERO, err);
    if (!st) st = sfi_plot_line_styled(p, 0, within, x, wm, (size_t)L, 1, SFI_PLOT_PLAIN, err);
    if (!st) st = sfi_plot_band(p, 0, within, x, w10, w90, (size_t)L, SFI_PLOT_PLAIN, err);
    if (!st) st = sfi_plot_line_styled(p, 0, across, x, am, (size_t)L, 1, SFI_PLOT_PRIMARY, err);
    if (!st) st = sfi_plot_band(p, 0, across, x, a10, a90, (size_t)L, SFI_PLOT_PRIMARY, err);
    if (!st)
        st = sfi_plot_write_png(p, path, err);
    sfi_plot_free(p);
    free(x);
    return st;
}
