/* Tokenizer vocabulary: vocab.json (byte-level BPE strings -> ids) plus the
 * added tokens of tokenizer_config.json, each token decoded to the raw bytes
 * it stands for, and the trigger set of sfi(7) TRIGGERS. */
#include <config.h>

#include "sfi_vocab.h"

#include <assert.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_io.h"

/* Real vocabularies are a few MB (Qwen3: 2.7 MB); the caps only stop a wrong
 * path (a checkpoint, /dev/zero) from being read into memory whole. */
#define VOCAB_FILE_MAX ((size_t)64 << 20)
#define CONFIG_FILE_MAX ((size_t)16 << 20)
/* Ids are dense array indexes; 2^24 is far above any real vocabulary. */
#define VOCAB_ID_MAX (1 << 24)

enum { FLAG_ADDED = 1, FLAG_SPECIAL = 2 };

struct sfi_vocab {
    int32_t n;       /* one past the largest id */
    char **text;     /* [n] as stored (byte-level form), NULL for holes */
    uint8_t **bytes; /* [n] decoded bytes, NULL for holes */
    size_t *blen;    /* [n] */
    uint8_t *flags;  /* [n] FLAG_* */
    int32_t *slots;  /* open-addressing hash of text -> id, -1 empty */
    size_t nslots;   /* power of two */
    int32_t *added;  /* ids of added tokens, in id order */
    int32_t n_added;
};

/* GPT-2's byte <-> unicode mapping: printable bytes stand for themselves,
 * the other 68 bytes (0..32, 127..160, 173) are shifted to U+0100..U+0143
 * in byte order, so every token string is printable text. Closed forms, no
 * tables: nothing to initialize, safe from any thread. */
uint32_t sfi_unicode_of_byte(uint8_t b)
{
    if (b <= 32)
        return 256u + b;
    if (b >= 127 && b <= 160)
        return 289u + (b - 127u);
    if (b == 173)
        return 323u;
    return b;
}

int sfi_byte_of_unicode(uint32_t cp)
{
    if (cp < 256) {
        int printable = (cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || cp >= 174;
        return printable ? (int)cp : -1;
    }
    if (cp <= 288)
        return (int)(cp - 256);
    if (cp <= 322)
        return (int)(cp - 289 + 127);
    return cp == 323 ? 173 : -1;
}

/* Decodes one UTF-8 character of s[0..len), strictly (no overlongs, no
 * surrogates). Returns its length, 0 when invalid. */
size_t sfi_utf8_decode(const uint8_t *s, size_t len, uint32_t *cp)
{
    if (len == 0)
        return 0;
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t n;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) {
        n = 2;
        v = c & 0x1F;
        min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3;
        v = c & 0x0F;
        min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4;
        v = c & 0x07;
        min = 0x10000;
    } else {
        return 0;
    }
    if (len < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return n;
}

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 1099511628211ULL;
    }
    /* FNV-1a's low bits cluster on similar strings; finish with a mixer so
     * linear probing stays short. */
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

/* path's JSON object; a missing file that is not required gives *out =
 * NULL. The file is read whole, then parsed from memory: json_load_file
 * reads through getc, several times slower on a multi-MB vocabulary. */
static int read_json(const char *path, size_t cap, const char *what, int required, json_t **out,
                     sfi_error *err)
{
    *out = NULL;
    char *buf;
    size_t got;
    sfi_status st = sfi_io_read(path, cap, what, &buf, &got, err);
    if (st == SFI_ENOTFOUND && !required) {
        sfi_error_clear(err);
        return SFI_OK;
    }
    if (st)
        return st;
    json_error_t je;
    json_t *j = json_loadb(buf, got, JSON_REJECT_DUPLICATES, &je);
    free(buf);
    if (!j)
        return sfi_error_set(err, SFI_EFORMAT, "%s: line %d column %d: %s", path, je.line,
                             je.column, je.text);
    if (!json_is_object(j)) {
        json_decref(j);
        return sfi_error_set(err, SFI_EFORMAT, "%s: top level is not a JSON object", path);
    }
    *out = j;
    return SFI_OK;
}

