/* sfi-sim sweep (also the default run): replays a trace's token stream
 * through the trigger policies and prices every (model, GPU, TP, context,
 * batch, policy) with the cost model; table/CSV/JSON and PNG figures. */
#include <config.h>

#include "sfi_sim_cli.h"

#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "sfi_cost.h"
#include "sfi_io.h"
#include "sfi_model.h"
#include "sfi_plot.h"
#include "sfi_replay.h"
#include "sfi_sim_stream.h"
#include "sfi_sim_util.h"

#define DEFAULT_MODELS "Qwen3-0.6B,Qwen3-4B,Qwen3-30B-A3B,Qwen3-235B-A22B"
#define DEFAULT_CONTEXTS "8K,16K,32K,64K,128K"
#define DEFAULT_PNG "sfi-sim-sweep.png"
#define TIMELINE_STEPS 512

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sfi-sim [sweep] [OPTIONS]\n\n"
            "Replays a trace's token stream through trigger policies and prices each step\n"
            "of every policy at one budget with a GPU cost model, for every combination\n"
            "of the lists below. Without\n"
            "options: contexts 8K..128K, Qwen3 presets, B200, all policies, the bundled\n"
            "sample trace; prints a table and writes " DEFAULT_PNG ".\n\n"
            "options (LIST = comma-separated values; --model, --gpu, --context and\n"
            "--policy are the same as the plural forms):\n"
            "  --models LIST     Qwen3 presets or config.json paths [" DEFAULT_MODELS "]\n"
            "  --gpus LIST       B200, H200, H100-SXM or GPU JSON files [B200]\n"
            "  --tp LIST         tensor-parallel degrees (GPUs per batch), or auto: per\n"
            "                    context, the fewest GPUs (power of two <= 8) at which\n"
            "                    every policy fits the batch [auto]; 1 for one GPU\n"
            "  --contexts LIST   context lengths, K = 1024 [" DEFAULT_CONTEXTS "]\n"
            "  --batch LIST      requests decoded together [8]\n"
            "  --policies LIST   policies, NAME or NAME:key=value,... [all]; keys: the\n"
            "                    policy's own (see 'sfi-sim presets') and K, n_sink,\n"
            "                    n_recent, T_max, e.g. sfi,sfi:T_max=32,quest:page=32\n"
            "  --budget B        positions per KV head per step, sink and recent\n"
            "                    included, for every policy: a share (6%%, 0.06), a\n"
            "                    count, or sfi = n_sink + K + n_recent [sfi]\n"
            "  --trace FILE      tokens-level trace (default: $SFI_TRACE, else the\n"
            "                    bundled traces/sample-*.db, else traces/*.db)\n"
            "  --tokenizer DIR   vocabulary for the trigger set [the trace's recorded\n"
            "                    sfi decisions when they tell, else bundled Qwen3]\n"
            "  --synthetic       use a synthetic trigger stream instead of a trace\n"
            "  --steps N         batch steps replayed per cell [2048]\n"
            "  --profile FILE    calibration profile JSON [built-in default]\n"
            "  --param KEY=VAL   SFI or policy parameter (K, n_sink, n_recent, T_max,\n"
            "                    quest_page, lfps_cand, ...); repeatable\n"
            "  --weight-bytes N  bytes per weight: 2 (bf16) or 1 (fp8) [2]\n"
            "  --kv-dtype T      KV cache elements: bf16 or fp8 [bf16]\n"
            "  --format F        table, csv or json [table]\n"
            "  -o, --output FILE write the table there instead of stdout\n"
            "  --png FILE        figure: tokens/s per GPU and speedup vs context (bars\n"
            "                    for one context) [" DEFAULT_PNG "]\n"
            "  --no-png          do not write the figure\n"
            "  --timeline-png FILE  per-step latency of the first %d steps\n"
            "  -h, --help        this help\n\n"
            "Sizes: GB = 1e9 bytes, MB = 1e6 bytes; memory columns are per GPU.\n"
            "Exit status: 0 ok, 1 bad input or nothing fits, 2 usage error.\n"
            "See sfi-sim-sweep(1).\n",
            TIMELINE_STEPS);
}

typedef struct {
    int model, gpu, tp, context, batch, policy;
    int tp_index; /* which --tp entry (auto is resolved per context) */
    int fits, max_batch;
    double tok_s, speedup, mean_s, p50_s, p99_s, slow_frac, bytes_per_tok, kv_per_req, exposed_s;
    /* Memory on one GPU: weights, weights + batch x per-request state (what
     * the batch uses, or would need when it does not fit), usable HBM. */
    double weights_gpu, hbm_gpu, usable_gpu;
} row;

typedef struct {
    char *name; /* policy spec as given */
    sfi_policy_kind kind;
    /* Its parameters: --param's, overridden by the spec's own (policy keys,
     * and K, n_sink, n_recent or T_max, e.g. "sfi:T_max=32"). */
    sfi_policy_config cfg;
} policy_spec;

typedef struct {
    sfi_model_config *models;
    char **model_names;
    int n_models;
    sfi_gpu *gpus;
    int n_gpus;
    int *tps; /* 0 = auto */
    int n_tps;
    int *contexts;
    int n_contexts;
    int *batches;
    int n_batches;
    policy_spec *pols;
    int n_pols;
    sfi_hw_profile prof;
    sfi_policy_config cfg; /* --param: SFI and policy parameters */
    sfi_budget budget;     /* --budget, the same for every policy */
    int weight_bytes;
    int kv_bytes;
    int64_t steps;
    sfi_sim_stream stream;
} sweep;

static void sweep_free(sweep *s)
{
    free(s->models);
    for (int i = 0; i < s->n_models; i++)
        free(s->model_names[i]);
    free(s->model_names);
    free(s->gpus);
    free(s->tps);
    free(s->contexts);
    free(s->batches);
    for (int i = 0; i < s->n_pols; i++)
        free(s->pols[i].name);
    free(s->pols);
    sfi_sim_stream_free(&s->stream);
}

/* ---- statistics of one cell ---- */

typedef struct {
    double t, n;
} tn;

static int cmp_tn(const void *a, const void *b)
{
    double x = ((const tn *)a)->t, y = ((const tn *)b)->t;
    return x < y ? -1 : x > y;
}

/* Nearest-rank quantile of the step-time distribution. */
static double quantile(tn *v, int m, double total, double q)
{
    double rank = ceil(q * total), c = 0;
    for (int i = 0; i < m; i++) {
        c += v[i].n;
        if (c >= rank)
            return v[i].t;
    }
    return m ? v[m - 1].t : 0;
}

static int64_t stagger_of(const policy_spec *p)
{
    return p->kind == SFI_POLICY_INTERVAL ? p->cfg.interval : p->cfg.prm.T_max;
}

