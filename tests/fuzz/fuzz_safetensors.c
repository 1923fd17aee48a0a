/* libFuzzer harness: a .safetensors file -> sfi_st_open, then every
 * tensor's table entry and (when small) its data through sfi_st_to_f32.
 * The first byte picks the layout: even -> the rest is one
 * model.safetensors; odd -> the rest is model.safetensors.index.json and
 * up to three shards model-0000N-of-00003.safetensors, separated by
 * "\n---8<---\n" (weight_map naming other files, "..", absent shards).
 * Invariants: accepted tensors have nbytes == numel * dtype size and a
 * shape whose product is numel; an accepted single file's tensors fill its
 * data block exactly (as the reference safetensors library requires: no
 * gap, no trailing bytes); load_f32 accepts a tensor exactly when all of it
 * is finite; refusals have messages. */
#include <config.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sfi_safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const char *shards[3] = {"model-00001-of-00003.safetensors",
                                    "model-00002-of-00003.safetensors",
                                    "model-00003-of-00003.safetensors"};
    char path[1024];
    if (!(data[0] & 1)) {
        fuzz_file("model.safetensors.index.json", NULL, 0);
        snprintf(path, sizeof path, "%s", fuzz_file("model.safetensors", data + 1, size - 1));
        for (int i = 0; i < 3; i++)
            fuzz_file(shards[i], NULL, 0);
    } else {
        const uint8_t *part[4];
        size_t len[4];
        size_t n = fuzz_split(data + 1, size - 1, "\n---8<---\n", part, len, 4);
        fuzz_file("model.safetensors", NULL, 0);
        snprintf(path, sizeof path, "%s",
                 fuzz_file("model.safetensors.index.json", part[0], len[0]));
        for (size_t i = 0; i < 3; i++)
            fuzz_file(shards[i], i + 1 < n ? part[i + 1] : NULL, i + 1 < n ? len[i + 1] : 0);
    }
    sfi_safetensors *st = NULL;
    sfi_error err;
    sfi_error_clear(&err);
    if (sfi_st_open(path, &st, &err) != SFI_OK) {
        if (!err.msg[0])
            abort();
        return 0;
    }
    size_t n = sfi_st_count(st);
    if (!(data[0] & 1)) {
        uint64_t hlen = 0, sum = 0;
        for (int i = 7; i >= 0; i--)
            hlen = hlen << 8 | data[1 + i];
        for (size_t i = 0; i < n; i++)
            sum += sfi_st_tensor_at(st, i)->nbytes;
        if (sum != size - 1 - 8 - hlen)
            abort();
    }
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
        /* The data must lie inside the files that were given. */
        if (t->nbytes > size)
            abort();
        if (t->numel <= (1u << 16)) {
            float *out = malloc((t->numel ? t->numel : 1) * sizeof *out);
            if (!out)
                abort();
            sfi_st_to_f32(t, out);
            int finite = 1;
            for (uint64_t k = 0; k < t->numel; k++)
                finite &= isfinite(out[k]) != 0;
            free(out);
            /* load_f32 accepts a tensor exactly when all of it is finite. */
            float *f = NULL;
            sfi_status ls = sfi_st_load_f32(st, t->name, t->ndim, t->shape, -1, &f, &err);
            if ((ls == SFI_OK) != finite || (ls != SFI_OK && !strstr(err.msg, "finite")))
                abort();
            free(f);
        }
    }
    sfi_st_close(st);
    return 0;
}
