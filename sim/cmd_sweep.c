/* sfi-sim sweep (also the default run): replays a trace's token stream
 * through the trigger policies and prices every (model, GPU, TP, context,
 * batch, policy) with the cost model; table/CSV/JSON and PNG figures. */
#include <config.h>

#include "sfi_sim_cli.h"

#include <errno.h>
#include <getopt.h>
#include <glob.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "sfi_cost.h"
#include "sfi_model.h"
#include "sfi_plot.h"
#include "sfi_replay.h"
#include "sfi_sim_util.h"
#include "sfi_trace.h"
#include "sfi_vocab.h"

#define DEFAULT_MODELS "Qwen3-0.6B,Qwen3-4B,Qwen3-30B-A3B,Qwen3-235B-A22B"
#define DEFAULT_CONTEXTS "8K,16K,32K,64K,128K"
#define DEFAULT_PNG "sfi-sim-sweep.png"
#define SYNTH_TOKENS 65536
#define SYNTH_MEAN_SENTENCE 24.0
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
            "  --tp LIST         tensor-parallel degrees, or auto: the smallest power of\n"
            "                    two that fits the largest context [auto]\n"
            "  --contexts LIST   context lengths, K = 1024 [" DEFAULT_CONTEXTS "]\n"
            "  --batch LIST      requests decoded together [8]\n"
            "  --policies LIST   policies, NAME or NAME:key=value,... [all]\n"
            "                    (see 'sfi-sim presets')\n"
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
            "  --format F        table, csv or json [table]\n"
            "  -o, --output FILE write the table there instead of stdout\n"
            "  --png FILE        figure: tokens/s and speedup vs context [" DEFAULT_PNG "]\n"
            "  --no-png          do not write the figure\n"
            "  --timeline-png FILE  per-step latency of the first %d steps\n"
            "  -h, --help        this help\n\n"
            "Exit status: 0 ok, 1 bad input or nothing fits, 2 usage error.\n"
            "See sfi-sim-sweep(1).\n",
            TIMELINE_STEPS);
}

typedef struct {
    int model, gpu, tp, context, batch, policy;
    int fits, max_batch;
    double tok_s, speedup, mean_s, p50_s, p99_s, slow_frac, bytes_per_tok, kv_per_req,
        exposed_s;
} row;

typedef struct {
    char *name; /* policy spec as given */
    sfi_policy_kind kind;
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
    sfi_policy_config cfg;   /* --param: SFI and policy parameters */
    sfi_budget budget;
    int weight_bytes;
    int64_t steps;
    /* stream */
    int32_t *tokens;
    int64_t n_tokens;
    uint8_t *is_trigger;
    int32_t n_vocab;
    char stream_label[512];
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
    free(s->tokens);
    free(s->is_trigger);
}

/* ---- the token stream ---- */

static sfi_status load_trigger_set(const char *dir, uint8_t **is_trigger, int32_t *n_vocab,
                                   const sfi_params *prm, sfi_error *err)
{
    sfi_vocab *v;
    sfi_status st = sfi_vocab_load(dir, &v, err);
    if (st)
        return st;
    sfi_trigger_set ts;
    st = sfi_trigger_set_build(v, prm->trigger_chars, &ts, err);
    sfi_vocab_free(v);
    if (st)
        return st;
    *is_trigger = ts.is_trigger;
    *n_vocab = ts.n_vocab;
    ts.is_trigger = NULL;
    sfi_trigger_set_free(&ts);
    return SFI_OK;
}

/* Appends every request's decode tokens of a trace. */
/* 1 when a trace's recorded step reasons tell, for every decode token but
 * the last of a request, whether it is in the trigger set that `prm`
 * defines: recorded under the sfi or boundary policy (whose step t >= 1 is
 * slow with reason "trigger" exactly when x_{t-1} is a trigger token, see
 * sfi_trigger_next) with the same trigger characters. */
static int reasons_reveal_triggers(const sfi_trace_meta *m, const sfi_params *prm)
{
    if (!m->policy || (strcmp(m->policy, "sfi") && strcmp(m->policy, "boundary")))
        return 0;
    sfi_params def;
    sfi_params_default(&def);
    const char *chars = def.trigger_chars;
    json_t *pj = m->params_json ? json_loads(m->params_json, 0, NULL) : NULL;
    json_t *tc = pj ? json_object_get(pj, "trigger_chars") : NULL;
    if (tc && json_is_string(tc))
        chars = json_string_value(tc);
    int same = !strcmp(chars, prm->trigger_chars);
    json_decref(pj);
    return same;
}

