/* sfi-sim serve: a workload (N requests, prompt and output lengths,
 * arrivals) through a simulated serving engine (admission under a KV
 * memory budget, queueing, recompute preemption, continuous batching,
 * chunked prefill), every step priced by the cost model; one run per
 * (prompt length, policy). */
#include <config.h>

#include "sfi_sim_cli.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <strings.h>

#include "sfi_cost.h"
#include "sfi_io.h"
#include "sfi_model.h"
#include "sfi_plot.h"
#include "sfi_rng.h"
#include "sfi_serve.h"
#include "sfi_sim_stream.h"
#include "sfi_sim_util.h"

#define ME "sfi-sim serve"
/* Points drawn per timeline series (steps are bucketed beyond). */
#define TIMELINE_POINTS 4000

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sfi-sim serve [OPTIONS]\n\n"
            "Runs a workload through a simulated serving engine: requests are admitted\n"
            "while their KV blocks fit the memory budget, queued otherwise, prefilled\n"
            "(chunked into decode steps by default) and decoded under continuous batching;\n"
            "a running request that cannot grow preempts the last admitted one\n"
            "(recompute). Every step is priced by the cost model. One run per prompt\n"
            "length and policy; prints throughput, TTFT, TPOT, goodput and peak memory.\n\n"
            "workload:\n"
            "  --requests N          requests [16]\n"
            "  --prompt LIST         prompt lengths, one run each: LEN (8K),\n"
            "                        uniform:LO:HI, lognormal:MEDIAN:SIGMA, trace [8K]\n"
            "  --gen LEN             new tokens per request, same forms [2048]\n"
            "  --rate R              Poisson arrivals at R requests/s [inf: all at t=0]\n"
            "  --shared-prefix N|all the first N prompt tokens are the same for every\n"
            "                        request, computed and held once (prefix caching) [0]\n"
            "  --seed N              seed of lengths and arrivals [1]\n"
            "engine:\n"
            "  --model NAME|FILE     Qwen3 preset or config.json [Qwen3-4B]\n"
            "  --gpu NAME|FILE       B200, H200, H100-SXM or a GPU JSON file [B200]\n"
            "  --tp N|auto           tensor-parallel degree; auto: the smallest power of\n"
            "                        two at which every request fits alone [auto]\n"
            "  --policies LIST       policies, NAME or NAME:key=value,... [full,sfi]\n"
            "  --budget B            positions per KV head per step for every policy: a\n"
            "                        share (6%%), a count, or sfi = n_sink + K + n_recent [sfi]\n"
            "  --engine NAME|FILE    engine profile: default, a name in sim/profiles\n"
            "                        (vllm-triton-b200) or a profile JSON [default]\n"
            "  --profile FILE        the same as --engine FILE\n"
            "  --gpu-mem-util F      fraction of HBM the engine may use [0.9]\n"
            "  --block-size N        tokens per KV block [16]\n"
            "  --max-num-seqs N      running requests at most [256]\n"
            "  --max-batched-tokens N  tokens per step at most [8192]\n"
            "  --no-chunked-prefill  prefill whole prompts in steps of their own\n"
            "  --kv-dtype T          KV cache elements: bf16 or fp8 [bf16]\n"
            "  --weight-dtype T      weights: bf16 or fp8 [bf16]\n"
            "  --param KEY=VAL       SFI or policy parameter (K, n_sink, n_recent, T_max,\n"
            "                        quest_page, ...; see sfi-sim presets)\n"
            "slow steps (each request replays a token stream through the trigger):\n"
            "  --trace FILE          tokens-level trace [$SFI_TRACE, else the bundled ones]\n"
            "  --tokenizer DIR       vocabulary for the trigger set\n"
            "  --synthetic           a synthetic trigger stream\n"
            "output:\n"
            "  --slo-tpot MS         goodput counts requests with TPOT <= MS\n"
            "  --slo-ttft MS         ... and TTFT <= MS\n"
            "  --format F            table, csv or json [table]\n"
            "  -o, --output FILE     write the table there instead of stdout\n"
            "  --requests-csv FILE   one line per request of every run\n"
            "  --png FILE            tokens/s and admitted concurrency vs prompt length\n"
            "  --timeline-png FILE   running/queued requests and step latency over time\n"
            "                        of the first prompt length's runs\n"
            "  -h, --help            this help\n\n"
            "Exit status: 0 ok, 1 bad input or a request that cannot fit, 2 usage error.\n"
            "See sfi-sim-serve(1).\n");
}

typedef struct {
    char *name;
    sfi_policy_kind kind;
    sfi_policy_config cfg;
} policy_spec;

typedef struct {
    int prompt_i, policy;
    double mean_prompt;
    sfi_serve_summary sum;
    sfi_serve_result res;
    double speedup;
} run_row;

typedef struct {
    sfi_model_config model;
    sfi_gpu gpu;
    sfi_hw_profile prof;
    char engine_label[300];
    sfi_policy_config cfg; /* --param: SFI and policy parameters */
    sfi_budget budget;     /* --budget, the same for every policy */
    int tp;
    int n_req;
    char **prompt_specs;
    int n_prompts;
    sfi_len_dist *prompt_d;
    sfi_len_dist gen_d;
    const char *gen_spec;
    double rate;
    uint64_t seed;
    policy_spec *pols;
    int n_pols;
    sfi_serve_config base;
    double slo_tpot, slo_ttft;
    sfi_sim_stream stream;
    sfi_replay_stream rs;
    int kv_bytes, weight_bytes;
} serve_cli;

/* An engine profile: "default", a file path, or NAME of
 * sim/profiles/NAME.json (source tree, then the installed data dir). */
