/* Model description from a Hugging Face config.json (Qwen3 dense and MoE),
 * its validation, the compiled-in presets and derived sizes. */
#include <config.h>

#include "sfi_model.h"
#include "sfi_io.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sfi_presets.h"

/* A Qwen3 config.json is under 2 KB; 16 MiB leaves room for any real one
 * while refusing a hostile multi-gigabyte file before allocating for it. */
#define CONFIG_FILE_MAX (16u << 20)

/* Size caps far above any published model, low enough that the products in
 * param_count and kv_bytes_per_token stay well inside 64 bits. */
#define CAP_VOCAB (1 << 24)
#define CAP_HIDDEN (1 << 20)
#define CAP_INTER (1 << 22)
#define CAP_HEADS (1 << 12)
#define CAP_HEAD_DIM (1 << 12)
#define CAP_EXPERTS (1 << 14)
#define CAP_POS (1 << 30)

static void set_name(sfi_model_config *cfg, const char *name)
{
    size_t n = strlen(name);
    if (n < sizeof cfg->name) {
        memcpy(cfg->name, name, n + 1);
    } else {
        /* Keep a path's tail, the part that tells configs apart. */
        size_t keep = sizeof cfg->name - 4;
        memcpy(cfg->name, "...", 3);
        memcpy(cfg->name + 3, name + n - keep, keep + 1);
    }
}

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "unknown";
}

/* Reads integer field key of o into *out. Absent or null: *out = def, or an
 * error when required. The value must be an integer in [lo, hi]. */
static sfi_status get_int(json_t *o, const char *key, int required, int def, long long lo,
                          long long hi, int *out, const char *origin, sfi_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return sfi_error_set(err, SFI_EFORMAT, "%s: %s: missing", origin, key);
        *out = def;
        return SFI_OK;
    }
    if (!json_is_integer(v))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: expected an integer, found %s", origin, key,
                             json_type_name(v));
    json_int_t n = json_integer_value(v);
    if (n < lo || n > hi)
        return sfi_error_set(err, SFI_ERANGE, "%s: %s: %lld is out of range [%lld, %lld]", origin,
                             key, (long long)n, lo, hi);
    *out = (int)n;
    return SFI_OK;
}

static sfi_status get_bool(json_t *o, const char *key, int def, int *out, const char *origin,
                           sfi_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return SFI_OK;
    }
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return SFI_OK;
    }
    if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1)) {
        *out = (int)json_integer_value(v);
        return SFI_OK;
    }
    return sfi_error_set(err, SFI_EFORMAT, "%s: %s: expected true or false, found %s", origin, key,
                         json_type_name(v));
}

static sfi_status get_positive_real(json_t *o, const char *key, double def, double *out,
                                    const char *origin, sfi_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return SFI_OK;
    }
    if (!json_is_number(v))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: expected a number, found %s", origin, key,
                             json_type_name(v));
    double d = json_number_value(v);
    if (!isfinite(d) || !(d > 0))
        return sfi_error_set(err, SFI_ERANGE, "%s: %s: %g must be a finite number > 0", origin, key,
                             d);
    *out = d;
    return SFI_OK;
}

/* bos/eos: an id, null, or (eos of chat models) a list of ids, every one
 * of which is checked (and, for eos, ends generation); *out gets the first
 * (-1: none), ids[0..*n) all of them, at most max. */
