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
