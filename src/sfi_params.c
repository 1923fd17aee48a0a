/* SFI parameters: sfi(7)'s knobs, their defaults, ranges and parsers.
 *
 * Every key lives in one table (name, type, offset, range, help) so that
 * set, validate, to_json and --help can never disagree about a key. */
#include <config.h>

#include "sfi_params.h"
#include "sfi_vocab.h" /* sfi_utf8_decode */

#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

typedef enum { KEY_INT, KEY_FLOAT, KEY_CHARS } key_type;

typedef struct {
    const char *name;
    key_type type;
    size_t offset;
    /* Allowed range; *_open makes that end exclusive. Ints use lo/hi as
     * inclusive integer bounds. */
    double lo, hi;
    int lo_open, hi_open;
    const char *help;
} key_def;

/* Upper bounds on counts: far above any real context (2^24 positions), low
 * enough that sums such as n_sink + n_recent + K cannot overflow an int. */
#define POS_MAX 16777216.0
/* Window queries per slow step: a prefill tail, never a whole context. */
#define WIN_MAX 65536.0

#define OFF(f) offsetof(sfi_params, f)

static const key_def keys[] = {
    {"n_sink", KEY_INT, OFF(n_sink), 0, POS_MAX, 0, 0,
     "sink positions 0..n_sink-1, always attended (integer >= 0, default 4)"},
    {"n_recent", KEY_INT, OFF(n_recent), 1, POS_MAX, 0, 0,
     "recent window, current token included (integer >= 1, default 256)"},
    {"K", KEY_INT, OFF(K), 1, POS_MAX, 0, 0,
     "positions the Selector keeps per KV head (integer >= 1, default 2048)"},
    {"T_max", KEY_INT, OFF(T_max), 1, POS_MAX, 0, 0,
     "most steps between two slow steps (integer >= 1, default 64)"},
    {"W_decode", KEY_INT, OFF(W_decode), 1, WIN_MAX, 0, 0,
     "window queries at a decode slow step (integer >= 1, default 1)"},
    {"W_prefill", KEY_INT, OFF(W_prefill), 1, WIN_MAX, 0, 0,
     "last prompt queries used by the Selector at prefill (integer >= 1, default 16)"},
    {"alpha", KEY_FLOAT, OFF(alpha), 0, 1, 1, 0,
     "power-mean exponent of evidence aggregation, in (0,1] (default 0.5)"},
    {"gamma", KEY_FLOAT, OFF(gamma), 0, HUGE_VAL, 0, 1,
     "key-norm prior exponent, >= 0 (default 1.0)"},
    {"beta", KEY_FLOAT, OFF(beta), 0, HUGE_VAL, 0, 1, "position prior decay, >= 0 (default 1.0)"},
    {"p", KEY_FLOAT, OFF(p), 0, HUGE_VAL, 1, 1, "position prior power, > 0 (default 2)"},
    {"eta", KEY_FLOAT, OFF(eta), 0, HUGE_VAL, 0, 1,
     "position prior tail exponent, >= 0 (default 0.5)"},
    {"lambda_clip", KEY_FLOAT, OFF(lambda_clip), 0, 1, 0, 0,
     "upper clip of the fusion weight lambda*, in [0,1] (default 0.02)"},
    {"nms_radius", KEY_INT, OFF(nms_radius), 0, POS_MAX, 0, 0,
     "Soft-NMS neighbourhood radius in positions (integer >= 0, default 2)"},
    {"alpha_soft", KEY_FLOAT, OFF(alpha_soft), 0, HUGE_VAL, 0, 1,
     "Soft-NMS strength, >= 0 (default 0.5)"},
    {"T", KEY_FLOAT, OFF(T), 0, HUGE_VAL, 1, 1,
     "cross-head softmax temperature, > 0 (default 1.0)"},
    {"alpha_cross", KEY_FLOAT, OFF(alpha_cross), 0, HUGE_VAL, 0, 1,
     "cross-head exclusivity strength, >= 0 (default 0.35)"},
    {"eps", KEY_FLOAT, OFF(eps), 0, 1, 1, 1, "numerical floor, in (0,1) (default 1e-8)"},
    {"refresh_delay", KEY_INT, OFF(refresh_delay), 0, 4, 0, 0,
     "deferred refresh: a decode slow step's new selected sets take effect this many steps "
     "later, a slow step in between drops them (0 = at once, off; else 2..4; default 0)"},
    {"trigger_chars", KEY_CHARS, OFF(trigger_chars), 0, 0, 0, 0,
     "characters (UTF-8, at most 31 bytes) that end a sentence or segment; escapes \\n \\t \\r "
     "\\\\ (default \".?!;\\n\")"},
};
#define N_KEYS (sizeof keys / sizeof keys[0])