static sfi_status get_token_id(json_t *o, const char *key, int *out, int *ids, int *n, int max,
                               const char *origin, sfi_error *err)
{
    json_t *v = json_object_get(o, key);
    *out = -1;
    *n = 0;
    if (!v || json_is_null(v))
        return SFI_OK;
    int list = json_is_array(v);
    size_t count = list ? json_array_size(v) : 1;
    if (!list && !json_is_integer(v))
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: %s: expected an integer or a list of integers, found %s", origin,
                             key, json_type_name(v));
    if (count > (size_t)max)
        return sfi_error_set(err, SFI_ERANGE, "%s: %s: %zu ids, more than the %d sfi reads", origin,
                             key, count, max);
    for (size_t i = 0; i < count; i++) {
        char label[64];
        if (list)
            snprintf(label, sizeof label, "%s[%zu]", key, i);
        else
            snprintf(label, sizeof label, "%s", key);
        json_t *e = list ? json_array_get(v, i) : v;
        if (!json_is_integer(e))
            return sfi_error_set(err, SFI_EFORMAT, "%s: %s: expected an integer, found %s", origin,
                                 label, json_type_name(e));
        json_int_t id = json_integer_value(e);
        if (id < 0 || id >= CAP_VOCAB)
            return sfi_error_set(err, SFI_ERANGE, "%s: %s: %lld is not a token id", origin, label,
                                 (long long)id);
        ids[i] = (int)id;
    }
    *n = (int)count;
    if (count)
        *out = ids[0];
    return SFI_OK;
}

/* Fields of config.json that change the computation in ways sfi does not
 * implement: refused rather than silently ignored. */
static sfi_status check_unsupported(json_t *o, int n_layers, const char *origin, sfi_error *err)
{
    json_t *v = json_object_get(o, "hidden_act");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v))
            return sfi_error_set(err, SFI_EFORMAT, "%s: hidden_act: expected a string, found %s",
                                 origin, json_type_name(v));
        /* transformers' ACT2FN maps both names to SiLU. */
        const char *a = json_string_value(v);
        if (strcmp(a, "silu") && strcmp(a, "swish"))
            return sfi_error_set(err, SFI_EUNSUPPORTED,
                                 "%s: hidden_act: '%.64s' is not "
                                 "supported (silu only)",
                                 origin, a);
    }
    /* partial_rotary_factor: top level, or inside rope_parameters
     * (transformers >= 5). */
    json_t *rp = json_object_get(o, "rope_parameters");
    json_t *where[2] = {o, json_is_object(rp) ? rp : NULL};
    for (int i = 0; i < 2; i++) {
        v = where[i] ? json_object_get(where[i], "partial_rotary_factor") : NULL;
        if (!v || json_is_null(v))
            continue;
        if (!json_is_number(v))
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: %spartial_rotary_factor: expected a "
                                 "number, found %s",
                                 origin, i ? "rope_parameters." : "", json_type_name(v));
        if (json_number_value(v) != 1.0)
            return sfi_error_set(err, SFI_EUNSUPPORTED,
                                 "%s: %spartial_rotary_factor: %g is not "
                                 "supported (RoPE over the whole head_dim only)",
                                 origin, i ? "rope_parameters." : "", json_number_value(v));
    }
    v = json_object_get(o, "layer_types");
    if (v && !json_is_null(v)) {
        if (!json_is_array(v) || json_array_size(v) != (size_t)n_layers)
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: layer_types: expected a list of %d "
                                 "layer types",
                                 origin, n_layers);
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *e = json_array_get(v, i);
            if (!json_is_string(e))
                return sfi_error_set(err, SFI_EFORMAT,
                                     "%s: layer_types[%zu]: expected a "
                                     "string, found %s",
                                     origin, i, json_type_name(e));
            if (strcmp(json_string_value(e), "full_attention"))
                return sfi_error_set(err, SFI_EUNSUPPORTED,
                                     "%s: layer_types[%zu]: '%.64s' is "
                                     "not supported (full_attention only)",
                                     origin, i, json_string_value(e));
        }
    }
    return SFI_OK;
}

/* RoPE scaling (YaRN, linear, ...) changes every position's rotation; sfi
 * implements plain RoPE only, so anything else is refused rather than
 * silently computed wrong. */
static sfi_status check_rope_type(json_t *o, const char *key, const char *origin, sfi_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return SFI_OK;
    if (!json_is_object(v))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: expected an object, found %s", origin, key,
                             json_type_name(v));
    json_t *t = json_object_get(v, "rope_type");
    if (!t)
        t = json_object_get(v, "type");
    if (!t || json_is_null(t))
        return SFI_OK;
    if (!json_is_string(t))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s.rope_type: expected a string, found %s",
                             origin, key, json_type_name(t));
    if (strcmp(json_string_value(t), "default"))
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "%s: %s.rope_type: '%.64s' is not supported (plain RoPE only)", origin,
                             key, json_string_value(t));
    return SFI_OK;
}