static sfi_status load_engine(const char *arg, sfi_hw_profile *p, char *label, size_t cap,
                              sfi_error *err)
{
    if (!arg || !strcmp(arg, "default")) {
        sfi_hw_profile_default(p);
        snprintf(label, cap, "default");
        return SFI_OK;
    }
    if (strchr(arg, '/') || strstr(arg, ".json")) {
        snprintf(label, cap, "%s", arg);
        return sfi_hw_profile_load(arg, p, NULL, NULL, err);
    }
    for (const char *c = arg; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '-' || *c == '_' || *c == '.'))
            return sfi_error_set(err, SFI_EINVAL, "--engine '%s': not a profile name or file", arg);
    const char *dirs[] = {SFI_SIM_SRCDIR "/sim/profiles", SFI_SIM_PKGDATADIR "/profiles"};
    for (int d = 0; d < 2; d++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.json", dirs[d], arg);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        snprintf(label, cap, "%s", arg);
        return sfi_hw_profile_load(path, p, NULL, NULL, err);
    }
    return sfi_error_set(err, SFI_ENOTFOUND,
                         "--engine '%s': no such profile (looked for %s.json in %s and %s)", arg,
                         arg, dirs[0], dirs[1]);
}

/* The requests of run `pi`: lengths drawn from the seed, arrivals from a
 * Poisson process (the same arrivals for every policy of the run). */
static sfi_status make_requests(const serve_cli *s, int pi, sfi_serve_request *rq, double *mean,
                                sfi_error *err)
{
    uint64_t rng = s->seed * 0x9e3779b97f4a7c15ULL + (uint64_t)pi;
    const int64_t *pv = NULL, *gv = s->stream.req_steps;
    int64_t *pbuf = NULL;
    int64_t nv = s->stream.n_requests;
    if ((s->prompt_d[pi].kind == SFI_LEN_TRACE || s->gen_d.kind == SFI_LEN_TRACE) && nv < 1)
        return sfi_error_set(err, SFI_EINVAL,
                             "'trace' lengths need a trace (--trace FILE, or the bundled ones)");
    if (s->prompt_d[pi].kind == SFI_LEN_TRACE) {
        pbuf = malloc((size_t)nv * sizeof *pbuf);
        if (!pbuf)
            return sfi_error_set(err, SFI_ENOMEM, "out of memory");
        for (int64_t i = 0; i < nv; i++)
            pbuf[i] = s->stream.req_prompt[i];
        pv = pbuf;
    }
    double t = 0, sum = 0;
    for (int i = 0; i < s->n_req; i++) {
        rq[i].prompt = sfi_len_dist_draw(&s->prompt_d[pi], &rng, i, pv, nv);
        rq[i].gen = sfi_len_dist_draw(&s->gen_d, &rng, i, gv, nv);
        if (s->rate > 0 && i > 0)
            t += -log(1.0 - sfi_rng_uniform(&rng)) / s->rate;
        rq[i].arrival = t;
        sum += rq[i].prompt;
    }
    free(pbuf);
    *mean = sum / s->n_req;
    return SFI_OK;
}

static void config_of(const serve_cli *s, int pol, int tp, sfi_serve_config *c)
{
    *c = s->base;
    c->cost.prof = s->prof;
    c->cost.budget = s->budget;
    c->cost.tp = tp;
    c->cost.kv_bytes = s->kv_bytes;
    c->cost.weight_bytes = s->weight_bytes;
    c->cost.kind = s->pols[pol].kind;
    c->cost.pol = s->pols[pol].cfg;
    c->stream = sfi_policy_has_slow_steps(c->cost.kind) ? &s->rs : NULL;
    c->trigger = sfi_policy_trigger_kind(c->cost.kind);
    c->interval = c->cost.pol.interval;
}

/* auto TP: the smallest power of two (up to 64) that divides the heads and
 * at which the longest request of every run fits alone under every
 * policy. */
static sfi_status resolve_tp(serve_cli *s, sfi_serve_request *rq, sfi_error *err)
{
    sfi_error last;
    memset(&last, 0, sizeof last);
    for (int t = 1; t <= 64; t *= 2) {
        int ok = 1, valid = 1;
        for (int pi = 0; pi < s->n_prompts && ok && valid; pi++) {
            double mean;
            sfi_status st = make_requests(s, pi, rq, &mean, err);
            if (st)
                return st;
            /* The longest request only: enough to know whether it fits. */
            int k = 0;
            for (int i = 1; i < s->n_req; i++)
                if (rq[i].prompt + rq[i].gen > rq[k].prompt + rq[k].gen)
                    k = i;
            sfi_serve_request one = rq[k];
            one.arrival = 0;
            one.gen = 1;
            one.prompt = rq[k].prompt + rq[k].gen - 1;
            for (int p = 0; p < s->n_pols && ok; p++) {
                sfi_serve_config c;
                config_of(s, p, t, &c);
                c.stream = NULL;
                c.shared_prefix = 0;
                sfi_serve_result r;
                sfi_error e2;
                st = sfi_serve_run(&c, &one, 1, &r, &e2);
                if (st == SFI_OK) {
                    sfi_serve_result_free(&r);
                    continue;
                }
                if (strstr(e2.msg, "--tp") && strstr(e2.msg, "divide")) {
                    valid = 0; /* not a valid TP for this model */
                    break;
                }
                if (st != SFI_ERANGE)
                    return sfi_error_set(err, e2.code, "%s", e2.msg);
                last = e2;
                ok = 0;
            }
        }
        if (valid && ok) {
            s->tp = t;
            return SFI_OK;
        }
    }
    return sfi_error_set(err, SFI_ERANGE, "%s (at every TP up to 64)", last.msg);
}

/* ---- output ---- */

static const char *arrivals_label(const serve_cli *s, char *buf, size_t cap)
{
    if (s->rate > 0)
        snprintf(buf, cap, "Poisson %.4g req/s", s->rate);
    else
        snprintf(buf, cap, "all at t=0");
    return buf;
}

static void print_header(FILE *f, const serve_cli *s)
{
    char arr[64];
    const sfi_serve_config *c = &s->base;
    fprintf(f,
            "# sfi-sim serve: %s on %s, TP %d, engine %s; %d requests, gen %s, %s; "
            "gpu-mem-util %.2f, block %d, max-num-seqs %d, max-batched-tokens %d, %s prefill, "
            "shared prefix %d, KV %s, weights %s; K=%d n_sink=%d n_recent=%d T_max=%d; %s\n",
            s->model.name, s->gpu.name, s->tp, s->engine_label, s->n_req, s->gen_spec,
            arrivals_label(s, arr, sizeof arr), c->gpu_mem_util, c->block_size, c->max_num_seqs,
            c->max_batched_tokens, c->chunked_prefill ? "chunked" : "unchunked", c->shared_prefix,
            s->kv_bytes == 1 ? "fp8" : "bf16", s->weight_bytes == 1 ? "fp8" : "bf16", s->cfg.prm.K,
            s->cfg.prm.n_sink, s->cfg.prm.n_recent, s->cfg.prm.T_max, s->stream.label);
}

