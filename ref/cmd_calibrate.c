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

int sfi_ref_cmd_calibrate(int argc, char **argv)
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
    const char *model = NULL, *text = NULL, *idsf = NULL, *outp = NULL, *tok_dir = NULL;
    int n_prompts = 4, plen = 1024, offset = 0, quiet = 0;
    sfi_policy_config cfg;
    sfi_policy_config_default(&cfg);
    sfi_backend be = sfi_backend_available(SFI_BACKEND_BLAS) ? SFI_BACKEND_BLAS
                                                             : SFI_BACKEND_SCALAR;
    sfi_error e;
    sfi_error_clear(&e);
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:o:n:L:P:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case O_TEXT: text = optarg; break;
        case O_IDS: idsf = optarg; break;
        case 'o': outp = optarg; break;
        case 'n':
            if (parse_int(optarg, "--prompts", 1, &n_prompts))
                return 2;
            break;
        case 'L':
            if (parse_int(optarg, "--prompt-len", 2, &plen))
                return 2;
            break;
        case O_OFFSET:
            if (parse_int(optarg, "--offset", 0, &offset))
                return 2;
            break;
        case 'P':
            if (sfi_policy_config_set(&cfg, optarg, &e)) {
                fprintf(stderr, ME ": %s\n", e.msg);
                return 2;
            }
            break;
        case O_TOKENIZER: tok_dir = optarg; break;
        case O_BACKEND:
            if (sfi_backend_parse(optarg, &be, &e)) {
                fprintf(stderr, ME ": --%s\n", e.msg);
                return 2;
            }
            break;
        case 'q': quiet = 1; break;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, ME ": %s: unknown option or missing value\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, ME ": unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!model || !outp || (!!text + !!idsf) != 1) {
        fprintf(stderr, ME ": need --model, --output and exactly one of --text, --ids\n");
        usage(stderr);
        return 2;
    }
    int rc = 1;
    sfi_qwen3 *m = NULL;
    sfi_tokenizer *tk = NULL;
    int32_t *ids = NULL;
    int n_ids = 0;
    char *s = NULL;
    size_t len = 0;
    sfi_kv_cache kv;
    memset(&kv, 0, sizeof kv);
    sfi_policy_calibrator *cb = NULL;
    sfi_policy_calib cal;
    memset(&cal, 0, sizeof cal);
    if (sfi_qwen3_load(model, &m, &e)) {
        fprintf(stderr, ME ": %s\n", e.msg);
        goto out;
    }
    const sfi_model_config *mc = sfi_qwen3_config(m);
    const char *src = text ? text : idsf;
    if (sfi_io_read(src, CALIB_MAX_INPUT, text ? "text" : "list of ids", &s, &len, &e)) {
        fprintf(stderr, ME ": %s\n", e.msg);
        goto out;
    }
    if (idsf) {
        if (sfi_ref_parse_ids(idsf, s, len, &ids, &n_ids, &e)) {
            fprintf(stderr, ME ": %s\n", e.msg);
            goto out;
        }
    } else {
        if (!tok_dir)
            tok_dir = model;
        if (!file_exists(tok_dir, "vocab.json") || !file_exists(tok_dir, "merges.txt")) {
            fprintf(stderr, ME ": %s: no vocab.json + merges.txt to encode the text (give "
                            "--tokenizer DIR)\n", tok_dir);
            goto out;
        }
        size_t n = 0;
        if (sfi_tokenizer_load(tok_dir, &tk, &e) ||
            sfi_tokenizer_encode(tk, s, len, &ids, &n, &e)) {
            fprintf(stderr, ME ": %s: %s\n", text, e.msg);
            goto out;
        }
        if (n > INT_MAX / 4) {
            fprintf(stderr, ME ": %s: too long\n", text);
            goto out;
        }
        n_ids = (int)n;
    }
    long need = (long)offset + (long)n_prompts * plen;
    if (n_ids < need) {
        fprintf(stderr, ME ": %s: %d tokens; --offset %d and %d prompts of %d tokens need %ld\n",
                src, n_ids, offset, n_prompts, plen, need);
        goto out;
    }
    if (plen > mc->max_position_embeddings) {
        fprintf(stderr, ME ": --prompt-len %d exceeds the model's max_position_embeddings %d\n",
                plen, mc->max_position_embeddings);
        goto out;
    }
    for (long i = offset; i < need; i++)
        if (ids[i] < 0 || ids[i] >= mc->vocab_size) {
            fprintf(stderr, ME ": %s: token %ld (id %d) is outside the model's vocabulary [0, "
                            "%d)\n", src, i, (int)ids[i], mc->vocab_size);
            goto out;
        }
    int tip = sfi_policy_fasa_tip(&cfg, mc->head_dim);
    if (sfi_policy_calibrator_create(cfg.kascade_calib_k, cfg.fasa_calib_k, tip,
                                     mc->num_hidden_layers, mc->num_attention_heads,
                                     mc->num_key_value_heads, mc->head_dim, plen, &cb, &e) ||
        sfi_kv_cache_init(&kv, mc, plen, &e)) {
        fprintf(stderr, ME ": %s\n", e.msg);
        goto out;
    }
    cctx cx = {m, be, cb, mc->hidden_size};
    for (int p = 0; p < n_prompts; p++) {
        if (!quiet)
            fprintf(stderr, ME ": prompt %d of %d (%d tokens)\n", p + 1, n_prompts, plen);
        kv.n = 0;
        sfi_policy_calibrator_begin(cb);
        if (sfi_qwen3_prefill_observed(m, be, &kv, ids + offset + (size_t)p * plen, plen,
                                       cal_attend, &cx, cal_layer, &cx, NULL, &e)) {
            fprintf(stderr, ME ": %s: prompt %d: %s\n", model, p, e.msg);
            goto out;
        }
    }
    char source[1024];
    const char *base = strrchr(src, '/');
    snprintf(source, sizeof source, "%s: %d prompts of %d tokens from token %d (kascade k %d, "
             "fasa K %d)", base ? base + 1 : src, n_prompts, plen, offset, cfg.kascade_calib_k,
             cfg.fasa_calib_k);
    if (sfi_policy_calibrator_finish(cb, source, &cal, &e) ||
        sfi_policy_calib_save(outp, &cal, &e)) {
        fprintf(stderr, ME ": %s\n", e.msg);
        goto out;
    }
    if (!quiet) {
        sfi_policy_shape sh = {mc->num_hidden_layers, mc->num_attention_heads,
                               mc->num_key_value_heads, mc->head_dim};
        sfi_policy *kp = NULL;
        if (cal.has_kascade &&
            !sfi_policy_create(SFI_POLICY_KASCADE, &cfg, &sh, plen, &cal, &kp, &e)) {
            int an[64];
            int na = sfi_policy_kascade_anchor_list(kp, an, 64);
            fprintf(stderr, ME ": kascade anchors (layer 0 dense):");
            for (int i = 0; i < na; i++)
                fprintf(stderr, " %d", an[i]);
            fprintf(stderr, "\n");
            sfi_policy_free(kp);
        }
        fprintf(stderr, ME ": wrote %s (kascade %s, fasa %s)\n", outp,
                cal.has_kascade ? "yes" : "no", cal.has_fasa ? "yes" : "no");
    }
    rc = 0;
out:
    sfi_policy_calib_free(&cal);
    sfi_policy_calibrator_free(cb);
    sfi_kv_cache_free(&kv);
    sfi_tokenizer_free(tk);
    sfi_qwen3_free(m);
    free(ids);
    free(s);
    return rc;
}