/* Byte-level string -> raw bytes. */
static sfi_status decode_token(const char *path, const char *text, uint8_t **out, size_t *outlen,
                               sfi_error *err)
{
    size_t len = strlen(text);
    uint8_t *b = malloc(len + 1);
    if (!b)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = sfi_utf8_decode((const uint8_t *)text + i, len - i, &cp);
        int byte = k ? sfi_byte_of_unicode(cp) : -1;
        if (byte < 0) {
            free(b);
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: token \"%s\": character %zu is not in the byte-level "
                                 "(GPT-2 byte-to-unicode) alphabet",
                                 path, text, i);
        }
        b[n++] = (uint8_t)byte;
        i += k;
    }
    *out = b;
    *outlen = n;
    return SFI_OK;
}

static sfi_status grow(sfi_vocab *v, int32_t n, sfi_error *err)
{
    if (n <= v->n)
        return SFI_OK;
    char **t = realloc(v->text, (size_t)n * sizeof *t);
    if (t)
        v->text = t;
    uint8_t **b = realloc(v->bytes, (size_t)n * sizeof *b);
    if (b)
        v->bytes = b;
    size_t *l = realloc(v->blen, (size_t)n * sizeof *l);
    if (l)
        v->blen = l;
    uint8_t *f = realloc(v->flags, (size_t)n);
    if (f)
        v->flags = f;
    if (!t || !b || !l || !f)
        return sfi_error_set(err, SFI_ENOMEM, "vocabulary: out of memory");
    for (int32_t i = v->n; i < n; i++) {
        v->text[i] = NULL;
        v->bytes[i] = NULL;
        v->blen[i] = 0;
        v->flags[i] = 0;
    }
    v->n = n;
    return SFI_OK;
}

static sfi_status build_hash(sfi_vocab *v, sfi_error *err)
{
    size_t want = 16;
    while (want < (size_t)v->n * 2)
        want *= 2;
    v->slots = malloc(want * sizeof *v->slots);
    if (!v->slots)
        return sfi_error_set(err, SFI_ENOMEM, "vocabulary: out of memory");
    v->nslots = want;
    for (size_t i = 0; i < want; i++)
        v->slots[i] = -1;
    for (int32_t id = 0; id < v->n; id++) {
        if (!v->text[id])
            continue;
        size_t h = (size_t)hash_str(v->text[id]) & (want - 1);
        while (v->slots[h] >= 0) {
            if (!strcmp(v->text[v->slots[h]], v->text[id]))
                return sfi_error_set(err, SFI_EFORMAT,
                                     "vocabulary: token \"%s\" has two ids, %d and %d", v->text[id],
                                     (int)v->slots[h], (int)id);
            h = (h + 1) & (want - 1);
        }
        v->slots[h] = id;
    }
    return SFI_OK;
}

static sfi_status load_vocab_json(sfi_vocab *v, const char *path, sfi_error *err)
{
    json_t *j;
    sfi_status s = read_json(path, VOCAB_FILE_MAX, "a vocabulary", 1, &j, err);
    if (s)
        return s;
    if (json_object_size(j) == 0) {
        json_decref(j);
        return sfi_error_set(err, SFI_EFORMAT, "%s: no tokens", path);
    }
    const char *key;
    json_t *val;
    int32_t maxid = -1;
    json_object_foreach(j, key, val)
    {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= VOCAB_ID_MAX) {
            /* The message first: key lives in j. */
            sfi_error_set(err, SFI_EFORMAT, "%s: token \"%s\": id is not an integer in [0, %d)",
                          path, key, VOCAB_ID_MAX);
            json_decref(j);
            return SFI_EFORMAT;
        }
        if (json_integer_value(val) > maxid)
            maxid = (int32_t)json_integer_value(val);
        if (!*key) {
            json_decref(j);
            return sfi_error_set(err, SFI_EFORMAT, "%s: empty token string", path);
        }
    }
    s = grow(v, maxid + 1, err);
    json_object_foreach(j, key, val)
    {
        if (s)
            break;
        int32_t id = (int32_t)json_integer_value(val);
        if (v->text[id]) {
            s = sfi_error_set(err, SFI_EFORMAT, "%s: id %d is used by \"%s\" and \"%s\"", path,
                              (int)id, v->text[id], key);
            break;
        }
        v->text[id] = strdup(key);
        if (!v->text[id]) {
            s = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
            break;
        }
        s = decode_token(path, key, &v->bytes[id], &v->blen[id], err);
    }
    json_decref(j);
    return s;
}

