/* sfi-ref run: decode a prompt with a Qwen3 checkpoint, SFI or dense, and
 * print the tokens, the kind of every step, the slow fraction and the run's
 * SHA-256 digest (text or one JSON object). */
#include <config.h>

#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sfi_cli.h"
#include "sfi_decode.h"
#include "sfi_io.h"
#include "sfi_params.h"
#include "sfi_parse.h"
#include "sfi_progress.h"
#include "sfi_qwen3.h"
#include "sfi_recorder.h"
#include "sfi_ref_cli.h"
#include "sfi_state.h"
#include "sfi_tokenizer.h"
#include "sfi_vocab.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sfi-ref run --model DIR (--prompt TEXT | --prompt-file F | --prompt-ids F)\n"
            "                   --max-new N [--mode sfi|dense] [--param KEY=VALUE ...]\n"
            "                   [--params FILE] [--trigger POLICY] [--interval N]\n"
            "                   [--backend scalar|blas] [--tokenizer DIR] [--stop-at-eos]\n"
            "                   [--trace FILE [--trace-level L] [--trace-top-m M]\n"
            "                   [--trace-layers LIST] [--trace-qk|--trace-qkv]\n"
            "                   [--trace-calib F]] [--json]\n\n"
            "Greedy decoding of a prompt with a Hugging Face Qwen3 / Qwen3-MoE checkpoint\n"
            "(config.json + model.safetensors or a sharded index). The prompt is prefilled\n"
            "densely; its last W_prefill queries initialize the selected sets; then every\n"
            "step is slow (dense attention, Selector refresh) or fast (sink + selected +\n"
            "recent) by the trigger policy (--mode sfi), or dense (--mode dense).\n\n"
            "  -m, --model DIR        checkpoint directory\n"
            "  -p, --prompt TEXT      prompt text (needs the tokenizer files)\n"
            "      --prompt-file F    prompt text read from file F\n"
            "      --prompt-ids F     whitespace-separated decimal token ids read from F\n"
            "      --forced-ids F     teacher forcing: step t >= 1 feeds the t-th id of F\n"
            "                         (at least N - 1 of them) instead of x_{t-1}; the\n"
            "                         argmax is still reported and traced\n"
            "                         ('-' reads standard input)\n"
            "  -n, --max-new N        tokens to generate (>= 1)\n"
            "      --mode MODE        sfi (default) or dense\n"
            "  -P, --param KEY=VALUE  an SFI parameter (repeatable; see sfi-ref(1))\n"
            "      --params FILE      a file of KEY=VALUE lines\n"
            "      --trigger POLICY   sfi (default), tmax, boundary, interval, always, never\n"
            "      --interval N       step interval of the interval policy (16)\n"
            "      --backend B        scalar (default, bit-exact) or blas (OpenBLAS)\n"
            "      --tokenizer DIR    tokenizer files (vocab.json, merges.txt); default the\n"
            "                         model directory. Without them the trigger set is empty\n"
            "                         and only ids are printed\n"
            "      --stop-at-eos      stop after generating one of the config's\n"
            "                         eos_token_id (every id of a list)\n"
            "      --json             print one JSON object\n"
            "  -h, --help             print this help\n"
            "%s\n"
            "Exit status: 0 ok, 1 bad input or failure, 2 usage error. See sfi-ref-run(1).\n",
            sfi_recorder_usage());
}

