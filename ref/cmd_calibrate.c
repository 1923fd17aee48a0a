/* sfi-ref calibrate: Kascade's and FASA's calibration from dense forward
 * passes over a calibration text (ref/sfi_policy_calib.h), written as JSON
 * for sfi-sim analyze, sfi-ref eval and sfi-ref run --trace. */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sfi_cli.h"
#include "sfi_io.h"
#include "sfi_policies.h"
#include "sfi_qwen3.h"
#include "sfi_ref_cli.h"
#include "sfi_tokenizer.h"

#define ME "sfi-ref calibrate"
#define CALIB_MAX_INPUT ((size_t)256 << 20)

static void usage(FILE *out)
{
    fprintf(out,
            "usage: " ME " --model DIR (--text FILE | --ids FILE) --output FILE\n"
            "                          [--prompts N] [--prompt-len L] [--offset T]\n"
            "                          [--param KEY=VALUE ...] [--tokenizer DIR]\n"
            "                          [--backend blas|scalar] [--quiet]\n\n"
            "Calibrates Kascade (cross-layer similarity of top-k attention, head map,\n"
            "layer importance) and FASA (each KV head's dominant RoPE frequency chunks)\n"
            "from dense forward passes over N prompts of L tokens cut from a calibration\n"
            "text that is not the text evaluated later, and writes the JSON the\n"
            "analyzer (--calib), the evaluation (--calib) and traces use.\n\n"
            "  -m, --model DIR      checkpoint directory (config.json + safetensors)\n"
            "      --text FILE      calibration text (UTF-8), encoded with the tokenizer\n"
            "      --ids FILE       the text as whitespace-separated decimal token ids\n"
            "  -o, --output FILE    the calibration JSON\n"
            "  -n, --prompts N      prompts (consecutive windows of the text) (4)\n"
            "  -L, --prompt-len L   tokens per prompt (1024); Kascade measures the tokens\n"
            "                       past kascade_calib_k, FASA those past 2 fasa_calib_k\n"
            "      --offset T       skip the text's first T tokens (0)\n"
            "  -P, --param KEY=VAL  kascade_calib_k (64), fasa_calib_k (256), fasa_tip\n"
            "                       (0: head_dim/8)\n"
            "      --tokenizer DIR  tokenizer files (default: the model directory)\n"
            "      --backend B      blas (default when built with OpenBLAS) or scalar\n"
            "  -q, --quiet          no progress lines on standard error\n"
            "  -h, --help           this help\n\n"
            "Exit status: 0 ok, 1 bad input or failure, 2 usage error. See\n"
            "sfi-ref-calibrate(1).\n");
}