static int parse_id(const char *s, int32_t *id)
{
    if (!*s || strlen(s) > 9)
        return 0;
    long x = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return 0;
        x = x * 10 + (*p - '0');
    }
    if (x >= VOCAB_ID_MAX)
        return 0;
    *id = (int32_t)x;
    return 1;
}

static sfi_status load_added(sfi_vocab *v, const char *path, sfi_error *err)
{
    json_t *j;
    sfi_status s = read_json(path, CONFIG_FILE_MAX, "a tokenizer config", 0, &j, err);
    if (s || !j)
        return s;
    json_t *dec = json_object_get(j, "added_tokens_decoder");
    if (!dec) {
        json_decref(j);
        return SFI_OK;
    }
    if (!json_is_object(dec)) {
        json_decref(j);
        return sfi_error_set(err, SFI_EFORMAT, "%s: added_tokens_decoder: not an object", path);
    }
    const char *key;
    json_t *val;
    json_object_foreach(dec, key, val)
    {
        int32_t id;
        if (!parse_id(key, &id)) {
            s = sfi_error_set(err, SFI_EFORMAT,
                              "%s: added_tokens_decoder: key \"%s\" is not an id in [0, %d)", path,
                              key, VOCAB_ID_MAX);
            break;
        }
        json_t *content = json_is_object(val) ? json_object_get(val, "content") : NULL;
        if (!json_is_string(content) || json_string_length(content) == 0 ||
            strlen(json_string_value(content)) != json_string_length(content)) {
            s = sfi_error_set(err, SFI_EFORMAT,
                              "%s: added_tokens_decoder: %s: content: not a non-empty string", path,
                              key);
            break;
        }
        /* lstrip/rstrip/single_word change how the token is matched in
         * text; no Qwen3 tokenizer sets them, so refuse rather than match
         * differently from Hugging Face. */
        static const char *const unsupported[] = {"lstrip", "rstrip", "single_word"};
        for (size_t i = 0; i < 3 && !s; i++)
            if (json_is_true(json_object_get(val, unsupported[i])))
                s = sfi_error_set(err, SFI_EUNSUPPORTED,
                                  "%s: added_tokens_decoder: %s: %s=true is not supported", path,
                                  key, unsupported[i]);
        if (s)
            break;
        const char *c = json_string_value(content);
        int special = json_is_true(json_object_get(val, "special"));
        if (id < v->n && v->text[id] && !(v->flags[id] & FLAG_ADDED)) {
            if (strcmp(v->text[id], c)) {
                s = sfi_error_set(err, SFI_EFORMAT,
                                  "%s: added_tokens_decoder: %s: content \"%s\" differs from "
                                  "vocab.json's \"%s\"",
                                  path, key, c, v->text[id]);
                break;
            }
            /* Same string in both: the added token's literal content wins
             * (it is matched as text, not as byte-level form). */
            free(v->bytes[id]);
            v->bytes[id] = NULL;
        } else {
            if ((s = grow(v, id + 1, err)))
                break;
            v->text[id] = strdup(c);
            if (!v->text[id]) {
                s = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
                break;
            }
        }
        size_t len = strlen(c);
        v->bytes[id] = malloc(len);
        if (!v->bytes[id]) {
            s = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
            break;
        }
        memcpy(v->bytes[id], c, len);
        v->blen[id] = len;
        v->flags[id] = (uint8_t)(FLAG_ADDED | (special ? FLAG_SPECIAL : 0));
    }
    json_decref(j);
    return s;
}