static int file_exists(const char *dir, const char *name)
{
    char p[PATH_MAX];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

/* A prompt file, or standard input for "-", with a limit: /dev/zero or an
 * endless pipe is refused instead of filling memory. */
static char *read_prompt(const char *path, const char *what, size_t *len, sfi_error *err)
{
    char *buf = NULL;
    sfi_status st = strcmp(path, "-")
                        ? sfi_io_read(path, SFI_REF_PROMPT_FILE_MAX, what, &buf, len, err)
                        : sfi_io_read_stream(stdin, "standard input", SFI_REF_PROMPT_FILE_MAX, what,
                                             &buf, len, err);
    return st ? NULL : buf;
}

enum {
    O_PROMPT_FILE = 256,
    O_PROMPT_IDS,
    O_FORCED_IDS,
    O_MODE,
    O_PARAMS,
    O_TRIGGER,
    O_INTERVAL,
    O_BACKEND,
    O_TOKENIZER,
    O_STOP,
    O_JSON,
    O_TRACE
};

static int parse_int(const char *s, const char *what, int lo, int *out)
{
    if (sfi_parse_int(s, lo, INT_MAX, out) == 0)
        return 0;
    fprintf(stderr, "sfi-ref run: %s '%s': expected an integer >= %d\n", what, s, lo);
    return -1;
}

/* The command line. */
typedef struct {
    const char *model, *prompt, *prompt_file, *prompt_ids, *forced_ids, *tok_dir;
    int json, stop;
    sfi_decode_opts o;    /* o.max_new: --max-new, -1 until given */
    sfi_recorder_opts ro; /* --trace* */
} run_args;

/* One option of getopt_long's c (opt names it for the --trace* group). */
static int parse_option(int c, const struct option *opt, run_args *a, sfi_error *e)
{
    switch (c) {
    case 'm': a->model = optarg; return 0;
    case 'p': a->prompt = optarg; return 0;
    case O_PROMPT_FILE: a->prompt_file = optarg; return 0;
    case O_PROMPT_IDS: a->prompt_ids = optarg; return 0;
    case O_FORCED_IDS: a->forced_ids = optarg; return 0;
    case 'n': return parse_int(optarg, "--max-new", 1, &a->o.max_new) ? 2 : 0;
    case O_INTERVAL: return parse_int(optarg, "--interval", 1, &a->o.interval) ? 2 : 0;
    case O_TOKENIZER: a->tok_dir = optarg; return 0;
    case O_STOP: a->stop = 1; return 0;
    case O_JSON: a->json = 1; return 0;
    case O_MODE:
        if (sfi_decode_mode_parse(optarg, &a->o.mode, e))
            return fprintf(stderr, "sfi-ref run: --%s\n", e->msg), 2;
        return 0;
    case 'P':
        if (sfi_params_set(&a->o.params, optarg, "--param", e))
            return fprintf(stderr, "sfi-ref run: %s\n", e->msg), 2;
        return 0;
    case O_PARAMS:
        if (sfi_params_load_file(&a->o.params, optarg, e))
            return fprintf(stderr, "sfi-ref run: %s\n", e->msg), 1;
        return 0;
    case O_TRIGGER:
        if (sfi_trigger_policy_parse(optarg, &a->o.trigger, e))
            return fprintf(stderr, "sfi-ref run: --trigger: %s\n", e->msg), 2;
        return 0;
    case O_BACKEND:
        if (sfi_backend_parse(optarg, &a->o.backend, e))
            return fprintf(stderr, "sfi-ref run: --%s\n", e->msg), 2;
        return 0;
    case O_TRACE:
        if (sfi_recorder_set_option(&a->ro, opt->name, optarg, e) != 1)
            return fprintf(stderr, "sfi-ref run: %s\n", e->msg), 2;
        return 0;
    }
    return 2;
}

/* Parses and checks the command line. Returns -1 to go on, else the exit
 * status (0 for --help). */
static int parse_args(int argc, char **argv, run_args *a)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"prompt", required_argument, NULL, 'p'},
        {"prompt-file", required_argument, NULL, O_PROMPT_FILE},
        {"prompt-ids", required_argument, NULL, O_PROMPT_IDS},
        {"forced-ids", required_argument, NULL, O_FORCED_IDS},
        {"max-new", required_argument, NULL, 'n'},
        {"mode", required_argument, NULL, O_MODE},
        {"param", required_argument, NULL, 'P'},
        {"params", required_argument, NULL, O_PARAMS},
        {"trigger", required_argument, NULL, O_TRIGGER},
        {"interval", required_argument, NULL, O_INTERVAL},
        {"backend", required_argument, NULL, O_BACKEND},
        {"tokenizer", required_argument, NULL, O_TOKENIZER},
        {"stop-at-eos", no_argument, NULL, O_STOP},
        {"json", no_argument, NULL, O_JSON},
        {"trace", required_argument, NULL, O_TRACE},
        {"trace-level", required_argument, NULL, O_TRACE},
        {"trace-top-m", required_argument, NULL, O_TRACE},
        {"trace-layers", required_argument, NULL, O_TRACE},
        {"trace-qk", no_argument, NULL, O_TRACE},
        {"trace-qkv", no_argument, NULL, O_TRACE},
        {"trace-calib", required_argument, NULL, O_TRACE},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(a, 0, sizeof *a);
    sfi_recorder_opts_default(&a->ro);
    sfi_decode_opts_default(&a->o);
    a->o.max_new = -1;
    sfi_error e;
    sfi_error_clear(&e);
    int c, long_index = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:p:n:P:h", opts, &long_index)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if (c == '?' || c == ':')
            return sfi_cli_bad_option("sfi-ref run", argv, "mpnP", usage);
        int rc = parse_option(c, &opts[long_index], a, &e);
        if (rc)
            return rc;
    }
    if (optind < argc) {
        fprintf(stderr, "sfi-ref run: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!a->model || a->o.max_new < 0 || (!!a->prompt + !!a->prompt_file + !!a->prompt_ids) != 1) {
        fprintf(stderr, "sfi-ref run: need --model, --max-new and exactly one of --prompt, "
                        "--prompt-file, --prompt-ids\n");
        usage(stderr);
        return 2;
    }
    if (sfi_params_validate(&a->o.params, &e) || sfi_recorder_opts_check(&a->ro, &e)) {
        fprintf(stderr, "sfi-ref run: %s\n", e.msg);
        return 2;
    }
    if (!a->tok_dir)
        a->tok_dir = a->model;
    return -1;
}