static sfi_status parse_object(json_t *o, const char *origin, sfi_model_config *cfg, sfi_error *err)
{
    sfi_status st;
#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((st = (x)))                                                                            \
            return st;                                                                             \
    } while (0)

    /* Architecture: model_type, or the architectures list of older files. */
    const char *mt = NULL;
    json_t *v = json_object_get(o, "model_type");
    if (v && !json_is_string(v))
        return sfi_error_set(err, SFI_EFORMAT, "%s: model_type: expected a string, found %s",
                             origin, json_type_name(v));
    if (v)
        mt = json_string_value(v);
    if (!mt) {
        json_t *a = json_object_get(o, "architectures");
        json_t *a0 = json_is_array(a) ? json_array_get(a, 0) : NULL;
        if (json_is_string(a0) && !strcmp(json_string_value(a0), "Qwen3ForCausalLM"))
            mt = "qwen3";
        else if (json_is_string(a0) && !strcmp(json_string_value(a0), "Qwen3MoeForCausalLM"))
            mt = "qwen3_moe";
        else
            return sfi_error_set(err, SFI_EFORMAT, "%s: model_type: missing", origin);
    }
    if (!strcmp(mt, "qwen3"))
        cfg->arch = SFI_ARCH_QWEN3;
    else if (!strcmp(mt, "qwen3_moe"))
        cfg->arch = SFI_ARCH_QWEN3_MOE;
    else
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "%s: model_type: '%.64s' is not supported (qwen3 or qwen3_moe)",
                             origin, mt);
    int moe = cfg->arch == SFI_ARCH_QWEN3_MOE;

    TRY(get_int(o, "vocab_size", 1, 0, 1, CAP_VOCAB, &cfg->vocab_size, origin, err));
    TRY(get_int(o, "hidden_size", 1, 0, 1, CAP_HIDDEN, &cfg->hidden_size, origin, err));
    /* The MoE layers do not use intermediate_size (only mlp_only_layers
     * would); dense models cannot do without it. */
    TRY(get_int(o, "intermediate_size", !moe, 0, moe ? 0 : 1, CAP_INTER, &cfg->intermediate_size,
                origin, err));
    TRY(get_int(o, "num_hidden_layers", 1, 0, 1, SFI_MODEL_MAX_LAYERS, &cfg->num_hidden_layers,
                origin, err));
    TRY(get_int(o, "num_attention_heads", 1, 0, 1, CAP_HEADS, &cfg->num_attention_heads, origin,
                err));
    /* Hugging Face's defaults: no KV grouping, head_dim = hidden / heads. */
    TRY(get_int(o, "num_key_value_heads", 0, cfg->num_attention_heads, 1, CAP_HEADS,
                &cfg->num_key_value_heads, origin, err));
    json_t *hd = json_object_get(o, "head_dim");
    if (!hd || json_is_null(hd)) {
        if (cfg->hidden_size % cfg->num_attention_heads)
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: head_dim: missing, and hidden_size (%d) is not divisible "
                                 "by num_attention_heads (%d)",
                                 origin, cfg->hidden_size, cfg->num_attention_heads);
        cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
    } else {
        TRY(get_int(o, "head_dim", 1, 0, 1, CAP_HEAD_DIM, &cfg->head_dim, origin, err));
    }
    TRY(get_int(o, "max_position_embeddings", 0, 32768, 1, CAP_POS, &cfg->max_position_embeddings,
                origin, err));

    /* rope_theta: top level (transformers < 5) or inside rope_parameters. */
    TRY(check_rope_type(o, "rope_scaling", origin, err));
    TRY(check_rope_type(o, "rope_parameters", origin, err));
    json_t *rp = json_object_get(o, "rope_parameters");
    if (json_object_get(o, "rope_theta") || !json_is_object(rp))
        TRY(get_positive_real(o, "rope_theta", 10000.0, &cfg->rope_theta, origin, err));
    else
        TRY(get_positive_real(rp, "rope_theta", 10000.0, &cfg->rope_theta, origin, err));
    TRY(get_positive_real(o, "rms_norm_eps", 1e-6, &cfg->rms_norm_eps, origin, err));
    TRY(get_bool(o, "tie_word_embeddings", 0, &cfg->tie_word_embeddings, origin, err));
    TRY(get_bool(o, "attention_bias", 0, &cfg->attention_bias, origin, err));
    int sliding = 0;
    TRY(get_bool(o, "use_sliding_window", 0, &sliding, origin, err));
    if (sliding)
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "%s: use_sliding_window: sliding-window attention is not supported",
                             origin);
    int bos_ids[SFI_MODEL_MAX_EOS], n_bos;
    TRY(get_token_id(o, "bos_token_id", &cfg->bos_token_id, bos_ids, &n_bos, SFI_MODEL_MAX_EOS,
                     origin, err));
    for (int i = 1; i < n_bos; i++)
        if (bos_ids[i] >= cfg->vocab_size)
            return sfi_error_set(err, SFI_ERANGE,
                                 "%s: bos_token_id[%d]: %d is not below "
                                 "vocab_size (%d)",
                                 origin, i, bos_ids[i], cfg->vocab_size);
    TRY(get_token_id(o, "eos_token_id", &cfg->eos_token_id, cfg->eos_token_ids, &cfg->n_eos,
                     SFI_MODEL_MAX_EOS, origin, err));
    TRY(check_unsupported(o, cfg->num_hidden_layers, origin, err));

    /* torch_dtype (transformers < 4.56) or dtype; the Qwen3 releases are
     * bfloat16, which is also what an absent field means here. */
    const char *dkey = json_object_get(o, "torch_dtype") ? "torch_dtype" : "dtype";
    json_t *dt = json_object_get(o, dkey);
    cfg->weight_bytes = 2;
    if (dt && !json_is_null(dt)) {
        if (!json_is_string(dt))
            return sfi_error_set(err, SFI_EFORMAT, "%s: %s: expected a string, found %s", origin,
                                 dkey, json_type_name(dt));
        const char *d = json_string_value(dt);
        if (!strcmp(d, "bfloat16") || !strcmp(d, "float16"))
            cfg->weight_bytes = 2;
        else if (!strcmp(d, "float32"))
            cfg->weight_bytes = 4;
        else
            return sfi_error_set(err, SFI_EUNSUPPORTED,
                                 "%s: %s: '%.64s' is not supported "
                                 "(bfloat16, float16 or float32)",
                                 origin, dkey, d);
    }

    if (moe) {
        /* num_local_experts is the name other MoE configs use. */
        const char *ek = json_object_get(o, "num_experts") ? "num_experts" : "num_local_experts";
        TRY(get_int(o, ek, 1, 0, 1, CAP_EXPERTS, &cfg->num_experts, origin, err));
        TRY(get_int(o, "num_experts_per_tok", 1, 0, 1, CAP_EXPERTS, &cfg->num_experts_per_tok,
                    origin, err));
        TRY(get_int(o, "moe_intermediate_size", 1, 0, 1, CAP_INTER, &cfg->moe_intermediate_size,
                    origin, err));
        TRY(get_bool(o, "norm_topk_prob", 0, &cfg->norm_topk_prob, origin, err));
        TRY(get_int(o, "decoder_sparse_step", 0, 1, 1, SFI_MODEL_MAX_LAYERS,
                    &cfg->decoder_sparse_step, origin, err));
        json_t *ml = json_object_get(o, "mlp_only_layers");
        if (ml && !json_is_null(ml)) {
            if (!json_is_array(ml))
                return sfi_error_set(err, SFI_EFORMAT,
                                     "%s: mlp_only_layers: expected a list of layer indices, "
                                     "found %s",
                                     origin, json_type_name(ml));
            size_t n = json_array_size(ml);
            if (n > (size_t)cfg->num_hidden_layers)
                return sfi_error_set(err, SFI_ERANGE,
                                     "%s: mlp_only_layers: %zu entries for %d layers", origin, n,
                                     cfg->num_hidden_layers);
            for (size_t i = 0; i < n; i++) {
                json_t *e = json_array_get(ml, i);
                if (!json_is_integer(e))
                    return sfi_error_set(err, SFI_EFORMAT,
                                         "%s: mlp_only_layers[%zu]: expected an integer, found %s",
                                         origin, i, json_type_name(e));
                json_int_t l = json_integer_value(e);
                if (l < 0 || l >= cfg->num_hidden_layers)
                    return sfi_error_set(err, SFI_ERANGE,
                                         "%s: mlp_only_layers[%zu]: %lld is not a layer index "
                                         "(0..%d)",
                                         origin, i, (long long)l, cfg->num_hidden_layers - 1);
                cfg->mlp_only_layers[i] = (int)l;
            }
            cfg->n_mlp_only_layers = (int)n;
        }
    }