sfi_status sfi_vocab_load(const char *dir, sfi_vocab **out, sfi_error *err)
{
    *out = NULL;
    sfi_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return sfi_error_set(err, SFI_ENOMEM, "vocabulary: out of memory");
    size_t plen = strlen(dir) + 32;
    char *path = malloc(plen);
    if (!path) {
        free(v);
        return sfi_error_set(err, SFI_ENOMEM, "vocabulary: out of memory");
    }
    snprintf(path, plen, "%s/vocab.json", dir);
    sfi_status s = load_vocab_json(v, path, err);
    if (!s) {
        snprintf(path, plen, "%s/tokenizer_config.json", dir);
        s = load_added(v, path, err);
    }
    if (!s)
        s = build_hash(v, err);
    if (!s) {
        for (int32_t id = 0; id < v->n; id++)
            v->n_added += (v->flags[id] & FLAG_ADDED) != 0;
        v->added = malloc(((size_t)v->n_added + 1) * sizeof *v->added);
        if (!v->added)
            s = sfi_error_set(err, SFI_ENOMEM, "vocabulary: out of memory");
        else
            for (int32_t id = 0, k = 0; id < v->n; id++)
                if (v->flags[id] & FLAG_ADDED)
                    v->added[k++] = id;
    }
    free(path);
    if (s) {
        sfi_vocab_free(v);
        return s;
    }
    *out = v;
    return SFI_OK;
}

void sfi_vocab_free(sfi_vocab *v)
{
    if (!v)
        return;
    for (int32_t i = 0; i < v->n; i++) {
        free(v->text[i]);
        free(v->bytes[i]);
    }
    free(v->text);
    free(v->bytes);
    free(v->blen);
    free(v->flags);
    free(v->slots);
    free(v->added);
    free(v);
}

int32_t sfi_vocab_size(const sfi_vocab *v)
{
    return v->n;
}

const uint8_t *sfi_vocab_token_bytes(const sfi_vocab *v, int32_t id, size_t *len)
{
    if (id < 0 || id >= v->n || !v->text[id]) {
        if (len)
            *len = 0;
        return NULL;
    }
    if (len)
        *len = v->blen[id];
    /* A token of zero bytes cannot occur (empty strings are rejected), so
     * bytes[id] is non-NULL here. */
    return v->bytes[id];
}

const char *sfi_vocab_token_text(const sfi_vocab *v, int32_t id)
{
    return id >= 0 && id < v->n ? v->text[id] : NULL;
}

int32_t sfi_vocab_lookup(const sfi_vocab *v, const char *text)
{
    /* open addressing: a power of two at most half full (build_hash), so
     * the probe reaches an empty slot */
    assert(v->nslots && !(v->nslots & (v->nslots - 1)) && (size_t)v->n * 2 <= v->nslots);
    size_t h = (size_t)hash_str(text) & (v->nslots - 1);
    while (v->slots[h] >= 0) {
        if (!strcmp(v->text[v->slots[h]], text))
            return v->slots[h];
        h = (h + 1) & (v->nslots - 1);
    }
    return -1;
}

int sfi_vocab_is_special(const sfi_vocab *v, int32_t id)
{
    return id >= 0 && id < v->n && (v->flags[id] & FLAG_SPECIAL);
}

int sfi_vocab_is_added(const sfi_vocab *v, int32_t id)
{
    return id >= 0 && id < v->n && (v->flags[id] & FLAG_ADDED);
}

int32_t sfi_vocab_added_count(const sfi_vocab *v)
{
    return v->n_added;
}

int32_t sfi_vocab_added_id(const sfi_vocab *v, int32_t i)
{
    return i >= 0 && i < v->n_added ? v->added[i] : -1;
}