/* What the run holds, freed by run_free. */
typedef struct {
    sfi_qwen3 *m;
    sfi_tokenizer *tk; /* NULL: no tokenizer files, ids only */
    sfi_trigger_set ts;
    int have_ts;
    int32_t *ids; /* the prompt */
    int n_ids;
    int32_t *forced; /* --forced-ids */
    int n_forced;
    sfi_decode_result res;
    char *text; /* the generated text (with a tokenizer) */
    size_t text_len;
} run_state;

static void run_free(run_state *r)
{
    free(r->text);
    free(r->ids);
    free(r->forced);
    sfi_decode_result_free(&r->res);
    if (r->have_ts)
        sfi_trigger_set_free(&r->ts);
    sfi_tokenizer_free(r->tk);
    sfi_qwen3_free(r->m);
}

/* The tokenizer and the trigger set when the tokenizer files are there
 * (they must be for prompt text). Returns 0 or 1 (message printed). */
static int load_tokenizer(run_args *a, const sfi_model_config *cfg, run_state *r)
{
    sfi_error e;
    int have_files = file_exists(a->tok_dir, "vocab.json") && file_exists(a->tok_dir, "merges.txt");
    if (!have_files) {
        if (a->prompt || a->prompt_file) {
            fprintf(stderr,
                    "sfi-ref run: %s: no vocab.json + merges.txt to encode the prompt "
                    "text (give --tokenizer DIR or --prompt-ids)\n",
                    a->tok_dir);
            return 1;
        }
        if (a->o.mode == SFI_DECODE_SFI && !a->json)
            fprintf(stderr,
                    "sfi-ref run: note: no tokenizer files in %s: the trigger set is "
                    "empty, slow steps come from T_max only\n",
                    a->tok_dir);
        return 0;
    }
    if (sfi_tokenizer_load(a->tok_dir, &r->tk, &e) ||
        sfi_ref_tokenizer_fits(r->tk, a->tok_dir, cfg, &e)) {
        fprintf(stderr, "sfi-ref run: %s\n", e.msg);
        return 1;
    }
    if (a->tok_dir != a->model)
        a->ro.tokenizer_dir = a->tok_dir;
    if (sfi_trigger_set_build(sfi_tokenizer_vocab(r->tk), a->o.params.trigger_chars, &r->ts, &e)) {
        fprintf(stderr, "sfi-ref run: %s\n", e.msg);
        return 1;
    }
    r->have_ts = 1;
    a->o.is_trigger = r->ts.is_trigger;
    a->o.n_trigger_vocab = r->ts.n_vocab;
    return 0;
}

