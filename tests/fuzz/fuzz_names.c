/* libFuzzer harness: the small command-line value parsers (--policy,
 * --peers, --mode, --backend, --trigger, --level). The first byte picks
 * the parser; the rest, NUL-terminated, is the value. Invariants: a
 * refusal has a message; an accepted name prints as a name that parses to
 * the same value. */
#include <config.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_cost.h"
#include "sfi_decode.h"
#include "sfi_policies.h"
#include "sfi_qwen3.h"
#include "sfi_state.h"
#include "sfi_trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(sfi_status st, const sfi_error *err)
{
    if (st != SFI_OK && !err->msg[0])
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char *s = malloc(size);
    if (!s)
        return 0;
    memcpy(s, data + 1, size - 1);
    s[size - 1] = '\0';
    sfi_error err;
    sfi_error_clear(&err);
    sfi_status st;
    switch (data[0] % 7) {
    case 0: {
        sfi_policy_kind k, k2;
        sfi_policy_config c, c2;
        sfi_policy_config_default(&c);
        st = sfi_policy_spec_parse(s, &k, &c, &err);
        check(st, &err);
        if (!st) {
            sfi_policy_config_default(&c2);
            if (sfi_policy_spec_parse(sfi_policy_kind_name(k), &k2, &c2, &err) || k2 != k)
                abort();
        }
        sfi_budget b;
        check(sfi_budget_parse(s, &b, &err), &err);
        break;
    }
    case 1: {
        unsigned mask = 0;
        check(sfi_policy_parse_list(s, &mask, &err), &err);
        break;
    }
    case 2: {
        sfi_policy_kind k;
        st = sfi_policy_kind_parse(s, &k, &err);
        check(st, &err);
        sfi_policy_kind k2;
        if (!st && (sfi_policy_kind_parse(sfi_policy_kind_name(k), &k2, &err) || k2 != k))
            abort();
        break;
    }
    case 3: {
        sfi_decode_mode m, m2;
        st = sfi_decode_mode_parse(s, &m, &err);
        check(st, &err);
        if (!st && (sfi_decode_mode_parse(sfi_decode_mode_name(m), &m2, &err) || m2 != m))
            abort();
        break;
    }
    case 4: {
        sfi_backend b;
        check(sfi_backend_parse(s, &b, &err), &err);
        break;
    }
    case 5: {
        sfi_trigger_kind k, k2;
        st = sfi_trigger_policy_parse(s, &k, &err);
        check(st, &err);
        if (!st && (sfi_trigger_policy_parse(sfi_trigger_kind_name(k), &k2, &err) || k2 != k))
            abort();
        break;
    }
    default: {
        sfi_trace_level l, l2;
        st = sfi_trace_level_parse(s, &l, &err);
        check(st, &err);
        if (!st && (sfi_trace_level_parse(sfi_trace_level_name(l), &l2, &err) || l2 != l))
            abort();
        break;
    }
    }
    free(s);
    return 0;
}