static int parse_int(const char *s, const char *what, int lo, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > INT_MAX / 4) {
        fprintf(stderr, ME ": %s '%s': expected an integer >= %d\n", what, s, lo);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* What the forward pass hands the calibrator. */
typedef struct {
    const sfi_qwen3 *m;
    sfi_backend be;
    sfi_policy_calibrator *cb;
    int hidden;
} cctx;

static sfi_status cal_attend(void *user, int layer, const float *q, const sfi_kv_cache *kv,
                             int n_ctx, float *out, sfi_error *err)
{
    cctx *c = user;
    sfi_status st = sfi_policy_calibrator_add(c->cb, layer, q, sfi_kv_k(kv, layer), n_ctx, err);
    if (st)
        return st;
    return sfi_qwen3_attn_dense(c->m, c->be, layer, q, kv, n_ctx, out, NULL, err);
}

static void cal_layer(void *user, int layer, int T, const float *in, const float *out)
{
    cctx *c = user;
    for (int t = 0; t < T; t++)
        sfi_policy_calibrator_hidden(c->cb, layer, in + (size_t)t * c->hidden,
                                     out + (size_t)t * c->hidden, c->hidden);
}

static int file_exists(const char *dir, const char *name)
{
    char p[PATH_MAX];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

/* What the command line asks for. */
typedef struct {
    const char *model, *text, *idsf, *outp, *tok_dir;
    int n_prompts, plen, offset, quiet;
    sfi_policy_config cfg;
    sfi_backend be;
} calib_opts;

/* What a run holds; calib_run_free releases it. */
typedef struct {
    sfi_qwen3 *m;
    sfi_tokenizer *tk;
    int32_t *ids;
    int n_ids;
    char *s;
    size_t len;
    sfi_kv_cache kv;
    sfi_policy_calibrator *cb;
    sfi_policy_calib cal;
} calib_run;

static void calib_run_free(calib_run *r)
{
    sfi_policy_calib_free(&r->cal);
    sfi_policy_calibrator_free(r->cb);
    sfi_kv_cache_free(&r->kv);
    sfi_tokenizer_free(r->tk);
    sfi_qwen3_free(r->m);
    free(r->ids);
    free(r->s);
}

/* Parses the command line into *o. Returns -1 to go on, else the exit
 * status (0 after --help, 2 for a usage error, reported). */
static int parse_args(int argc, char **argv, calib_opts *o, sfi_error *e)
{
    enum { O_TEXT = 256, O_IDS, O_OFFSET, O_TOKENIZER, O_BACKEND };
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"text", required_argument, NULL, O_TEXT},
        {"ids", required_argument, NULL, O_IDS},
        {"output", required_argument, NULL, 'o'},
        {"prompts", required_argument, NULL, 'n'},
        {"prompt-len", required_argument, NULL, 'L'},
        {"offset", required_argument, NULL, O_OFFSET},
        {"param", required_argument, NULL, 'P'},
        {"tokenizer", required_argument, NULL, O_TOKENIZER},
        {"backend", required_argument, NULL, O_BACKEND},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof *o);
    o->n_prompts = 4;
    o->plen = 1024;
    sfi_policy_config_default(&o->cfg);
    o->be = sfi_backend_available(SFI_BACKEND_BLAS) ? SFI_BACKEND_BLAS : SFI_BACKEND_SCALAR;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:o:n:L:P:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case O_TEXT: o->text = optarg; break;
        case O_IDS: o->idsf = optarg; break;
        case 'o': o->outp = optarg; break;
        case 'n':
            if (parse_int(optarg, "--prompts", 1, &o->n_prompts))
                return 2;
            break;
        case 'L':
            if (parse_int(optarg, "--prompt-len", 2, &o->plen))
                return 2;
            break;
        case O_OFFSET:
            if (parse_int(optarg, "--offset", 0, &o->offset))
                return 2;
            break;
        case 'P':
            if (sfi_policy_config_set(&o->cfg, optarg, e)) {
                fprintf(stderr, ME ": %s\n", e->msg);
                return 2;
            }
            break;
        case O_TOKENIZER: o->tok_dir = optarg; break;
        case O_BACKEND:
            if (sfi_backend_parse(optarg, &o->be, e)) {
                fprintf(stderr, ME ": --%s\n", e->msg);
                return 2;
            }
            break;
        case 'q': o->quiet = 1; break;
        case 'h': usage(stdout); return 0;
        default: return sfi_cli_bad_option(ME, argv, NULL, usage);
        }
    }
    if (optind < argc) {
        fprintf(stderr, ME ": unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!o->model || !o->outp || (!!o->text + !!o->idsf) != 1) {
        fprintf(stderr, ME ": need --model, --output and exactly one of --text, --ids\n");
        usage(stderr);
        return 2;
    }
    return -1;
}

/* Reads src (--text or --ids) into r->ids, r->n_ids; 0 or -1 (reported). */
static int read_ids(const calib_opts *o, const char *src, calib_run *r, sfi_error *e)
{
    if (sfi_io_read(src, CALIB_MAX_INPUT, o->text ? "text" : "list of ids", &r->s, &r->len, e)) {
        fprintf(stderr, ME ": %s\n", e->msg);
        return -1;
    }
    if (o->idsf) {
        if (sfi_ref_parse_ids(o->idsf, r->s, r->len, &r->ids, &r->n_ids, e)) {
            fprintf(stderr, ME ": %s\n", e->msg);
            return -1;
        }
        return 0;
    }
    const char *tok_dir = o->tok_dir ? o->tok_dir : o->model;
    if (!file_exists(tok_dir, "vocab.json") || !file_exists(tok_dir, "merges.txt")) {
        fprintf(stderr, ME ": %s: no vocab.json + merges.txt to encode the text (give "
                        "--tokenizer DIR)\n", tok_dir);
        return -1;
    }
    size_t n = 0;
    if (sfi_tokenizer_load(tok_dir, &r->tk, e) ||
        sfi_tokenizer_encode(r->tk, r->s, r->len, &r->ids, &n, e)) {
        fprintf(stderr, ME ": %s: %s\n", o->text, e->msg);
        return -1;
    }
    if (n > INT_MAX / 4) {
        fprintf(stderr, ME ": %s: too long\n", o->text);
        return -1;
    }
    r->n_ids = (int)n;
    return 0;
}

/* Checks that the ids hold the prompts asked for, in the model's vocabulary
 * and position range; 0 or -1 (reported). */
static int check_ids(const calib_opts *o, const char *src, const calib_run *r,
                     const sfi_model_config *mc)
{
    long need = (long)o->offset + (long)o->n_prompts * o->plen;
    if (r->n_ids < need) {
        fprintf(stderr, ME ": %s: %d tokens; --offset %d and %d prompts of %d tokens need %ld\n",
                src, r->n_ids, o->offset, o->n_prompts, o->plen, need);
        return -1;
    }
    if (o->plen > mc->max_position_embeddings) {
        fprintf(stderr, ME ": --prompt-len %d exceeds the model's max_position_embeddings %d\n",
                o->plen, mc->max_position_embeddings);
        return -1;
    }
    for (long i = o->offset; i < need; i++)
        if (r->ids[i] < 0 || r->ids[i] >= mc->vocab_size) {
            fprintf(stderr, ME ": %s: token %ld (id %d) is outside the model's vocabulary [0, "
                            "%d)\n", src, i, (int)r->ids[i], mc->vocab_size);
            return -1;
        }
    return 0;
}