/* The prompt's text (--prompt, --prompt-file) encoded. Returns 0 or 1. */
static int encode_prompt(const run_args *a, run_state *r)
{
    sfi_error e;
    size_t len = 0;
    char *s =
        a->prompt ? strdup(a->prompt) : read_prompt(a->prompt_file, "a prompt file", &len, &e);
    if (!s) {
        fprintf(stderr, "sfi-ref run: %s\n", a->prompt ? "out of memory" : e.msg);
        return 1;
    }
    if (a->prompt)
        len = strlen(s);
    size_t n;
    sfi_status st = sfi_tokenizer_encode(r->tk, s, len, &r->ids, &n, &e);
    free(s);
    if (st) {
        fprintf(stderr, "sfi-ref run: %s: %s\n", a->prompt ? "--prompt" : a->prompt_file, e.msg);
        return 1;
    }
    if (n == 0) {
        fprintf(stderr, "sfi-ref run: the prompt encodes to no tokens\n");
        return 1;
    }
    if (n > INT_MAX / 2) {
        fprintf(stderr, "sfi-ref run: prompt too long\n");
        return 1;
    }
    r->n_ids = (int)n;
    return 0;
}

/* The prompt's ids (--prompt-ids, or the text encoded), no longer than
 * the model's positions. Returns 0 or 1. */
static int read_prompt_ids(const run_args *a, const sfi_model_config *cfg, run_state *r)
{
    if (a->prompt_ids) {
        sfi_error e;
        size_t len;
        char *s = read_prompt(a->prompt_ids, "a list of token ids", &len, &e);
        if (!s || sfi_ref_parse_ids(a->prompt_ids, s, len, &r->ids, &r->n_ids, &e)) {
            free(s);
            fprintf(stderr, "sfi-ref run: %s\n", e.msg);
            return 1;
        }
        free(s);
    } else if (encode_prompt(a, r)) {
        return 1;
    }
    if (r->n_ids > cfg->max_position_embeddings) {
        fprintf(stderr,
                "sfi-ref run: prompt of %d tokens is longer than the model's "
                "max_position_embeddings %d\n",
                r->n_ids, cfg->max_position_embeddings);
        return 1;
    }
    return 0;
}

/* --forced-ids: at least one id per step after the first. Returns 0 or 1. */
static int read_forced_ids(run_args *a, run_state *r)
{
    sfi_error e;
    size_t len;
    char *s = read_prompt(a->forced_ids, "a list of token ids", &len, &e);
    if (!s || sfi_ref_parse_ids(a->forced_ids, s, len, &r->forced, &r->n_forced, &e)) {
        free(s);
        fprintf(stderr, "sfi-ref run: --forced-ids: %s\n", e.msg);
        return 1;
    }
    free(s);
    if (r->n_forced < a->o.max_new - 1) {
        fprintf(stderr, "sfi-ref run: --forced-ids %s: %d ids for %d steps (need %d)\n",
                a->forced_ids, r->n_forced, a->o.max_new, a->o.max_new - 1);
        return 1;
    }
    a->o.forced = r->forced;
    a->o.n_forced = r->n_forced;
    return 0;
}

/* The decode steps' progress line (sfi_progress.h) around the recorder's
 * observer (all NULL without --trace): its callbacks are passed through
 * with its own user, and only those it has are set, so that the run does
 * exactly what it does without progress. */
typedef struct {
    sfi_decode_observer inner;
    sfi_progress pg;
} step_progress;

static sfi_status sp_step(void *user, const sfi_decode_step_info *info, sfi_error *err)
{
    step_progress *sp = user;
    if (info->step == 0) /* the clock of the estimate starts after the prefill */
        sfi_progress_begin(&sp->pg, sp->pg.what, sp->pg.unit, sp->pg.total);
    sfi_progress_update(&sp->pg, info->step + 1);
    return sp->inner.on_step ? sp->inner.on_step(sp->inner.user, info, err) : SFI_OK;
}

static sfi_status sp_prefill(void *user, const sfi_decode_prefill_info *info, sfi_error *err)
{
    const sfi_decode_observer *in = &((step_progress *)user)->inner;
    return in->on_prefill(in->user, info, err);
}