/* A parameter file is a handful of lines; anything bigger is not one. */
#define PARAM_FILE_MAX (1u << 20)
#define PARAM_LINE_MAX 4096

void sfi_params_default(sfi_params *p)
{
    memset(p, 0, sizeof *p);
    p->n_sink = 4;
    p->n_recent = 256;
    p->K = 2048;
    p->T_max = 64;
    p->W_decode = 1;
    p->W_prefill = 16;
    p->alpha = 0.5f;
    p->gamma = 1.0f;
    p->beta = 1.0f;
    p->p = 2.0f;
    p->eta = 0.5f;
    p->lambda_clip = 0.02f;
    p->nms_radius = 2;
    p->alpha_soft = 0.5f;
    p->T = 1.0f;
    p->alpha_cross = 0.35f;
    p->eps = 1e-8f;
    strcpy(p->trigger_chars, ".?!;\n");
}

size_t sfi_params_key_count(void)
{
    return N_KEYS;
}

const char *sfi_params_key_name(size_t i)
{
    return i < N_KEYS ? keys[i].name : NULL;
}

const char *sfi_params_key_help(size_t i)
{
    return i < N_KEYS ? keys[i].help : NULL;
}

static const key_def *find_key(const char *name, size_t len)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (strlen(keys[i].name) == len && !memcmp(keys[i].name, name, len))
            return &keys[i];
    return NULL;
}

/* A key that differs only in case (k vs K, t_max vs T_max) is a likely typo
 * worth naming in the message. */
static const key_def *find_key_nocase(const char *name, size_t len)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (strlen(keys[i].name) == len && !strncasecmp(keys[i].name, name, len))
            return &keys[i];
    return NULL;
}

static int in_range(const key_def *k, double v)
{
    if (k->lo_open ? !(v > k->lo) : !(v >= k->lo))
        return 0;
    if (k->hi_open ? !(v < k->hi) : !(v <= k->hi))
        return 0;
    return 1;
}

/* refresh_delay = 1 would install a slow step's sets at the very next
 * step, which is what 0 already does without a pending copy: a value that
 * only looks different is refused rather than silently equal to 0. */
static const char *int_hole(const key_def *k, long v)
{
    if (k->offset == OFF(refresh_delay) && v == 1)
        return "1 is not allowed (0 = off: sets take effect at once; a deferred refresh needs a "
               "delay of 2, 3 or 4 steps)";
    return NULL;
}

static void range_text(const key_def *k, char *buf, size_t n)
{
    if (k->type == KEY_INT) {
        snprintf(buf, n, "an integer in [%.0f, %.0f]", k->lo, k->hi);
    } else if (isinf(k->hi)) {
        snprintf(buf, n, "a finite number %s %g", k->lo_open ? ">" : ">=", k->lo);
    } else {
        snprintf(buf, n, "a number in %c%g, %g%c", k->lo_open ? '(' : '[', k->lo, k->hi,
                 k->hi_open ? ')' : ']');
    }
}

/* Quotes a user's value for a message: printable ASCII as is, the rest
 * escaped, long values cut, so that a hostile value cannot flood or garble
 * a terminal. */
static void quote_value(const char *v, char *buf, size_t n)
{
    size_t o = 0;
    for (const unsigned char *s = (const unsigned char *)v; *s && o + 8 < n; s++) {
        if (*s == '\n')
            o += (size_t)snprintf(buf + o, n - o, "\\n");
        else if (*s == '\t')
            o += (size_t)snprintf(buf + o, n - o, "\\t");
        else if (*s == '\\')
            o += (size_t)snprintf(buf + o, n - o, "\\\\");
        else if (*s < 0x20 || *s >= 0x7f)
            o += (size_t)snprintf(buf + o, n - o, "\\x%02x", *s);
        else
            buf[o++] = (char)*s;
        if (s[1] && o + 8 >= n) {
            snprintf(buf + o, n - o, "...");
            return;
        }
    }
    buf[o] = '\0';
}

