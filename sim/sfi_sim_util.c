/* Small helpers shared by sfi-sim's commands. */
#include <config.h>

#include "sfi_sim_util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int sfi_sim_parse_size(const char *s, int kilo, int64_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || v < 0)
        return -1;
    long long mul = 1;
    if (kilo && (*end == 'K' || *end == 'k'))
        mul = 1024, end++;
    else if (kilo && (*end == 'M' || *end == 'm'))
        mul = 1024 * 1024, end++;
    if (*end || v > INT64_MAX / mul)
        return -1;
    *out = (int64_t)(v * mul);
    return 0;
}

int sfi_sim_split_list(const char *arg, char ***out)
{
    int n = 1;
    for (const char *p = arg; *p; p++)
        n += *p == ',';
    char **v = calloc((size_t)n, sizeof *v);
    if (!v)
        return -1;
    int k = 0;
    const char *p = arg;
    for (;;) {
        size_t len = strcspn(p, ",");
        v[k] = malloc(len + 1);
        if (!v[k]) {
            for (int i = 0; i < k; i++)
                free(v[i]);
            free(v);
            return -1;
        }
        memcpy(v[k], p, len);
        v[k][len] = 0;
        k++;
        if (!p[len])
            break;
        p += len + 1;
    }
    *out = v;
    return k;
}

void sfi_sim_free_list(char **v, int n)
{
    for (int i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* Policy lists are split on commas that start a new policy name, so
 * "quest:page=32,k=1024,sfi" gives two policies. */
int sfi_sim_split_policies(const char *arg, char ***out)
{
    char **parts;
    int n = sfi_sim_split_list(arg, &parts);
    if (n < 0)
        return -1;
    char **v = calloc((size_t)n, sizeof *v);
    int k = 0;
    for (int i = 0; i < n && v; i++) {
        if (k > 0 && strchr(parts[i], '=') && !strchr(parts[i], ':')) {
            size_t a = strlen(v[k - 1]), b = strlen(parts[i]);
            char *j = realloc(v[k - 1], a + b + 2);
            if (!j)
                continue;
            j[a] = ',';
            memcpy(j + a + 1, parts[i], b + 1);
            v[k - 1] = j;
        } else {
            v[k++] = parts[i];
            parts[i] = NULL;
        }
    }
    sfi_sim_free_list(parts, n);
    if (!v)
        return -1;
    *out = v;
    return k;
}

void sfi_sim_csv_str(FILE *f, const char *s)
{
    int q = strpbrk(s, ",\"\n") != NULL;
    if (!q) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}


/* SFI parameters a policy spec may set for itself: the ones the cost
 * model and the replay read (the Selector's own knobs do not change what a
 * step costs). */
static int is_policy_sfi_key(const char *key)
{
    return !strcmp(key, "K") || !strcmp(key, "n_sink") || !strcmp(key, "n_recent") ||
           !strcmp(key, "T_max");
}

static int is_sfi_key(const char *key)
{
    for (size_t i = 0; i < sfi_params_key_count(); i++)
        if (!strcmp(key, sfi_params_key_name(i)))
            return 1;
    return 0;
}

sfi_status sfi_sim_policy_spec_parse(const char *spec, const sfi_params *global,
                                     sfi_sim_policy *pol, sfi_params *prm, sfi_error *err)
{
    *prm = *global;
    const char *colon = strchr(spec, ':');
    if (!colon)
        return sfi_sim_policy_parse(spec, pol, err);
    size_t nlen = (size_t)(colon - spec), len = strlen(spec);
    char *peer = malloc(len + 1), *items = malloc(len + 1);
    if (!peer || !items) {
        free(peer);
        free(items);
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    }
    memcpy(peer, spec, nlen);
    peer[nlen] = 0;
    size_t plen = nlen;
    int n_peer = 0, has_tmax = 0;
    strcpy(items, colon + 1);
    sfi_status st = SFI_OK;
    for (char *it = items; it && !st;) {
        char *comma = strchr(it, ',');
        if (comma)
            *comma = 0;
        size_t klen = strcspn(it, "=");
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)(klen < sizeof key ? klen : sizeof key - 1), it);
        if (it[klen] == '=' && is_policy_sfi_key(key)) {
            st = sfi_params_set(prm, it, spec, err);
            has_tmax |= !strcmp(key, "T_max");
        } else if (it[klen] == '=' && is_sfi_key(key)) {
            st = sfi_error_set(err, SFI_EINVAL,
                               "policy '%s': %s does not change what a step costs; a policy may "
                               "set K, n_sink, n_recent and T_max (the others: --param)",
                               spec, key);
        } else {
            peer[plen++] = n_peer++ ? ',' : ':';
            strcpy(peer + plen, it);
            plen += strlen(it);
        }
        it = comma ? comma + 1 : NULL;
    }
    if (!st)
        st = sfi_sim_policy_parse(peer, pol, err);
    if (!st && has_tmax && pol->kind != SFI_SIM_SFI && pol->kind != SFI_SIM_TMAX)
        st = sfi_error_set(err, SFI_EINVAL, "policy '%s': T_max applies to sfi and tmax only",
                           spec);
    if (!st && (st = sfi_params_validate(prm, err)) != SFI_OK)
        sfi_error_prefix(err, "policy '%s'", spec);
    free(peer);
    free(items);
    return st;
}