static sfi_status price_cell(const sfi_cost_setup *cs, const sfi_replay_result *rp, row *r,
                             double **step_time, sfi_error *err)
{
    const int B = cs->batch;
    assert(!rp || rp->batch == B); /* rp->hist has batch + 1 entries */
    sfi_cost_memory mem;
    sfi_status st = sfi_cost_memory_of(cs, &mem, err);
    if (st)
        return st;
    r->max_batch = mem.max_batch;
    r->kv_per_req = mem.kv_per_request;
    r->fits = B <= mem.max_batch;
    r->weights_gpu = mem.weights;
    r->hbm_gpu = mem.weights + mem.scratch + B * mem.kv_per_request;
    r->usable_gpu = mem.usable;
    tn *v = malloc((size_t)(B + 1) * sizeof *v);
    double *tt = step_time ? calloc((size_t)B + 1, sizeof *tt) : NULL;
    if (!v || (step_time && !tt)) {
        free(v);
        free(tt);
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    }
    int m = 0;
    double sum_t = 0, sum_b = 0, sum_x = 0, total = 0;
    for (int n = 0; n <= B; n++) {
        double cnt = rp ? (double)rp->hist[n] : (n == 0 ? 1.0 : 0.0);
        if (cnt == 0)
            continue;
        sfi_step_cost c;
        if ((st = sfi_cost_step(cs, n, &c, err))) {
            free(v);
            free(tt);
            return st;
        }
        v[m].t = c.time_s;
        v[m].n = cnt;
        m++;
        if (tt)
            tt[n] = c.time_s;
        sum_t += cnt * c.time_s;
        sum_b += cnt * c.hbm_bytes;
        sum_x += cnt * c.exposed_s;
        total += cnt;
    }
    qsort(v, (size_t)m, sizeof *v, cmp_tn);
    r->mean_s = sum_t / total;
    r->p50_s = quantile(v, m, total, 0.50);
    r->p99_s = quantile(v, m, total, 0.99);
    r->tok_s = B / r->mean_s;
    r->bytes_per_tok = sum_b / total / B;
    r->exposed_s = sum_x / total;
    r->slow_frac =
        rp ? (double)rp->slow / ((double)rp->steps * B) : (cs->kind == SFI_POLICY_FULL ? 1.0 : 0.0);
    free(v);
    if (step_time)
        *step_time = tt;
    return SFI_OK;
}

/* ---- option parsing ---- */

/* SFI parameters a policy spec may set for itself: the ones the cost
 * model and the replay read (the Selector's own knobs do not change what a
 * step costs). */
static int is_policy_sfi_key(const char *key)
{
    return !strcmp(key, "K") || !strcmp(key, "n_sink") || !strcmp(key, "n_recent") ||
           !strcmp(key, "T_max");
}

static int is_sfi_key(const char *key)
{
    for (size_t i = 0; i < sfi_params_key_count(); i++)
        if (!strcmp(key, sfi_params_key_name(i)))
            return 1;
    return 0;
}

/* "NAME[:key=value,...]" (sfi_policy_spec_parse) from --param's values; of
 * the SFI parameters a spec may set only those that change what a step
 * costs or when it is slow (K, n_sink, n_recent, T_max), T_max for sfi and
 * tmax only. */
static sfi_status parse_policy_spec(const char *spec, const sfi_policy_config *global,
                                    policy_spec *out, sfi_error *err)
{
    out->cfg = *global;
    sfi_status st = sfi_policy_spec_parse(spec, &out->kind, &out->cfg, err);
    if (st)
        return st;
    int has_tmax = 0;
    for (const char *it = strchr(spec, ':'); it && *it;) {
        it++;
        size_t klen = strcspn(it, "=,");
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)(klen < sizeof key ? klen : sizeof key - 1), it);
        if (is_sfi_key(key) && !is_policy_sfi_key(key))
            return sfi_error_set(err, SFI_EINVAL,
                                 "policy '%s': %s does not change what a step costs; a policy "
                                 "may set K, n_sink, n_recent and T_max (the others: --param)",
                                 spec, key);
        has_tmax |= !strcmp(key, "T_max");
        it = strchr(it, ',');
    }
    if (has_tmax && out->kind != SFI_POLICY_SFI && out->kind != SFI_POLICY_TMAX)
        return sfi_error_set(err, SFI_EINVAL, "policy '%s': T_max applies to sfi and tmax only",
                             spec);
    if ((st = sfi_params_validate(&out->cfg.prm, err)) != SFI_OK)
        sfi_error_prefix(err, "policy '%s'", spec);
    return st;
}

/* Every policy of ref/sfi_policies.h with the sweep's parameters. */
static int all_policies(const sfi_policy_config *cfg, policy_spec **out)
{
    policy_spec *p = calloc(SFI_POLICY_N_KINDS, sizeof *p);
    if (!p)
        return -1;
    for (int k = 0; k < SFI_POLICY_N_KINDS; k++) {
        p[k].kind = (sfi_policy_kind)k;
        p[k].cfg = *cfg;
        p[k].name = strdup(sfi_policy_kind_name((sfi_policy_kind)k));
    }
    *out = p;
    return SFI_POLICY_N_KINDS;
}

