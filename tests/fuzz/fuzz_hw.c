/* libFuzzer harness: sfi-sim's hardware files. The first byte picks the
 * parser (even: GPU file, sfi_gpu_parse; odd: calibration profile,
 * sfi_hw_profile_parse with measurements); the rest is the JSON text.
 * Invariants: accepted GPUs validate; accepted profiles have efficiencies
 * in (0,1] and contention in [0,1]; refusals have messages. */
#include <config.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_hw.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *json = (const char *)data + 1;
    size_t len = size - 1;
    sfi_error err;
    sfi_error_clear(&err);
    if (!(data[0] & 1)) {
        sfi_gpu g;
        if (sfi_gpu_parse(json, len, "fuzz.json", &g, &err) != SFI_OK) {
            if (!err.msg[0])
                abort();
            return 0;
        }
        if (sfi_gpu_validate(&g, "fuzz.json", &err) != SFI_OK)
            abort();
        if (memchr(g.name, '\0', sizeof g.name) == NULL)
            abort();
        return 0;
    }
    sfi_hw_profile p;
    sfi_hw_measurement *m = NULL;
    size_t nm = 0;
    if (sfi_hw_profile_parse(json, len, "fuzz.json", &p, &m, &nm, &err) != SFI_OK) {
        if (!err.msg[0])
            abort();
        free(m);
        return 0;
    }
    for (int c = 0; c < SFI_KC_COUNT; c++)
        if (!(p.efficiency[c] > 0 && p.efficiency[c] <= 1))
            abort();
    if (!(p.overlap_contention >= 0 && p.overlap_contention <= 1))
        abort();
    for (size_t i = 0; i < nm; i++)
        if (memchr(m[i].kernel, '\0', sizeof m[i].kernel) == NULL || !isfinite(m[i].time_s))
            abort();
    free(m);
    return 0;
}
