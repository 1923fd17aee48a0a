/* libFuzzer harness: config.json text -> sfi_model_config_parse.
 * Beyond "no crash", it checks invariants: a config the parser accepts
 * passes validation, and its derived sizes are consistent. */
#include <config.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sfi_model_config cfg;
    sfi_error err;
    sfi_error_clear(&err);
    if (sfi_model_config_parse((const char *)data, size, "fuzz.json", &cfg, &err) != SFI_OK) {
        /* Every refusal explains itself. */
        if (!err.msg[0] || strncmp(err.msg, "fuzz.json", 9))
            abort();
        return 0;
    }
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