static int parse_int_list(const char *what, const char *arg, int allow_auto, int kilo, int lo,
                          int hi, int **out)
{
    char **v;
    int n = sfi_sim_split_list(arg, &v);
    if (n < 0)
        return -1;
    int *x = calloc((size_t)n, sizeof *x);
    if (!x) {
        sfi_sim_free_list(v, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (allow_auto && !strcasecmp(v[i], "auto")) {
            x[i] = 0;
            continue;
        }
        int64_t val;
        if (sfi_sim_parse_size(v[i], kilo, &val) || val < lo || val > hi) {
            fprintf(stderr, "sfi-sim sweep: %s: '%s' is not %s in %d..%d\n", what, v[i],
                    kilo ? "a size (e.g. 32K)" : "an integer", lo, hi);
            free(x);
            sfi_sim_free_list(v, n);
            return -2;
        }
        x[i] = (int)val;
    }
    sfi_sim_free_list(v, n);
    *out = x;
    return n;
}

/* ---- output ---- */

static void context_label(int c, char *buf, size_t n)
{
    if (c >= 1048576 && c % 1048576 == 0)
        snprintf(buf, n, "%dM", c / 1048576);
    else if (c >= 1024 && c % 1024 == 0)
        snprintf(buf, n, "%dK", c / 1024);
    else
        snprintf(buf, n, "%d", c);
}

static const char *model_label(const sweep *s, int i)
{
    return s->models[i].name[0] ? s->models[i].name : s->model_names[i];
}

/* Usable HBM per GPU of each GPU in the sweep, for the table's legend. */
static void usable_list(const sweep *s, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    for (int g = 0; g < s->n_gpus && len < n; g++)
        len += (size_t)snprintf(buf + len, n - len, "%s%.1f GB of %s's %.0f GB", g ? ", " : "",
                                s->gpus[g].hbm_capacity * SFI_COST_USABLE_HBM / 1e9,
                                s->gpus[g].name, s->gpus[g].hbm_capacity / 1e9);
}

static int any_auto(const sweep *s)
{
    for (int i = 0; i < s->n_tps; i++)
        if (s->tps[i] == 0)
            return 1;
    return 0;
}

static void print_table(FILE *f, const sweep *s, const row *rows, int n)
{
    char usable[512];
    usable_list(s, usable, sizeof usable);
    char bud[32];
    sfi_budget_format(&s->budget, bud, sizeof bud);
    fprintf(f,
            "# sfi-sim sweep: %s; %lld steps per cell; profile %s; budget %s (positions per "
            "KV head per step, every policy); K=%d n_sink=%d n_recent=%d T_max=%d%s\n",
            s->stream.label, (long long)s->steps, s->prof.name, bud, s->cfg.prm.K,
            s->cfg.prm.n_sink, s->cfg.prm.n_recent, s->cfg.prm.T_max,
            s->kv_bytes == 1 ? "; KV fp8" : "");
    fprintf(f,
            "# GPUs: the tensor-parallel group serving one batch%s; tok/s is the group's, "
            "tok/s/GPU = tok/s / GPUs\n",
            any_auto(s) ? " (--tp auto: per context, the fewest GPUs, a power of two up to 8, at "
                          "which every policy fits the batch)"
                        : "");
    fprintf(f,
            "# per GPU, GB = 1e9 bytes: KV_GB/req one request's KV cache and policy state, "
            "wts_GB the weights, HBM_GB = wts_GB + batch x KV_GB/req (usable: %s); "
            "HBM_MB/tok = 1e6 bytes read or written per token\n",
            usable);
    int wm = 16, wg = 9, wp = 10;
    for (int i = 0; i < s->n_models; i++)
        if ((int)strlen(model_label(s, i)) > wm)
            wm = (int)strlen(model_label(s, i));
    for (int i = 0; i < s->n_gpus; i++)
        if ((int)strlen(s->gpus[i].name) > wg)
            wg = (int)strlen(s->gpus[i].name);
    for (int i = 0; i < s->n_pols; i++)
        if ((int)strlen(s->pols[i].name) > wp)
            wp = (int)strlen(s->pols[i].name);
    fprintf(f, "%-*s %-*s %4s %7s %5s %-*s %10s %9s %7s %8s %8s %8s %6s %10s %9s %7s %7s %9s\n", wm,
            "model", wg, "gpu", "GPUs", "context", "batch", wp, "policy", "tok/s", "tok/s/GPU",
            "speedup", "mean_ms", "p50_ms", "p99_ms", "slow%", "HBM_MB/tok", "KV_GB/req", "wts_GB",
            "HBM_GB", "max_batch");
    int no_base = 0, no_weights = 0;
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        fprintf(f, "%-*s %-*s %4d %7d %5d %-*s ", wm, model_label(s, r->model), wg,
                s->gpus[r->gpu].name, r->tp, r->context, r->batch, wp, s->pols[r->policy].name);
        if (r->fits) {
            char sp[16] = "-";
            if (isfinite(r->speedup))
                snprintf(sp, sizeof sp, "%.2f", r->speedup);
            else
                no_base = 1;
            fprintf(f, "%10.1f %9.1f %7s %8.3f %8.3f %8.3f %6.2f %10.2f", r->tok_s,
                    r->tok_s / r->tp, sp, r->mean_s * 1e3, r->p50_s * 1e3, r->p99_s * 1e3,
                    r->slow_frac * 100, r->bytes_per_tok / 1e6);
        } else {
            fprintf(f, "%10s %9s %7s %8s %8s %8s %6s %10s", "no-fit", "-", "-", "-", "-", "-", "-",
                    "-");
        }
        if (r->max_batch == 0)
            no_weights |= r->weights_gpu >= r->usable_gpu ? 1 : 2;
        fprintf(f, " %9.3f %7.2f %7.2f %9d\n", r->kv_per_req / 1e9, r->weights_gpu / 1e9,
                r->hbm_gpu / 1e9, r->max_batch);
    }
    if (no_base)
        fprintf(f, "# speedup -: full KV does not fit this batch on these GPUs, so there is no "
                   "baseline to compare with\n");
    if (no_weights & 1)
        fprintf(f, "# max_batch 0 with wts_GB above the usable HBM: the weights alone do not fit "
                   "on these GPUs; use more GPUs (--tp) or fp8 weights (--weight-bytes 1)\n");
    if (no_weights & 2)
        fprintf(f, "# max_batch 0 with wts_GB below the usable HBM: the weights fit but not one "
                   "request's KV_GB/req beside them; use more GPUs (--tp) or a shorter context\n");
}

static void print_csv(FILE *f, const sweep *s, const row *rows, int n)
{
    fprintf(f, "model,gpu,tp,context,batch,policy,fits,tokens_per_s,speedup,mean_ms,p50_ms,p99_ms,"
               "slow_fraction,hbm_bytes_per_token,kv_bytes_per_request,max_batch,exposed_us,"
               "tokens_per_s_per_gpu,weight_bytes_per_gpu,hbm_bytes_per_gpu,"
               "usable_hbm_bytes_per_gpu\n");
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        sfi_sim_csv_str(f, model_label(s, r->model));
        fputc(',', f);
        sfi_sim_csv_str(f, s->gpus[r->gpu].name);
        fprintf(f, ",%d,%d,%d,", r->tp, r->context, r->batch);
        sfi_sim_csv_str(f, s->pols[r->policy].name);
        if (r->fits) {
            fprintf(f, ",1,%.6g,", r->tok_s);
            if (isfinite(r->speedup)) /* empty: full KV does not fit (no baseline) */
                fprintf(f, "%.6g", r->speedup);
            fprintf(f, ",%.6g,%.6g,%.6g,%.6g,%.6g", r->mean_s * 1e3, r->p50_s * 1e3, r->p99_s * 1e3,
                    r->slow_frac, r->bytes_per_tok);
        } else {
            fprintf(f, ",0,,,,,,,");
        }
        fprintf(f, ",%.6g,%d,", r->kv_per_req, r->max_batch);
        if (r->fits)
            fprintf(f, "%.6g", r->exposed_s * 1e6);
        fputc(',', f);
        if (r->fits)
            fprintf(f, "%.6g", r->tok_s / r->tp);
        fprintf(f, ",%.6g,%.6g,%.6g\n", r->weights_gpu, r->hbm_gpu, r->usable_gpu);
    }
}

static int print_json(FILE *f, const sweep *s, const row *rows, int n)
{
    json_t *root = json_object(), *arr = json_array();
    if (!root || !arr)
        return -1;
    json_object_set_new(root, "stream", json_string(s->stream.label));
    json_object_set_new(root, "steps_per_cell", json_integer(s->steps));
    json_object_set_new(root, "profile", json_string(s->prof.name));
    char bud[32];
    sfi_budget_format(&s->budget, bud, sizeof bud);
    json_object_set_new(root, "budget", json_string(bud));
    json_object_set_new(root, "K", json_integer(s->cfg.prm.K));
    json_object_set_new(root, "n_sink", json_integer(s->cfg.prm.n_sink));
    json_object_set_new(root, "n_recent", json_integer(s->cfg.prm.n_recent));
    json_object_set_new(root, "T_max", json_integer(s->cfg.prm.T_max));
    json_object_set_new(root, "kv_dtype", json_string(s->kv_bytes == 1 ? "fp8" : "bf16"));
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        json_t *o = json_object();
        json_object_set_new(o, "model", json_string(model_label(s, r->model)));
        json_object_set_new(o, "gpu", json_string(s->gpus[r->gpu].name));
        json_object_set_new(o, "tp", json_integer(r->tp));
        json_object_set_new(o, "context", json_integer(r->context));
        json_object_set_new(o, "batch", json_integer(r->batch));
        json_object_set_new(o, "policy", json_string(s->pols[r->policy].name));
        json_object_set_new(o, "fits", json_boolean(r->fits));
        if (r->fits) {
            json_object_set_new(o, "tokens_per_s", json_real(r->tok_s));
            json_object_set_new(o, "tokens_per_s_per_gpu", json_real(r->tok_s / r->tp));
            /* null: full KV does not fit this batch (no baseline). */
            json_object_set_new(o, "speedup",
                                isfinite(r->speedup) ? json_real(r->speedup) : json_null());
            json_object_set_new(o, "mean_ms", json_real(r->mean_s * 1e3));
            json_object_set_new(o, "p50_ms", json_real(r->p50_s * 1e3));
            json_object_set_new(o, "p99_ms", json_real(r->p99_s * 1e3));
            json_object_set_new(o, "slow_fraction", json_real(r->slow_frac));
            json_object_set_new(o, "hbm_bytes_per_token", json_real(r->bytes_per_tok));
            json_object_set_new(o, "exposed_us", json_real(r->exposed_s * 1e6));
        }
        json_object_set_new(o, "kv_bytes_per_request", json_real(r->kv_per_req));
        json_object_set_new(o, "max_batch", json_integer(r->max_batch));
        json_object_set_new(o, "weight_bytes_per_gpu", json_real(r->weights_gpu));
        json_object_set_new(o, "hbm_bytes_per_gpu", json_real(r->hbm_gpu));
        json_object_set_new(o, "usable_hbm_bytes_per_gpu", json_real(r->usable_gpu));
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "rows", arr);
    int rc = json_dumpf(root, f, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
    fputc('\n', f);
    json_decref(root);
    return rc;
}