/* The offset of the first byte of s[0..n) that does not start a valid
 * UTF-8 character, or (size_t)-1. The trigger set matches whole characters
 * (sfi_trigger_set_build), so a stray byte would match nothing sensible. */
static size_t utf8_bad_offset(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = sfi_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (l == 0 || cp == 0)
            return i;
        i += l;
    }
    return (size_t)-1;
}

/* Decodes trigger_chars' escapes into out (SFI_TRIGGER_CHARS_MAX bytes). */
static sfi_status parse_chars(const char *v, char *out, const char *origin, const key_def *k,
                              sfi_error *err)
{
    size_t o = 0;
    for (const char *s = v; *s; s++) {
        char c = *s;
        if (c == '\\') {
            s++;
            switch (*s) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case '\\': c = '\\'; break;
            case '\0':
                return sfi_error_set(err, SFI_EINVAL, "%s: %s: value ends with a lone backslash",
                                     origin, k->name);
            default:
                return sfi_error_set(
                    err, SFI_EINVAL, "%s: %s: unknown escape '\\%c' (use \\n \\t \\r \\\\)", origin,
                    k->name, (unsigned char)*s >= 0x20 && (unsigned char)*s < 0x7f ? *s : '?');
            }
        }
        if (o + 1 >= SFI_TRIGGER_CHARS_MAX)
            return sfi_error_set(err, SFI_ERANGE, "%s: %s: longer than %d bytes", origin, k->name,
                                 SFI_TRIGGER_CHARS_MAX - 1);
        out[o++] = c;
    }
    out[o] = '\0';
    if (o == 0)
        return sfi_error_set(err, SFI_EINVAL, "%s: %s: needs at least one character", origin,
                             k->name);
    size_t bad = utf8_bad_offset(out, o);
    if (bad != (size_t)-1)
        return sfi_error_set(err, SFI_EINVAL, "%s: %s: not valid UTF-8 at byte %zu", origin,
                             k->name, bad);
    return SFI_OK;
}