#undef TRY
    return SFI_OK;
}

sfi_status sfi_model_config_validate(const sfi_model_config *cfg, const char *origin,
                                     sfi_error *err)
{
    if (!cfg)
        return sfi_error_set(err, SFI_EINVAL, "sfi_model_config_validate: NULL config");
    if (!origin)
        origin = cfg->name;
#define POS(f, cap)                                                                                \
    if (cfg->f < 1 || cfg->f > (cap))                                                              \
        return sfi_error_set(err, SFI_ERANGE, "%s: " #f ": %d is out of range [1, %d]", origin,    \
                             cfg->f, (int)(cap));
    POS(vocab_size, CAP_VOCAB)
    POS(hidden_size, CAP_HIDDEN)
    POS(num_hidden_layers, SFI_MODEL_MAX_LAYERS)
    POS(num_attention_heads, CAP_HEADS)
    POS(num_key_value_heads, CAP_HEADS)
    POS(head_dim, CAP_HEAD_DIM)
    POS(max_position_embeddings, CAP_POS)
    if (cfg->arch != SFI_ARCH_QWEN3 && cfg->arch != SFI_ARCH_QWEN3_MOE)
        return sfi_error_set(err, SFI_EUNSUPPORTED, "%s: model_type: unknown architecture %d",
                             origin, (int)cfg->arch);
    int moe = cfg->arch == SFI_ARCH_QWEN3_MOE;
    if (cfg->intermediate_size < (moe ? 0 : 1) || cfg->intermediate_size > CAP_INTER)
        return sfi_error_set(err, SFI_ERANGE, "%s: intermediate_size: %d is out of range [%d, %d]",
                             origin, cfg->intermediate_size, moe ? 0 : 1, CAP_INTER);
    if (cfg->num_attention_heads % cfg->num_key_value_heads)
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: num_attention_heads: %d is not divisible by "
                             "num_key_value_heads (%d)",
                             origin, cfg->num_attention_heads, cfg->num_key_value_heads);
    if (!isfinite(cfg->rope_theta) || !(cfg->rope_theta > 0))
        return sfi_error_set(err, SFI_ERANGE, "%s: rope_theta: must be a finite number > 0",
                             origin);
    if (!isfinite(cfg->rms_norm_eps) || !(cfg->rms_norm_eps > 0))
        return sfi_error_set(err, SFI_ERANGE, "%s: rms_norm_eps: must be a finite number > 0",
                             origin);
    if (cfg->weight_bytes != 2 && cfg->weight_bytes != 4)
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "%s: torch_dtype: %d bytes per weight is not "
                             "supported (2 or 4)",
                             origin, cfg->weight_bytes);
    if (cfg->bos_token_id >= cfg->vocab_size || cfg->bos_token_id < -1)
        return sfi_error_set(err, SFI_ERANGE, "%s: bos_token_id: %d is not below vocab_size (%d)",
                             origin, cfg->bos_token_id, cfg->vocab_size);
    if (cfg->eos_token_id >= cfg->vocab_size || cfg->eos_token_id < -1)
        return sfi_error_set(err, SFI_ERANGE, "%s: eos_token_id: %d is not below vocab_size (%d)",
                             origin, cfg->eos_token_id, cfg->vocab_size);
    if (cfg->n_eos < 0 || cfg->n_eos > SFI_MODEL_MAX_EOS ||
        (cfg->n_eos > 0) != (cfg->eos_token_id >= 0) ||
        (cfg->n_eos > 0 && cfg->eos_token_ids[0] != cfg->eos_token_id))
        return sfi_error_set(err, SFI_EINVAL,
                             "%s: eos_token_ids: %d entries disagree with "
                             "eos_token_id %d",
                             origin, cfg->n_eos, cfg->eos_token_id);
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_token_ids[i] < 0 || cfg->eos_token_ids[i] >= cfg->vocab_size)
            return sfi_error_set(err, SFI_ERANGE,
                                 "%s: eos_token_id[%d]: %d is not below "
                                 "vocab_size (%d)",
                                 origin, i, cfg->eos_token_ids[i], cfg->vocab_size);
    /* RoPE rotates pairs of dimensions: every Qwen3 model has an even
     * head_dim, and sfi-ref, sfi-gpu and sfi-sim all assume one. */
    if (cfg->head_dim % 2)
        return sfi_error_set(err, SFI_EUNSUPPORTED, "%s: head_dim: %d is odd (RoPE needs pairs)",
                             origin, cfg->head_dim);
    if (!moe) {
        if (cfg->num_experts || cfg->num_experts_per_tok || cfg->moe_intermediate_size ||
            cfg->n_mlp_only_layers)
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: num_experts: a dense qwen3 model has no "
                                 "experts",
                                 origin);
        return SFI_OK;
    }
    POS(num_experts, CAP_EXPERTS)
    POS(num_experts_per_tok, cfg->num_experts)
    POS(moe_intermediate_size, CAP_INTER)
    POS(decoder_sparse_step, cfg->num_hidden_layers)