static sfi_plot_emphasis emphasis_of(sfi_policy_kind k)
{
    return k == SFI_POLICY_SFI    ? SFI_PLOT_PRIMARY
           : k == SFI_POLICY_FULL ? SFI_PLOT_REFERENCE
                                  : SFI_PLOT_PLAIN;
}

static int same_group(const row *a, const row *b)
{
    return a->model == b->model && a->gpu == b->gpu && a->tp_index == b->tp_index &&
           a->batch == b->batch;
}

/* "1 H100-SXM" / "2x H100-SXM (TP 2)" for a fixed degree; under --tp auto
 * the degree per context, runs of equal degree merged: "TP auto: 1 GPU at
 * 8K-32K, 2 at 64K, 4 at 128K". */
static void gpus_label(const sweep *s, const row *rows, int n, const row *r0, char *buf, size_t cap)
{
    const char *gname = s->gpus[r0->gpu].name;
    if (s->tps[r0->tp_index] != 0) {
        if (r0->tp == 1)
            snprintf(buf, cap, "1 %s", gname);
        else
            snprintf(buf, cap, "%dx %s (TP %d)", r0->tp, gname, r0->tp);
        return;
    }
    /* The group's rows of its first policy, in context order. */
    int ctx[64], tp[64], m = 0;
    for (int i = 0; i < n && m < 64; i++)
        if (same_group(&rows[i], r0) && rows[i].policy == r0->policy) {
            ctx[m] = rows[i].context;
            tp[m] = rows[i].tp;
            m++;
        }
    int uniform = 1;
    for (int i = 1; i < m; i++)
        uniform &= tp[i] == tp[0];
    if (uniform) {
        snprintf(buf, cap, "%d %s%s (TP auto)", tp[0], gname, tp[0] > 1 ? "s" : "");
        return;
    }
    size_t len = (size_t)snprintf(buf, cap, "%ss, TP auto:", gname);
    for (int i = 0; i < m && len < cap;) {
        int j = i;
        while (j + 1 < m && tp[j + 1] == tp[i])
            j++;
        char c0[16], c1[16];
        context_label(ctx[i], c0, sizeof c0);
        context_label(ctx[j], c1, sizeof c1);
        len += (size_t)snprintf(buf + len, cap - len, "%s %d%s at %s%s%s", i ? "," : "", tp[i],
                                i ? "" : (tp[i] > 1 ? " GPUs" : " GPU"), c0, j > i ? "-" : "",
                                j > i ? c1 : "");
        i = j + 1;
    }
}

/* One row of two panels per (model, GPU, TP, batch) group: tokens/s per
 * GPU and speedup over full KV against the context (lines), or per policy
 * (bars) when the sweep has one context. SFI and full KV stand out. */
static sfi_status write_figure(const sweep *s, const row *rows, int n, const char *path,
                               sfi_error *err)
{
    int groups = 0;
    int gidx[16];
    for (int i = 0; i < n; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++)
            first = !same_group(&rows[j], &rows[i]);
        if (!first)
            continue;
        if (groups == 16) {
            fprintf(stderr, "sfi-sim: %s: only the first 16 (model, GPU, TP, batch) groups drawn\n",
                    path);
            break;
        }
        gidx[groups++] = i;
    }
    const int bars = s->n_contexts == 1;
    const int height = bars ? 70 + 30 * s->n_pols : 400;
    sfi_plot *p = sfi_plot_new(1800, height * groups, groups, 2);
    if (!p)
        return sfi_error_set(err, SFI_ENOMEM, "%s: cannot create figure", path);
    double *x = malloc((size_t)s->n_contexts * sizeof *x),
           *y1 = malloc((size_t)s->n_contexts * sizeof *y1),
           *y2 = malloc((size_t)s->n_contexts * sizeof *y2);
    sfi_status st = (!x || !y1 || !y2) ? sfi_error_set(err, SFI_ENOMEM, "out of memory") : SFI_OK;
    for (int g = 0; g < groups && !st; g++) {
        const row *r0 = &rows[gidx[g]];
        char gl[256], title[512], ctx[32] = "";
        gpus_label(s, rows, n, r0, gl, sizeof gl);
        if (bars)
            context_label(r0->context, ctx, sizeof ctx);
        /* What fits: nothing at all, and where full KV (the baseline) does
         * not fit although another policy does. */
        int any_fit = 0, max_mb = 0;
        double wmin = INFINITY, usable = 0;
        char nobase[256] = "";
        size_t nbl = 0;
        for (int i = 0; i < n; i++) {
            const row *r = &rows[i];
            if (!same_group(r, r0))
                continue;
            any_fit |= r->fits;
            wmin = fmin(wmin, r->weights_gpu);
            usable = r->usable_gpu;
            if (r->max_batch > max_mb)
                max_mb = r->max_batch;
            if (r->fits && !isfinite(r->speedup) && nbl < sizeof nobase - 16) {
                char c[16];
                context_label(r->context, c, sizeof c);
                if (!strstr(nobase, c))
                    nbl += (size_t)snprintf(nobase + nbl, sizeof nobase - nbl, "%s%s",
                                            nbl ? ", " : "", c);
            }
        }
        /* Line 1: model, batch (context) and what is shown; line 2: the
         * GPUs. */
        const char *head = bars ? "%s, batch %d, context %s: %s\n%s" : "%s, batch %d%s: %s\n%s";
        snprintf(title, sizeof title, head, model_label(s, r0->model), r0->batch, ctx,
                 "tokens/s per GPU", gl);
        st = sfi_plot_axes(p, 2 * g, title, bars ? "tokens/s per GPU" : "context (tokens)",
                           bars ? "" : "tokens/s per GPU",
                           bars ? 0u : SFI_PLOT_XLOG2 | SFI_PLOT_XKILO | SFI_PLOT_YZERO, err);
        snprintf(title, sizeof title, head, model_label(s, r0->model), r0->batch, ctx,
                 "speedup over full KV", gl);
        if (!st)
            st = sfi_plot_axes(p, 2 * g + 1, title,
                               bars ? "speedup over full KV (x)" : "context (tokens)",
                               bars ? "" : "speedup over full KV (x)",
                               bars ? 0u : SFI_PLOT_XLOG2 | SFI_PLOT_XKILO | SFI_PLOT_YZERO, err);
        char note[sizeof nobase + 64]; /* the longest note quotes nobase */
        if (!st && !any_fit) {
            if (wmin >= usable)
                snprintf(
                    note, sizeof note,
                    "nothing fits: the weights alone (%.1f GB per GPU) exceed the %.1f GB usable",
                    wmin / 1e9, usable / 1e9);
            else
                snprintf(note, sizeof note,
                         "nothing fits: batch %d exceeds max_batch (at most %d) at every context",
                         r0->batch, max_mb);
            st = sfi_plot_note(p, 2 * g, note, err);
            if (!st)
                st = sfi_plot_note(p, 2 * g + 1, note, err);
        } else if (!st && nbl && !bars) {
            snprintf(note, sizeof note, "no speedup where full KV does not fit: %s", nobase);
            st = sfi_plot_note(p, 2 * g + 1, note, err);
        }
        for (int pi = 0; pi < s->n_pols && !st; pi++) {
            sfi_plot_emphasis em = emphasis_of(s->pols[pi].kind);
            int m = 0;
            for (int i = 0; i < n; i++) {
                const row *r = &rows[i];
                if (!same_group(r, r0) || r->policy != pi)
                    continue;
                x[m] = r->context;
                y1[m] = r->fits ? r->tok_s / r->tp : NAN;
                y2[m] = r->fits ? r->speedup : NAN;
                m++;
            }
            if (!m)
                continue;
            if (bars) {
                const row *r = NULL;
                for (int i = 0; i < n && !r; i++)
                    if (same_group(&rows[i], r0) && rows[i].policy == pi)
                        r = &rows[i];
                char t1[64], t2[64];
                if (r->fits) {
                    snprintf(t1, sizeof t1, "%.0f", y1[0]);
                    if (isfinite(y2[0]))
                        snprintf(t2, sizeof t2, "%.2fx", y2[0]);
                    else
                        snprintf(t2, sizeof t2, "- (full KV does not fit)");
                } else {
                    snprintf(t1, sizeof t1, "no-fit (max_batch %d)", r->max_batch);
                    snprintf(t2, sizeof t2, "no-fit");
                }
                if (!any_fit) /* the note says it once */
                    t1[0] = t2[0] = 0;
                st = sfi_plot_bar(p, 2 * g, s->pols[pi].name, y1[0], t1[0] ? t1 : NULL, em, err);
                if (!st)
                    st = sfi_plot_bar(p, 2 * g + 1, s->pols[pi].name, y2[0], t2[0] ? t2 : NULL, em,
                                      err);
                continue;
            }
            st = sfi_plot_line_styled(p, 2 * g, s->pols[pi].name, x, y1, (size_t)m, 1, em, err);
            if (!st)
                st = sfi_plot_line_styled(p, 2 * g + 1, s->pols[pi].name, x, y2, (size_t)m, 1, em,
                                          err);
        }
    }
    if (!st)
        st = sfi_plot_write_png(p, path, err);
    free(x);
    free(y1);
    free(y2);
    sfi_plot_free(p);
    return st;
}