static void print_table(FILE *f, const serve_cli *s, const run_row *rows, int n)
{
    print_header(f, s);
    int slo = s->slo_tpot > 0 || s->slo_ttft > 0;
    fprintf(f,
            "# tok/s = generated tokens / elapsed (first arrival to last token); TTFT mean and "
            "p99 (s); TPOT mean, p50, p99 (ms); run_pk/run_mean = requests running at once; "
            "per GPU, GB = 1e9 bytes: mem_GB peak memory in use (weights + activations + "
            "reserved + KV), KVcap_GB the KV budget%s\n",
            slo ? "; goodput = tokens/s of the requests meeting the SLO" : "");
    fprintf(f, "%-22s %-10s %9s %7s %9s %9s %9s %8s %8s %8s", "prompt", "policy", "tok/s",
            "speedup", "elapsed_s", "TTFT_s", "TTFTp99_s", "TPOT_ms", "TPOTp50", "TPOTp99");
    if (slo)
        fprintf(f, " %9s %5s", "goodput", "SLO%");
    fprintf(f, " %6s %8s %7s %6s %8s %8s\n", "run_pk", "run_mean", "preempt", "slow%", "mem_GB",
            "KVcap_GB");
    for (int i = 0; i < n; i++) {
        const run_row *r = &rows[i];
        const sfi_serve_summary *m = &r->sum;
        fprintf(f, "%-22s %-10s %9.1f ", s->prompt_specs[r->prompt_i], s->pols[r->policy].name,
                m->tok_s);
        if (isfinite(r->speedup))
            fprintf(f, "%7.2f", r->speedup);
        else /* no full-KV run to compare with */
            fprintf(f, "%7s", "-");
        fprintf(f, " %9.2f %9.3f %9.3f", m->elapsed, m->ttft_mean, m->ttft_p99);
        if (isfinite(m->tpot_mean))
            fprintf(f, " %8.2f %8.2f %8.2f", m->tpot_mean * 1e3, m->tpot_p50 * 1e3,
                    m->tpot_p99 * 1e3);
        else /* every request generated one token */
            fprintf(f, " %8s %8s %8s", "-", "-", "-");
        if (slo)
            fprintf(f, " %9.1f %5.1f", m->goodput_tok_s, m->slo_met * 100);
        fprintf(f, " %6d %8.1f %7lld %6.2f %8.2f %8.2f\n", r->res.peak_running, r->res.mean_running,
                (long long)r->res.preemptions, m->slow_frac * 100, r->res.peak_mem / 1e9,
                r->res.kv_budget / 1e9);
    }
}

static void print_csv(FILE *f, const serve_cli *s, const run_row *rows, int n)
{
    fprintf(f, "model,gpu,tp,engine,requests,prompt,mean_prompt,gen,policy,tokens_per_s,speedup,"
               "elapsed_s,ttft_mean_s,ttft_p50_s,ttft_p99_s,tpot_mean_ms,tpot_p50_ms,tpot_p99_ms,"
               "e2e_mean_s,e2e_p99_s,goodput_tokens_per_s,slo_met,peak_running,mean_running,"
               "preemptions,recomputed_tokens,cached_tokens,slow_fraction,steps,peak_mem_bytes,"
               "kv_budget_bytes,peak_kv_bytes,weight_bytes\n");
    for (int i = 0; i < n; i++) {
        const run_row *r = &rows[i];
        const sfi_serve_summary *m = &r->sum;
        sfi_sim_csv_str(f, s->model.name);
        fputc(',', f);
        sfi_sim_csv_str(f, s->gpu.name);
        fprintf(f, ",%d,", s->tp);
        sfi_sim_csv_str(f, s->engine_label);
        fprintf(f, ",%d,", s->n_req);
        sfi_sim_csv_str(f, s->prompt_specs[r->prompt_i]);
        fprintf(f, ",%.6g,", r->mean_prompt);
        sfi_sim_csv_str(f, s->gen_spec);
        fputc(',', f);
        sfi_sim_csv_str(f, s->pols[r->policy].name);
        const double v[] = {m->tok_s,          r->speedup,  m->elapsed,         m->ttft_mean,
                            m->ttft_p50,       m->ttft_p99, m->tpot_mean * 1e3, m->tpot_p50 * 1e3,
                            m->tpot_p99 * 1e3, m->e2e_mean, m->e2e_p99,         m->goodput_tok_s,
                            m->slo_met};
        /* Empty where undefined (no full-KV run; no request with a TPOT). */
        for (size_t k = 0; k < sizeof v / sizeof v[0]; k++)
            if (isfinite(v[k]))
                fprintf(f, ",%.6g", v[k]);
            else
                fputc(',', f);
        fprintf(f, ",%d,%.6g,%lld,%lld,%lld,%.6g,%lld,%.6g,%.6g,%.6g,%.6g\n", r->res.peak_running,
                r->res.mean_running, (long long)r->res.preemptions,
                (long long)r->res.recomputed_tokens, (long long)r->res.cached_tokens, m->slow_frac,
                (long long)r->res.n_steps, r->res.peak_mem, r->res.kv_budget, r->res.peak_kv,
                r->res.weights);
    }
}