#undef POS
    if (cfg->n_mlp_only_layers < 0 || cfg->n_mlp_only_layers > cfg->num_hidden_layers)
        return sfi_error_set(err, SFI_ERANGE, "%s: mlp_only_layers: %d entries for %d layers",
                             origin, cfg->n_mlp_only_layers, cfg->num_hidden_layers);
    int any_dense = 0;
    for (int i = 0; i < cfg->n_mlp_only_layers; i++) {
        int l = cfg->mlp_only_layers[i];
        if (l < 0 || l >= cfg->num_hidden_layers)
            return sfi_error_set(err, SFI_ERANGE,
                                 "%s: mlp_only_layers[%d]: %d is not a layer index (0..%d)", origin,
                                 i, l, cfg->num_hidden_layers - 1);
        for (int j = 0; j < i; j++)
            if (cfg->mlp_only_layers[j] == l)
                return sfi_error_set(err, SFI_EFORMAT,
                                     "%s: mlp_only_layers[%d]: layer %d is listed twice", origin, i,
                                     l);
    }
    for (int l = 0; l < cfg->num_hidden_layers; l++)
        any_dense |= !sfi_model_layer_is_moe(cfg, l);
    if (any_dense && cfg->intermediate_size < 1)
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: intermediate_size: missing, but some layers use the dense MLP "
                             "(mlp_only_layers / decoder_sparse_step)",
                             origin);
    return SFI_OK;
}