static sfi_status sp_slow_layer(void *user, const sfi_decode_slow_layer_info *info, sfi_error *err)
{
    const sfi_decode_observer *in = &((step_progress *)user)->inner;
    return in->on_slow_layer(in->user, info, err);
}

static sfi_status sp_attention(void *user, const sfi_decode_attention_info *info, sfi_error *err)
{
    const sfi_decode_observer *in = &((step_progress *)user)->inner;
    return in->on_attention(in->user, info, err);
}

static sfi_status sp_qk(void *user, const sfi_decode_qk_info *info, sfi_error *err)
{
    const sfi_decode_observer *in = &((step_progress *)user)->inner;
    return in->on_qk(in->user, info, err);
}

/* obs: sp's observer, showing the progress of max_new steps, then inner's. */
static void step_progress_observer(step_progress *sp, const sfi_decode_observer *inner, int max_new,
                                   sfi_decode_observer *obs)
{
    sp->inner = *inner;
    sfi_progress_begin(&sp->pg, "decode", "steps", max_new);
    *obs = *inner;
    obs->user = sp;
    obs->on_step = sp_step;
    obs->on_prefill = inner->on_prefill ? sp_prefill : NULL;
    obs->on_slow_layer = inner->on_slow_layer ? sp_slow_layer : NULL;
    obs->on_attention = inner->on_attention ? sp_attention : NULL;
    obs->on_qk = inner->on_qk ? sp_qk : NULL;
}

/* Decodes, recording the trace when asked (the trace file is created, or
 * refused, before decoding), and decodes the generated ids to text.
 * Returns 0 or 1. */
static int decode(run_args *a, const sfi_model_config *cfg, run_state *r)
{
    sfi_error e;
    a->o.stop_tokens = a->stop ? cfg->eos_token_ids : NULL;
    a->o.n_stop_tokens = a->stop ? cfg->n_eos : 0;
    if (a->forced_ids && read_forced_ids(a, r))
        return 1;
    sfi_recorder *rec = NULL;
    if (sfi_recorder_open(&a->ro, a->model, cfg, &a->o, &rec, &e)) {
        fprintf(stderr, "sfi-ref run: %s\n", e.msg);
        return 1;
    }
    sfi_decode_observer obs, pobs;
    sfi_recorder_observer(rec, &obs);
    const sfi_decode_observer *use = rec ? &obs : NULL;
    /* A long prefill (sfi_qwen3_prefill) and the steps show progress on a
     * terminal. */
    int progress = sfi_progress_enable(1);
    step_progress sp;
    if (progress) {
        step_progress_observer(&sp, &obs, a->o.max_new, &pobs);
        use = &pobs;
    }
    sfi_status st = sfi_decode_run(r->m, &a->o, r->ids, r->n_ids, use, &r->res, &e);
    if (progress)
        sfi_progress_end(&sp.pg);
    if (st) {
        fprintf(stderr, "sfi-ref run: %s: %s\n", a->model, e.msg);
        if (rec)
            sfi_recorder_abort(rec);
        return 1;
    }
    if (rec && sfi_recorder_finish(rec, &e)) {
        fprintf(stderr, "sfi-ref run: %s\n", e.msg);
        return 1;
    }
    if (r->tk && sfi_tokenizer_decode(r->tk, r->res.ids, (size_t)r->res.n_generated, &r->text,
                                      &r->text_len, &e)) {
        fprintf(stderr, "sfi-ref run: %s\n", e.msg);
        return 1;
    }
    return 0;
}

