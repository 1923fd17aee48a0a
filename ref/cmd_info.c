/* sfi-ref info: the shape and sizes of a model preset or config.json
 * (layers, heads, KV bytes per token, parameters, weight bytes). */
#include <config.h>

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sfi_model.h"
#include "sfi_ref_cli.h"
#include "sfi_safetensors.h"

/* When the model is a checkpoint directory: its tensors' count and bytes
 * (as stored, per dtype). Returns 0 when there is no checkpoint there, -1
 * when there is one that cannot be read (message printed). */
static int checkpoint_sizes(const char *model, size_t *n, uint64_t bytes[3])
{
    char p1[4096], p2[4096];
    snprintf(p1, sizeof p1, "%s/model.safetensors", model);
    snprintf(p2, sizeof p2, "%s/model.safetensors.index.json", model);
    /* stat, not fopen: opening a FIFO there would wait for a writer. */
    struct stat sb;
    if (stat(p1, &sb) != 0 && stat(p2, &sb) != 0)
        return 0;
    sfi_safetensors *st;
    sfi_error e;
    if (sfi_st_open(model, &st, &e)) {
        fprintf(stderr, "sfi-ref info: %s\n", e.msg);
        return -1;
    }
    *n = sfi_st_count(st);
    bytes[0] = bytes[1] = bytes[2] = 0;
    for (size_t i = 0; i < *n; i++) {
        const sfi_st_tensor *t = sfi_st_tensor_at(st, i);
        bytes[t->dtype] += t->nbytes;
    }
    sfi_st_close(st);
    return 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sfi-ref info --model PRESET|DIR|FILE [--json]\n"
            "       sfi-ref info --list\n\n"
            "Print a Qwen3 model's architecture and sizes: layers, attention and KV heads,\n"
            "head_dim, parameter count, KV cache bytes per token (bf16) and weight bytes.\n\n"
            "  -m, --model NAME  a built-in preset (case-insensitive, e.g. Qwen3-0.6B), a\n"
            "                    config.json, or a directory holding one\n"
            "      --json        print one JSON object instead of text\n"
            "  -l, --list        print the built-in preset names, one a line\n"
            "  -h, --help        print this help\n\n"
            "Exit status: 0 ok, 1 bad or unreadable config, 2 usage error. See sfi-ref-info(1).\n");
}

/* Parameters a token activates: every MoE layer runs num_experts_per_tok of
 * its num_experts experts. Equal to the total for dense models. */
static uint64_t active_params(const sfi_model_config *c)
{
    uint64_t total = sfi_model_param_count(c);
    uint64_t idle = (uint64_t)(c->num_experts - c->num_experts_per_tok) * 3u *
                    (uint64_t)c->hidden_size * (uint64_t)c->moe_intermediate_size;
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (sfi_model_layer_is_moe(c, l))
            total -= idle;
    return total;
}

static int n_moe_layers(const sfi_model_config *c)
{
    int n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++)
        n += sfi_model_layer_is_moe(c, l);
    return n;
}