sfi_status sfi_model_config_parse(const char *json, size_t len, const char *origin,
                                  sfi_model_config *cfg, sfi_error *err)
{
    if (!json || !cfg)
        return sfi_error_set(err, SFI_EINVAL, "sfi_model_config_parse: NULL argument");
    if (!origin)
        origin = "config.json";
    if (len > CONFIG_FILE_MAX)
        return sfi_error_set(err, SFI_ERANGE,
                             "%s: %zu bytes is too large for a config.json "
                             "(limit %u)",
                             origin, len, CONFIG_FILE_MAX);
    json_error_t je;
    /* Duplicate keys would make "which value counts" depend on the parser. */
    json_t *o = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return sfi_error_set(err, SFI_EFORMAT, "%s:%d:%d: invalid JSON: %s", origin, je.line,
                             je.column, je.text);
    sfi_model_config tmp;
    memset(&tmp, 0, sizeof tmp);
    set_name(&tmp, origin);
    sfi_status st;
    if (!json_is_object(o))
        st = sfi_error_set(err, SFI_EFORMAT, "%s: expected a JSON object, found %s", origin,
                           json_type_name(o));
    else
        st = parse_object(o, origin, &tmp, err);
    json_decref(o);
    if (!st)
        st = sfi_model_config_validate(&tmp, origin, err);
    if (!st)
        *cfg = tmp;
    return st;
}