/* One JSON object on standard output. Returns 0 or 1. */
static int print_json(const run_args *a, const run_state *r)
{
    const sfi_decode_result *res = &r->res;
    json_t *j = json_object(), *g = json_array(), *steps = json_array();
    json_object_set_new(j, "model", json_string(a->model));
    json_object_set_new(j, "mode", json_string(sfi_decode_mode_name(a->o.mode)));
    json_object_set_new(j, "backend", json_string(sfi_backend_name(a->o.backend)));
    json_object_set_new(j, "trigger", json_string(sfi_trigger_kind_name(a->o.trigger)));
    json_object_set_new(j, "prompt_tokens", json_integer(r->n_ids));
    for (int i = 0; i < res->n_generated; i++) {
        json_array_append_new(g, json_integer(res->ids[i]));
        json_t *s = json_object();
        json_object_set_new(s, "kind", json_string(sfi_step_kind_name(res->kinds[i])));
        json_object_set_new(s, "reason", json_string(sfi_step_reason_name(res->reasons[i])));
        json_array_append_new(steps, s);
    }
    json_object_set_new(j, "generated_ids", g);
    int text_ok = 1;
    if (r->text) {
        /* JSON holds text: bytes that do not form UTF-8 become U+FFFD */
        size_t n;
        char *clean = sfi_utf8_clean(r->text, r->text_len, &n);
        text_ok = clean && !json_object_set_new(j, "text", json_stringn(clean, n));
        free(clean);
    }
    json_object_set_new(j, "steps", steps);
    json_object_set_new(j, "n_slow", json_integer(res->n_slow));
    json_object_set_new(j, "slow_fraction", json_real(res->slow_fraction));
    json_object_set_new(j, "digest", json_string(res->digest_hex));
    json_object_set_new(j, "prefill_seconds", json_real(res->prefill_seconds));
    json_object_set_new(j, "decode_seconds", json_real(res->decode_seconds));
    json_object_set_new(j, "prefill_cpu_seconds", json_real(res->prefill_cpu_seconds));
    json_object_set_new(j, "decode_cpu_seconds", json_real(res->decode_cpu_seconds));
    char *pj = sfi_params_to_json(&a->o.params);
    json_t *pv = pj ? json_loads(pj, 0, NULL) : NULL;
    free(pj);
    if (pv)
        json_object_set_new(j, "params", pv);
    char *s = text_ok ? json_dumps(j, JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII) : NULL;
    json_decref(j);
    if (!s) {
        fprintf(stderr, "sfi-ref run: out of memory\n");
        return 1;
    }
    printf("%s\n", s);
    free(s);
    return 0;
}

/* The text report on standard output. */
static void print_text(const run_args *a, const run_state *r)
{
    const sfi_decode_result *res = &r->res;
    if (r->text) {
        printf("text: ");
        fwrite(r->text, 1, r->text_len, stdout);
        printf("\n");
    }
    printf("ids:");
    for (int i = 0; i < res->n_generated; i++)
        printf(" %d", (int)res->ids[i]);
    printf("\nsteps:\n");
    for (int i = 0; i < res->n_generated; i++)
        printf("  %d %s %s %d\n", i, sfi_step_kind_name(res->kinds[i]),
               sfi_step_reason_name(res->reasons[i]), (int)res->ids[i]);
    printf("slow_fraction: %.6f (%d of %d steps)\n", res->slow_fraction, res->n_slow,
           res->n_generated);
    printf("prompt_tokens: %d\nmode: %s\nbackend: %s\n", r->n_ids, sfi_decode_mode_name(a->o.mode),
           sfi_backend_name(a->o.backend));
    printf("seconds: prefill %.3f, decode %.3f (%.2f ms/token); CPU seconds: prefill "
           "%.3f, decode %.3f\n",
           res->prefill_seconds, res->decode_seconds,
           res->n_generated > 1 ? 1e3 * res->decode_seconds / (res->n_generated - 1) : 0.0,
           res->prefill_cpu_seconds, res->decode_cpu_seconds);
    printf("digest: %s\n", res->digest_hex);
}

/* parse, load, read the prompt, decode, report. */
int sfi_ref_cmd_run(int argc, char **argv)
{
    run_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    run_state r;
    memset(&r, 0, sizeof r);
    sfi_error e;
    rc = 1;
    if (sfi_qwen3_load(a.model, &r.m, &e)) {
        fprintf(stderr, "sfi-ref run: %s\n", e.msg);
        goto out;
    }
    const sfi_model_config *cfg = sfi_qwen3_config(r.m);
    if (load_tokenizer(&a, cfg, &r) || read_prompt_ids(&a, cfg, &r) || decode(&a, cfg, &r))
        goto out;
    if (a.json) {
        if (print_json(&a, &r))
            goto out;
    } else {
        print_text(&a, &r);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "sfi-ref run: writing standard output failed\n");
        goto out;
    }
    rc = 0;
out:
    run_free(&r);
    return rc;
}
