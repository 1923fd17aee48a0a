/* sfi-ref eval: quality inside the forward pass of every policy at equal
 * budget on held-out text (ref/sfi_eval.h): a table (or CSV/JSON) on
 * standard output and optionally a PNG of NLL change and KL vs budget. */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sfi_cli.h"
#include "sfi_eval.h"
#include "sfi_io.h"
#include "sfi_plot.h"
#include "sfi_qwen3.h"
#include "sfi_ref_cli.h"
#include "sfi_tokenizer.h"
#include "sfi_trace.h"
#include "sfi_vocab.h"

/* The largest text or id list read (a text of this size is far more than
 * any model's context). */
#define EVAL_MAX_INPUT ((size_t)1 << 30)

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sfi-ref eval --model DIR (--text FILE | --ids FILE | --trace FILE\n"
            "                    [--request R])\n"
            "                    [--prefix L] [--tokens N] [--offset T] [--budgets LIST]\n"
            "                    [--policies LIST] [--param KEY=VALUE ...] [--params FILE]\n"
            "                    [--backend blas|scalar] [--tokenizer DIR] [--bootstrap R]\n"
            "                    [--seed S] [--threads T] [--format table|csv|json] [--png FILE]\n"
            "                    [--quiet]\n\n"
            "Teacher-forced quality of every KV policy at equal budget. The text's first L\n"
            "tokens are prefilled once; then N tokens are fed one at a time, and at every\n"
            "step each layer's attention is restricted to the positions the policy chooses\n"
            "(real query, real keys). Reported per policy and budget: mean retained share,\n"
            "mean captured attention mass (the share of each query head's dense attention\n"
            "on the positions it attended), NLL and perplexity of the N tokens, the NLL change against full KV with a\n"
            "bootstrap interval over tokens, top-1 agreement with full KV's argmax, KL from\n"
            "full KV's next-token distribution, and SFI's slow-step fraction.\n\n"
            "  -m, --model DIR        checkpoint directory (config.json + safetensors)\n"
            "      --text FILE        held-out text (UTF-8), encoded with the tokenizer\n"
            "      --ids FILE         the text as whitespace-separated decimal token ids\n"
            "      --trace FILE       a trace's request as the text: prompt, then the step\n"
            "                         tokens (ids must fit the model's vocabulary)\n"
            "      --request R        which request of --trace (0)\n"
            "  -L, --prefix L         tokens prefilled once (8192)\n"
            "  -n, --tokens N         scored tokens after the prefix (512); the text needs\n"
            "                         T + L + N + 1 tokens\n"
            "      --offset T         skip the text's first T tokens (0)\n"
            "  -b, --budgets LIST     retained shares, e.g. 2%%,4%%,6%%,12%%,27%% (the default)\n"
            "                         or 0.02,0.04: B = round(share * (L + N)) positions per\n"
            "                         KV head per step, sink and recent included\n"
            "      --policies LIST    comma-separated: oracle, streaming, h2o, snapkv, quest,\n"
            "                         lfps, kascade, fasa, sfi (the default: these), tmax,\n"
            "                         interval, boundary, or all; full KV is always run as\n"
            "                         the reference\n"
            "      --calib FILE       Kascade/FASA calibration (sfi-ref calibrate); without\n"
            "                         it, stand-ins measured on the prefix (named as proxies)\n"
            "  -P, --param KEY=VALUE  an SFI parameter or a policy knob (repeatable; see\n"
            "                         sfi-ref-eval(1))\n"
            "      --params FILE      a file of KEY=VALUE lines\n"
            "      --backend B        blas (default when built with OpenBLAS) or scalar\n"
            "      --tokenizer DIR    tokenizer files (vocab.json, merges.txt); default the\n"
            "                         model directory. SFI's trigger set comes from them\n"
            "      --bootstrap R      bootstrap resamples of the NLL change (1000; 0: none)\n"
            "      --seed S           bootstrap seed (1)\n"
            "      --threads T        runs in parallel (default: one per CPU); results do not\n"
            "                         depend on it\n"
            "      --format F         table (default), csv or json on standard output\n"
            "      --png FILE         write NLL change and KL vs budget, one line per policy\n"
            "  -q, --quiet            no progress lines on standard error\n"
            "  -h, --help             print this help\n\n"
            "Exit status: 0 ok, 1 bad input or failure, 2 usage error. See sfi-ref-eval(1).\n");
}