sfi_status sfi_model_config_load(const char *path, sfi_model_config *cfg, sfi_error *err)
{
    if (!path || !cfg)
        return sfi_error_set(err, SFI_EINVAL, "sfi_model_config_load: NULL argument");
    struct stat sb;
    if (stat(path, &sb))
        return sfi_error_set(err, errno == ENOENT ? SFI_ENOTFOUND : SFI_EIO, "%s: %s", path,
                             strerror(errno));
    char *file = NULL;
    if (S_ISDIR(sb.st_mode)) {
        size_t n = strlen(path);
        file = malloc(n + sizeof "/config.json");
        if (!file)
            return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
        memcpy(file, path, n);
        strcpy(file + n, n && path[n - 1] == '/' ? "config.json" : "/config.json");
        path = file;
    }
    char *buf = NULL;
    size_t len = 0;
    sfi_status st = sfi_io_read(path, CONFIG_FILE_MAX, "a config.json", &buf, &len, err);
    if (st)
        goto out;
    if (len == 0) {
        st = sfi_error_set(err, SFI_EFORMAT, "%s: empty file", path);
        goto out;
    }
    st = sfi_model_config_parse(buf, len, path, cfg, err);
out:
    free(buf);
    free(file);
    return st;
}

size_t sfi_model_preset_count(void)
{
    return sfi_presets_count;
}

const char *sfi_model_preset_name(size_t i)
{
    return i < sfi_presets_count ? sfi_presets[i].name : NULL;
}

static void preset_list(char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = '\0';
    for (unsigned i = 0; i < sfi_presets_count && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? ", " : "", sfi_presets[i].name);
}

sfi_status sfi_model_preset(const char *name, sfi_model_config *cfg, sfi_error *err)
{
    if (!name || !cfg)
        return sfi_error_set(err, SFI_EINVAL, "sfi_model_preset: NULL argument");
    for (unsigned i = 0; i < sfi_presets_count; i++) {
        if (strcasecmp(name, sfi_presets[i].name))
            continue;
        char origin[SFI_MODEL_NAME_MAX + 16];
        snprintf(origin, sizeof origin, "preset %s", sfi_presets[i].name);
        sfi_status st = sfi_model_config_parse(sfi_presets[i].json, strlen(sfi_presets[i].json),
                                               origin, cfg, err);
        if (!st)
            set_name(cfg, sfi_presets[i].name);
        return st;
    }
    char list[512];
    preset_list(list, sizeof list);
    return sfi_error_set(err, SFI_ENOTFOUND, "unknown model preset '%.64s' (presets: %s)", name,
                         list);
}