/* The dense forward passes over the prompts, observed by the calibrator;
 * 0 or -1 (reported). */
static int run_prompts(const calib_opts *o, const sfi_model_config *mc, calib_run *r,
                       sfi_error *e)
{
    int tip = sfi_policy_fasa_tip(&o->cfg, mc->head_dim);
    if (sfi_policy_calibrator_create(o->cfg.kascade_calib_k, o->cfg.fasa_calib_k, tip,
                                     mc->num_hidden_layers, mc->num_attention_heads,
                                     mc->num_key_value_heads, mc->head_dim, o->plen, &r->cb, e) ||
        sfi_kv_cache_init(&r->kv, mc, o->plen, e)) {
        fprintf(stderr, ME ": %s\n", e->msg);
        return -1;
    }
    cctx cx = {r->m, o->be, r->cb, mc->hidden_size};
    for (int p = 0; p < o->n_prompts; p++) {
        if (!o->quiet)
            fprintf(stderr, ME ": prompt %d of %d (%d tokens)\n", p + 1, o->n_prompts, o->plen);
        r->kv.n = 0;
        sfi_policy_calibrator_begin(r->cb);
        if (sfi_qwen3_prefill_observed(r->m, o->be, &r->kv,
                                       r->ids + o->offset + (size_t)p * o->plen, o->plen,
                                       cal_attend, &cx, cal_layer, &cx, NULL, e)) {
            fprintf(stderr, ME ": %s: prompt %d: %s\n", o->model, p, e->msg);
            return -1;
        }
    }
    return 0;
}

/* Finishes the calibration and writes it to --output; 0 or -1 (reported). */
static int write_calib(const calib_opts *o, const char *src, calib_run *r, sfi_error *e)
{
    char source[1024];
    const char *base = strrchr(src, '/');
    snprintf(source, sizeof source, "%s: %d prompts of %d tokens from token %d (kascade k %d, "
             "fasa K %d)", base ? base + 1 : src, o->n_prompts, o->plen, o->offset,
             o->cfg.kascade_calib_k, o->cfg.fasa_calib_k);
    if (sfi_policy_calibrator_finish(r->cb, source, &r->cal, e) ||
        sfi_policy_calib_save(o->outp, &r->cal, e)) {
        fprintf(stderr, ME ": %s\n", e->msg);
        return -1;
    }
    return 0;
}

/* The closing lines on standard error: Kascade's anchors and what was
 * written. */
static void report(const calib_opts *o, const sfi_model_config *mc, const calib_run *r,
                   sfi_error *e)
{
    sfi_policy_shape sh = {mc->num_hidden_layers, mc->num_attention_heads,
                           mc->num_key_value_heads, mc->head_dim};
    sfi_policy *kp = NULL;
    if (r->cal.has_kascade &&
        !sfi_policy_create(SFI_POLICY_KASCADE, &o->cfg, &sh, o->plen, &r->cal, &kp, e)) {
        int an[64];
        int na = sfi_policy_kascade_anchor_list(kp, an, 64);
        fprintf(stderr, ME ": kascade anchors (layer 0 dense):");
        for (int i = 0; i < na; i++)
            fprintf(stderr, " %d", an[i]);
        fprintf(stderr, "\n");
        sfi_policy_free(kp);
    }
    fprintf(stderr, ME ": wrote %s (kascade %s, fasa %s)\n", o->outp,
            r->cal.has_kascade ? "yes" : "no", r->cal.has_fasa ? "yes" : "no");
}

int sfi_ref_cmd_calibrate(int argc, char **argv)
{
    calib_opts o;
    sfi_error e;
    sfi_error_clear(&e);
    int st = parse_args(argc, argv, &o, &e);
    if (st >= 0)
        return st;
    int rc = 1;
    calib_run r;
    memset(&r, 0, sizeof r);
    if (sfi_qwen3_load(o.model, &r.m, &e)) {
        fprintf(stderr, ME ": %s\n", e.msg);
        goto out;
    }
    const sfi_model_config *mc = sfi_qwen3_config(r.m);
    const char *src = o.text ? o.text : o.idsf;
    if (read_ids(&o, src, &r, &e) || check_ids(&o, src, &r, mc) || run_prompts(&o, mc, &r, &e) ||
        write_calib(&o, src, &r, &e))
        goto out;
    if (!o.quiet)
        report(&o, mc, &r, &e);
    rc = 0;
out:
    calib_run_free(&r);
    return rc;
}