static int file_exists(const char *dir, const char *name)
{
    char p[PATH_MAX];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

static int parse_int(const char *s, const char *what, int lo, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > INT_MAX / 4) {
        fprintf(stderr, "sfi-ref eval: %s '%s': expected an integer >= %d\n", what, s, lo);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* The trace request's ids: prompt, then every step's token. */
static int trace_ids(const char *path, int req, int32_t **ids, int *n)
{
    sfi_error e;
    sfi_error_clear(&e);
    sfi_trace *t = NULL;
    sfi_trace_request rq;
    sfi_trace_steps st;
    memset(&rq, 0, sizeof rq);
    memset(&st, 0, sizeof st);
    int rc = 1;
    if (sfi_trace_open(path, &t, &e)) {
        fprintf(stderr, "sfi-ref eval: %s\n", e.msg);
        return 1;
    }
    if (req >= sfi_trace_n_requests(t)) {
        fprintf(stderr, "sfi-ref eval: %s: no request %d (it has %lld)\n", path, req,
                (long long)sfi_trace_n_requests(t));
        goto out;
    }
    if (sfi_trace_read_request(t, req, &rq, &e) || sfi_trace_read_steps(t, req, &st, &e)) {
        fprintf(stderr, "sfi-ref eval: %s\n", e.msg);
        goto out;
    }
    if ((int64_t)rq.n_prompt + st.n > INT_MAX / 4) {
        fprintf(stderr, "sfi-ref eval: %s: request %d is too long\n", path, req);
        goto out;
    }
    *n = (int)(rq.n_prompt + st.n);
    *ids = malloc(sizeof(int32_t) * (size_t)(*n > 0 ? *n : 1));
    if (!*ids) {
        fprintf(stderr, "sfi-ref eval: out of memory\n");
        goto out;
    }
    memcpy(*ids, rq.prompt, sizeof(int32_t) * (size_t)rq.n_prompt);
    for (int64_t i = 0; i < st.n; i++)
        (*ids)[rq.n_prompt + i] = st.token[i];
    rc = 0;
out:
    sfi_trace_steps_free(&st);
    sfi_trace_request_free(&rq);
    sfi_trace_close(t);
    return rc;
}

static double pct(double x)
{
    return 100.0 * x;
}

static void print_table(const char *model, const char *src, const sfi_eval_opts *o,
                        const sfi_eval_result *r)
{
    printf("model: %s\ntext: %s\nprefix: %d tokens, scored: %d tokens, backend: %s\n", model,
           src, r->n_prefix, r->n_tokens, sfi_backend_name(o->backend));
    printf("full KV: NLL %.4f nats/token, perplexity %.3f\n", r->full_nll, r->full_ppl);
    printf("seconds: prefill %.1f (once), full KV %.1f, all %.1f (%d runs in parallel)\n",
           r->prefill_seconds, r->full_seconds, r->seconds, r->n_threads);
    if (r->n_kascade_anchors) {
        printf("kascade anchors:");
        for (int i = 0; i < r->n_kascade_anchors; i++)
            printf(" %d", r->kascade_anchors[i]);
        printf(" (plan of the last budget)\n");
    }
    printf("\n%-9s %7s %6s %8s %6s %8s %9s %9s %21s %6s %9s %6s %7s\n", "policy", "budget",
           "B", "retained", "mass", "NLL", "PPL", "dNLL", "dNLL interval", "top-1", "KL", "slow",
           "sec");
    for (int i = 0; i < r->n_rows; i++) {
        const sfi_eval_row *w = &r->rows[i];
        char ci[64], slow[16];
        if (isnan(w->dnll_lo))
            snprintf(ci, sizeof ci, "-");
        else
            snprintf(ci, sizeof ci, "[%+.4f, %+.4f]", w->dnll_lo, w->dnll_hi);
        if (w->slow_fraction >= 0.0)
            snprintf(slow, sizeof slow, "%.3f", w->slow_fraction);
        else
            snprintf(slow, sizeof slow, "-");
        printf("%-9s %6.1f%% %6d %7.2f%% %6.4f %8.4f %9.3f %+9.4f %21s %6.3f %9.5f %6s %7.1f\n",
               sfi_policy_kind_name(w->kind), pct(w->share), w->budget, pct(w->retained), w->mass,
               w->nll, w->ppl, w->dnll, ci, w->top1, w->kl, slow, w->seconds);
    }
    /* Each proxy a peer had to use, once per policy. */
    int notes = 0;
    for (int i = 0; i < r->n_rows; i++) {
        const sfi_eval_row *w = &r->rows[i];
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= r->rows[j].kind == w->kind && r->rows[j].proxy;
        if (!w->proxy || seen)
            continue;
        if (!notes++)
            printf("\nproxies (a policy not listed ran its paper's rule):\n");
        printf("  %-9s %s\n", sfi_policy_kind_name(w->kind), w->proxy);
    }
}

static void print_csv(const sfi_eval_result *r)
{
    printf("policy,share,budget,retained,mass,nll,ppl,dnll,dnll_lo,dnll_hi,top1,kl,kl_max,"
           "slow_fraction,seconds,full_nll,prefix,tokens\n");
    for (int i = 0; i < r->n_rows; i++) {
        const sfi_eval_row *w = &r->rows[i];
        printf("%s,%.6g,%d,%.6f,%.6f,%.6f,%.6f,%.6f,", sfi_policy_kind_name(w->kind), w->share,
               w->budget, w->retained, w->mass, w->nll, w->ppl, w->dnll);
        if (isnan(w->dnll_lo))
            printf(",,");
        else
            printf("%.6f,%.6f,", w->dnll_lo, w->dnll_hi);
        printf("%.6f,%.8f,%.8f,", w->top1, w->kl, w->kl_max);
        if (w->slow_fraction >= 0.0)
            printf("%.6f", w->slow_fraction);
        printf(",%.3f,%.6f,%d,%d\n", w->seconds, r->full_nll, r->n_prefix, r->n_tokens);
    }
}

static int print_json(const char *model, const char *src, const sfi_eval_opts *o,
                      const sfi_eval_result *r)
{
    json_t *j = json_object(), *rows = json_array();
    json_object_set_new(j, "model", json_string(model));
    json_object_set_new(j, "text", json_string(src));
    json_object_set_new(j, "backend", json_string(sfi_backend_name(o->backend)));
    json_object_set_new(j, "prefix", json_integer(r->n_prefix));
    json_object_set_new(j, "tokens", json_integer(r->n_tokens));
    json_object_set_new(j, "full_nll", json_real(r->full_nll));
    json_object_set_new(j, "full_ppl", json_real(r->full_ppl));
    json_object_set_new(j, "prefill_seconds", json_real(r->prefill_seconds));
    json_object_set_new(j, "full_seconds", json_real(r->full_seconds));
    json_object_set_new(j, "seconds", json_real(r->seconds));
    json_object_set_new(j, "cpu_seconds", json_real(r->cpu_seconds));
    json_object_set_new(j, "threads", json_integer(r->n_threads));
    json_object_set_new(j, "bootstrap", json_integer(o->n_boot));
    json_object_set_new(j, "confidence", json_real(o->conf));
    for (int i = 0; i < r->n_rows; i++) {
        const sfi_eval_row *w = &r->rows[i];
        json_t *x = json_object();
        json_object_set_new(x, "policy", json_string(sfi_policy_kind_name(w->kind)));
        json_object_set_new(x, "share", json_real(w->share));
        json_object_set_new(x, "budget", json_integer(w->budget));
        json_object_set_new(x, "retained", json_real(w->retained));
        json_object_set_new(x, "mass", json_real(w->mass));
        json_object_set_new(x, "nll", json_real(w->nll));
        json_object_set_new(x, "ppl", json_real(w->ppl));
        json_object_set_new(x, "dnll", json_real(w->dnll));
        json_object_set_new(x, "dnll_lo", isnan(w->dnll_lo) ? json_null() : json_real(w->dnll_lo));
        json_object_set_new(x, "dnll_hi", isnan(w->dnll_hi) ? json_null() : json_real(w->dnll_hi));
        json_object_set_new(x, "top1", json_real(w->top1));
        json_object_set_new(x, "kl", json_real(w->kl));
        json_object_set_new(x, "kl_max", json_real(w->kl_max));
        json_object_set_new(x, "slow_fraction",
                            w->slow_fraction >= 0.0 ? json_real(w->slow_fraction) : json_null());
        json_object_set_new(x, "seconds", json_real(w->seconds));
        json_object_set_new(x, "cpu_seconds", json_real(w->cpu_seconds));
        json_object_set_new(x, "proxy", w->proxy ? json_string(w->proxy) : json_null());
        json_array_append_new(rows, x);
    }
    json_object_set_new(j, "rows", rows);
    if (r->n_kascade_anchors) {
        json_t *a = json_array();
        for (int i = 0; i < r->n_kascade_anchors; i++)
            json_array_append_new(a, json_integer(r->kascade_anchors[i]));
        json_object_set_new(j, "kascade_anchors", a);
    }
    char *s = json_dumps(j, JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    json_decref(j);
    if (!s) {
        fprintf(stderr, "sfi-ref eval: out of memory\n");
        return -1;
    }
    printf("%s\n", s);
    free(s);
    return 0;
}

/* Two panels: NLL change and KL against the budget, one line per policy. */
static sfi_status write_png(const char *path, const char *title, const sfi_eval_opts *o,
                            const sfi_eval_result *r, sfi_error *err)
{
    sfi_plot *p = sfi_plot_new(1400, 560, 1, 2);
    if (!p)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory for the figure", path);
    double lo = o->shares[0], hi = o->shares[0];
    for (int i = 1; i < o->n_shares; i++) {
        if (o->shares[i] < lo)
            lo = o->shares[i];
        if (o->shares[i] > hi)
            hi = o->shares[i];
    }
    unsigned xf = hi >= 4.0 * lo ? SFI_PLOT_XLOG10 : 0u;
    char t0[256], t1[256];
    snprintf(t0, sizeof t0, "NLL change vs full KV (%s)", title);
    snprintf(t1, sizeof t1, "KL(full KV || policy) (%s)", title);
    sfi_status rc = sfi_plot_axes(p, 0, t0, "budget (% of context, per KV head)",
                                  "NLL - full KV NLL (nats/token)", xf | SFI_PLOT_YZERO, err);
    if (!rc)
        rc = sfi_plot_axes(p, 1, t1, "budget (% of context, per KV head)",
                           "mean KL (nats/token)", xf | SFI_PLOT_YLOG10, err);
    double *x = malloc(sizeof(double) * (size_t)o->n_shares);
    double *y0 = malloc(sizeof(double) * (size_t)o->n_shares);
    double *y1 = malloc(sizeof(double) * (size_t)o->n_shares);
    if (!rc && (!x || !y0 || !y1))
        rc = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    for (int k = 0; k < SFI_POLICY_N_KINDS && !rc; k++) {
        size_t n = 0;
        for (int i = 0; i < r->n_rows; i++)
            if ((int)r->rows[i].kind == k) {
                x[n] = pct(r->rows[i].share);
                y0[n] = r->rows[i].dnll;
                y1[n] = r->rows[i].kl > 0.0 ? r->rows[i].kl : NAN;
                n++;
            }
        if (!n)
            continue;
        const char *name = sfi_policy_kind_name((sfi_policy_kind)k);
        rc = sfi_plot_line(p, 0, name, x, y0, n, 1, err);
        if (!rc)
            rc = sfi_plot_line(p, 1, name, x, y1, n, 1, err);
    }
    if (!rc)
        rc = sfi_plot_write_png(p, path, err);
    free(x);
    free(y0);
    free(y1);
    sfi_plot_free(p);
    return rc;
}

/* sfi-ref eval's command line. */
typedef struct {
    const char *model, *text, *idsf, *trace, *tok_dir, *png, *calib_path;
    int request, offset, quiet;
    int format; /* 0 table, 1 csv, 2 json */
    sfi_eval_opts o;
} eval_args;

enum { O_TEXT = 256, O_IDS, O_TRACE, O_REQUEST, O_OFFSET, O_POLICIES, O_CALIB, O_PARAMS,
       O_BACKEND, O_TOKENIZER, O_BOOT, O_SEED, O_THREADS, O_FORMAT, O_PNG };

/* One option getopt_long returned (c, with optarg) into a. Returns -1 to
 * go on, else the exit code. */
static int eval_option(eval_args *a, int c, char **argv)
{
    sfi_eval_opts *o = &a->o;
    sfi_error e;
    sfi_error_clear(&e);
    switch (c) {
    case 'm': a->model = optarg; break;
    case O_TEXT: a->text = optarg; break;
    case O_IDS: a->idsf = optarg; break;
    case O_TRACE: a->trace = optarg; break;
    case O_REQUEST:
        if (parse_int(optarg, "--request", 0, &a->request))
            return 2;
        break;
    case 'L':
        if (parse_int(optarg, "--prefix", 1, &o->n_prefix))
            return 2;
        break;
    case 'n':
        if (parse_int(optarg, "--tokens", 1, &o->n_tokens))
            return 2;
        break;
    case O_OFFSET:
        if (parse_int(optarg, "--offset", 0, &a->offset))
            return 2;
        break;
    case 'b':
        if (sfi_eval_parse_shares(optarg, o, &e)) {
            fprintf(stderr, "sfi-ref eval: --%s\n", e.msg);
            return 2;
        }
        break;
    case O_POLICIES:
        if (sfi_policy_parse_list(optarg, &o->policies, &e)) {
            fprintf(stderr, "sfi-ref eval: --policies: %s\n", e.msg);
            return 2;
        }
        break;
    case O_CALIB: a->calib_path = optarg; break;
    case 'P':
        if (sfi_policy_config_set(&o->cfg, optarg, &e)) {
            fprintf(stderr, "sfi-ref eval: %s\n", e.msg);
            return 2;
        }
        break;
    case O_PARAMS:
        if (sfi_params_load_file(&o->cfg.prm, optarg, &e)) {
            fprintf(stderr, "sfi-ref eval: %s\n", e.msg);
            return 1;
        }
        break;
    case O_BACKEND:
        if (sfi_backend_parse(optarg, &o->backend, &e)) {
            fprintf(stderr, "sfi-ref eval: --%s\n", e.msg);
            return 2;
        }
        break;
    case O_TOKENIZER: a->tok_dir = optarg; break;
    case O_BOOT:
        if (parse_int(optarg, "--bootstrap", 0, &o->n_boot))
            return 2;
        break;
    case O_SEED: {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(optarg, &end, 10);
        if (!*optarg || *end || errno || *optarg == '-') {
            fprintf(stderr, "sfi-ref eval: --seed '%s': expected a non-negative integer\n",
                    optarg);
            return 2;
        }
        o->seed = s;
        break;
    }
    case O_THREADS:
        if (parse_int(optarg, "--threads", 1, &o->n_threads))
            return 2;
        if (o->n_threads > SFI_EVAL_MAX_THREADS) {
            fprintf(stderr, "sfi-ref eval: --threads %d: at most %d\n", o->n_threads,
                    SFI_EVAL_MAX_THREADS);
            return 2;
        }
        break;
    case O_FORMAT:
        if (!strcmp(optarg, "table"))
            a->format = 0;
        else if (!strcmp(optarg, "csv"))
            a->format = 1;
        else if (!strcmp(optarg, "json"))
            a->format = 2;
        else {
            fprintf(stderr, "sfi-ref eval: --format: '%s' is not table, csv or json\n", optarg);
            return 2;
        }
        break;
    case O_PNG: a->png = optarg; break;
    case 'q': a->quiet = 1; break;
    case 'h': usage(stdout); return 0;
    default: return sfi_cli_bad_option("sfi-ref eval", argv, "mLnbP", usage);
    }
    return -1;
}

/* The command line into a. Returns -1 to go on, else the exit code. */
static int eval_parse(int argc, char **argv, eval_args *a)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"text", required_argument, NULL, O_TEXT},
        {"ids", required_argument, NULL, O_IDS},
        {"trace", required_argument, NULL, O_TRACE},
        {"request", required_argument, NULL, O_REQUEST},
        {"prefix", required_argument, NULL, 'L'},
        {"tokens", required_argument, NULL, 'n'},
        {"offset", required_argument, NULL, O_OFFSET},
        {"budgets", required_argument, NULL, 'b'},
        {"policies", required_argument, NULL, O_POLICIES},
        {"calib", required_argument, NULL, O_CALIB},
        {"param", required_argument, NULL, 'P'},
        {"params", required_argument, NULL, O_PARAMS},
        {"backend", required_argument, NULL, O_BACKEND},
        {"tokenizer", required_argument, NULL, O_TOKENIZER},
        {"bootstrap", required_argument, NULL, O_BOOT},
        {"seed", required_argument, NULL, O_SEED},
        {"threads", required_argument, NULL, O_THREADS},
        {"format", required_argument, NULL, O_FORMAT},
        {"png", required_argument, NULL, O_PNG},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(a, 0, sizeof *a);
    sfi_eval_opts_default(&a->o);
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:L:n:b:P:qh", opts, NULL)) != -1) {
        int rc = eval_option(a, c, argv);
        if (rc >= 0)
            return rc;
    }
    if (optind < argc) {
        fprintf(stderr, "sfi-ref eval: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!a->model || (!!a->text + !!a->idsf + !!a->trace) != 1) {
        fprintf(stderr, "sfi-ref eval: need --model and exactly one of --text, --ids, --trace\n");
        usage(stderr);
        return 2;
    }
    sfi_error e;
    if (sfi_params_validate(&a->o.cfg.prm, &e)) {
        fprintf(stderr, "sfi-ref eval: %s\n", e.msg);
        return 2;
    }
    if (!(a->o.policies & ~(1u << SFI_POLICY_FULL))) {
        fprintf(stderr, "sfi-ref eval: --policies: nothing to compare with full KV\n");
        return 2;
    }
    a->o.progress = a->quiet ? NULL : stderr;
    return -1;
}

/* What a run holds (eval_free releases it). */
typedef struct {
    sfi_qwen3 *m;
    sfi_tokenizer *tk;
    sfi_trigger_set ts;
    int have_ts;
    int32_t *ids;
    int n_ids;
    sfi_eval_result res;
    sfi_policy_calib calib;
} eval_state;

static void eval_free(eval_state *s)
{
    sfi_eval_result_free(&s->res);
    sfi_policy_calib_free(&s->calib);
    free(s->ids);
    if (s->have_ts)
        sfi_trigger_set_free(&s->ts);
    sfi_tokenizer_free(s->tk);
    sfi_qwen3_free(s->m);
}

/* The model, and the tokenizer with SFI's trigger set when its files are
 * there (a text needs them). 0 or 1 (reported). */
static int eval_load(eval_args *a, eval_state *s)
{
    sfi_error e;
    if (sfi_qwen3_load(a->model, &s->m, &e)) {
        fprintf(stderr, "sfi-ref eval: %s\n", e.msg);
        return 1;
    }
    if (!a->tok_dir)
        a->tok_dir = a->model;
    const char *tok_dir = a->tok_dir;
    if (file_exists(tok_dir, "vocab.json") && file_exists(tok_dir, "merges.txt")) {
        if (sfi_tokenizer_load(tok_dir, &s->tk, &e) ||
            sfi_ref_tokenizer_fits(s->tk, tok_dir, sfi_qwen3_config(s->m), &e)) {
            fprintf(stderr, "sfi-ref eval: %s\n", e.msg);
            return 1;
        }
        if (sfi_trigger_set_build(sfi_tokenizer_vocab(s->tk), a->o.cfg.prm.trigger_chars, &s->ts,
                                  &e)) {
            fprintf(stderr, "sfi-ref eval: %s\n", e.msg);
            return 1;
        }
        s->have_ts = 1;
        a->o.is_trigger = s->ts.is_trigger;
        a->o.n_trigger_vocab = s->ts.n_vocab;
    } else if (a->text) {
        fprintf(stderr, "sfi-ref eval: %s: no vocab.json + merges.txt to encode the text "
                        "(give --tokenizer DIR)\n", tok_dir);
        return 1;
    } else if (!a->quiet) {
        fprintf(stderr, "sfi-ref eval: note: no tokenizer files in %s: SFI's trigger set is "
                        "empty, slow steps come from T_max only\n", tok_dir);
    }
    return 0;
}

/* The token ids: the text encoded, the id list, or the trace request's
 * prompt and generated tokens. 0 or 1 (reported). */
static int eval_read_tokens(const eval_args *a, eval_state *s)
{
    const char *text = a->text, *idsf = a->idsf;
    if (!text && !idsf)
        return trace_ids(a->trace, a->request, &s->ids, &s->n_ids);
    sfi_error e;
    const char *path = text ? text : idsf;
    size_t len = 0;
    char *buf = NULL;
    sfi_status st = strcmp(path, "-")
                        ? sfi_io_read(path, EVAL_MAX_INPUT, text ? "text" : "list of ids", &buf,
                                      &len, &e)
                        : sfi_io_read_stream(stdin, "standard input", EVAL_MAX_INPUT,
                                             "list of ids", &buf, &len, &e);
    if (st) {
        fprintf(stderr, "sfi-ref eval: %s\n", e.msg);
        return 1;
    }
    if (idsf) {
        st = sfi_ref_parse_ids(path, buf, len, &s->ids, &s->n_ids, &e);
        free(buf);
        if (st) {
            fprintf(stderr, "sfi-ref eval: %s\n", e.msg);
            return 1;
        }
        return 0;
    }
    size_t n = 0;
    st = sfi_tokenizer_encode(s->tk, buf, len, &s->ids, &n, &e);
    free(buf);
    if (st) {
        fprintf(stderr, "sfi-ref eval: %s: %s\n", text, e.msg);
        return 1;
    }
    if (n > INT_MAX / 4) {
        fprintf(stderr, "sfi-ref eval: %s: too long\n", text);
        return 1;
    }
    s->n_ids = (int)n;
    return 0;
}

/* Enough tokens from --offset, each in the model's vocabulary. */
static int eval_check_tokens(const eval_args *a, const eval_state *s, const char *src)
{
    const sfi_model_config *cfg = sfi_qwen3_config(s->m);
    const int32_t *ids = s->ids;
    long need = (long)a->offset + a->o.n_prefix + a->o.n_tokens + 1;
    if (s->n_ids < need) {
        fprintf(stderr, "sfi-ref eval: %s: %d tokens; --offset %d, --prefix %d and --tokens %d "
                        "need %ld\n", src, s->n_ids, a->offset, a->o.n_prefix, a->o.n_tokens,
                need);
        return 1;
    }
    for (int i = a->offset; i < need; i++)
        if (ids[i] < 0 || ids[i] >= cfg->vocab_size) {
            fprintf(stderr, "sfi-ref eval: %s: token %d (id %d) is outside the model's "
                            "vocabulary [0, %d): another tokenizer's ids?\n",
                    src, i, (int)ids[i], cfg->vocab_size);
            return 1;
        }
    return 0;
}

/* The PNG when asked, then the table, CSV or JSON on standard output. */
static int eval_report(const eval_args *a, const eval_state *s, const char *src)
{
    const char *model = a->model;
    sfi_error e;
    if (a->png) {
        const char *base = strrchr(model, '/');
        char title[200];
        snprintf(title, sizeof title, "%s, %d+%d tokens",
                 base && base[1] ? base + 1 : model, s->res.n_prefix, s->res.n_tokens);
        if (write_png(a->png, title, &a->o, &s->res, &e)) {
            fprintf(stderr, "sfi-ref eval: %s\n", e.msg);
            return 1;
        }
    }
    if (a->format == 0)
        print_table(model, src, &a->o, &s->res);
    else if (a->format == 1)
        print_csv(&s->res);
    else if (print_json(model, src, &a->o, &s->res))
        return 1;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "sfi-ref eval: writing standard output failed\n");
        return 1;
    }
    return 0;
}

int sfi_ref_cmd_eval(int argc, char **argv)
{
    eval_args a;
    int rc = eval_parse(argc, argv, &a);
    if (rc >= 0)
        return rc;
    eval_state s;
    memset(&s, 0, sizeof s);
    rc = 1;
    const char *src = a.text ? a.text : a.idsf ? a.idsf : a.trace;
    if (eval_load(&a, &s) || eval_read_tokens(&a, &s) || eval_check_tokens(&a, &s, src))
        goto out;
    sfi_error e;
    if (a.calib_path) {
        if (sfi_policy_calib_load(a.calib_path, &s.calib, &e)) {
            fprintf(stderr, "sfi-ref eval: --calib: %s\n", e.msg);
            goto out;
        }
        a.o.calib = &s.calib;
    }
    if (sfi_eval_run(s.m, &a.o, s.ids + a.offset, s.n_ids - a.offset, &s.res, &e)) {
        fprintf(stderr, "sfi-ref eval: %s: %s\n", a.model, e.msg);
        goto out;
    }
    if (eval_report(&a, &s, src))
        goto out;
    rc = 0;
out:
    if (a.png)
        sfi_plot_release_fonts();
    eval_free(&s);
    return rc;
}