sfi_status sfi_model_resolve(const char *name_or_path, sfi_model_config *cfg, sfi_error *err)
{
    if (!name_or_path || !cfg)
        return sfi_error_set(err, SFI_EINVAL, "sfi_model_resolve: NULL argument");
    /* An existing file or directory wins: a local checkpoint directory that
     * happens to be named like a preset carries its own config. */
    struct stat sb;
    if (strchr(name_or_path, '/') || stat(name_or_path, &sb) == 0)
        return sfi_model_config_load(name_or_path, cfg, err);
    for (unsigned i = 0; i < sfi_presets_count; i++)
        if (!strcasecmp(name_or_path, sfi_presets[i].name))
            return sfi_model_preset(name_or_path, cfg, err);
    char list[512];
    preset_list(list, sizeof list);
    return sfi_error_set(err, SFI_ENOTFOUND,
                         "%.200s: neither a model preset (%s) nor a config.json or a directory "
                         "holding one",
                         name_or_path, list);
}

int sfi_model_layer_is_moe(const sfi_model_config *cfg, int layer)
{
    if (!cfg || cfg->arch != SFI_ARCH_QWEN3_MOE || cfg->num_experts <= 0 || layer < 0 ||
        layer >= cfg->num_hidden_layers)
        return 0;
    /* Hugging Face's Qwen3MoeDecoderLayer rule. */
    for (int i = 0; i < cfg->n_mlp_only_layers && i < SFI_MODEL_MAX_LAYERS; i++)
        if (cfg->mlp_only_layers[i] == layer)
            return 0;
    int step = cfg->decoder_sparse_step > 0 ? cfg->decoder_sparse_step : 1;
    return (layer + 1) % step == 0;
}

/* Saturating arithmetic: a hostile (unvalidated) config gives UINT64_MAX,
 * never a wrapped small number. */
static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t nonneg(int v)
{
    return v > 0 ? (uint64_t)v : 0;
}

uint64_t sfi_model_kv_bytes_per_token(const sfi_model_config *cfg, int bytes_per_elem)
{
    if (!cfg)
        return 0;
    /* K and V, for every KV head of every layer. */
    uint64_t per_layer = mul_sat(2 * nonneg(cfg->num_key_value_heads), nonneg(cfg->head_dim));
    return mul_sat(mul_sat(per_layer, nonneg(cfg->num_hidden_layers)), nonneg(bytes_per_elem));
}

uint64_t sfi_model_param_count(const sfi_model_config *cfg)
{
    if (!cfg)
        return 0;
    uint64_t h = nonneg(cfg->hidden_size), hd = nonneg(cfg->head_dim);
    uint64_t q = mul_sat(nonneg(cfg->num_attention_heads), hd);
    uint64_t kv = mul_sat(nonneg(cfg->num_key_value_heads), hd);
    uint64_t emb = mul_sat(nonneg(cfg->vocab_size), h);
    uint64_t total = cfg->tie_word_embeddings ? emb : add_sat(emb, emb);
    total = add_sat(total, h); /* final norm */
    /* q, k, v, o projections; biases when attention_bias; q/k RMSNorms of
     * head_dim; the two RMSNorms of the block. */
    uint64_t attn = add_sat(mul_sat(mul_sat(2, h), q), mul_sat(mul_sat(2, h), kv));
    if (cfg->attention_bias)
        attn = add_sat(attn, add_sat(add_sat(q, mul_sat(2, kv)), h));
    attn = add_sat(attn, add_sat(mul_sat(2, hd), mul_sat(2, h)));
    uint64_t dense = mul_sat(mul_sat(3, h), nonneg(cfg->intermediate_size));
    /* Router (no bias) plus gate/up/down of every expert. */
    uint64_t moe = add_sat(mul_sat(h, nonneg(cfg->num_experts)),
                           mul_sat(nonneg(cfg->num_experts),
                                   mul_sat(mul_sat(3, h), nonneg(cfg->moe_intermediate_size))));
    int layers = cfg->num_hidden_layers > SFI_MODEL_MAX_LAYERS ? SFI_MODEL_MAX_LAYERS
                                                               : cfg->num_hidden_layers;
    for (int l = 0; l < layers; l++)
        total = add_sat(total, add_sat(attn, sfi_model_layer_is_moe(cfg, l) ? moe : dense));
    return total;
}
