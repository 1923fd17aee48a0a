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