/* ---- main ---- */

/* A phase's status for "out of memory", said once by the command. */
#define SWEEP_OOM 3

/* A context past the model's max_position_embeddings is priced all the
 * same (the cost does not depend on what RoPE can reach), but the model
 * was not trained for it: say so once per model. */
static void warn_positions(const sweep *s)
{
    /* One line per max_position_embeddings value, naming its models. */
    for (int m = 0; m < s->n_models; m++) {
        int maxpos = s->models[m].max_position_embeddings, seen = 0;
        for (int k = 0; k < m && !seen; k++)
            seen = s->models[k].max_position_embeddings == maxpos;
        if (seen || maxpos <= 0)
            continue;
        char list[512] = "", names[1024] = "";
        size_t len = 0, nl = 0;
        for (int ci = 0; ci < s->n_contexts; ci++)
            if (s->contexts[ci] > maxpos && len < sizeof list - 32) {
                char c[32];
                context_label(s->contexts[ci], c, sizeof c);
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", len ? ", " : "", c);
            }
        if (!len)
            continue;
        int n_names = 0;
        for (int k = m; k < s->n_models; k++)
            if (s->models[k].max_position_embeddings == maxpos && nl < sizeof names - 2) {
                nl += (size_t)snprintf(names + nl, sizeof names - nl, "%s%s", nl ? ", " : "",
                                       model_label(s, k));
                n_names++;
            }
        int many = strchr(list, ',') != NULL;
        fprintf(stderr,
                "sfi-sim sweep: warning: context%s %s exceed%s the max_position_embeddings (%d) "
                "of %s: simulated all the same, but the model%s need%s RoPE scaling (e.g. YaRN) "
                "to use %s\n",
                many ? "s" : "", list, many ? "" : "s", maxpos, names, n_names > 1 ? "s" : "",
                n_names > 1 ? "" : "s", many ? "them" : "it");
    }
}

/* The replay reads batch x steps tokens from a ring of n_tokens: when the
 * stream is shorter, tokens are read again (by other requests, at other
 * phases). Say so, since the slow-step pattern then repeats. */
static void note_recycling(const sweep *s)
{
    int any = 0, bmax = 0;
    for (int pi = 0; pi < s->n_pols; pi++)
        any |= sfi_policy_has_slow_steps(s->pols[pi].kind);
    for (int bi = 0; bi < s->n_batches; bi++)
        if (s->batches[bi] > bmax)
            bmax = s->batches[bi];
    double need = (double)bmax * (double)s->steps;
    if (any && need > (double)s->stream.n_tokens)
        fprintf(stderr,
                "sfi-sim sweep: note: batch %d x %lld steps reads %.0f tokens from a stream of "
                "%lld: tokens are replayed about %.1f times (the ring wraps; request r starts at "
                "token r*n/batch); a longer trace or fewer --steps avoids it\n",
                bmax, (long long)s->steps, need, (long long)s->stream.n_tokens,
                need / (double)s->stream.n_tokens);
}

/* The cost setup of one cell, its policy left to the caller. */
static sfi_cost_setup cell_setup(const sweep *s, int m, int g, int tp, int context, int batch)
{
    sfi_cost_setup cs;
    sfi_cost_setup_init(&cs);
    cs.model = &s->models[m];
    cs.gpu = s->gpus[g];
    cs.prof = s->prof;
    cs.budget = s->budget;
    cs.tp = tp;
    cs.context = context;
    cs.batch = batch;
    cs.weight_bytes = s->weight_bytes;
    cs.kv_bytes = s->kv_bytes;
    return cs;
}

/* --tp auto, per (model, GPU, batch, context): the smallest power of two
 * (up to 8, one node) at which every requested policy fits the batch at
 * this context; when none does, the largest valid degree up to 8 (its rows
 * then say no-fit). Degrees that do not divide the model's heads are
 * skipped. */
static sfi_status resolve_tp_auto(const sweep *s, int m, int g, int batch, int context, int *tp,
                                  sfi_error *err)
{
    int last_ok = 0;
    for (int t = 1; t <= 8; t *= 2) {
        sfi_cost_setup cs = cell_setup(s, m, g, t, context, batch);
        int all_fit = 1, valid = 1;
        for (int pi = 0; pi < s->n_pols && valid; pi++) {
            cs.kind = s->pols[pi].kind;
            cs.pol = s->pols[pi].cfg;
            sfi_cost_memory mem;
            sfi_error e2;
            if (sfi_cost_memory_of(&cs, &mem, &e2) != SFI_OK) {
                valid = strstr(e2.msg, "--tp") == NULL;
                if (valid) /* not a TP problem: report it */
                    return sfi_error_set(err, e2.code, "%s", e2.msg);
                break;
            }
            all_fit &= batch <= mem.max_batch;
        }
        if (!valid)
            continue;
        last_ok = t;
        if (all_fit) {
            *tp = t;
            return SFI_OK;
        }
    }
    *tp = last_ok ? last_ok : 1;
    return SFI_OK;
}

/* The command line: what to sweep (lists, as text until setup resolves
 * them) and where the results go. */
typedef struct {
    const char *models, *gpus, *tp, *contexts, *batch, *pols, *trace, *tok, *prof, *fmt, *out, *png,
        *timeline;
    int synthetic;
} sweep_args;

