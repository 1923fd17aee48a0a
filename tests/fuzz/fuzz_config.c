/* libFuzzer harness: config.json text -> sfi_model_config_parse, and the
 * same bytes through a pipe -> sfi_model_config_load (the reader of files
 * that are not regular: pipes, /dev/stdin, process substitution).
 * Beyond "no crash", it checks invariants: a config the parser accepts
 * passes validation, its derived sizes are consistent, and reading it from
 * a pipe gives the same verdict as parsing it from memory. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <jansson.h>

#include "sfi_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Loads data through a pipe holding all of it (no writer thread needed);
 * -1 when the pipe cannot hold that much. */
static int load_through_pipe(const uint8_t *data, size_t size, sfi_model_config *cfg,
                             sfi_error *err)
{
    int fds[2];
    if (pipe(fds))
        abort();
    int ok = size < 65536 || fcntl(fds[1], F_SETPIPE_SZ, (int)size) >= (int)size;
    size_t off = 0;
    while (ok && off < size) {
        ssize_t w = write(fds[1], data + off, size - off);
        if (w <= 0)
            abort();
        off += (size_t)w;
    }
    close(fds[1]);
    int st = -1;
    if (ok) {
        char path[64];
        snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
        st = (int)sfi_model_config_load(path, cfg, err);
        /* Every refusal names the file. */
        if (st != SFI_OK && strncmp(err->msg, path, strlen(path)))
            abort();
    }
    close(fds[0]);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sfi_model_config cfg;
    sfi_error err;
    sfi_error_clear(&err);
    sfi_status st = sfi_model_config_parse((const char *)data, size, "fuzz.json", &cfg, &err);
    if (st != SFI_OK && (!err.msg[0] || strncmp(err.msg, "fuzz.json", 9)))
        abort(); /* every refusal explains itself */
    sfi_model_config piped;
    sfi_error perr;
    sfi_error_clear(&perr);
    int pst = load_through_pipe(data, size, &piped, &perr);
    if (pst >= 0 && pst != (int)st)
        abort();
    if (pst == SFI_OK && piped.num_hidden_layers != cfg.num_hidden_layers)
        abort();
    if (st != SFI_OK)
        return 0;
    /* An accepted config holds nothing sfi would compute differently:
     * SiLU, full RoPE, full attention in every layer, every eos id in the
     * vocabulary and recorded. */
    json_t *o = json_loadb((const char *)data, size, 0, NULL);
    if (!o)
        abort();
    json_t *v = json_object_get(o, "hidden_act");
    if (json_is_string(v) && strcmp(json_string_value(v), "silu") &&
        strcmp(json_string_value(v), "swish"))
        abort();
    json_t *rp = json_object_get(o, "rope_parameters");
    json_t *prf[2] = {json_object_get(o, "partial_rotary_factor"),
                      json_is_object(rp) ? json_object_get(rp, "partial_rotary_factor") : NULL};
    for (int i = 0; i < 2; i++)
        if (json_is_number(prf[i]) && json_number_value(prf[i]) != 1.0)
            abort();
    json_t *lt = json_object_get(o, "layer_types");
    for (size_t i = 0; json_is_array(lt) && i < json_array_size(lt); i++)
        if (strcmp(json_string_value(json_array_get(lt, i)) ? json_string_value(json_array_get(lt, i)) : "",
                   "full_attention"))
            abort();
    json_t *eos = json_object_get(o, "eos_token_id");
    if (json_is_array(eos)) {
        if (json_array_size(eos) != (size_t)cfg.n_eos)
            abort();
        for (size_t i = 0; i < json_array_size(eos); i++)
            if (json_integer_value(json_array_get(eos, i)) != cfg.eos_token_ids[i] ||
                cfg.eos_token_ids[i] >= cfg.vocab_size)
                abort();
    }
    json_decref(o);
    if (cfg.head_dim % 2)
        abort();
    if (sfi_model_config_validate(&cfg, "fuzz.json", &err) != SFI_OK)
        abort();
    if (cfg.num_attention_heads % cfg.num_key_value_heads)
        abort();
    uint64_t kv = sfi_model_kv_bytes_per_token(&cfg, 2);
    uint64_t want = 4ull * (uint64_t)cfg.num_hidden_layers * (uint64_t)cfg.num_key_value_heads *
                    (uint64_t)cfg.head_dim;
    if (kv != want)
        abort();
    /* Validated sizes never saturate the parameter count. */
    if (sfi_model_param_count(&cfg) == UINT64_MAX)
        abort();
    int moe = 0;
    for (int l = 0; l < cfg.num_hidden_layers; l++)
        moe += sfi_model_layer_is_moe(&cfg, l);
    if (cfg.arch == SFI_ARCH_QWEN3 && moe)
        abort();
    return 0;
}
