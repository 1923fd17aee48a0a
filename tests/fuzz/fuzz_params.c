/* libFuzzer harness: --param strings and parameter files.
 * The first byte picks the entry point: even -> sfi_params_set on the rest
 * as one string, odd -> sfi_params_load_file on the rest written to a file.
 * Invariants: whatever is accepted validates and serializes to JSON that
 * jansson reads back; whatever is refused leaves the parameters unchanged
 * and has a message. */
#include <config.h>

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sfi_params.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char tmp_path[256];

static void remove_tmp(void)
{
    if (tmp_path[0])
        unlink(tmp_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    sfi_params p, before;
    sfi_params_default(&p);
    before = p;
    sfi_error err;
    sfi_error_clear(&err);
    sfi_status st;
    if (!(data[0] & 1)) {
        char *s = malloc(size);
        if (!s)
            return 0;
        memcpy(s, data + 1, size - 1);
        s[size - 1] = '\0';
        st = sfi_params_set(&p, s, "--param", &err);
        free(s);
    } else {
        if (!tmp_path[0]) {
            const char *t = getenv("TMPDIR");
            snprintf(tmp_path, sizeof tmp_path, "%s/sfi-fuzz-params-%ld.conf",
                     t && *t ? t : "/tmp", (long)getpid());
            atexit(remove_tmp);
        }
        FILE *f = fopen(tmp_path, "wb");
        if (!f)
            return 0;
        fwrite(data + 1, 1, size - 1, f);
        fclose(f);
        st = sfi_params_load_file(&p, tmp_path, &err);
    }
    if (st != SFI_OK) {
        if (!err.msg[0] || memcmp(&p, &before, sizeof p))
            abort();
        return 0;
    }
    if (sfi_params_validate(&p, &err) != SFI_OK)
        abort();
    char *js = sfi_params_to_json(&p);
    if (!js)
        abort();
    json_error_t je;
    json_t *o = json_loads(js, 0, &je);
    if (!o || json_object_size(o) != sfi_params_key_count())
        abort();
    json_t *tc = json_object_get(o, "trigger_chars");
    if (!json_is_string(tc) || strcmp(json_string_value(tc), p.trigger_chars))
        abort();
    json_decref(o);
    free(js);
    return 0;
}