/* Parses the options into a and s's scalars (steps, bytes, --param,
 * --budget). Returns -1 to go on, else the exit status (0 for --help). */
static int parse_args(int argc, char **argv, sweep_args *a, sweep *s)
{
    /* clang-format off */
    static const struct option opts[] = {
        {"models", required_argument, NULL, 'm'},   {"gpus", required_argument, NULL, 'g'},
        {"tp", required_argument, NULL, 't'},       {"contexts", required_argument, NULL, 'c'},
        {"batch", required_argument, NULL, 'b'},    {"policies", required_argument, NULL, 'P'},
        {"trace", required_argument, NULL, 'T'},    {"tokenizer", required_argument, NULL, 'k'},
        {"synthetic", no_argument, NULL, 'S'},      {"steps", required_argument, NULL, 's'},
        {"profile", required_argument, NULL, 'p'},  {"param", required_argument, NULL, 'x'},
        {"weight-bytes", required_argument, NULL, 'w'}, {"format", required_argument, NULL, 'f'},
        {"kv-dtype", required_argument, NULL, 'K'},
        {"output", required_argument, NULL, 'o'},   {"png", required_argument, NULL, 'G'},
        {"no-png", no_argument, NULL, 'N'},         {"timeline-png", required_argument, NULL, 'L'},
        {"budget", required_argument, NULL, 'B'},   {"help", no_argument, NULL, 'h'},
        /* Singular spellings of the list options. */
        {"model", required_argument, NULL, 'm'},    {"gpu", required_argument, NULL, 'g'},
        {"context", required_argument, NULL, 'c'},  {"policy", required_argument, NULL, 'P'},
        {NULL, 0, NULL, 0}};
    /* clang-format on */
    *a = (sweep_args){.models = DEFAULT_MODELS,
                      .gpus = "B200",
                      .tp = "auto",
                      .contexts = DEFAULT_CONTEXTS,
                      .batch = "8",
                      .fmt = "table",
                      .png = DEFAULT_PNG};
    s->steps = 2048;
    s->weight_bytes = 2;
    s->kv_bytes = 2;
    sfi_error err;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        switch (c) {
        case 'm': a->models = optarg; break;
        case 'g': a->gpus = optarg; break;
        case 't': a->tp = optarg; break;
        case 'c': a->contexts = optarg; break;
        case 'b': a->batch = optarg; break;
        case 'P': a->pols = optarg; break;
        case 'T': a->trace = optarg; break;
        case 'k': a->tok = optarg; break;
        case 'S': a->synthetic = 1; break;
        case 's': {
            int64_t v;
            if (sfi_sim_parse_size(optarg, 1, &v) || v < 1 || v > 100000000) {
                fprintf(stderr, "sfi-sim sweep: --steps: '%s' is not in 1..1e8\n", optarg);
                return 2;
            }
            s->steps = v;
            break;
        }
        case 'p': a->prof = optarg; break;
        case 'B':
            if (sfi_budget_parse(optarg, &s->budget, &err) != SFI_OK) {
                fprintf(stderr, "sfi-sim sweep: --budget: %s\n", err.msg);
                return 2;
            }
            break;
        case 'x':
            if (sfi_policy_config_set(&s->cfg, optarg, &err) != SFI_OK) {
                fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
                return 1;
            }
            break;
        case 'w':
            if (strcmp(optarg, "1") && strcmp(optarg, "2")) {
                fprintf(stderr, "sfi-sim sweep: --weight-bytes: must be 1 or 2\n");
                return 2;
            }
            s->weight_bytes = optarg[0] - '0';
            break;
        case 'K':
            if (!strcasecmp(optarg, "bf16")) {
                s->kv_bytes = 2;
            } else if (!strcasecmp(optarg, "fp8")) {
                s->kv_bytes = 1;
            } else {
                fprintf(stderr, "sfi-sim sweep: --kv-dtype: '%s' is not bf16 or fp8\n", optarg);
                return 2;
            }
            break;
        case 'f': a->fmt = optarg; break;
        case 'o': a->out = optarg; break;
        case 'G': a->png = optarg; break;
        case 'N': a->png = NULL; break;
        case 'L': a->timeline = optarg; break;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "sfi-sim sweep: unknown or incomplete option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "sfi-sim sweep: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (strcmp(a->fmt, "table") && strcmp(a->fmt, "csv") && strcmp(a->fmt, "json")) {
        fprintf(stderr, "sfi-sim sweep: --format: '%s' is not table, csv or json\n", a->fmt);
        return 2;
    }
    if (a->png && !strcmp(a->png, "none"))
        a->png = NULL;
    if (sfi_params_validate(&s->cfg.prm, &err) != SFI_OK) {
        fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
        return 1;
    }
    return -1;
}

/* --models: presets or config.json paths. Returns 0, or the exit status. */
static int resolve_models(sweep *s, const char *arg)
{
    char **v;
    int n = sfi_sim_split_list(arg, &v);
    if (n < 0)
        return SWEEP_OOM;
    s->model_names = v;
    s->n_models = n;
    s->models = calloc((size_t)n, sizeof *s->models);
    if (!s->models)
        return SWEEP_OOM;
    sfi_error err;
    for (int i = 0; i < n; i++)
        if (sfi_model_resolve(v[i], &s->models[i], &err) != SFI_OK) {
            fprintf(stderr, "sfi-sim sweep: --models: %s\n", err.msg);
            return 1;
        }
    return 0;
}

/* --gpus: names or GPU JSON files. Returns 0, or the exit status. */
static int resolve_gpus(sweep *s, const char *arg)
{
    char **v;
    int n = sfi_sim_split_list(arg, &v);
    if (n < 0)
        return SWEEP_OOM;
    s->gpus = calloc((size_t)n, sizeof *s->gpus);
    s->n_gpus = n;
    sfi_error err;
    for (int i = 0; i < n && s->gpus; i++)
        if (sfi_gpu_resolve(v[i], &s->gpus[i], &err) != SFI_OK) {
            fprintf(stderr, "sfi-sim sweep: --gpus: %s\n", err.msg);
            sfi_sim_free_list(v, n);
            return 1;
        }
    sfi_sim_free_list(v, n);
    return s->gpus ? 0 : SWEEP_OOM;
}

/* --policies: every policy, or the specs given. Returns 0, or the exit
 * status. */
static int resolve_policies(sweep *s, const char *arg)
{
    if (!arg || !strcasecmp(arg, "all"))
        return (s->n_pols = all_policies(&s->cfg, &s->pols)) < 0 ? SWEEP_OOM : 0;
    char **v;
    int n = sfi_sim_split_policies(arg, &v);
    if (n < 0)
        return SWEEP_OOM;
    s->pols = calloc((size_t)n, sizeof *s->pols);
    s->n_pols = s->pols ? n : 0;
    for (int i = 0; i < n; i++) {
        if (s->pols)
            s->pols[i].name = v[i];
        else
            free(v[i]);
    }
    free(v);
    if (!s->pols)
        return SWEEP_OOM;
    sfi_error err;
    for (int i = 0; i < n; i++)
        if (parse_policy_spec(s->pols[i].name, &s->cfg, &s->pols[i], &err) != SFI_OK) {
            fprintf(stderr, "sfi-sim sweep: --policies: %s\n", err.msg);
            return 1;
        }
    return 0;
}

/* Everything the sweep reads, resolved and checked before any pricing:
 * profile, lists, writable outputs, the token stream. Returns 0, or the
 * exit status (SWEEP_OOM: out of memory, not yet said). */
static int setup(sweep *s, const sweep_args *a)
{
    sfi_error err;
    if (a->prof && sfi_hw_profile_load(a->prof, &s->prof, NULL, NULL, &err) != SFI_OK) {
        fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
        return 1;
    }
    int rc = resolve_models(s, a->models);
    if (!rc)
        rc = resolve_gpus(s, a->gpus);
    if (rc)
        return rc;
    if ((s->n_tps = parse_int_list("--tp", a->tp, 1, 0, 1, 64, &s->tps)) < 0 ||
        (s->n_contexts =
             parse_int_list("--contexts", a->contexts, 0, 1, 1, 1 << 30, &s->contexts)) < 0 ||
        (s->n_batches = parse_int_list("--batch", a->batch, 0, 0, 1, 1 << 16, &s->batches)) < 0)
        return 2;
    if ((rc = resolve_policies(s, a->pols)))
        return rc;
    /* Outputs that cannot be written fail now, not after the sweep. */
    const char *outs[] = {a->out, a->png, a->timeline};
    for (int i = 0; i < 3; i++)
        if (outs[i] && sfi_out_check(outs[i], &err) != SFI_OK) {
            fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
            return 1;
        }
    if (sfi_sim_stream_load(a->trace, a->tok, a->synthetic, &s->cfg.prm, &s->stream, &err) !=
        SFI_OK) {
        fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* Replays, one per (policy, batch) into replays[pi * n_batches + bi]: the
 * trigger stream does not depend on model, GPU or context. Policies
 * without slow steps are not replayed (their entries stay zero). */
static sfi_status run_replays(const sweep *s, int timeline, sfi_replay_result *replays,
                              sfi_error *err)
{
    const sfi_replay_stream rs = {s->stream.tokens, s->stream.n_tokens, s->stream.is_trigger,
                                  s->stream.n_vocab};
    for (int pi = 0; pi < s->n_pols; pi++) {
        const policy_spec *ps = &s->pols[pi];
        if (!sfi_policy_has_slow_steps(ps->kind))
            continue;
        for (int bi = 0; bi < s->n_batches; bi++) {
            sfi_status st = sfi_replay_run(&rs, sfi_policy_trigger_kind(ps->kind), &ps->cfg.prm,
                                           ps->cfg.interval, s->batches[bi], stagger_of(ps),
                                           s->steps, timeline ? TIMELINE_STEPS : 0,
                                           &replays[pi * s->n_batches + bi], err);
            if (st)
                return st;
        }
    }
    return SFI_OK;
}

/* The rows of one (model, GPU, TP entry, batch, context): every policy,
 * with its speedup over full KV on the same GPUs, appended at
 * rows[*n_rows]. Returns 0 or 1 (message printed). */
static int price_group(const sweep *s, const sfi_replay_result *replays, int m, int g, int ti,
                       int bi, int ci, row *rows, int *n_rows, int *n_fit)
{
    sfi_error err;
    int tp = s->tps[ti];
    if (tp == 0 && resolve_tp_auto(s, m, g, s->batches[bi], s->contexts[ci], &tp, &err) != SFI_OK) {
        fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
        return 1;
    }
    sfi_cost_setup cs = cell_setup(s, m, g, tp, s->contexts[ci], s->batches[bi]);
    /* Full-KV baseline of the speedup column, on the same GPUs. */
    row base;
    memset(&base, 0, sizeof base);
    cs.kind = SFI_POLICY_FULL;
    cs.pol = s->cfg;
    if (price_cell(&cs, NULL, &base, NULL, &err) != SFI_OK) {
        fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
        return 1;
    }
    for (int pi = 0; pi < s->n_pols; pi++) {
        row *r = &rows[*n_rows];
        cs.kind = s->pols[pi].kind;
        cs.pol = s->pols[pi].cfg;
        const sfi_replay_result *rp =
            sfi_policy_has_slow_steps(cs.kind) ? &replays[pi * s->n_batches + bi] : NULL;
        if (price_cell(&cs, rp, r, NULL, &err) != SFI_OK) {
            fprintf(stderr, "sfi-sim sweep: %s (model %s, context %d, policy %s)\n", err.msg,
                    model_label(s, m), cs.context, s->pols[pi].name);
            return 1;
        }
        r->model = m;
        r->gpu = g;
        r->tp = tp;
        r->tp_index = ti;
        r->context = cs.context;
        r->batch = cs.batch;
        r->policy = pi;
        /* No speedup when either side does not fit. */
        r->speedup = base.fits && r->fits ? r->tok_s / base.tok_s : NAN;
        *n_fit += r->fits;
        (*n_rows)++;
    }
    return 0;
}

/* Every cell of the sweep, in the table's order. Returns 0 or 1. */
static int price_all(const sweep *s, const sfi_replay_result *replays, row *rows, int *n_rows,
                     int *n_fit)
{
    *n_rows = *n_fit = 0;
    for (int m = 0; m < s->n_models; m++)
        for (int g = 0; g < s->n_gpus; g++)
            for (int ti = 0; ti < s->n_tps; ti++)
                for (int bi = 0; bi < s->n_batches; bi++)
                    for (int ci = 0; ci < s->n_contexts; ci++)
                        if (price_group(s, replays, m, g, ti, bi, ci, rows, n_rows, n_fit))
                            return 1;
    return 0;
}

/* The table (text, CSV or JSON) to --output or standard output. Returns
 * 0 or 1. */
static int write_table(const sweep *s, const row *rows, int n_rows, const sweep_args *a)
{
    sfi_error err;
    FILE *f = stdout;
    sfi_out *o = NULL;
    if (a->out && sfi_out_open(a->out, &o, &f, &err) != SFI_OK) {
        fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
        return 1;
    }
    if (!strcmp(a->fmt, "csv"))
        print_csv(f, s, rows, n_rows);
    else if (!strcmp(a->fmt, "json"))
        print_json(f, s, rows, n_rows);
    else
        print_table(f, s, rows, n_rows);
    if (o) {
        if (sfi_out_commit(o, 0, &err) != SFI_OK) {
            fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
            return 1;
        }
    } else if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "sfi-sim sweep: standard output: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}

/* The degree that --tp's first entry took at (first model, first GPU,
 * first batch, context): --tp auto resolves per context. */
static int first_tp_at(const sweep *s, const row *rows, int n_rows, int context)
{
    for (int i = 0; i < n_rows; i++)
        if (rows[i].model == 0 && rows[i].gpu == 0 && rows[i].tp_index == 0 &&
            rows[i].batch == s->batches[0] && rows[i].context == context)
            return rows[i].tp;
    return rows[0].tp;
}

/* The timeline figure's panels: one per replayed policy, full KV drawn
 * in each as the reference (x, yf: TIMELINE_STEPS points); none replayed,
 * full KV alone. */
static sfi_status timeline_panels(const sweep *s, const sfi_replay_result *replays,
                                  sfi_cost_setup *cs, sfi_plot *p, int n_panels, const double *x,
                                  const double *yf, double *y, const char *cl, const char *gl,
                                  sfi_error *err)
{
    sfi_status st = SFI_OK;
    int panel = 0;
    row tmp;
    for (int pi = 0; pi < s->n_pols && !st && panel < n_panels; pi++) {
        cs->kind = s->pols[pi].kind;
        cs->pol = s->pols[pi].cfg;
        if (!sfi_policy_has_slow_steps(cs->kind))
            continue;
        const sfi_replay_result *rp = &replays[pi * s->n_batches];
        double *tt = NULL;
        st = price_cell(cs, rp, &tmp, &tt, err);
        if (st)
            break;
        int64_t nt = rp->n_timeline;
        for (int64_t i = 0; i < nt; i++)
            y[i] = tt[rp->timeline[i]] * 1e3;
        free(tt);
        char title[512];
        snprintf(title, sizeof title, "%s: %s, batch %d, context %s: per-step latency\n%s%s",
                 s->pols[pi].name, model_label(s, 0), s->batches[0], cl, gl,
                 tmp.fits ? "" : " (the batch does not fit: see max_batch)");
        st =
            sfi_plot_axes(p, panel, title, "decode step", "step latency (ms)", SFI_PLOT_YZERO, err);
        if (!st)
            st = sfi_plot_line_styled(p, panel, "full", x, yf, TIMELINE_STEPS, 0,
                                      SFI_PLOT_REFERENCE, err);
        if (!st)
            st = sfi_plot_line_styled(p, panel, s->pols[pi].name, x, y, (size_t)nt, 0,
                                      emphasis_of(cs->kind), err);
        panel++;
    }
    if (!st && panel == 0) {
        char title[512];
        snprintf(title, sizeof title, "%s, batch %d, context %s: per-step latency\n%s",
                 model_label(s, 0), s->batches[0], cl, gl);
        st = sfi_plot_axes(p, 0, title, "decode step", "step latency (ms)", SFI_PLOT_YZERO, err);
        if (!st)
            st = sfi_plot_line_styled(p, 0, "full", x, yf, TIMELINE_STEPS, 0, SFI_PLOT_REFERENCE,
                                      err);
    }
    return st;
}

/* --timeline-png: per-step latency of the replayed policies at the first
 * model, GPU and batch and the largest context. *drew is set once a
 * figure exists (its fonts are released at the end). */
static sfi_status write_timeline(const sweep *s, const row *rows, int n_rows,
                                 const sfi_replay_result *replays, const char *path, int *drew,
                                 sfi_error *err)
{
    int ci_max = 0;
    for (int ci = 1; ci < s->n_contexts; ci++)
        if (s->contexts[ci] > s->contexts[ci_max])
            ci_max = ci;
    int n_panels = 0;
    for (int pi = 0; pi < s->n_pols; pi++)
        n_panels += sfi_policy_has_slow_steps(s->pols[pi].kind);
    if (n_panels == 0)
        n_panels = 1;
    if (n_panels > 16)
        n_panels = 16;
    sfi_plot *p = sfi_plot_new(1400, 80 + 240 * n_panels, n_panels, 1);
    if (!p)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    *drew = 1;
    int tp = first_tp_at(s, rows, n_rows, s->contexts[ci_max]);
    sfi_status st = SFI_OK;
    double *x = malloc(TIMELINE_STEPS * sizeof *x), *y = malloc(TIMELINE_STEPS * sizeof *y),
           *yf = malloc(TIMELINE_STEPS * sizeof *yf);
    if (!x || !y || !yf)
        st = sfi_error_set(err, SFI_ENOMEM, "out of memory");
    sfi_cost_setup cs = cell_setup(s, 0, 0, tp, s->contexts[ci_max], s->batches[0]);
    char cl[32], gl[128];
    context_label(s->contexts[ci_max], cl, sizeof cl);
    if (tp == 1)
        snprintf(gl, sizeof gl, "1 %s", s->gpus[0].name);
    else
        snprintf(gl, sizeof gl, "%dx %s (TP %d)", tp, s->gpus[0].name, tp);
    row full;
    cs.kind = SFI_POLICY_FULL;
    cs.pol = s->cfg;
    if (!st)
        st = price_cell(&cs, NULL, &full, NULL, err);
    for (int i = 0; i < TIMELINE_STEPS && !st; i++) {
        x[i] = (double)i;
        yf[i] = full.mean_s * 1e3;
    }
    if (!st)
        st = timeline_panels(s, replays, &cs, p, n_panels, x, yf, y, cl, gl, err);
    free(yf);
    free(x);
    free(y);
    if (!st)
        st = sfi_plot_write_png(p, path, err);
    sfi_plot_free(p);
    return st;
}

/* The figures (--png, --timeline-png), after the table. Returns 0 or 1. */
static int write_figures(const sweep *s, const row *rows, int n_rows,
                         const sfi_replay_result *replays, const sweep_args *a, int *drew)
{
    sfi_error err;
    if (a->png) {
        *drew = 1;
        if (write_figure(s, rows, n_rows, a->png, &err) != SFI_OK) {
            fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
            return 1;
        }
        fprintf(stderr, "sfi-sim sweep: wrote %s\n", a->png);
    }
    if (a->timeline) {
        if (write_timeline(s, rows, n_rows, replays, a->timeline, drew, &err) != SFI_OK) {
            fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
            return 1;
        }
        fprintf(stderr, "sfi-sim sweep: wrote %s\n", a->timeline);
    }
    return 0;
}

/* Says how many rows do not fit; returns 1 when none does. */
static int report_fit(int n_rows, int n_fit)
{
    if (n_fit < n_rows)
        fprintf(stderr,
                "sfi-sim sweep: %d of %d rows do not fit in GPU memory (no-fit: batch > max_batch; "
                "'sfi-sim serve' admits what fits and queues the rest)\n",
                n_rows - n_fit, n_rows);
    if (n_fit == 0) {
        fprintf(stderr, "sfi-sim sweep: nothing fits: the batch does not fit at any context "
                        "(see max_batch; lower --batch or raise --tp)\n");
        return 1;
    }
    return 0;
}

/* parse, setup, replay, price, report. */
int sfi_sim_cmd_sweep(int argc, char **argv)
{
    sweep s;
    memset(&s, 0, sizeof s);
    sfi_policy_config_default(&s.cfg);
    sfi_hw_profile_default(&s.prof);
    sweep_args a;
    int rc = parse_args(argc, argv, &a, &s);
    if (rc >= 0)
        return rc;
    row *rows = NULL;
    sfi_replay_result *replays = NULL;
    int n_replays = 0, n_rows = 0, n_fit = 0;
    int drew = 0; /* a figure was drawn: release the font caches at the end */
    sfi_error err;
    if ((rc = setup(&s, &a)))
        goto out;
    n_replays = s.n_pols * s.n_batches;
    replays = calloc((size_t)n_replays, sizeof *replays);
    size_t n_rows_max =
        (size_t)s.n_models * s.n_gpus * s.n_tps * s.n_contexts * s.n_batches * s.n_pols;
    rows = calloc(n_rows_max ? n_rows_max : 1, sizeof *rows);
    if (!replays || !rows) {
        rc = SWEEP_OOM;
        goto out;
    }
    if (run_replays(&s, a.timeline != NULL, replays, &err) != SFI_OK) {
        fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
        rc = 1;
        goto out;
    }
    if ((rc = price_all(&s, replays, rows, &n_rows, &n_fit)))
        goto out;
    warn_positions(&s);
    note_recycling(&s);
    if ((rc = write_table(&s, rows, n_rows, &a)) || (rc = report_fit(n_rows, n_fit)))
        goto out;
    rc = write_figures(&s, rows, n_rows, replays, &a, &drew);
out:
    if (rc == SWEEP_OOM) {
        fprintf(stderr, "sfi-sim sweep: out of memory\n");
        rc = 1;
    }
    for (int i = 0; i < n_replays && replays; i++)
        sfi_replay_result_free(&replays[i]);
    free(replays);
    free(rows);
    sweep_free(&s);
    if (drew)
        sfi_plot_release_fonts();
    return rc;
}