static sfi_status parse_value(sfi_params *p, const key_def *k, const char *v, const char *origin,
                              sfi_error *err)
{
    char q[96], r[96];
    quote_value(v, q, sizeof q);
    if (k->type == KEY_CHARS)
        return parse_chars(v, (char *)p + k->offset, origin, k, err);
    if (!*v)
        return sfi_error_set(err, SFI_EINVAL, "%s: %s: empty value", origin, k->name);
    char *end;
    errno = 0;
    if (k->type == KEY_INT) {
        long n = strtol(v, &end, 10);
        if (end == v || *end) {
            range_text(k, r, sizeof r);
            return sfi_error_set(err, SFI_EINVAL, "%s: %s: '%s' is not an integer (expected %s)",
                                 origin, k->name, q, r);
        }
        if (errno == ERANGE || !in_range(k, (double)n)) {
            range_text(k, r, sizeof r);
            return sfi_error_set(err, SFI_ERANGE, "%s: %s: %s is out of range (expected %s)",
                                 origin, k->name, q, r);
        }
        const char *hole = int_hole(k, n);
        if (hole)
            return sfi_error_set(err, SFI_ERANGE, "%s: %s: %s", origin, k->name, hole);
        *(int *)((char *)p + k->offset) = (int)n;
        return SFI_OK;
    }
    double d = strtod(v, &end);
    if (end == v || *end) {
        range_text(k, r, sizeof r);
        return sfi_error_set(err, SFI_EINVAL, "%s: %s: '%s' is not a number (expected %s)", origin,
                             k->name, q, r);
    }
    /* The value is stored as a float: a double that overflows it, or one
     * strtod already flagged (overflow, underflow to a denormal), is out of
     * range; nan and inf are never in range. */
    float f = (float)d;
    if (errno == ERANGE || !isfinite(d) || !isfinite(f) || !in_range(k, (double)f) ||
        (d != 0 && f == 0)) {
        range_text(k, r, sizeof r);
        return sfi_error_set(err, SFI_ERANGE, "%s: %s: %s is out of range (expected %s)", origin,
                             k->name, q, r);
    }
    *(float *)((char *)p + k->offset) = f;
    return SFI_OK;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* Splits "key=value" with the blanks around key and value removed. Returns
 * the key in [*ks, *ks + *kl) and writes the value, NUL-terminated, to val. */
static sfi_status split_kv(const char *kv, const char *origin, const char **ks, size_t *kl,
                           char *val, size_t valn, sfi_error *err)
{
    const char *eq = strchr(kv, '=');
    if (!eq) {
        char q[96];
        quote_value(kv, q, sizeof q);
        return sfi_error_set(err, SFI_EINVAL, "%s: '%s' is not of the form key=value", origin, q);
    }
    const char *a = kv, *b = eq;
    while (a < b && is_space(*a))
        a++;
    while (b > a && is_space(b[-1]))
        b--;
    if (a == b)
        return sfi_error_set(err, SFI_EINVAL, "%s: missing key before '='", origin);
    const char *v = eq + 1, *ve = v + strlen(v);
    while (v < ve && is_space(*v))
        v++;
    while (ve > v && is_space(ve[-1]))
        ve--;
    if ((size_t)(ve - v) >= valn)
        return sfi_error_set(err, SFI_ERANGE, "%s: %.*s: value longer than %zu bytes", origin,
                             (int)(b - a > 64 ? 64 : b - a), a, valn - 1);
    memcpy(val, v, (size_t)(ve - v));
    val[ve - v] = '\0';
    *ks = a;
    *kl = (size_t)(b - a);
    return SFI_OK;
}

static sfi_status set_one(sfi_params *p, const char *key_value, const char *origin,
                          const key_def **which, sfi_error *err)
{
    if (!p || !key_value)
        return sfi_error_set(err, SFI_EINVAL, "sfi_params_set: NULL argument");
    if (!origin)
        origin = "--param";
    const char *ks = NULL;
    size_t kl = 0;
    char val[PARAM_LINE_MAX];
    sfi_status st = split_kv(key_value, origin, &ks, &kl, val, sizeof val, err);
    if (st)
        return st;
    const key_def *k = find_key(ks, kl);
    if (!k) {
        char q[96];
        char name[PARAM_LINE_MAX];
        memcpy(name, ks, kl < sizeof name ? kl : sizeof name - 1);
        name[kl < sizeof name ? kl : sizeof name - 1] = '\0';
        quote_value(name, q, sizeof q);
        const key_def *near = find_key_nocase(ks, kl);
        if (near)
            return sfi_error_set(err, SFI_ENOTFOUND,
                                 "%s: unknown parameter '%s' (did you mean '%s'? keys are "
                                 "case-sensitive)",
                                 origin, q, near->name);
        return sfi_error_set(err, SFI_ENOTFOUND,
                             "%s: unknown parameter '%s' (see --help for the list of keys)", origin,
                             q);
    }
    /* Parse into a copy so that a bad value leaves *p as it was. */
    sfi_params tmp = *p;
    st = parse_value(&tmp, k, val, origin, err);
    if (st)
        return st;
    *p = tmp;
    if (which)
        *which = k;
    return SFI_OK;
}

sfi_status sfi_params_set(sfi_params *p, const char *key_value, const char *origin, sfi_error *err)
{
    return set_one(p, key_value, origin, NULL, err);
}

sfi_status sfi_params_load_file(sfi_params *p, const char *path, sfi_error *err)
{
    if (!p || !path)
        return sfi_error_set(err, SFI_EINVAL, "sfi_params_load_file: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f)
        return sfi_error_set(err, SFI_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(f);
        return sfi_error_set(err, SFI_EIO, "%s: is a directory, not a parameter file", path);
    }
    if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > (off_t)PARAM_FILE_MAX) {
        fclose(f);
        return sfi_error_set(err, SFI_ERANGE,
                             "%s: %lld bytes is too large for a parameter file "
                             "(limit %u)",
                             path, (long long)sb.st_size, PARAM_FILE_MAX);
    }
    sfi_params tmp = *p;
    int first_line[N_KEYS] = {0};
    char line[PARAM_LINE_MAX + 2];
    char origin[PATH_MAX + 32];
    sfi_status st = SFI_OK;
    size_t total = 0;
    int lineno = 0;
    for (;;) {
        /* fgets cannot tell an embedded NUL from the line's end; read
         * bytes one by one instead (files are tiny). */
        size_t n = 0;
        int c = EOF, too_long = 0, has_nul = 0;
        while ((c = getc(f)) != EOF) {
            if (++total > PARAM_FILE_MAX) {
                st = sfi_error_set(err, SFI_ERANGE,
                                   "%s: more than %u bytes is too large for a "
                                   "parameter file",
                                   path, PARAM_FILE_MAX);
                goto out;
            }
            if (c == '\n')
                break;
            if (c == '\0')
                has_nul = 1;
            if (n < PARAM_LINE_MAX)
                line[n++] = (char)c;
            else
                too_long = 1;
        }
        if (ferror(f)) {
            st = sfi_error_set(err, SFI_EIO, "%s: read error: %s", path, strerror(errno));
            goto out;
        }
        if (c == EOF && n == 0 && !too_long)
            break;
        line[n] = '\0';
        lineno++;
        snprintf(origin, sizeof origin, "%s:%d", path, lineno);
        if (has_nul) {
            st = sfi_error_set(err, SFI_EFORMAT, "%s: line contains a NUL byte", origin);
            goto out;
        }
        if (too_long) {
            st = sfi_error_set(err, SFI_ERANGE, "%s: line longer than %d bytes", origin,
                               PARAM_LINE_MAX);
            goto out;
        }
        /* '#' starts a comment at the start of a line or after a blank, so
         * that "trigger_chars=.#" can still name '#'. */
        for (size_t i = 0; i < n; i++)
            if (line[i] == '#' && (i == 0 || is_space(line[i - 1]))) {
                line[i] = '\0';
                break;
            }
        const char *s = line;
        while (is_space(*s))
            s++;
        if (!*s) {
            if (c == EOF)
                break;
            continue;
        }
        const key_def *k = NULL;
        st = set_one(&tmp, s, origin, &k, err);
        if (st)
            goto out;
        size_t ki = (size_t)(k - keys);
        if (first_line[ki]) {
            st = sfi_error_set(err, SFI_EINVAL, "%s: %s set twice (first on line %d)", origin,
                               k->name, first_line[ki]);
            goto out;
        }
        first_line[ki] = lineno;
        if (c == EOF)
            break;
    }
    *p = tmp;
out:
    fclose(f);
    return st;
}

sfi_status sfi_params_validate(const sfi_params *p, sfi_error *err)
{
    if (!p)
        return sfi_error_set(err, SFI_EINVAL, "sfi_params_validate: NULL argument");
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_def *k = &keys[i];
        const char *field = (const char *)p + k->offset;
        char r[96];
        if (k->type == KEY_INT) {
            int v = *(const int *)field;
            if (!in_range(k, v)) {
                range_text(k, r, sizeof r);
                return sfi_error_set(err, SFI_ERANGE,
                                     "parameters: %s: %d is out of range "
                                     "(expected %s)",
                                     k->name, v, r);
            }
            const char *hole = int_hole(k, v);
            if (hole)
                return sfi_error_set(err, SFI_ERANGE, "parameters: %s: %s", k->name, hole);
        } else if (k->type == KEY_FLOAT) {
            float v = *(const float *)field;
            if (!isfinite(v) || !in_range(k, v)) {
                range_text(k, r, sizeof r);
                return sfi_error_set(err, SFI_ERANGE,
                                     "parameters: %s: %g is out of range "
                                     "(expected %s)",
                                     k->name, (double)v, r);
            }
        } else {
            size_t n = strnlen(field, SFI_TRIGGER_CHARS_MAX);
            if (n == SFI_TRIGGER_CHARS_MAX)
                return sfi_error_set(err, SFI_EFORMAT, "parameters: %s: not NUL-terminated",
                                     k->name);
            if (n == 0)
                return sfi_error_set(err, SFI_EINVAL, "parameters: %s: empty", k->name);
            if (utf8_bad_offset(field, n) != (size_t)-1)
                return sfi_error_set(err, SFI_EINVAL, "parameters: %s: not valid UTF-8", k->name);
        }
    }
    return SFI_OK;
}