/* Does b[0..n) end with the bytes of c[0..cn)? */
static int ends_with(const uint8_t *b, size_t n, const uint8_t *c, size_t cn)
{
    return cn <= n && memcmp(b + n - cn, c, cn) == 0;
}

sfi_status sfi_trigger_set_build(const sfi_vocab *v, const char *chars, sfi_trigger_set *out,
                                 sfi_error *err)
{
    memset(out, 0, sizeof *out);
    if (!chars)
        chars = SFI_TRIGGER_CHARS_DEFAULT;
    /* chars is a string of UTF-8 characters; each one is matched as its
     * whole byte sequence, so a multi-byte character never matches a token
     * that merely ends with its last byte. */
    size_t clen = strlen(chars);
    for (size_t i = 0; i < clen;) {
        uint32_t cp;
        size_t k = sfi_utf8_decode((const uint8_t *)chars + i, clen - i, &cp);
        if (!k)
            return sfi_error_set(err, SFI_EINVAL, "trigger characters: byte %zu is not valid UTF-8",
                                 i);
        i += k;
    }
    out->n_vocab = v->n;
    out->is_trigger = calloc((size_t)v->n + 1, 1);
    out->ids = malloc(((size_t)v->n + 1) * sizeof *out->ids);
    if (!out->is_trigger || !out->ids) {
        sfi_trigger_set_free(out);
        return sfi_error_set(err, SFI_ENOMEM, "trigger set: out of memory");
    }
    for (int32_t id = 0; id < v->n; id++) {
        size_t n;
        const uint8_t *b = sfi_vocab_token_bytes(v, id, &n);
        if (!b)
            continue;
        int hit = memchr(b, '\n', n) != NULL;
        /* sfi(7) TRIGGERS: trailing spaces (U+0020) are removed before
         * the end is tested, so "Ġ." and ".Ġ" both end a sentence. */
        size_t m = n;
        while (m > 0 && b[m - 1] == ' ')
            m--;
        for (size_t i = 0; i < clen && !hit;) {
            uint32_t cp;
            size_t k = sfi_utf8_decode((const uint8_t *)chars + i, clen - i, &cp);
            hit = ends_with(b, m, (const uint8_t *)chars + i, k);
            i += k;
        }
        if (hit) {
            out->is_trigger[id] = 1;
            out->ids[out->n_ids++] = id;
        }
    }
    return SFI_OK;
}

void sfi_trigger_set_free(sfi_trigger_set *t)
{
    if (!t)
        return;
    free(t->is_trigger);
    free(t->ids);
    memset(t, 0, sizeof *t);
}

char *sfi_escape_bytes(const uint8_t *b, size_t n)
{
    char *out = malloc(4 * n + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n;) {
        uint8_t c = b[i];
        uint32_t cp;
        size_t k;
        if (c == '\n' || c == '\t' || c == '\r' || c == '\\' || c == '"') {
            *o++ = '\\';
            *o++ = c == '\n' ? 'n' : c == '\t' ? 't' : c == '\r' ? 'r' : (char)c;
            i++;
        } else if (c >= 0x20 && c < 0x7f) {
            *o++ = (char)c;
            i++;
        } else if (c >= 0x80 && (k = sfi_utf8_decode(b + i, n - i, &cp)) > 0) {
            memcpy(o, b + i, k);
            o += k;
            i += k;
        } else {
            o += sprintf(o, "\\x%02X", c);
            i++;
        }
    }
    *o = '\0';
    return out;
}

char *sfi_utf8_clean(const char *s, size_t n, size_t *out_n)
{
    if (n > (SIZE_MAX - 1) / 3)
        return NULL;
    char *o = malloc(3 * n + 1); /* at worst every byte becomes 3 */
    if (!o)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t len = sfi_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (len) {
            memcpy(o + k, s + i, len);
            k += len;
            i += len;
        } else {
            memcpy(o + k, "\xef\xbf\xbd", 3);
            k += 3;
            i++;
        }
    }
    assert(k <= 3 * n);
    o[k] = 0;
    *out_n = k;
    return o;
}