static json_t *jreal(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static int print_json(FILE *f, const serve_cli *s, const run_row *rows, int n)
{
    json_t *root = json_object(), *arr = json_array();
    if (!root || !arr) {
        json_decref(root);
        json_decref(arr);
        return -1;
    }
    char arrv[64];
    const sfi_serve_config *c = &s->base;
    json_object_set_new(root, "model", json_string(s->model.name));
    json_object_set_new(root, "gpu", json_string(s->gpu.name));
    json_object_set_new(root, "tp", json_integer(s->tp));
    json_object_set_new(root, "engine", json_string(s->engine_label));
    json_object_set_new(root, "requests", json_integer(s->n_req));
    json_object_set_new(root, "gen", json_string(s->gen_spec));
    json_object_set_new(root, "arrivals", json_string(arrivals_label(s, arrv, sizeof arrv)));
    json_object_set_new(root, "gpu_mem_util", json_real(c->gpu_mem_util));
    json_object_set_new(root, "block_size", json_integer(c->block_size));
    json_object_set_new(root, "max_num_seqs", json_integer(c->max_num_seqs));
    json_object_set_new(root, "max_batched_tokens", json_integer(c->max_batched_tokens));
    json_object_set_new(root, "chunked_prefill", json_boolean(c->chunked_prefill));
    json_object_set_new(root, "shared_prefix", json_integer(c->shared_prefix));
    json_object_set_new(root, "kv_dtype", json_string(s->kv_bytes == 1 ? "fp8" : "bf16"));
    json_object_set_new(root, "weight_dtype", json_string(s->weight_bytes == 1 ? "fp8" : "bf16"));
    json_object_set_new(root, "K", json_integer(s->cfg.prm.K));
    json_object_set_new(root, "n_sink", json_integer(s->cfg.prm.n_sink));
    json_object_set_new(root, "n_recent", json_integer(s->cfg.prm.n_recent));
    json_object_set_new(root, "T_max", json_integer(s->cfg.prm.T_max));
    json_object_set_new(root, "stream", json_string(s->stream.label));
    if (s->slo_tpot > 0)
        json_object_set_new(root, "slo_tpot_ms", json_real(s->slo_tpot * 1e3));
    if (s->slo_ttft > 0)
        json_object_set_new(root, "slo_ttft_ms", json_real(s->slo_ttft * 1e3));
    for (int i = 0; i < n; i++) {
        const run_row *r = &rows[i];
        const sfi_serve_summary *m = &r->sum;
        json_t *o = json_object();
        json_object_set_new(o, "prompt", json_string(s->prompt_specs[r->prompt_i]));
        json_object_set_new(o, "mean_prompt", json_real(r->mean_prompt));
        json_object_set_new(o, "policy", json_string(s->pols[r->policy].name));
        json_object_set_new(o, "tokens", json_integer(m->tokens));
        json_object_set_new(o, "tokens_per_s", jreal(m->tok_s));
        json_object_set_new(o, "speedup", jreal(r->speedup));
        json_object_set_new(o, "elapsed_s", jreal(m->elapsed));
        json_object_set_new(o, "ttft_mean_s", jreal(m->ttft_mean));
        json_object_set_new(o, "ttft_p50_s", jreal(m->ttft_p50));
        json_object_set_new(o, "ttft_p99_s", jreal(m->ttft_p99));
        json_object_set_new(o, "tpot_mean_ms", jreal(m->tpot_mean * 1e3));
        json_object_set_new(o, "tpot_p50_ms", jreal(m->tpot_p50 * 1e3));
        json_object_set_new(o, "tpot_p99_ms", jreal(m->tpot_p99 * 1e3));
        json_object_set_new(o, "e2e_mean_s", jreal(m->e2e_mean));
        json_object_set_new(o, "e2e_p99_s", jreal(m->e2e_p99));
        json_object_set_new(o, "goodput_tokens_per_s", jreal(m->goodput_tok_s));
        json_object_set_new(o, "slo_met", jreal(m->slo_met));
        json_object_set_new(o, "peak_running", json_integer(r->res.peak_running));
        json_object_set_new(o, "mean_running", jreal(r->res.mean_running));
        json_object_set_new(o, "preemptions", json_integer(r->res.preemptions));
        json_object_set_new(o, "recomputed_tokens", json_integer(r->res.recomputed_tokens));
        json_object_set_new(o, "cached_tokens", json_integer(r->res.cached_tokens));
        json_object_set_new(o, "slow_fraction", jreal(m->slow_frac));
        json_object_set_new(o, "steps", json_integer(r->res.n_steps));
        json_object_set_new(o, "peak_mem_bytes", jreal(r->res.peak_mem));
        json_object_set_new(o, "kv_budget_bytes", jreal(r->res.kv_budget));
        json_object_set_new(o, "peak_kv_bytes", jreal(r->res.peak_kv));
        json_object_set_new(o, "weight_bytes", jreal(r->res.weights));
        json_object_set_new(o, "activation_bytes", jreal(r->res.activations));
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "runs", arr);
    int rc = json_dumpf(root, f, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
    fputc('\n', f);
    json_decref(root);
    return rc;
}

static void print_requests_csv(FILE *f, const serve_cli *s, const run_row *rows, int n)
{
    fprintf(f, "prompt_spec,policy,request,prompt,gen,arrival_s,admitted_s,first_token_s,finish_s,"
               "ttft_s,tpot_ms,e2e_s,preemptions,decode_steps,slow_steps\n");
    for (int i = 0; i < n; i++)
        for (int k = 0; k < rows[i].res.n; k++) {
            const sfi_serve_req_stats *q = &rows[i].res.req[k];
            sfi_sim_csv_str(f, s->prompt_specs[rows[i].prompt_i]);
            fputc(',', f);
            sfi_sim_csv_str(f, s->pols[rows[i].policy].name);
            double tpot = q->gen > 1 ? (q->finish - q->first_token) / (q->gen - 1) * 1e3 : 0;
            fprintf(f, ",%d,%d,%d,%.9g,%.9g,%.9g,%.9g,%.9g,%.6g,%.9g,%d,%lld,%lld\n", k, q->prompt,
                    q->gen, q->arrival, q->admitted, q->first_token, q->finish,
                    q->first_token - q->arrival, tpot, q->finish - q->arrival, q->preemptions,
                    (long long)q->decode_steps, (long long)q->slow_steps);
        }
}

/* Writes through the output rule (sfi_io.h), or stdout for NULL. */
static int write_out(const char *path, const char *what, void (*fn)(FILE *, const void *),
                     const void *ctx)
{
    FILE *f = stdout;
    sfi_out *o = NULL;
    sfi_error err;
    if (path && sfi_out_open(path, &o, &f, &err) != SFI_OK) {
        fprintf(stderr, ME ": %s\n", err.msg);
        return -1;
    }
    fn(f, ctx);
    if (o) {
        if (sfi_out_commit(o, 0, &err) != SFI_OK) {
            fprintf(stderr, ME ": %s\n", err.msg);
            return -1;
        }
    } else if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, ME ": standard output (%s): %s\n", what, strerror(errno));
        return -1;
    }
    return 0;
}

