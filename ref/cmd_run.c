/* sfi-ref run: decode a prompt with a Qwen3 checkpoint, SFI or dense, and
 * print the tokens, the kind of every step, the slow fraction and the run's
 * SHA-256 digest (text or one JSON object). */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sfi_decode.h"
#include "sfi_io.h"
#include "sfi_params.h"
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
                        : sfi_io_read_stream(stdin, "standard input", SFI_REF_PROMPT_FILE_MAX,
                                             what, &buf, len, err);
    return st ? NULL : buf;
}

static int parse_int(const char *s, const char *what, int lo, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > INT_MAX) {
        fprintf(stderr, "sfi-ref run: %s '%s': expected an integer >= %d\n", what, s, lo);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int sfi_ref_cmd_run(int argc, char **argv)
{
    enum { O_PROMPT_FILE = 256, O_PROMPT_IDS, O_FORCED_IDS, O_MODE, O_PARAMS, O_TRIGGER, O_INTERVAL,
           O_BACKEND, O_TOKENIZER, O_STOP, O_JSON, O_TRACE };
    int long_index = 0;
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
    const char *model = NULL, *prompt = NULL, *prompt_file = NULL, *prompt_ids = NULL;
    const char *forced_ids = NULL;
    int32_t *forced = NULL;
    int n_forced = 0;
    const char *tok_dir = NULL;
    sfi_recorder_opts ro;
    sfi_recorder_opts_default(&ro);
    int max_new = -1, json = 0, stop = 0;
    sfi_decode_opts o;
    sfi_decode_opts_default(&o);
    sfi_error e;
    sfi_error_clear(&e);
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:p:n:P:h", opts, &long_index)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'p': prompt = optarg; break;
        case O_PROMPT_FILE: prompt_file = optarg; break;
        case O_PROMPT_IDS: prompt_ids = optarg; break;
        case O_FORCED_IDS: forced_ids = optarg; break;
        case 'n':
            if (parse_int(optarg, "--max-new", 1, &max_new))
                return 2;
            break;
        case O_MODE:
            if (sfi_decode_mode_parse(optarg, &o.mode, &e)) {
                fprintf(stderr, "sfi-ref run: --%s\n", e.msg);
                return 2;
            }
            break;
        case 'P':
            if (sfi_params_set(&o.params, optarg, "--param", &e)) {
                fprintf(stderr, "sfi-ref run: %s\n", e.msg);
                return 2;
            }
            break;
        case O_PARAMS:
            if (sfi_params_load_file(&o.params, optarg, &e)) {
                fprintf(stderr, "sfi-ref run: %s\n", e.msg);
                return 1;
            }
            break;
        case O_TRIGGER:
            if (sfi_trigger_policy_parse(optarg, &o.trigger, &e)) {
                fprintf(stderr, "sfi-ref run: --trigger: %s\n", e.msg);
                return 2;
            }
            break;
        case O_INTERVAL:
            if (parse_int(optarg, "--interval", 1, &o.interval))
                return 2;
            break;
        case O_BACKEND:
            if (sfi_backend_parse(optarg, &o.backend, &e)) {
                fprintf(stderr, "sfi-ref run: --%s\n", e.msg);
                return 2;
            }
            break;
        case O_TOKENIZER: tok_dir = optarg; break;
        case O_STOP: stop = 1; break;
        case O_JSON: json = 1; break;
        case O_TRACE:
            if (sfi_recorder_set_option(&ro, opts[long_index].name, optarg, &e) != 1) {
                fprintf(stderr, "sfi-ref run: %s\n", e.msg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default:
            if (optopt && optopt < 256)
                fprintf(stderr, "sfi-ref run: option -%c: %s\n", optopt,
                        strchr("mpnP", optopt) ? "needs a value" : "unknown");
            else
                fprintf(stderr, "sfi-ref run: %s: unknown option or missing value\n",
                        argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "sfi-ref run: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!model || max_new < 0 || (!!prompt + !!prompt_file + !!prompt_ids) != 1) {
        fprintf(stderr, "sfi-ref run: need --model, --max-new and exactly one of --prompt, "
                        "--prompt-file, --prompt-ids\n");
        usage(stderr);
        return 2;
    }
    if (sfi_params_validate(&o.params, &e)) {
        fprintf(stderr, "sfi-ref run: %s\n", e.msg);
        return 2;
    }
    if (sfi_recorder_opts_check(&ro, &e)) {
        fprintf(stderr, "sfi-ref run: %s\n", e.msg);
        return 2;
    }
    o.max_new = max_new;

    int rc = 1;
    sfi_qwen3 *m = NULL;
    sfi_tokenizer *tk = NULL;
    sfi_trigger_set ts;
    int have_ts = 0;
    int32_t *ids = NULL;
    int n_ids = 0;
    char *text = NULL;
    sfi_decode_result res;
    memset(&res, 0, sizeof res);
    sfi_recorder *rec = NULL;

    if (sfi_qwen3_load(model, &m, &e)) {
        fprintf(stderr, "sfi-ref run: %s\n", e.msg);
        goto out;
    }
    const sfi_model_config *cfg = sfi_qwen3_config(m);
    if (!tok_dir)
        tok_dir = model;
    int have_tok_files = file_exists(tok_dir, "vocab.json") && file_exists(tok_dir, "merges.txt");
    if (have_tok_files) {
        if (sfi_tokenizer_load(tok_dir, &tk, &e) || sfi_ref_tokenizer_fits(tk, tok_dir, cfg, &e)) {
            fprintf(stderr, "sfi-ref run: %s\n", e.msg);
            goto out;
        }
        if (tok_dir != model)
            ro.tokenizer_dir = tok_dir;
        if (sfi_trigger_set_build(sfi_tokenizer_vocab(tk), o.params.trigger_chars, &ts, &e)) {
            fprintf(stderr, "sfi-ref run: %s\n", e.msg);
            goto out;
        }
        have_ts = 1;
        o.is_trigger = ts.is_trigger;
        o.n_trigger_vocab = ts.n_vocab;
    } else if (prompt || prompt_file) {
        fprintf(stderr, "sfi-ref run: %s: no vocab.json + merges.txt to encode the prompt "
                        "text (give --tokenizer DIR or --prompt-ids)\n", tok_dir);
        goto out;
    } else if (o.mode == SFI_DECODE_SFI && !json) {
        fprintf(stderr, "sfi-ref run: note: no tokenizer files in %s: the trigger set is "
                        "empty, slow steps come from T_max only\n", tok_dir);
    }
    if (prompt_ids) {
        size_t len;
        char *s = read_prompt(prompt_ids, "a list of token ids", &len, &e);
        if (!s || sfi_ref_parse_ids(prompt_ids, s, len, &ids, &n_ids, &e)) {
            free(s);
            fprintf(stderr, "sfi-ref run: %s\n", e.msg);
            goto out;
        }
        free(s);
    } else {
        size_t len = 0;
        char *s = prompt ? strdup(prompt) : read_prompt(prompt_file, "a prompt file", &len, &e);
        if (!s) {
            fprintf(stderr, "sfi-ref run: %s\n", prompt ? "out of memory" : e.msg);
            goto out;
        }
        if (prompt)
            len = strlen(s);
        size_t n;
        sfi_status st = sfi_tokenizer_encode(tk, s, len, &ids, &n, &e);
        free(s);
        if (st) {
            fprintf(stderr, "sfi-ref run: %s: %s\n", prompt ? "--prompt" : prompt_file, e.msg);
            goto out;
        }
        if (n == 0) {
            fprintf(stderr, "sfi-ref run: the prompt encodes to no tokens\n");
            goto out;
        }
        if (n > INT_MAX / 2) {
            fprintf(stderr, "sfi-ref run: prompt too long\n");
            goto out;
        }
        n_ids = (int)n;
    }
    if (n_ids > cfg->max_position_embeddings) {
        fprintf(stderr, "sfi-ref run: prompt of %d tokens is longer than the model's "
                        "max_position_embeddings %d\n", n_ids, cfg->max_position_embeddings);
        goto out;
    }
    o.stop_tokens = stop ? cfg->eos_token_ids : NULL;
    o.n_stop_tokens = stop ? cfg->n_eos : 0;
    if (forced_ids) {
        size_t len;
        char *s = read_prompt(forced_ids, "a list of token ids", &len, &e);
        if (!s || sfi_ref_parse_ids(forced_ids, s, len, &forced, &n_forced, &e)) {
            free(s);
            fprintf(stderr, "sfi-ref run: --forced-ids: %s\n", e.msg);
            goto out;
        }
        free(s);
        if (n_forced < max_new - 1) {
            fprintf(stderr, "sfi-ref run: --forced-ids %s: %d ids for %d steps (need %d)\n",
                    forced_ids, n_forced, max_new, max_new - 1);
            goto out;
        }
        o.forced = forced;
        o.n_forced = n_forced;
    }
    /* the trace file is created (or refused: unwritable) before decoding */
    if (sfi_recorder_open(&ro, model, cfg, &o, &rec, &e)) {
        fprintf(stderr, "sfi-ref run: %s\n", e.msg);
        goto out;
    }
    sfi_decode_observer obs;
    sfi_recorder_observer(rec, &obs);
    if (sfi_decode_run(m, &o, ids, n_ids, rec ? &obs : NULL, &res, &e)) {
        fprintf(stderr, "sfi-ref run: %s: %s\n", model, e.msg);
        goto out;
    }
    if (rec) {
        sfi_recorder *r = rec;
        rec = NULL;
        if (sfi_recorder_finish(r, &e)) {
            fprintf(stderr, "sfi-ref run: %s\n", e.msg);
            goto out;
        }
    }
    size_t text_len = 0;
    if (tk && sfi_tokenizer_decode(tk, res.ids, (size_t)res.n_generated, &text, &text_len, &e)) {
        fprintf(stderr, "sfi-ref run: %s\n", e.msg);
        goto out;
    }
    if (json) {
        json_t *j = json_object(), *g = json_array(), *steps = json_array();
        json_object_set_new(j, "model", json_string(model));
        json_object_set_new(j, "mode", json_string(sfi_decode_mode_name(o.mode)));
        json_object_set_new(j, "backend", json_string(sfi_backend_name(o.backend)));
        json_object_set_new(j, "trigger", json_string(sfi_trigger_kind_name(o.trigger)));
        json_object_set_new(j, "prompt_tokens", json_integer(n_ids));
        for (int i = 0; i < res.n_generated; i++) {
            json_array_append_new(g, json_integer(res.ids[i]));
            json_t *s = json_object();
            json_object_set_new(s, "kind", json_string(sfi_step_kind_name(res.kinds[i])));
            json_object_set_new(s, "reason", json_string(sfi_step_reason_name(res.reasons[i])));
            json_array_append_new(steps, s);
        }
        json_object_set_new(j, "generated_ids", g);
        if (text)
            json_object_set_new(j, "text", json_stringn_nocheck(text, text_len));
        json_object_set_new(j, "steps", steps);
        json_object_set_new(j, "n_slow", json_integer(res.n_slow));
        json_object_set_new(j, "slow_fraction", json_real(res.slow_fraction));
        json_object_set_new(j, "digest", json_string(res.digest_hex));
        json_object_set_new(j, "prefill_seconds", json_real(res.prefill_seconds));
        json_object_set_new(j, "decode_seconds", json_real(res.decode_seconds));
        json_object_set_new(j, "prefill_cpu_seconds", json_real(res.prefill_cpu_seconds));
        json_object_set_new(j, "decode_cpu_seconds", json_real(res.decode_cpu_seconds));
        char *pj = sfi_params_to_json(&o.params);
        json_t *pv = pj ? json_loads(pj, 0, NULL) : NULL;
        free(pj);
        if (pv)
            json_object_set_new(j, "params", pv);
        char *s = json_dumps(j, JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
        json_decref(j);
        if (!s) {
            fprintf(stderr, "sfi-ref run: out of memory\n");
            goto out;
        }
        printf("%s\n", s);
        free(s);
    } else {
        if (text) {
            printf("text: ");
            fwrite(text, 1, text_len, stdout);
            printf("\n");
        }
        printf("ids:");
        for (int i = 0; i < res.n_generated; i++)
            printf(" %d", (int)res.ids[i]);
        printf("\nsteps:\n");
        for (int i = 0; i < res.n_generated; i++)
            printf("  %d %s %s %d\n", i, sfi_step_kind_name(res.kinds[i]),
                   sfi_step_reason_name(res.reasons[i]), (int)res.ids[i]);
        printf("slow_fraction: %.6f (%d of %d steps)\n", res.slow_fraction, res.n_slow,
               res.n_generated);
        printf("prompt_tokens: %d\nmode: %s\nbackend: %s\n", n_ids,
               sfi_decode_mode_name(o.mode), sfi_backend_name(o.backend));
        printf("seconds: prefill %.3f, decode %.3f (%.2f ms/token); CPU seconds: prefill "
               "%.3f, decode %.3f\n", res.prefill_seconds, res.decode_seconds,
               res.n_generated > 1 ? 1e3 * res.decode_seconds / (res.n_generated - 1) : 0.0,
               res.prefill_cpu_seconds, res.decode_cpu_seconds);
        printf("digest: %s\n", res.digest_hex);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "sfi-ref run: writing standard output failed\n");
        goto out;
    }
    rc = 0;
out:
    if (rec)
        sfi_recorder_abort(rec);
    free(text);
    free(ids);
    free(forced);
    sfi_decode_result_free(&res);
    if (have_ts)
        sfi_trigger_set_free(&ts);
    sfi_tokenizer_free(tk);
    sfi_qwen3_free(m);
    return rc;
}