/* The shortest decimal that reads back as the same float, as a double, so
 * that JSON shows 0.02 rather than 0.019999999552965164. */
static double short_double(float f)
{
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if ((float)strtod(buf, NULL) == f)
            return strtod(buf, NULL);
    }
    return (double)f;
}

char *sfi_params_to_json(const sfi_params *p)
{
    if (!p)
        return NULL;
    json_t *o = json_object();
    if (!o)
        return NULL;
    int bad = 0;
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_def *k = &keys[i];
        const char *field = (const char *)p + k->offset;
        json_t *v;
        if (k->type == KEY_INT)
            v = json_integer(*(const int *)field);
        else if (k->type == KEY_FLOAT)
            /* JSON has no nan or inf: such a (never valid) value is null. */
            v = isfinite(*(const float *)field) ? json_real(short_double(*(const float *)field))
                                                : json_null();
        else
            v = json_stringn(field, strnlen(field, SFI_TRIGGER_CHARS_MAX));
        if (!v || json_object_set_new(o, k->name, v))
            bad = 1;
    }
    /* 9 significant digits print every short_double back exactly. */
    char *s = bad ? NULL : json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    return s;
}

sfi_status sfi_params_from_json(sfi_params *p, const char *json, const char *origin, sfi_error *err)
{
    if (!p || !json)
        return sfi_error_set(err, SFI_EINVAL, "sfi_params_from_json: NULL argument");
    if (!origin)
        origin = "params";
    json_error_t je;
    json_t *o = json_loads(json, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return sfi_error_set(err, SFI_EFORMAT, "%s: invalid JSON: %s", origin, je.text);
    if (!json_is_object(o)) {
        json_decref(o);
        return sfi_error_set(err, SFI_EFORMAT, "%s: not a JSON object", origin);
    }
    sfi_params tmp = *p;
    sfi_status st = SFI_OK;
    const char *name;
    json_t *v;
    json_object_foreach(o, name, v)
    {
        size_t i = 0;
        while (i < N_KEYS && strcmp(keys[i].name, name))
            i++;
        if (i == N_KEYS)
            continue; /* another producer's key: not ours to judge */
        /* Through sfi_params_set, so that the ranges are those of --param. */
        char kv[256];
        if (keys[i].type == KEY_CHARS) {
            const char *s = json_is_string(v) ? json_string_value(v) : NULL;
            size_t n = s ? json_string_length(v) : 0, off = 0;
            int ok = s && strlen(s) == n;
            off = (size_t)snprintf(kv, sizeof kv, "%s=", name);
            for (size_t j = 0; ok && j < n; j++) {
                const char *e = s[j] == '\\'   ? "\\\\"
                                : s[j] == '\n' ? "\\n"
                                : s[j] == '\t' ? "\\t"
                                : s[j] == '\r' ? "\\r"
                                               : NULL;
                size_t add = e ? 2 : 1;
                if (off + add >= sizeof kv) {
                    ok = 0;
                    break;
                }
                if (e)
                    memcpy(kv + off, e, 2);
                else
                    kv[off] = s[j];
                off += add;
            }
            kv[off < sizeof kv ? off : sizeof kv - 1] = '\0';
            if (!ok) {
                st = sfi_error_set(err, SFI_EFORMAT, "%s: %s: not a string of at most %d bytes",
                                   origin, name, SFI_TRIGGER_CHARS_MAX - 1);
                break;
            }
        } else if (keys[i].type == KEY_INT ? json_is_integer(v) : json_is_number(v)) {
            if (json_is_integer(v))
                snprintf(kv, sizeof kv, "%s=%" JSON_INTEGER_FORMAT, name, json_integer_value(v));
            else
                snprintf(kv, sizeof kv, "%s=%.17g", name, json_real_value(v));
        } else {
            st = sfi_error_set(err, SFI_EFORMAT, "%s: %s: expected %s, found %s", origin, name,
                               keys[i].type == KEY_INT ? "an integer" : "a number",
                               json_is_null(v)     ? "null"
                               : json_is_string(v) ? "a string"
                                                   : "another type");
            break;
        }
        if ((st = sfi_params_set(&tmp, kv, origin, err)) != SFI_OK)
            break;
    }
    json_decref(o);
    if (!st)
        st = sfi_params_validate(&tmp, err);
    if (!st)
        *p = tmp;
    return st;
}
