/* libFuzzer harness: a .safetensors file -> sfi_st_open, then every
 * tensor's table entry and (when small) its data through sfi_st_to_f32.
 * Invariants: accepted tensors have nbytes == numel * dtype size and a
 * shape whose product is numel; refusals have messages. */
#include <config.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sfi_safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file("model.safetensors", data, size);
    sfi_safetensors *st = NULL;
    sfi_error err;
    sfi_error_clear(&err);
    if (sfi_st_open(path, &st, &err) != SFI_OK) {
        if (!err.msg[0])
            abort();
        return 0;
    }
    size_t n = sfi_st_count(st);
    for (size_t i = 0; i < n; i++) {
        const sfi_st_tensor *t = sfi_st_tensor_at(st, i);
        if (!t || !t->name || t->ndim < 0 || t->ndim > SFI_ST_MAX_DIMS)
            abort();
        uint64_t prod = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0)
                abort();
            prod *= (uint64_t)t->shape[d];
        }
        if (prod != t->numel || t->nbytes != t->numel * sfi_st_dtype_size(t->dtype))
            abort();
        if (sfi_st_find(st, t->name) == NULL)
            abort();
        /* The data must lie inside the file that was given. */
        if (t->nbytes > size)
            abort();
        if (t->numel <= (1u << 16)) {
            float *out = malloc((t->numel ? t->numel : 1) * sizeof *out);
            if (!out)
                abort();
            sfi_st_to_f32(t, out);
            free(out);
            float *f = NULL;
            if (sfi_st_load_f32(st, t->name, t->ndim, t->shape, -1, &f, &err) != SFI_OK)
                abort();
            free(f);
        }
    }
    sfi_st_close(st);
    return 0;
}