static int print_json(const sfi_model_config *c, const char *model_dir)
{
    uint64_t params = sfi_model_param_count(c);
    int moe = c->arch == SFI_ARCH_QWEN3_MOE;
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(c->name));
    json_object_set_new(o, "arch", json_string(moe ? "qwen3_moe" : "qwen3"));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(o, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(o, "layers", json_integer(c->num_hidden_layers));
    json_object_set_new(o, "attention_heads", json_integer(c->num_attention_heads));
    json_object_set_new(o, "kv_heads", json_integer(c->num_key_value_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    if (moe) {
        json_object_set_new(o, "experts", json_integer(c->num_experts));
        json_object_set_new(o, "experts_per_token", json_integer(c->num_experts_per_tok));
        json_object_set_new(o, "moe_intermediate_size", json_integer(c->moe_intermediate_size));
        json_object_set_new(o, "moe_layers", json_integer(n_moe_layers(c)));
    }
    /* json_int_t is 64-bit signed; every validated config's sizes fit. */
    json_object_set_new(o, "params", json_integer((json_int_t)params));
    json_object_set_new(o, "active_params", json_integer((json_int_t)active_params(c)));
    json_object_set_new(o, "weight_bytes_per_param", json_integer(c->weight_bytes));
    json_object_set_new(o, "weight_bytes",
                        json_integer((json_int_t)(params * (uint64_t)c->weight_bytes)));
    json_object_set_new(o, "kv_bytes_per_token_bf16",
                        json_integer((json_int_t)sfi_model_kv_bytes_per_token(c, 2)));
    size_t nt;
    uint64_t cb[3];
    int ck = model_dir ? checkpoint_sizes(model_dir, &nt, cb) : 0;
    if (ck < 0) {
        json_decref(o);
        return 1;
    }
    if (ck > 0) {
        json_t *by = json_object();
        for (int d = 0; d < 3; d++)
            if (cb[d])
                json_object_set_new(by, sfi_st_dtype_name((sfi_st_dtype)d),
                                    json_integer((json_int_t)cb[d]));
        json_object_set_new(o, "checkpoint_tensors", json_integer((json_int_t)nt));
        json_object_set_new(o, "checkpoint_bytes",
                            json_integer((json_int_t)(cb[0] + cb[1] + cb[2])));
        json_object_set_new(o, "checkpoint_bytes_by_dtype", by);
    }
    int rc = json_dumpf(o, stdout, JSON_PRESERVE_ORDER | JSON_INDENT(2));
    json_decref(o);
    if (rc)
        return 1;
    putchar('\n');
    return 0;
}

/* 1536 -> "1.5 kB": a reading aid next to the exact number, in the
 * decimal units of GPU memory capacities (kB = 1e3 bytes, GB = 1e9), so
 * that it reads against an "80 GB" GPU and sfi-sim's columns. */
static const char *human(uint64_t n, char *buf, size_t sz)
{
    static const char *units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1000 && u < 5) {
        v /= 1000;
        u++;
    }
    snprintf(buf, sz, u ? "%.1f %s" : "%.0f %s", v, units[u]);
    return buf;
}

static int print_text(const sfi_model_config *c, const char *model_dir)
{
    char b1[32];
    uint64_t params = sfi_model_param_count(c);
    int moe = c->arch == SFI_ARCH_QWEN3_MOE;
    uint64_t kv = sfi_model_kv_bytes_per_token(c, 2);
    printf("model                    %s\n", c->name);
    printf("arch                     %s\n", moe ? "qwen3_moe" : "qwen3");
    printf("vocab_size               %d\n", c->vocab_size);
    printf("hidden_size              %d\n", c->hidden_size);
    printf("intermediate_size        %d\n", c->intermediate_size);
    printf("layers                   %d\n", c->num_hidden_layers);
    printf("attention_heads          %d\n", c->num_attention_heads);
    printf("kv_heads                 %d\n", c->num_key_value_heads);
    printf("head_dim                 %d\n", c->head_dim);
    printf("max_position_embeddings  %d\n", c->max_position_embeddings);
    printf("rope_theta               %.17g\n", c->rope_theta);
    printf("tie_word_embeddings      %s\n", c->tie_word_embeddings ? "true" : "false");
    if (moe) {
        printf("experts                  %d\n", c->num_experts);
        printf("experts_per_token        %d\n", c->num_experts_per_tok);
        printf("moe_intermediate_size    %d\n", c->moe_intermediate_size);
        printf("moe_layers               %d\n", n_moe_layers(c));
    }
    printf("params                   %llu (%.3f B)\n", (unsigned long long)params,
           (double)params / 1e9);
    printf("active_params            %llu (%.3f B)\n", (unsigned long long)active_params(c),
           (double)active_params(c) / 1e9);
    printf("weight_bytes             %llu (%s, %d bytes per param)\n",
           (unsigned long long)(params * (uint64_t)c->weight_bytes),
           human(params * (uint64_t)c->weight_bytes, b1, sizeof b1), c->weight_bytes);
    printf("kv_bytes_per_token_bf16  %llu (%s)\n", (unsigned long long)kv,
           human(kv, b1, sizeof b1));
    size_t nt;
    uint64_t cb[3];
    int ck = model_dir ? checkpoint_sizes(model_dir, &nt, cb) : 0;
    if (ck < 0)
        return 1;
    if (ck > 0) {
        uint64_t tot = cb[0] + cb[1] + cb[2];
        printf("checkpoint_tensors       %zu\n", nt);
        printf("checkpoint_bytes         %llu (%s;", (unsigned long long)tot,
               human(tot, b1, sizeof b1));
        for (int d = 0; d < 3; d++)
            if (cb[d])
                printf(" %s %llu", sfi_st_dtype_name((sfi_st_dtype)d), (unsigned long long)cb[d]);
        printf(")\n");
    }
    return 0;
}

int sfi_ref_cmd_info(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"json", no_argument, NULL, 'j'},
        {"list", no_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *model = NULL;
    int json = 0, list = 0, c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:lh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'j': json = 1; break;
        case 'l': list = 1; break;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "sfi-ref info: %s option '%s'\n",
                    c == ':' ? "missing argument for" : "unknown", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "sfi-ref info: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (list) {
        for (size_t i = 0; i < sfi_model_preset_count(); i++)
            printf("%s\n", sfi_model_preset_name(i));
        return fflush(stdout) || ferror(stdout) ? 1 : 0;
    }
    if (!model) {
        fprintf(stderr, "sfi-ref info: --model is required\n");
        usage(stderr);
        return 2;
    }
    sfi_model_config cfg;
    sfi_error err;
    sfi_error_clear(&err);
    if (sfi_model_resolve(model, &cfg, &err)) {
        fprintf(stderr, "sfi-ref info: %s\n", err.msg);
        return 1;
    }
    /* a checkpoint directory: also its tensors' sizes */
    struct stat sb;
    const char *dir = stat(model, &sb) == 0 && S_ISDIR(sb.st_mode) ? model : NULL;
    int rc = json ? print_json(&cfg, dir) : print_text(&cfg, dir);
    if (fflush(stdout) || ferror(stdout)) {
        fprintf(stderr, "sfi-ref info: error writing standard output\n");
        return 1;
    }
    return rc;
}