typedef struct {
    const serve_cli *s;
    const run_row *rows;
    int n;
    const char *fmt;
} out_ctx;

static void emit_table(FILE *f, const void *p)
{
    const out_ctx *c = p;
    if (!strcmp(c->fmt, "csv"))
        print_csv(f, c->s, c->rows, c->n);
    else if (!strcmp(c->fmt, "json"))
        print_json(f, c->s, c->rows, c->n);
    else
        print_table(f, c->s, c->rows, c->n);
}

static void emit_requests(FILE *f, const void *p)
{
    const out_ctx *c = p;
    print_requests_csv(f, c->s, c->rows, c->n);
}

static sfi_status write_figure(const serve_cli *s, const run_row *rows, int n, const char *path,
                               sfi_error *err)
{
    sfi_plot *p = sfi_plot_new(1500, 420, 1, 2);
    if (!p)
        return sfi_error_set(err, SFI_ENOMEM, "%s: cannot create figure", path);
    double *x = malloc((size_t)s->n_prompts * sizeof *x),
           *y1 = malloc((size_t)s->n_prompts * sizeof *y1),
           *y2 = malloc((size_t)s->n_prompts * sizeof *y2);
    sfi_status st = (!x || !y1 || !y2) ? sfi_error_set(err, SFI_ENOMEM, "out of memory") : SFI_OK;
    char title[512];
    snprintf(title, sizeof title, "%s, %s x%d, %s: throughput", s->model.name, s->gpu.name, s->tp,
             s->engine_label);
    if (!st)
        st = sfi_plot_axes(p, 0, title, "prompt length (tokens, mean)", "generated tokens/s",
                           SFI_PLOT_XLOG2 | SFI_PLOT_XKILO | SFI_PLOT_YZERO, err);
    snprintf(title, sizeof title, "admitted concurrency: most of the %d requests running at once",
             s->n_req);
    if (!st)
        st = sfi_plot_axes(p, 1, title, "prompt length (tokens, mean)", "requests running",
                           SFI_PLOT_XLOG2 | SFI_PLOT_XKILO | SFI_PLOT_YZERO, err);
    for (int pi = 0; pi < s->n_pols && !st; pi++) {
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (rows[i].policy != pi)
                continue;
            x[m] = rows[i].mean_prompt;
            y1[m] = rows[i].sum.tok_s;
            y2[m] = rows[i].res.peak_running;
            m++;
        }
        st = sfi_plot_line(p, 0, s->pols[pi].name, x, y1, (size_t)m, 1, err);
        if (!st)
            st = sfi_plot_line(p, 1, s->pols[pi].name, x, y2, (size_t)m, 1, err);
    }
    if (!st)
        st = sfi_plot_write_png(p, path, err);
    free(x);
    free(y1);
    free(y2);
    sfi_plot_free(p);
    return st;
}

/* Running and queued requests and step latency over time, the runs of the
 * first prompt length; long runs are bucketed (latency: the bucket's
 * largest, so slow-step spikes stay visible). */
static sfi_status write_timeline(const serve_cli *s, const run_row *rows, int n, const char *path,
                                 sfi_error *err)
{
    sfi_plot *p = sfi_plot_new(1400, 900, 3, 1);
    if (!p)
        return sfi_error_set(err, SFI_ENOMEM, "%s: cannot create figure", path);
    double *x = malloc(TIMELINE_POINTS * sizeof *x), *yr = malloc(TIMELINE_POINTS * sizeof *yr),
           *yq = malloc(TIMELINE_POINTS * sizeof *yq), *yl = malloc(TIMELINE_POINTS * sizeof *yl);
    sfi_status st =
        (!x || !yr || !yq || !yl) ? sfi_error_set(err, SFI_ENOMEM, "out of memory") : SFI_OK;
    char title[512];
    snprintf(title, sizeof title,
             "%s on %s (TP %d, engine %s), %d requests, prompt %s: requests running", s->model.name,
             s->gpu.name, s->tp, s->engine_label, s->n_req, s->prompt_specs[0]);
    if (!st)
        st = sfi_plot_axes(p, 0, title, "time (s)", "running", SFI_PLOT_YZERO, err);
    if (!st)
        st = sfi_plot_axes(p, 1, "requests queued (arrived, not running)", "time (s)", "queued",
                           SFI_PLOT_YZERO, err);
    if (!st)
        st = sfi_plot_axes(p, 2, "step latency", "time (s)", "step latency (ms)", SFI_PLOT_YZERO,
                           err);
    for (int i = 0; i < n && !st; i++) {
        const run_row *r = &rows[i];
        if (r->prompt_i != 0 || !r->res.steps)
            continue;
        int64_t ns = r->res.n_steps, per = (ns + TIMELINE_POINTS - 1) / TIMELINE_POINTS;
        if (per < 1)
            per = 1;
        size_t m = 0;
        for (int64_t a = 0; a < ns && m < TIMELINE_POINTS; a += per, m++) {
            const sfi_serve_step *q = &r->res.steps[a];
            x[m] = q->t;
            yr[m] = q->running;
            yq[m] = q->waiting;
            yl[m] = 0;
            for (int64_t b = a; b < a + per && b < ns; b++)
                if (r->res.steps[b].latency * 1e3 > yl[m])
                    yl[m] = r->res.steps[b].latency * 1e3;
        }
        const char *nm = s->pols[r->policy].name;
        st = sfi_plot_line(p, 0, nm, x, yr, m, 0, err);
        if (!st)
            st = sfi_plot_line(p, 1, nm, x, yq, m, 0, err);
        if (!st)
            st = sfi_plot_line(p, 2, nm, x, yl, m, 0, err);
    }
    if (!st)
        st = sfi_plot_write_png(p, path, err);
    free(x);
    free(yr);
    free(yq);
    free(yl);
    sfi_plot_free(p);
    return st;
}

/* ---- main ---- */

static int parse_dtype(const char *opt, const char *v, int *bytes)
{
    if (!strcasecmp(v, "bf16") || !strcmp(v, "2"))
        *bytes = 2;
    else if (!strcasecmp(v, "fp8") || !strcmp(v, "1"))
        *bytes = 1;
    else {
        fprintf(stderr, ME ": %s: '%s' is not bf16 or fp8\n", opt, v);
        return -1;
    }
    return 0;
}