static sfi_status load_trace_tokens(const char *path, int32_t **tokens, uint8_t **flags,
                                    int *all_reveal, const sfi_params *prm, int64_t *n,
                                    int64_t *n_req, char *tok_id, size_t tok_cap, int *skipped,
                                    sfi_error *err)
{
    sfi_trace *t;
    sfi_status st = sfi_trace_open(path, &t, err);
    if (st)
        return st;
    /* Joined traces must share one vocabulary: the trigger set is one. */
    const char *tk = sfi_trace_get_meta(t)->tokenizer;
    if (!tk)
        tk = "";
    if (skipped && *n > 0 && strcmp(tk, tok_id)) {
        fprintf(stderr, "sfi-sim: %s: recorded with another tokenizer than the first trace; skipped\n",
                path);
        sfi_trace_close(t);
        (*skipped)++;
        return SFI_OK;
    }
    if (*n == 0)
        snprintf(tok_id, tok_cap, "%s", tk);
    int64_t nr = sfi_trace_n_requests(t), total = sfi_trace_n_steps(t);
    if (total < 1) {
        sfi_trace_close(t);
        return sfi_error_set(err, SFI_EFORMAT, "%s: trace has no decode steps to replay", path);
    }
    int32_t *buf = realloc(*tokens, (size_t)(*n + total) * sizeof *buf);
    if (buf)
        *tokens = buf;
    uint8_t *fl = buf ? realloc(*flags, (size_t)(*n + total)) : NULL;
    if (!buf || !fl) {
        sfi_trace_close(t);
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    }
    *flags = fl;
    if (!reasons_reveal_triggers(sfi_trace_get_meta(t), prm))
        *all_reveal = 0;
    int64_t got = 0;
    for (int64_t r = 0; r < nr && !st; r++) {
        sfi_trace_steps s;
        st = sfi_trace_read_steps(t, r, &s, err);
        if (st)
            break;
        if (got + s.n > total) {
            st = sfi_error_set(err, SFI_EFORMAT, "%s: more steps than the trace's count", path);
        } else {
            memcpy(buf + *n + got, s.token, (size_t)s.n * sizeof *buf);
            /* Token i is a trigger iff step i+1 was slow for a trigger; the
             * request's last token is taken as none. */
            for (int64_t i = 0; i < s.n; i++)
                fl[*n + got + i] = i + 1 < s.n && s.reason[i + 1] == SFI_REASON_TRIGGER;
            got += s.n;
        }
        sfi_trace_steps_free(&s);
    }
    sfi_trace_close(t);
    if (st)
        return st;
    *n += got;
    *n_req += nr;
    return SFI_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static sfi_status setup_stream(sweep *s, const char *trace_opt, const char *tok_dir, int synthetic,
                               sfi_error *err)
{
    char *paths[64];
    int n_paths = 0;
    glob_t g;
    int have_glob = 0;
    const char *env = getenv("SFI_TRACE");
    if (trace_opt) {
        paths[n_paths++] = (char *)trace_opt;
    } else if (!synthetic && env && env[0]) {
        paths[n_paths++] = (char *)env;
    } else if (!synthetic) {
        /* The bundled samples: sample-*.db if present, else every *.db of
         * traces/ (kjv-8k.db, ...). Only traces recorded with the same
         * tokenizer as the first one are joined (checked when loading). */
        const char *dirs[] = {SFI_SIM_SRCDIR "/traces", SFI_SIM_PKGDATADIR "/traces"};
        const char *pats[] = {"sample-*.db", "*.db"};
        for (int d = 0; d < 2 && !n_paths; d++)
            for (int k = 0; k < 2 && !n_paths; k++) {
                char pat[4096];
                snprintf(pat, sizeof pat, "%s/%s", dirs[d], pats[k]);
                if (have_glob)
                    globfree(&g);
                have_glob = 0;
                if (glob(pat, 0, NULL, &g) == 0) {
                    have_glob = 1;
                    for (size_t i = 0; i < g.gl_pathc && n_paths < 64; i++)
                        paths[n_paths++] = g.gl_pathv[i];
                    qsort(paths, (size_t)n_paths, sizeof *paths, cmp_str);
                }
            }
        if (!n_paths)
            fprintf(stderr,
                    "sfi-sim: no sample trace found (looked for *.db in %s/traces and "
                    "%s/traces; set SFI_TRACE or pass --trace): using a SYNTHETIC trigger "
                    "stream\n",
                    SFI_SIM_SRCDIR, SFI_SIM_PKGDATADIR);
    }
    sfi_status st = SFI_OK;
    if (n_paths) {
        int64_t n_req = 0;
        int skipped = 0, used = 0, reveal = 1;
        uint8_t *flags = NULL;
        char tok_id[256] = "";
        for (int i = 0; i < n_paths && !st; i++) {
            int before = skipped;
            /* An explicit --trace or $SFI_TRACE is one file: no skipping. */
            st = load_trace_tokens(paths[i], &s->tokens, &flags, &reveal, &s->cfg.prm, &s->n_tokens,
                                   &n_req, tok_id, sizeof tok_id, n_paths > 1 ? &skipped : NULL,
                                   err);
            used += !st && skipped == before;
        }
        const char *how = "";
        if (!st && reveal && !tok_dir) {
            /* The recorded decisions already say which tokens are
             * triggers: replay a 0/1 stream and skip loading the 4 MB
             * vocabulary (same decisions through sfi_trigger_next). */
            for (int64_t i = 0; i < s->n_tokens; i++)
                s->tokens[i] = flags[i];
            s->is_trigger = malloc(2);
            if (!s->is_trigger) {
                st = sfi_error_set(err, SFI_ENOMEM, "out of memory");
            } else {
                s->is_trigger[0] = 0;
                s->is_trigger[1] = 1;
                s->n_vocab = 2;
                how = "; trigger tokens from its recorded decisions";
            }
        } else if (!st) {
            const char *dir = tok_dir ? tok_dir : SFI_SIM_SRCDIR "/tests/fixtures/qwen3-tokenizer";
            st = load_trigger_set(dir, &s->is_trigger, &s->n_vocab, &s->cfg.prm, err);
            if (st)
                sfi_error_prefix(err, "trigger set (--tokenizer)");
        }
        free(flags);
        if (!st) {
            char more[32] = "";
            if (used > 1)
                snprintf(more, sizeof more, " + %d more", used - 1);
            snprintf(s->stream_label, sizeof s->stream_label,
                     "trace %s%s (%lld requests, %lld decode tokens%s)", paths[0], more,
                     (long long)n_req, (long long)s->n_tokens, how);
        }
        if (have_glob)
            globfree(&g);
        return st;
    }
    if (have_glob)
        globfree(&g);
    st = sfi_replay_synthetic(SYNTH_TOKENS, SYNTH_MEAN_SENTENCE, 1, &s->tokens, &s->is_trigger, err);
    if (st)
        return st;
    s->n_tokens = SYNTH_TOKENS;
    s->n_vocab = 2;
    snprintf(s->stream_label, sizeof s->stream_label,
             "SYNTHETIC trigger stream (mean sentence %.0f tokens; no trace)", SYNTH_MEAN_SENTENCE);
    return SFI_OK;
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

/* Requests of a batch are spread over one period of the policy's refresh
 * cycle (see sfi_replay.h), as they would be under continuous batching. */
static int64_t stagger_of(const policy_spec *p)
{
    return p->kind == SFI_POLICY_INTERVAL ? p->cfg.interval : p->cfg.prm.T_max;
}

static sfi_status price_cell(const sfi_cost_setup *cs, const sfi_replay_result *rp, row *r,
                             double **step_time, sfi_error *err)
{
    const int B = cs->batch;
    sfi_cost_memory mem;
    sfi_status st = sfi_cost_memory_of(cs, &mem, err);
    if (st)
        return st;
    r->max_batch = mem.max_batch;
    r->kv_per_req = mem.kv_per_request;
    r->fits = B <= mem.max_batch;
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
    r->slow_frac = rp ? (double)rp->slow / ((double)rp->steps * B)
                      : (cs->kind == SFI_POLICY_FULL ? 1.0 : 0.0);
    free(v);
    if (step_time)
        *step_time = tt;
    return SFI_OK;
}

/* ---- option parsing ---- */

static int split_list(const char *arg, char ***out)
{
    int n = 1;
    for (const char *p = arg; *p; p++)
        n += *p == ',';
    char **v = calloc((size_t)n, sizeof *v);
    if (!v)
        return -1;
    int k = 0;
    const char *p = arg;
    for (;;) {
        size_t len = strcspn(p, ",");
        v[k] = malloc(len + 1);
        if (!v[k]) {
            for (int i = 0; i < k; i++)
                free(v[i]);
            free(v);
            return -1;
        }
        memcpy(v[k], p, len);
        v[k][len] = 0;
        k++;
        if (!p[len])
            break;
        p += len + 1;
    }
    *out = v;
    return k;
}

static void free_list(char **v, int n)
{
    for (int i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* Policy lists are split on commas that start a new policy name, so
 * "quest:page=32,k=1024,sfi" gives two policies. */
static int split_policies(const char *arg, char ***out)
{
    char **parts;
    int n = split_list(arg, &parts);
    if (n < 0)
        return -1;
    char **v = calloc((size_t)n, sizeof *v);
    int k = 0;
    for (int i = 0; i < n && v; i++) {
        if (k > 0 && strchr(parts[i], '=') && !strchr(parts[i], ':')) {
            size_t a = strlen(v[k - 1]), b = strlen(parts[i]);
            char *j = realloc(v[k - 1], a + b + 2);
            if (!j)
                continue;
            j[a] = ',';
            memcpy(j + a + 1, parts[i], b + 1);
            v[k - 1] = j;
        } else {
            v[k++] = parts[i];
            parts[i] = NULL;
        }
    }
    free_list(parts, n);
    if (!v)
        return -1;
    *out = v;
    return k;
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
    int n = split_list(arg, &v);
    if (n < 0)
        return -1;
    int *x = calloc((size_t)n, sizeof *x);
    if (!x) {
        free_list(v, n);
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
            free_list(v, n);
            return -2;
        }
        x[i] = (int)val;
    }
    free_list(v, n);
    *out = x;
    return n;
}

/* ---- output ---- */

static const char *model_label(const sweep *s, int i)
{
    return s->models[i].name[0] ? s->models[i].name : s->model_names[i];
}

static void print_table(FILE *f, const sweep *s, const row *rows, int n)
{
    char bud[32];
    sfi_budget_format(&s->budget, bud, sizeof bud);
    fprintf(f, "# sfi-sim sweep: %s; %lld steps per cell; profile %s; budget %s; K=%d n_sink=%d "
            "n_recent=%d T_max=%d\n", s->stream_label, (long long)s->steps, s->prof.name, bud,
            s->cfg.prm.K, s->cfg.prm.n_sink, s->cfg.prm.n_recent, s->cfg.prm.T_max);
    fprintf(f, "%-16s %-9s %3s %7s %5s %-10s %10s %7s %8s %8s %8s %6s %10s %9s %9s\n", "model",
            "gpu", "tp", "context", "batch", "policy", "tok/s", "speedup", "mean_ms", "p50_ms",
            "p99_ms", "slow%", "HBM_MB/tok", "KV_GB/req", "max_batch");
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        fprintf(f, "%-16s %-9s %3d %7d %5d %-10s ", model_label(s, r->model), s->gpus[r->gpu].name,
                r->tp, r->context, r->batch, s->pols[r->policy].name);
        if (r->fits)
            fprintf(f, "%10.1f %7.2f %8.3f %8.3f %8.3f %6.2f %10.2f", r->tok_s, r->speedup,
                    r->mean_s * 1e3, r->p50_s * 1e3, r->p99_s * 1e3, r->slow_frac * 100,
                    r->bytes_per_tok / 1e6);
        else
            fprintf(f, "%10s %7s %8s %8s %8s %6s %10s", "no-fit", "-", "-", "-", "-", "-", "-");
        fprintf(f, " %9.3f %9d\n", r->kv_per_req / 1e9, r->max_batch);
    }
}

static void csv_str(FILE *f, const char *s)
{
    int q = strpbrk(s, ",\"\n") != NULL;
    if (!q) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void print_csv(FILE *f, const sweep *s, const row *rows, int n)
{
    fprintf(f, "model,gpu,tp,context,batch,policy,fits,tokens_per_s,speedup,mean_ms,p50_ms,p99_ms,"
               "slow_fraction,hbm_bytes_per_token,kv_bytes_per_request,max_batch,exposed_us\n");
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        csv_str(f, model_label(s, r->model));
        fputc(',', f);
        csv_str(f, s->gpus[r->gpu].name);
        fprintf(f, ",%d,%d,%d,", r->tp, r->context, r->batch);
        csv_str(f, s->pols[r->policy].name);
        if (r->fits)
            fprintf(f, ",1,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g", r->tok_s, r->speedup, r->mean_s * 1e3,
                    r->p50_s * 1e3, r->p99_s * 1e3, r->slow_frac, r->bytes_per_tok);
        else
            fprintf(f, ",0,,,,,,,");
        fprintf(f, ",%.6g,%d,%.6g\n", r->kv_per_req, r->max_batch, r->fits ? r->exposed_s * 1e6 : 0);
    }
}

static int print_json(FILE *f, const sweep *s, const row *rows, int n)
{
    json_t *root = json_object(), *arr = json_array();
    if (!root || !arr)
        return -1;
    json_object_set_new(root, "stream", json_string(s->stream_label));
    json_object_set_new(root, "steps_per_cell", json_integer(s->steps));
    json_object_set_new(root, "profile", json_string(s->prof.name));
    char bud[32];
    sfi_budget_format(&s->budget, bud, sizeof bud);
    json_object_set_new(root, "budget", json_string(bud));
    json_object_set_new(root, "K", json_integer(s->cfg.prm.K));
    json_object_set_new(root, "n_sink", json_integer(s->cfg.prm.n_sink));
    json_object_set_new(root, "n_recent", json_integer(s->cfg.prm.n_recent));
    json_object_set_new(root, "T_max", json_integer(s->cfg.prm.T_max));
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
            json_object_set_new(o, "speedup", json_real(r->speedup));
            json_object_set_new(o, "mean_ms", json_real(r->mean_s * 1e3));
            json_object_set_new(o, "p50_ms", json_real(r->p50_s * 1e3));
            json_object_set_new(o, "p99_ms", json_real(r->p99_s * 1e3));
            json_object_set_new(o, "slow_fraction", json_real(r->slow_frac));
            json_object_set_new(o, "hbm_bytes_per_token", json_real(r->bytes_per_tok));
            json_object_set_new(o, "exposed_us", json_real(r->exposed_s * 1e6));
        }
        json_object_set_new(o, "kv_bytes_per_request", json_real(r->kv_per_req));
        json_object_set_new(o, "max_batch", json_integer(r->max_batch));
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "rows", arr);
    int rc = json_dumpf(root, f, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
    fputc('\n', f);
    json_decref(root);
    return rc;
}

static sfi_status write_figure(const sweep *s, const row *rows, int n, const char *path,
                               sfi_error *err)
{
    /* One row of two panels per (model, GPU, TP, batch) group, in order. */
    int groups = 0;
    int gidx[16];
    for (int i = 0; i < n; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++)
            first = !(rows[j].model == rows[i].model && rows[j].gpu == rows[i].gpu &&
                      rows[j].tp == rows[i].tp && rows[j].batch == rows[i].batch);
        if (!first)
            continue;
        if (groups == 16) {
            fprintf(stderr, "sfi-sim: %s: only the first 16 (model, GPU, TP, batch) groups drawn\n", path);
            break;
        }
        gidx[groups++] = i;
    }
    sfi_plot *p = sfi_plot_new(1500, 360 * groups, groups, 2);
    if (!p)
        return sfi_error_set(err, SFI_ENOMEM, "%s: cannot create figure", path);
    double *x = malloc((size_t)s->n_contexts * sizeof *x), *y1 = malloc((size_t)s->n_contexts * sizeof *y1),
           *y2 = malloc((size_t)s->n_contexts * sizeof *y2);
    sfi_status st = (!x || !y1 || !y2) ? sfi_error_set(err, SFI_ENOMEM, "out of memory") : SFI_OK;
    for (int g = 0; g < groups && !st; g++) {
        const row *r0 = &rows[gidx[g]];
        char title[256];
        snprintf(title, sizeof title, "%s on %s (TP %d, batch %d): throughput", model_label(s, r0->model),
                 s->gpus[r0->gpu].name, r0->tp, r0->batch);
        st = sfi_plot_axes(p, 2 * g, title, "context (tokens)", "tokens/s",
                           SFI_PLOT_XLOG2 | SFI_PLOT_XKILO | SFI_PLOT_YZERO, err);
        snprintf(title, sizeof title, "%s on %s: speedup over full KV", model_label(s, r0->model),
                 s->gpus[r0->gpu].name);
        if (!st)
            st = sfi_plot_axes(p, 2 * g + 1, title, "context (tokens)", "speedup (x)",
                               SFI_PLOT_XLOG2 | SFI_PLOT_XKILO | SFI_PLOT_YZERO, err);
        for (int pi = 0; pi < s->n_pols && !st; pi++) {
            int m = 0;
            for (int i = 0; i < n; i++) {
                const row *r = &rows[i];
                if (r->model != r0->model || r->gpu != r0->gpu || r->tp != r0->tp ||
                    r->batch != r0->batch || r->policy != pi)
                    continue;
                x[m] = r->context;
                y1[m] = r->fits ? r->tok_s : NAN;
                y2[m] = r->fits ? r->speedup : NAN;
                m++;
            }
            if (!m)
                continue;
            st = sfi_plot_line(p, 2 * g, s->pols[pi].name, x, y1, (size_t)m, 1, err);
            if (!st)
                st = sfi_plot_line(p, 2 * g + 1, s->pols[pi].name, x, y2, (size_t)m, 1, err);
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

static sfi_status resolve_tp_auto(const sweep *s, int m, int g, int batch, int *tp, sfi_error *err)
{
    int ctx_max = 0;
    for (int c = 0; c < s->n_contexts; c++)
        if (s->contexts[c] > ctx_max)
            ctx_max = s->contexts[c];
    int last_ok = 0;
    for (int t = 1; t <= 64; t *= 2) {
        sfi_cost_setup cs;
        sfi_cost_setup_init(&cs);
        cs.model = &s->models[m];
        cs.gpu = s->gpus[g];
        cs.tp = t;
        cs.context = ctx_max;
        cs.batch = batch;
        cs.budget = s->budget;
        cs.prof = s->prof;
        cs.weight_bytes = s->weight_bytes;
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
        if (t >= 8) /* one node; beyond it the rows show no-fit */
            break;
    }
    *tp = last_ok ? last_ok : 1;
    return SFI_OK;
}

int sfi_sim_cmd_sweep(int argc, char **argv)
{
    static const struct option opts[] = {
        {"models", required_argument, NULL, 'm'},   {"gpus", required_argument, NULL, 'g'},
        {"tp", required_argument, NULL, 't'},       {"contexts", required_argument, NULL, 'c'},
        {"batch", required_argument, NULL, 'b'},    {"policies", required_argument, NULL, 'P'},
        {"trace", required_argument, NULL, 'T'},    {"tokenizer", required_argument, NULL, 'k'},
        {"synthetic", no_argument, NULL, 'S'},      {"steps", required_argument, NULL, 's'},
        {"profile", required_argument, NULL, 'p'},  {"param", required_argument, NULL, 'x'},
        {"weight-bytes", required_argument, NULL, 'w'}, {"format", required_argument, NULL, 'f'},
        {"output", required_argument, NULL, 'o'},   {"png", required_argument, NULL, 'G'},
        {"no-png", no_argument, NULL, 'N'},         {"timeline-png", required_argument, NULL, 'L'},
        {"budget", required_argument, NULL, 'B'},   {"help", no_argument, NULL, 'h'},
        /* Singular spellings of the list options. */
        {"model", required_argument, NULL, 'm'},    {"gpu", required_argument, NULL, 'g'},
        {"context", required_argument, NULL, 'c'},  {"policy", required_argument, NULL, 'P'},
        {NULL, 0, NULL, 0}};
    const char *a_models = DEFAULT_MODELS, *a_gpus = "B200", *a_tp = "auto",
               *a_ctx = DEFAULT_CONTEXTS, *a_batch = "8", *a_pols = NULL, *a_trace = NULL,
               *a_tok = NULL, *a_prof = NULL, *a_fmt = "table", *a_out = NULL,
               *a_png = DEFAULT_PNG, *a_tl = NULL;
    int synthetic = 0;
    int64_t steps = 2048;
    int wbytes = 2;
    sweep s;
    memset(&s, 0, sizeof s);
    sfi_policy_config_default(&s.cfg);
    sfi_hw_profile_default(&s.prof);
    sfi_error err;
    int rc = 1;
    row *rows = NULL;
    sfi_replay_result *replays = NULL;
    int n_replays = 0;
    int drew = 0; /* a figure was drawn: release the font caches at the end */

    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        switch (c) {
        case 'm': a_models = optarg; break;
        case 'g': a_gpus = optarg; break;
        case 't': a_tp = optarg; break;
        case 'c': a_ctx = optarg; break;
        case 'b': a_batch = optarg; break;
        case 'P': a_pols = optarg; break;
        case 'T': a_trace = optarg; break;
        case 'k': a_tok = optarg; break;
        case 'S': synthetic = 1; break;
        case 's': {
            int64_t v;
            if (sfi_sim_parse_size(optarg, 1, &v) || v < 1 || v > 100000000) {
                fprintf(stderr, "sfi-sim sweep: --steps: '%s' is not in 1..1e8\n", optarg);
                return 2;
            }
            steps = v;
            break;
        }
        case 'p': a_prof = optarg; break;
        case 'B':
            if (sfi_budget_parse(optarg, &s.budget, &err) != SFI_OK) {
                fprintf(stderr, "sfi-sim sweep: --budget: %s\n", err.msg);
                return 2;
            }
            break;
        case 'x':
            if (sfi_policy_config_set(&s.cfg, optarg, &err) != SFI_OK) {
                fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
                return 1;
            }
            break;
        case 'w':
            if (strcmp(optarg, "1") && strcmp(optarg, "2")) {
                fprintf(stderr, "sfi-sim sweep: --weight-bytes: must be 1 or 2\n");
                return 2;
            }
            wbytes = atoi(optarg);
            break;
        case 'f': a_fmt = optarg; break;
        case 'o': a_out = optarg; break;
        case 'G': a_png = optarg; break;
        case 'N': a_png = NULL; break;
        case 'L': a_tl = optarg; break;
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
    if (strcmp(a_fmt, "table") && strcmp(a_fmt, "csv") && strcmp(a_fmt, "json")) {
        fprintf(stderr, "sfi-sim sweep: --format: '%s' is not table, csv or json\n", a_fmt);
        return 2;
    }
    if (sfi_params_validate(&s.cfg.prm, &err) != SFI_OK) {
        fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
        return 1;
    }
    s.steps = steps;
    s.weight_bytes = wbytes;
    if (a_prof && sfi_hw_profile_load(a_prof, &s.prof, NULL, NULL, &err) != SFI_OK) {
        fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
        return 1;
    }

    /* Models. */
    {
        char **v;
        int n = split_list(a_models, &v);
        if (n < 0)
            goto oom;
        s.model_names = v;
        s.n_models = n;
        s.models = calloc((size_t)n, sizeof *s.models);
        if (!s.models)
            goto oom;
        for (int i = 0; i < n; i++)
            if (sfi_model_resolve(v[i], &s.models[i], &err) != SFI_OK) {
                fprintf(stderr, "sfi-sim sweep: --models: %s\n", err.msg);
                goto out;
            }
    }
    /* GPUs. */
    {
        char **v;
        int n = split_list(a_gpus, &v);
        if (n < 0)
            goto oom;
        s.gpus = calloc((size_t)n, sizeof *s.gpus);
        s.n_gpus = n;
        for (int i = 0; i < n && s.gpus; i++)
            if (sfi_gpu_resolve(v[i], &s.gpus[i], &err) != SFI_OK) {
                fprintf(stderr, "sfi-sim sweep: --gpus: %s\n", err.msg);
                free_list(v, n);
                goto out;
            }
        free_list(v, n);
        if (!s.gpus)
            goto oom;
    }
    if ((s.n_tps = parse_int_list("--tp", a_tp, 1, 0, 1, 64, &s.tps)) < 0 ||
        (s.n_contexts = parse_int_list("--contexts", a_ctx, 0, 1, 1, 1 << 30, &s.contexts)) < 0 ||
        (s.n_batches = parse_int_list("--batch", a_batch, 0, 0, 1, 1 << 16, &s.batches)) < 0) {
        rc = 2;
        goto out;
    }
    /* Policies. */
    if (!a_pols || !strcasecmp(a_pols, "all")) {
        if ((s.n_pols = all_policies(&s.cfg, &s.pols)) < 0)
            goto oom;
    } else {
        char **v;
        int n = split_policies(a_pols, &v);
        if (n < 0)
            goto oom;
        s.pols = calloc((size_t)n, sizeof *s.pols);
        s.n_pols = s.pols ? n : 0;
        for (int i = 0; i < n; i++) {
            if (s.pols)
                s.pols[i].name = v[i];
            else
                free(v[i]);
        }
        free(v);
        if (!s.pols)
            goto oom;
        for (int i = 0; i < n; i++) {
            s.pols[i].cfg = s.cfg;
            if (sfi_policy_spec_parse(s.pols[i].name, &s.pols[i].kind, &s.pols[i].cfg, &err) ||
                sfi_params_validate(&s.pols[i].cfg.prm, &err)) {
                fprintf(stderr, "sfi-sim sweep: --policies: %s\n", err.msg);
                goto out;
            }
        }
    }
    if (setup_stream(&s, a_trace, a_tok, synthetic, &err) != SFI_OK) {
        fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
        goto out;
    }

    /* Replays: one per (policy, batch); the trigger stream does not depend
     * on model, GPU or context. */
    n_replays = s.n_pols * s.n_batches;
    replays = calloc((size_t)n_replays, sizeof *replays);
    if (!replays)
        goto oom;
    for (int pi = 0; pi < s.n_pols; pi++) {
        const policy_spec *ps = &s.pols[pi];
        if (!sfi_policy_has_slow_steps(ps->kind))
            continue;
        for (int bi = 0; bi < s.n_batches; bi++)
            if (sfi_replay_run(&(sfi_replay_stream){s.tokens, s.n_tokens, s.is_trigger, s.n_vocab},
                               sfi_policy_trigger_kind(ps->kind), &ps->cfg.prm, ps->cfg.interval,
                               s.batches[bi], stagger_of(ps), s.steps,
                               a_tl ? TIMELINE_STEPS : 0,
                               &replays[pi * s.n_batches + bi], &err) != SFI_OK) {
                fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
                goto out;
            }
    }

    size_t n_rows_max = (size_t)s.n_models * s.n_gpus * s.n_tps * s.n_contexts * s.n_batches * s.n_pols;
    rows = calloc(n_rows_max ? n_rows_max : 1, sizeof *rows);
    if (!rows)
        goto oom;
    int n_rows = 0, n_fit = 0;
    for (int m = 0; m < s.n_models; m++)
        for (int g = 0; g < s.n_gpus; g++)
            for (int ti = 0; ti < s.n_tps; ti++)
                for (int bi = 0; bi < s.n_batches; bi++) {
                    int tp = s.tps[ti];
                    if (tp == 0 && resolve_tp_auto(&s, m, g, s.batches[bi], &tp, &err) != SFI_OK) {
                        fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
                        goto out;
                    }
                    for (int ci = 0; ci < s.n_contexts; ci++) {
                        sfi_cost_setup cs;
                        sfi_cost_setup_init(&cs);
                        cs.model = &s.models[m];
                        cs.gpu = s.gpus[g];
                        cs.prof = s.prof;
                        cs.budget = s.budget;
                        cs.tp = tp;
                        cs.context = s.contexts[ci];
                        cs.batch = s.batches[bi];
                        cs.weight_bytes = s.weight_bytes;
                        /* Full-KV baseline of the speedup column. */
                        row base;
                        memset(&base, 0, sizeof base);
                        cs.kind = SFI_POLICY_FULL;
                        cs.pol = s.cfg;
                        if (price_cell(&cs, NULL, &base, NULL, &err) != SFI_OK) {
                            fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
                            goto out;
                        }
                        for (int pi = 0; pi < s.n_pols; pi++) {
                            row *r = &rows[n_rows];
                            cs.kind = s.pols[pi].kind;
                            cs.pol = s.pols[pi].cfg;
                            const sfi_replay_result *rp =
                                sfi_policy_has_slow_steps(cs.kind) ? &replays[pi * s.n_batches + bi]
                                                                   : NULL;
                            if (price_cell(&cs, rp, r, NULL, &err) != SFI_OK) {
                                fprintf(stderr, "sfi-sim sweep: %s (model %s, context %d, policy %s)\n",
                                        err.msg, model_label(&s, m), cs.context, s.pols[pi].name);
                                goto out;
                            }
                            r->model = m;
                            r->gpu = g;
                            r->tp = tp;
                            r->context = cs.context;
                            r->batch = cs.batch;
                            r->policy = pi;
                            r->speedup = base.fits ? r->tok_s / base.tok_s : NAN;
                            if (!base.fits && r->fits)
                                r->speedup = NAN;
                            n_fit += r->fits;
                            n_rows++;
                        }
                    }
                }

    /* Table. */
    {
        FILE *f = stdout;
        char *tmp = NULL;
        if (a_out) {
            size_t len = strlen(a_out) + 16;
            tmp = malloc(len);
            if (!tmp)
                goto oom;
            snprintf(tmp, len, "%s.tmpXXXXXX", a_out);
            int fd = mkstemp(tmp);
            f = fd >= 0 ? fdopen(fd, "w") : NULL;
            if (!f) {
                fprintf(stderr, "sfi-sim sweep: %s: cannot write: %s\n", a_out, strerror(errno));
                if (fd >= 0)
                    close(fd);
                free(tmp);
                goto out;
            }
        }
        if (!strcmp(a_fmt, "csv"))
            print_csv(f, &s, rows, n_rows);
        else if (!strcmp(a_fmt, "json"))
            print_json(f, &s, rows, n_rows);
        else
            print_table(f, &s, rows, n_rows);
        if (a_out) {
            int bad = ferror(f) | (fclose(f) != 0);
            if (bad || rename(tmp, a_out) != 0) {
                fprintf(stderr, "sfi-sim sweep: %s: cannot write\n", a_out);
                unlink(tmp);
                free(tmp);
                goto out;
            }
            free(tmp);
        } else if (fflush(stdout) != 0) {
            goto out;
        }
    }
    if (n_fit < n_rows)
        fprintf(stderr, "sfi-sim sweep: %d of %d rows do not fit in GPU memory (no-fit: batch > max_batch)\n",
                n_rows - n_fit, n_rows);
    if (n_fit == 0) {
        fprintf(stderr, "sfi-sim sweep: nothing fits: the batch does not fit at any context "
                        "(see max_batch; lower --batch or raise --tp)\n");
        goto out;
    }
    if (a_png && strcmp(a_png, "none")) {
        drew = 1;
        if (write_figure(&s, rows, n_rows, a_png, &err) != SFI_OK) {
            fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
            goto out;
        }
        fprintf(stderr, "sfi-sim sweep: wrote %s\n", a_png);
    }
    if (a_tl) {
        /* Per-step latency of the replayed policies at the first model,
         * GPU and batch and the largest context. */
        int ci_max = 0;
        for (int ci = 1; ci < s.n_contexts; ci++)
            if (s.contexts[ci] > s.contexts[ci_max])
                ci_max = ci;
        /* One panel per replayed policy, full KV drawn in each as the
         * reference; no replayed policy: full KV alone. */
        int n_panels = 0;
        for (int pi = 0; pi < s.n_pols; pi++)
            n_panels += sfi_policy_has_slow_steps(s.pols[pi].kind);
        if (n_panels == 0)
            n_panels = 1;
        if (n_panels > 16)
            n_panels = 16;
        sfi_plot *p = sfi_plot_new(1400, 80 + 240 * n_panels, n_panels, 1);
        if (!p)
            goto oom;
        drew = 1;
        int tp = rows[0].tp;
        sfi_status st = SFI_OK;
        double *x = malloc(TIMELINE_STEPS * sizeof *x), *y = malloc(TIMELINE_STEPS * sizeof *y),
               *yf = malloc(TIMELINE_STEPS * sizeof *yf);
        if (!x || !y || !yf)
            st = sfi_error_set(&err, SFI_ENOMEM, "out of memory");
        sfi_cost_setup cs;
        sfi_cost_setup_init(&cs);
        cs.model = &s.models[0];
        cs.gpu = s.gpus[0];
        cs.prof = s.prof;
        cs.budget = s.budget;
        cs.tp = tp;
        cs.context = s.contexts[ci_max];
        cs.batch = s.batches[0];
        cs.weight_bytes = s.weight_bytes;
        row tmp;
        double full_t = 0;
        cs.kind = SFI_POLICY_FULL;
        cs.pol = s.cfg;
        if (!st)
            st = price_cell(&cs, NULL, &tmp, NULL, &err);
        full_t = tmp.mean_s;
        for (int i = 0; i < TIMELINE_STEPS && !st; i++) {
            x[i] = (double)i;
            yf[i] = full_t * 1e3;
        }
        int panel = 0;
        for (int pi = 0; pi < s.n_pols && !st && panel < n_panels; pi++) {
            cs.kind = s.pols[pi].kind;
            cs.pol = s.pols[pi].cfg;
            if (!sfi_policy_has_slow_steps(cs.kind))
                continue;
            const sfi_replay_result *rp = &replays[pi * s.n_batches];
            double *tt = NULL;
            st = price_cell(&cs, rp, &tmp, &tt, &err);
            if (st)
                break;
            int64_t nt = rp->n_timeline;
            for (int64_t i = 0; i < nt; i++)
                y[i] = tt[rp->timeline[i]] * 1e3;
            free(tt);
            char title[256];
            snprintf(title, sizeof title,
                     "%s: %s on %s (TP %d, batch %d, context %d), per-step latency", s.pols[pi].name,
                     model_label(&s, 0), s.gpus[0].name, tp, s.batches[0], s.contexts[ci_max]);
            st = sfi_plot_axes(p, panel, title, "decode step", "step latency (ms)", SFI_PLOT_YZERO, &err);
            if (!st)
                st = sfi_plot_line(p, panel, "full", x, yf, TIMELINE_STEPS, 0, &err);
            if (!st)
                st = sfi_plot_line(p, panel, s.pols[pi].name, x, y, (size_t)nt, 0, &err);
            panel++;
        }
        if (!st && panel == 0) {
            char title[256];
            snprintf(title, sizeof title, "%s on %s (TP %d, batch %d, context %d): per-step latency",
                     model_label(&s, 0), s.gpus[0].name, tp, s.batches[0], s.contexts[ci_max]);
            st = sfi_plot_axes(p, 0, title, "decode step", "step latency (ms)", SFI_PLOT_YZERO, &err);
            if (!st)
                st = sfi_plot_line(p, 0, "full", x, yf, TIMELINE_STEPS, 0, &err);
        }
        free(yf);
        free(x);
        free(y);
        if (!st)
            st = sfi_plot_write_png(p, a_tl, &err);
        sfi_plot_free(p);
        if (st) {
            fprintf(stderr, "sfi-sim sweep: %s\n", err.msg);
            goto out;
        }
        fprintf(stderr, "sfi-sim sweep: wrote %s\n", a_tl);
    }
    rc = 0;
    goto out;
oom:
    fprintf(stderr, "sfi-sim sweep: out of memory\n");
    rc = 1;
out:
    for (int i = 0; i < n_replays; i++)
        sfi_replay_result_free(&replays[i]);
    free(replays);
    free(rows);
    sweep_free(&s);
    if (drew)
        sfi_plot_release_fonts();
    return rc;
}