static int parse_count(const char *opt, const char *v, int kilo, int lo, int hi, int *out)
{
    int64_t x;
    if (sfi_sim_parse_size(v, kilo, &x) || x < lo || x > hi) {
        fprintf(stderr, ME ": %s: '%s' is not %s in %d..%d\n", opt, v,
                kilo ? "a size (e.g. 8K)" : "an integer", lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_ms(const char *opt, const char *v, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (end == v || *end || errno || !(d > 0 && d < 1e9)) {
        fprintf(stderr, ME ": %s: '%s' is not a time in ms > 0\n", opt, v);
        return -1;
    }
    *out = d * 1e-3;
    return 0;
}

/* The command line's lists and outputs, as text until setup resolves
 * them; the scalars go straight into serve_cli. */
typedef struct {
    const char *model, *gpu, *tp, *prompt, *pols, *engine, *trace, *tok, *fmt, *out, *req, *png,
        *timeline;
    int synthetic;
} serve_args;

/* A phase's status for "out of memory", said once by the command. */
#define SERVE_OOM 3

/* --rate: requests per second, or inf (0: all at once). Returns 0 or 2. */
static int parse_rate(const char *v, double *rate)
{
    if (!strcasecmp(v, "inf")) {
        *rate = 0;
        return 0;
    }
    char *end;
    errno = 0;
    *rate = strtod(v, &end);
    if (end == v || *end || errno || !(*rate > 0 && *rate < 1e9)) {
        fprintf(stderr, ME ": --rate: '%s' is not a rate > 0 (requests/s) or inf\n", v);
        return 2;
    }
    return 0;
}

/* The options that set the workload (requests, arrivals, seed). Returns 0
 * when c is not one of them or its value is good, else 2. */
static int parse_workload_option(int c, serve_cli *s)
{
    switch (c) {
    case 'n': return parse_count("--requests", optarg, 1, 1, 1 << 20, &s->n_req) ? 2 : 0;
    case 'G': s->gen_spec = optarg; return 0;
    case 'r': return parse_rate(optarg, &s->rate);
    case 'X':
        if (!strcasecmp(optarg, "all")) {
            s->base.shared_prefix = 1 << 30;
            return 0;
        }
        return parse_count("--shared-prefix", optarg, 1, 0, 1 << 30, &s->base.shared_prefix) ? 2
                                                                                             : 0;
    case 'e': {
        int64_t v;
        if (sfi_sim_parse_size(optarg, 0, &v)) {
            fprintf(stderr, ME ": --seed: '%s' is not a non-negative integer\n", optarg);
            return 2;
        }
        s->seed = (uint64_t)v;
        return 0;
    }
    case 'L': return parse_ms("--slo-tpot", optarg, &s->slo_tpot) ? 2 : 0;
    case 'F': return parse_ms("--slo-ttft", optarg, &s->slo_ttft) ? 2 : 0;
    }
    return 0;
}

/* The options that set the engine (memory, batching, dtypes, parameters).
 * Returns 0 when c is not one of them or its value is good, else the exit
 * status. */
static int parse_engine_option(int c, serve_cli *s)
{
    sfi_error err;
    switch (c) {
    case 'u': {
        char *end;
        errno = 0;
        double v = strtod(optarg, &end);
        if (end == optarg || *end || errno || !(v > 0 && v <= 1)) {
            fprintf(stderr, ME ": --gpu-mem-util: '%s' is not in (0, 1]\n", optarg);
            return 2;
        }
        s->base.gpu_mem_util = v;
        return 0;
    }
    case 'B': return parse_count("--block-size", optarg, 0, 1, 65536, &s->base.block_size) ? 2 : 0;
    case 'S':
        return parse_count("--max-num-seqs", optarg, 1, 1, 1 << 20, &s->base.max_num_seqs) ? 2 : 0;
    case 'M':
        return parse_count("--max-batched-tokens", optarg, 1, 1, 1 << 24,
                           &s->base.max_batched_tokens)
                   ? 2
                   : 0;
    case 'C': s->base.chunked_prefill = 0; return 0;
    case 'k': return parse_dtype("--kv-dtype", optarg, &s->kv_bytes) ? 2 : 0;
    case 'w': return parse_dtype("--weight-dtype", optarg, &s->weight_bytes) ? 2 : 0;
    case 'b':
        if (sfi_budget_parse(optarg, &s->budget, &err) != SFI_OK) {
            fprintf(stderr, ME ": --budget: %s\n", err.msg);
            return 2;
        }
        return 0;
    case 'x':
        if (sfi_policy_config_set(&s->cfg, optarg, &err) != SFI_OK) {
            fprintf(stderr, ME ": %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    return 0;
}

/* The options that name something (model, GPU, files, outputs). Returns
 * 1 when c is one of them. */
static int parse_name_option(int c, serve_args *a)
{
    switch (c) {
    case 'P': a->prompt = optarg; return 1;
    case 'm': a->model = optarg; return 1;
    case 'g': a->gpu = optarg; return 1;
    case 't': a->tp = optarg; return 1;
    case 'p': a->pols = optarg; return 1;
    case 'E': a->engine = optarg; return 1;
    case 'T': a->trace = optarg; return 1;
    case 'z': a->tok = optarg; return 1;
    case 'y': a->synthetic = 1; return 1;
    case 'f': a->fmt = optarg; return 1;
    case 'o': a->out = optarg; return 1;
    case 'R': a->req = optarg; return 1;
    case 'Q': a->png = optarg; return 1;
    case 'l': a->timeline = optarg; return 1;
    }
    return 0;
}

/* Parses the options into a and s. Returns -1 to go on, else the exit
 * status (0 for --help). */
static int parse_args(int argc, char **argv, serve_args *a, serve_cli *s)
{
    /* clang-format off */
    static const struct option opts[] = {
        {"requests", required_argument, NULL, 'n'},     {"prompt", required_argument, NULL, 'P'},
        {"gen", required_argument, NULL, 'G'},          {"rate", required_argument, NULL, 'r'},
        {"shared-prefix", required_argument, NULL, 'X'}, {"seed", required_argument, NULL, 'e'},
        {"model", required_argument, NULL, 'm'},        {"gpu", required_argument, NULL, 'g'},
        {"tp", required_argument, NULL, 't'},           {"policies", required_argument, NULL, 'p'},
        {"policy", required_argument, NULL, 'p'},       {"engine", required_argument, NULL, 'E'},
        {"profile", required_argument, NULL, 'E'},      {"gpu-mem-util", required_argument, NULL, 'u'},
        {"block-size", required_argument, NULL, 'B'},   {"max-num-seqs", required_argument, NULL, 'S'},
        {"max-batched-tokens", required_argument, NULL, 'M'},
        {"no-chunked-prefill", no_argument, NULL, 'C'}, {"kv-dtype", required_argument, NULL, 'k'},
        {"weight-dtype", required_argument, NULL, 'w'}, {"param", required_argument, NULL, 'x'},
        {"trace", required_argument, NULL, 'T'},        {"tokenizer", required_argument, NULL, 'z'},
        {"synthetic", no_argument, NULL, 'y'},          {"slo-tpot", required_argument, NULL, 'L'},
        {"slo-ttft", required_argument, NULL, 'F'},     {"format", required_argument, NULL, 'f'},
        {"output", required_argument, NULL, 'o'},       {"requests-csv", required_argument, NULL, 'R'},
        {"png", required_argument, NULL, 'Q'},          {"timeline-png", required_argument, NULL, 'l'},
        {"budget", required_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'},               {NULL, 0, NULL, 0}};
    /* clang-format on */
    *a = (serve_args){.model = "Qwen3-4B",
                      .gpu = "B200",
                      .tp = "auto",
                      .prompt = "8K",
                      .pols = "full,sfi",
                      .fmt = "table"};
    sfi_error err;
    optind = 1;
    opterr = 0;
    int c, rc;
    while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if (c == '?' || c == ':') {
            fprintf(stderr, ME ": unknown or incomplete option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
        if (!parse_name_option(c, a) &&
            ((rc = parse_workload_option(c, s)) || (rc = parse_engine_option(c, s))))
            return rc;
    }
    if (optind < argc) {
        fprintf(stderr, ME ": unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (strcmp(a->fmt, "table") && strcmp(a->fmt, "csv") && strcmp(a->fmt, "json")) {
        fprintf(stderr, ME ": --format: '%s' is not table, csv or json\n", a->fmt);
        return 2;
    }
    if (s->base.max_batched_tokens < s->base.max_num_seqs) {
        fprintf(stderr,
                ME ": --max-batched-tokens %d is below --max-num-seqs %d (every running request "
                   "decodes in each step)\n",
                s->base.max_batched_tokens, s->base.max_num_seqs);
        return 2;
    }
    if (sfi_len_dist_parse(s->gen_spec, &s->gen_d, &err) != SFI_OK) {
        fprintf(stderr, ME ": --gen: %s\n", err.msg);
        return 2;
    }
    if (sfi_params_validate(&s->cfg.prm, &err) != SFI_OK) {
        fprintf(stderr, ME ": %s\n", err.msg);
        return 1;
    }
    return -1;
}

/* Engine profile, model, GPU and --tp. Returns 0 or the exit status. */
static int resolve_hardware(const serve_args *a, serve_cli *s)
{
    sfi_error err;
    if (load_engine(a->engine, &s->prof, s->engine_label, sizeof s->engine_label, &err) != SFI_OK) {
        fprintf(stderr, ME ": %s\n", err.msg);
        return 1;
    }
    if (sfi_model_resolve(a->model, &s->model, &err) != SFI_OK) {
        fprintf(stderr, ME ": --model: %s\n", err.msg);
        return 1;
    }
    if (!s->model.name[0])
        snprintf(s->model.name, sizeof s->model.name, "%s", a->model);
    if (sfi_gpu_resolve(a->gpu, &s->gpu, &err) != SFI_OK) {
        fprintf(stderr, ME ": --gpu: %s\n", err.msg);
        return 1;
    }
    if (strcasecmp(a->tp, "auto") && parse_count("--tp", a->tp, 0, 1, 64, &s->tp))
        return 2;
    return 0;
}

/* --prompt: one run per length distribution. Returns 0 or the exit
 * status. */
static int resolve_prompts(const serve_args *a, serve_cli *s)
{
    sfi_error err;
    s->n_prompts = sfi_sim_split_list(a->prompt, &s->prompt_specs);
    if (s->n_prompts < 0) {
        s->n_prompts = 0;
        return SERVE_OOM;
    }
    s->prompt_d = calloc((size_t)s->n_prompts, sizeof *s->prompt_d);
    if (!s->prompt_d)
        return SERVE_OOM;
    for (int i = 0; i < s->n_prompts; i++)
        if (sfi_len_dist_parse(s->prompt_specs[i], &s->prompt_d[i], &err) != SFI_OK) {
            fprintf(stderr, ME ": --prompt: %s\n", err.msg);
            return 2;
        }
    return 0;
}

/* --policies: each spec with --param's values under its own. Returns 0
 * or the exit status. */
static int resolve_policies(const serve_args *a, serve_cli *s)
{
    sfi_error err;
    char **v;
    int n = sfi_sim_split_policies(a->pols, &v);
    if (n < 0)
        return SERVE_OOM;
    s->pols = calloc((size_t)n, sizeof *s->pols);
    if (!s->pols) {
        sfi_sim_free_list(v, n);
        return SERVE_OOM;
    }
    s->n_pols = n;
    for (int i = 0; i < n; i++)
        s->pols[i].name = v[i];
    free(v);
    for (int i = 0; i < n; i++) {
        s->pols[i].cfg = s->cfg;
        if (sfi_policy_spec_parse(s->pols[i].name, &s->pols[i].kind, &s->pols[i].cfg, &err) ||
            sfi_params_validate(&s->pols[i].cfg.prm, &err)) {
            fprintf(stderr, ME ": --policies: %s\n", err.msg);
            return 1;
        }
    }
    return 0;
}

/* Everything the runs read: hardware, prompts, policies, the token stream.
 * Returns 0 or the exit status (SERVE_OOM: out of memory, not yet said). */
static int setup(const serve_args *a, serve_cli *s)
{
    int rc = resolve_hardware(a, s);
    if (rc || (rc = resolve_prompts(a, s)) || (rc = resolve_policies(a, s)))
        return rc;
    sfi_error err;
    if (sfi_sim_stream_load(a->trace, a->tok, a->synthetic, &s->cfg.prm, &s->stream, &err) !=
        SFI_OK) {
        fprintf(stderr, ME ": %s\n", err.msg);
        return 1;
    }
    s->rs = (sfi_replay_stream){s->stream.tokens, s->stream.n_tokens, s->stream.is_trigger,
                                s->stream.n_vocab};
    s->base.cost.model = &s->model;
    s->base.cost.gpu = s->gpu;
    s->base.timeline = a->timeline != NULL;
    return 0;
}

/* One run per (prompt distribution, policy), rows in that order, each
 * with its speedup over the run's full-KV row (NaN without one). Returns
 * 0 or 1. */
static int run_all(serve_cli *s, sfi_serve_request *rq, run_row *rows, int *n_rows)
{
    sfi_error err;
    if (s->tp == 0 && resolve_tp(s, rq, &err) != SFI_OK) {
        fprintf(stderr, ME ": %s\n", err.msg);
        return 1;
    }
    for (int pi = 0; pi < s->n_prompts; pi++) {
        double mean;
        if (make_requests(s, pi, rq, &mean, &err) != SFI_OK) {
            fprintf(stderr, ME ": %s\n", err.msg);
            return 1;
        }
        int base = -1;
        for (int p = 0; p < s->n_pols; p++) {
            run_row *r = &rows[*n_rows];
            sfi_serve_config cfg;
            config_of(s, p, s->tp, &cfg);
            if (sfi_serve_run(&cfg, rq, s->n_req, &r->res, &err) != SFI_OK ||
                sfi_serve_summarize(&r->res, s->slo_tpot, s->slo_ttft, &r->sum, &err) != SFI_OK) {
                fprintf(stderr, ME ": prompt %s, policy %s: %s\n", s->prompt_specs[pi],
                        s->pols[p].name, err.msg);
                return 1;
            }
            r->prompt_i = pi;
            r->policy = p;
            r->mean_prompt = mean;
            (*n_rows)++;
            if (base < 0 && s->pols[p].kind == SFI_POLICY_FULL)
                base = *n_rows - 1;
        }
        for (int i = *n_rows - s->n_pols; i < *n_rows; i++)
            rows[i].speedup = base >= 0 ? rows[i].sum.tok_s / rows[base].sum.tok_s : NAN;
    }
    return 0;
}

/* Says where a policy's buffers cost admitted concurrency. */
static void note_concurrency(const serve_cli *s, const run_row *rows, int n_rows)
{
    for (int i = 0; i < n_rows; i++) {
        int pi = rows[i].prompt_i;
        for (int j = 0; j < n_rows; j++)
            if (rows[j].prompt_i == pi && s->pols[rows[j].policy].kind == SFI_POLICY_FULL &&
                rows[i].res.peak_running < rows[j].res.peak_running)
                fprintf(stderr,
                        ME ": prompt %s: %s runs at most %d requests at once, full KV %d (its "
                           "buffers count against the KV budget of %.2f GB per GPU)\n",
                        s->prompt_specs[pi], s->pols[rows[i].policy].name, rows[i].res.peak_running,
                        rows[j].res.peak_running, rows[i].res.kv_budget / 1e9);
    }
}

/* The table, the requests CSV and the figures. *drew is set once a figure
 * is started (its fonts are released at the end). Returns 0 or 1. */
static int report(const serve_args *a, const serve_cli *s, const run_row *rows, int n_rows,
                  int *drew)
{
    sfi_error err;
    out_ctx oc = {s, rows, n_rows, a->fmt};
    if (write_out(a->out, "table", emit_table, &oc))
        return 1;
    note_concurrency(s, rows, n_rows);
    if (a->req && write_out(a->req, "requests", emit_requests, &oc))
        return 1;
    if (a->png) {
        *drew = 1;
        if (write_figure(s, rows, n_rows, a->png, &err) != SFI_OK) {
            fprintf(stderr, ME ": %s\n", err.msg);
            return 1;
        }
        fprintf(stderr, ME ": wrote %s\n", a->png);
    }
    if (a->timeline) {
        *drew = 1;
        if (write_timeline(s, rows, n_rows, a->timeline, &err) != SFI_OK) {
            fprintf(stderr, ME ": %s\n", err.msg);
            return 1;
        }
        fprintf(stderr, ME ": wrote %s\n", a->timeline);
    }
    return 0;
}

/* parse, setup, run, report. */
int sfi_sim_cmd_serve(int argc, char **argv)
{
    serve_cli s;
    memset(&s, 0, sizeof s);
    sfi_policy_config_default(&s.cfg);
    sfi_serve_config_init(&s.base);
    s.n_req = 16;
    s.seed = 1;
    s.kv_bytes = 2;
    s.weight_bytes = 2;
    s.gen_spec = "2048";
    serve_args a;
    int rc = parse_args(argc, argv, &a, &s);
    if (rc >= 0)
        return rc;
    int n_rows = 0, drew = 0;
    run_row *rows = NULL;
    sfi_serve_request *rq = NULL;
    if ((rc = setup(&a, &s)))
        goto out;
    rq = calloc((size_t)s.n_req, sizeof *rq);
    rows = calloc((size_t)s.n_prompts * s.n_pols, sizeof *rows);
    if (!rq || !rows) {
        rc = SERVE_OOM;
        goto out;
    }
    if ((rc = run_all(&s, rq, rows, &n_rows)) || (rc = report(&a, &s, rows, n_rows, &drew)))
        goto out;
out:
    if (rc == SERVE_OOM) {
        fprintf(stderr, ME ": out of memory\n");
        rc = 1;
    }
    for (int i = 0; i < n_rows; i++)
        sfi_serve_result_free(&rows[i].res);
    free(rows);
    free(rq);
    for (int i = 0; i < s.n_pols; i++)
        free(s.pols[i].name);
    free(s.pols);
    if (s.prompt_specs)
        sfi_sim_free_list(s.prompt_specs, s.n_prompts);
    free(s.prompt_d);
    sfi_sim_stream_free(&s.stream);
    if (drew)
        sfi_plot_release_fonts();
    return rc;
}
