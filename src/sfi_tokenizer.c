/* Byte-level BPE encoding and decoding, step for step what Hugging Face's
 * Qwen2Tokenizer (tokenizers' BPE model) does; see sfi_tokenizer.h. */
#include <config.h>

#include "sfi_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <assert.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_io.h"
#include "sfi_nfc.h"
#include "sfi_pretok_classes.h"

#define MERGES_FILE_MAX ((size_t)64 << 20)

const char sfi_qwen_pretokenize_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* The same pattern as PCRE2 must be given it to split text exactly as
 * tokenizers' Oniguruma does:
 * - \s spelled out as Unicode's White_Space (what Oniguruma matches):
 *   PCRE2's \s also takes U+180E MONGOLIAN VOWEL SEPARATOR (through \h),
 *   which has not been White_Space since Unicode 6.3;
 * - \p{L} and \p{N} extended by the letters and digits Oniguruma's newer
 *   Unicode data has and PCRE2 10.42's (Unicode 14.0) lacks
 *   (sfi_pretok_classes.h, from src/gen_pretok_classes.py). */
#define WS                                                                                         \
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"             \
    "\\x{202F}\\x{205F}\\x{3000}"
#define L "\\p{L}" SFI_PRETOK_EXTRA_L
#define N "\\p{N}" SFI_PRETOK_EXTRA_N
static const char pretokenize_pcre2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n" L N "]?[" L "]+|[" N "]|"
    " ?[^" WS L N "]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";
#undef L
#undef N

typedef struct {
    uint64_t key; /* (left id << 32) | right id; UINT64_MAX when empty */
    int32_t rank;
    int32_t id; /* the merged token */
} merge_slot;

struct sfi_tokenizer {
    sfi_vocab *vocab;
    int32_t byte_id[256]; /* the one-character token of each byte */
    merge_slot *merges;
    size_t nmerge_slots; /* power of two */
    pcre2_code *re;
    int jit;
};

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static const merge_slot *merge_find(const sfi_tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = t->nmerge_slots - 1;
    /* open addressing: a power of two at most half full, so the probe
     * reaches an empty slot */
    assert(t->nmerge_slots && !(t->nmerge_slots & mask));
    for (size_t h = (size_t)mix64(key) & mask;; h = (h + 1) & mask) {
        if (t->merges[h].key == key)
            return &t->merges[h];
        if (t->merges[h].key == UINT64_MAX)
            return NULL;
    }
}

/* merges.txt: an optional "#version" first line, then one "LEFT RIGHT" pair
 * per line, highest priority first. Both halves and their concatenation
 * must be tokens (tokenizers refuses the file otherwise, too). */
static sfi_status load_merges(sfi_tokenizer *t, const char *path, sfi_error *err)
{
    size_t len;
    char *buf;
    sfi_status st = sfi_io_read(path, MERGES_FILE_MAX, "a merges file", &buf, &len, err);
    if (st)
        return st;
    if (memchr(buf, '\0', len)) {
        free(buf);
        return sfi_error_set(err, SFI_EFORMAT, "%s: contains a NUL byte", path);
    }
    size_t nlines = 1;
    for (size_t i = 0; i < len; i++)
        nlines += buf[i] == '\n';
    size_t want = 16;
    while (want < nlines * 2)
        want *= 2;
    t->merges = malloc(want * sizeof *t->merges);
    if (!t->merges) {
        free(buf);
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    }
    t->nmerge_slots = want;
    for (size_t i = 0; i < want; i++)
        t->merges[i].key = UINT64_MAX;
    sfi_status s = SFI_OK;
    int32_t rank = 0;
    size_t lineno = 0;
    char *joined = malloc(len + 2);
    if (!joined) {
        free(buf);
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    }
    for (char *line = buf; line && !s;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        lineno++;
        size_t ll = strlen(line);
        if (ll && line[ll - 1] == '\r')
            line[--ll] = '\0';
        if (ll == 0 || (lineno == 1 && !strncmp(line, "#version", 8))) {
            line = nl ? nl + 1 : NULL;
            continue;
        }
        char *sp = strchr(line, ' ');
        if (!sp || sp == line || !sp[1] || strchr(sp + 1, ' ')) {
            s = sfi_error_set(err, SFI_EFORMAT,
                              "%s: line %zu: expected two tokens separated by one space", path,
                              lineno);
            break;
        }
        *sp = '\0';
        int32_t a = sfi_vocab_lookup(t->vocab, line), b = sfi_vocab_lookup(t->vocab, sp + 1);
        size_t la = (size_t)(sp - line), lb = ll - la - 1;
        memcpy(joined, line, la);
        memcpy(joined + la, sp + 1, lb + 1);
        int32_t c = sfi_vocab_lookup(t->vocab, joined);
        if (a < 0 || b < 0 || c < 0) {
            s = sfi_error_set(err, SFI_EFORMAT, "%s: line %zu: token \"%s\" is not in vocab.json",
                              path, lineno,
                              a < 0   ? line
                              : b < 0 ? sp + 1
                                      : joined);
            break;
        }
        uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
        size_t h = (size_t)mix64(key) & (want - 1);
        while (t->merges[h].key != UINT64_MAX && t->merges[h].key != key)
            h = (h + 1) & (want - 1);
        /* A repeated pair keeps its first (higher-priority) rank. */
        if (t->merges[h].key == UINT64_MAX) {
            t->merges[h].key = key;
            t->merges[h].rank = rank;
            t->merges[h].id = c;
        }
        rank++;
        line = nl ? nl + 1 : NULL;
    }
    free(joined);
    free(buf);
    return s;
}

sfi_status sfi_tokenizer_load(const char *dir, sfi_tokenizer **out, sfi_error *err)
{
    *out = NULL;
    sfi_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return sfi_error_set(err, SFI_ENOMEM, "tokenizer: out of memory");
    sfi_status s = sfi_vocab_load(dir, &t->vocab, err);
    size_t plen = strlen(dir) + 32;
    char *path = malloc(plen);
    if (!s && !path)
        s = sfi_error_set(err, SFI_ENOMEM, "tokenizer: out of memory");
    if (!s) {
        snprintf(path, plen, "%s/vocab.json", dir);
        for (int b = 0; b < 256 && !s; b++) {
            char one[5];
            uint32_t cp = sfi_unicode_of_byte((uint8_t)b);
            /* cp < 0x800: one or two UTF-8 bytes. */
            if (cp < 0x80) {
                one[0] = (char)cp;
                one[1] = '\0';
            } else {
                one[0] = (char)(0xC0 | (cp >> 6));
                one[1] = (char)(0x80 | (cp & 0x3F));
                one[2] = '\0';
            }
            t->byte_id[b] = sfi_vocab_lookup(t->vocab, one);
            if (t->byte_id[b] < 0)
                s = sfi_error_set(err, SFI_EFORMAT,
                                  "%s: no token for byte 0x%02X (\"%s\"): not a byte-level "
                                  "vocabulary",
                                  path, b, one);
        }
    }
    if (!s) {
        snprintf(path, plen, "%s/merges.txt", dir);
        s = load_merges(t, path, err);
    }
    if (!s) {
        int ec;
        PCRE2_SIZE off;
        t->re = pcre2_compile((PCRE2_SPTR)pretokenize_pcre2, PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP, &ec, &off, NULL);
        if (!t->re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            s = sfi_error_set(err, SFI_EUNSUPPORTED,
                              "tokenizer: pre-tokenization pattern: offset %zu: %s", (size_t)off,
                              (const char *)msg);
        } else {
            /* JIT is only speed: the interpreter gives the same matches. */
            t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
        }
    }
    free(path);
    if (s) {
        sfi_tokenizer_free(t);
        return s;
    }
    *out = t;
    return SFI_OK;
}

void sfi_tokenizer_free(sfi_tokenizer *t)
{
    if (!t)
        return;
    sfi_vocab_free(t->vocab);
    free(t->merges);
    if (t->re)
        pcre2_code_free(t->re);
    free(t);
}

const sfi_vocab *sfi_tokenizer_vocab(const sfi_tokenizer *t)
{
    return t->vocab;
}

/* Growable id array. */
typedef struct {
    int32_t *v;
    size_t n, cap;
} idvec;

static int idvec_push(idvec *a, int32_t id)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 256;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

/* Scratch of one BPE word: symbols in a linked list and a binary min-heap
 * of candidate merges ordered by (rank, position), as tokenizers'
 * Word::merge_all. */
typedef struct {
    int32_t id, prev, next, alive;
} symbol;

typedef struct {
    int32_t rank, pos, id;
} cand;

/* Per-call cache of short pieces' ids: real text repeats its words, and
 * BPE of a word costs far more than finding it again. Per call, not per
 * tokenizer, so that encoding stays thread-safe without locks. */
#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_PIECE 48
#define CACHE_MAX_USED (CACHE_SLOTS / 2)

typedef struct {
    uint64_t hash;    /* 0: empty */
    uint32_t key_off; /* piece bytes in keys */
    uint32_t ids_off; /* its ids in ids */
    uint16_t key_len, n_ids;
} cache_slot;

typedef struct {
    symbol *sym;
    cand *heap;
    size_t cap, hn;
    cache_slot *slots; /* [CACHE_SLOTS], NULL until first use */
    size_t used;
    uint8_t *keys;
    size_t keys_n, keys_cap;
    int32_t *ids;
    size_t ids_n, ids_cap;
} bpe_scratch;

static int cand_less(const cand *a, const cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(bpe_scratch *s, cand c)
{
    size_t i = s->hn++;
    s->heap[i] = c;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&s->heap[i], &s->heap[p]))
            break;
        cand tmp = s->heap[i];
        s->heap[i] = s->heap[p];
        s->heap[p] = tmp;
        i = p;
    }
}

static cand heap_pop(bpe_scratch *s)
{
    cand top = s->heap[0];
    s->heap[0] = s->heap[--s->hn];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < s->hn && cand_less(&s->heap[l], &s->heap[m]))
            m = l;
        if (r < s->hn && cand_less(&s->heap[r], &s->heap[m]))
            m = r;
        if (m == i)
            break;
        cand tmp = s->heap[i];
        s->heap[i] = s->heap[m];
        s->heap[m] = tmp;
        i = m;
    }
    return top;
}

static void push_pair(const sfi_tokenizer *t, bpe_scratch *s, int32_t pos)
{
    int32_t nx = s->sym[pos].next;
    if (nx < 0)
        return;
    const merge_slot *m = merge_find(t, s->sym[pos].id, s->sym[nx].id);
    if (m)
        heap_push(s, (cand){m->rank, pos, m->id});
}

/* BPE of one pre-tokenized piece's bytes, appended to out. */
static int bpe_piece_uncached(const sfi_tokenizer *t, bpe_scratch *s, const uint8_t *p, size_t n,
                              idvec *out)
{
    if (n == 1)
        return idvec_push(out, t->byte_id[p[0]]);
    /* Each merge removes one symbol and pushes at most two candidates, so
     * the heap never holds more than 3n entries. */
    if (n * 3 > s->cap) {
        size_t cap = n * 3 + 64;
        symbol *sym = realloc(s->sym, cap * sizeof *sym);
        if (sym)
            s->sym = sym;
        cand *heap = realloc(s->heap, cap * sizeof *heap);
        if (heap)
            s->heap = heap;
        if (!sym || !heap)
            return -1;
        s->cap = cap;
    }
    for (size_t i = 0; i < n; i++)
        s->sym[i] = (symbol){t->byte_id[p[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, 1};
    s->hn = 0;
    for (size_t i = 0; i + 1 < n; i++)
        push_pair(t, s, (int32_t)i);
    while (s->hn) {
        cand c = heap_pop(s);
        symbol *a = &s->sym[c.pos];
        if (!a->alive || a->next < 0)
            continue;
        /* Stale candidate: one of the two symbols has changed since. */
        const merge_slot *m = merge_find(t, a->id, s->sym[a->next].id);
        if (!m || m->id != c.id)
            continue;
        symbol *b = &s->sym[a->next];
        a->id = c.id;
        b->alive = 0;
        a->next = b->next;
        if (b->next >= 0)
            s->sym[b->next].prev = c.pos;
        if (a->prev >= 0)
            push_pair(t, s, a->prev);
        push_pair(t, s, c.pos);
    }
    for (int32_t i = 0; i >= 0; i = s->sym[i].next)
        if (idvec_push(out, s->sym[i].id))
            return -1;
    return 0;
}

static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    h = mix64(h);
    return h ? h : 1;
}

static int grow_bytes(void **buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 4096;
    while (c < need)
        c *= 2;
    void *nb = realloc(*buf, c * elem);
    if (!nb)
        return -1;
    *buf = nb;
    *cap = c;
    return 0;
}

/* bpe_piece_uncached through the cache. */
static int bpe_piece(const sfi_tokenizer *t, bpe_scratch *s, const uint8_t *p, size_t n, idvec *out)
{
    if (n == 1 || n > CACHE_MAX_PIECE)
        return bpe_piece_uncached(t, s, p, n, out);
    if (!s->slots && !(s->slots = calloc(CACHE_SLOTS, sizeof *s->slots)))
        return -1;
    uint64_t h = hash_bytes(p, n);
    size_t mask = CACHE_SLOTS - 1, i = (size_t)h & mask;
    for (; s->slots[i].hash; i = (i + 1) & mask) {
        cache_slot *c = &s->slots[i];
        if (c->hash == h && c->key_len == n && !memcmp(s->keys + c->key_off, p, n)) {
            for (size_t k = 0; k < c->n_ids; k++)
                if (idvec_push(out, s->ids[c->ids_off + k]))
                    return -1;
            return 0;
        }
    }
    size_t before = out->n;
    if (bpe_piece_uncached(t, s, p, n, out))
        return -1;
    size_t nids = out->n - before;
    if (s->used >= CACHE_MAX_USED) {
        /* Full: start over rather than evict (text this varied gains
         * little from a cache anyway). */
        memset(s->slots, 0, CACHE_SLOTS * sizeof *s->slots);
        s->used = s->keys_n = s->ids_n = 0;
        for (i = (size_t)h & mask; s->slots[i].hash; i = (i + 1) & mask)
            ;
    }
    if (grow_bytes((void **)&s->keys, &s->keys_cap, s->keys_n + n, 1) ||
        grow_bytes((void **)&s->ids, &s->ids_cap, s->ids_n + nids, sizeof *s->ids))
        return -1;
    memcpy(s->keys + s->keys_n, p, n);
    memcpy(s->ids + s->ids_n, out->v + before, nids * sizeof *s->ids);
    s->slots[i] =
        (cache_slot){h, (uint32_t)s->keys_n, (uint32_t)s->ids_n, (uint16_t)n, (uint16_t)nids};
    s->keys_n += n;
    s->ids_n += nids;
    s->used++;
    return 0;
}

/* Pre-tokenizes one normalized segment (valid UTF-8) and BPE-encodes each
 * piece. Text between matches (none with Qwen's pattern, which matches
 * every character) would be a piece of its own, as tokenizers' "isolated"
 * split does. */
static sfi_status encode_segment(const sfi_tokenizer *t, const uint8_t *seg, size_t len,
                                 pcre2_match_data *md, bpe_scratch *s, idvec *out, sfi_error *err)
{
    size_t start = 0;
    while (start < len) {
        int rc = pcre2_match(t->re, seg, len, start, PCRE2_NO_UTF_CHECK, md, NULL);
        size_t m0, m1;
        if (rc == PCRE2_ERROR_NOMATCH) {
            m0 = m1 = len;
        } else if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return sfi_error_set(err, SFI_EINVAL, "tokenizer: pre-tokenization failed: %s",
                                 (const char *)msg);
        } else {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            m0 = ov[0];
            m1 = ov[1];
        }
        if (m0 > start && bpe_piece(t, s, seg + start, m0 - start, out))
            return sfi_error_set(err, SFI_ENOMEM, "tokenizer: out of memory");
        if (m1 > m0 && bpe_piece(t, s, seg + m0, m1 - m0, out))
            return sfi_error_set(err, SFI_ENOMEM, "tokenizer: out of memory");
        if (m1 == m0 && m0 < len) {
            /* An empty match cannot come from Qwen's pattern; step over one
             * character so a different pattern cannot loop forever. */
            uint32_t cp;
            size_t k = sfi_utf8_decode(seg + m0, len - m0, &cp);
            if (bpe_piece(t, s, seg + m0, k ? k : 1, out))
                return sfi_error_set(err, SFI_ENOMEM, "tokenizer: out of memory");
            m1 = m0 + (k ? k : 1);
        }
        start = m1 > start ? m1 : len;
    }
    return SFI_OK;
}

/* The added token starting at text[i] (longest), or -1. */
static int32_t added_at(const sfi_vocab *v, const uint8_t *text, size_t len, size_t i, size_t *mlen)
{
    int32_t best = -1;
    size_t bl = 0;
    int32_t na = sfi_vocab_added_count(v);
    for (int32_t k = 0; k < na; k++) {
        int32_t id = sfi_vocab_added_id(v, k);
        size_t n;
        const uint8_t *b = sfi_vocab_token_bytes(v, id, &n);
        if (n > bl && n <= len - i && b[0] == text[i] && !memcmp(b, text + i, n)) {
            best = id;
            bl = n;
        }
    }
    *mlen = bl;
    return best;
}

sfi_status sfi_tokenizer_encode(const sfi_tokenizer *t, const char *text, size_t len, int32_t **ids,
                                size_t *n, sfi_error *err)
{
    *ids = NULL;
    *n = 0;
    const uint8_t *u = (const uint8_t *)text;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = sfi_utf8_decode(u + i, len - i, &cp);
        if (!k)
            return sfi_error_set(err, SFI_EINVAL, "text: byte %zu: not valid UTF-8", i);
        i += k;
    }
    /* First bytes of added tokens, to skip the search at most positions. */
    uint8_t first[256] = {0};
    const sfi_vocab *v = t->vocab;
    for (int32_t k = 0; k < sfi_vocab_added_count(v); k++) {
        size_t bl;
        first[sfi_vocab_token_bytes(v, sfi_vocab_added_id(v, k), &bl)[0]] = 1;
    }
    idvec out = {0};
    bpe_scratch s = {0};
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
    sfi_nfc_buf nb = {0};
    sfi_status st = md ? SFI_OK : sfi_error_set(err, SFI_ENOMEM, "tokenizer: out of memory");
    size_t seg = 0;
    for (size_t i = 0; i <= len && !st;) {
        size_t ml = 0;
        int32_t aid = i < len && first[u[i]] ? added_at(v, u, len, i, &ml) : -1;
        if (aid < 0 && i < len) {
            i++;
            continue;
        }
        if (i > seg) {
            /* NFC only touches the text between added tokens: Qwen's added
             * tokens are "normalized": false. */
            const uint8_t *norm;
            size_t nlen;
            if (sfi_nfc(u + seg, i - seg, &nb, &norm, &nlen))
                st = sfi_error_set(err, SFI_ENOMEM, "tokenizer: out of memory");
            else
                st = encode_segment(t, norm, nlen, md, &s, &out, err);
        }
        if (st || i == len)
            break;
        if (idvec_push(&out, aid))
            st = sfi_error_set(err, SFI_ENOMEM, "tokenizer: out of memory");
        i += ml;
        seg = i;
    }
    if (md)
        pcre2_match_data_free(md);
    sfi_nfc_buf_free(&nb);
    free(s.sym);
    free(s.heap);
    free(s.slots);
    free(s.keys);
    free(s.ids);
    if (!st && !out.v && !(out.v = malloc(sizeof *out.v)))
        st = sfi_error_set(err, SFI_ENOMEM, "tokenizer: out of memory");
    if (st) {
        free(out.v);
        return st;
    }
    *ids = out.v;
    *n = out.n;
    return SFI_OK;
}

sfi_status sfi_tokenizer_decode(const sfi_tokenizer *t, const int32_t *ids, size_t n, char **text,
                                size_t *len, sfi_error *err)
{
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t bl;
        if (!sfi_vocab_token_bytes(t->vocab, ids[i], &bl))
            return sfi_error_set(err, SFI_EINVAL,
                                 "ids: %zu: %ld is not a token of this vocabulary (size %d)", i,
                                 (long)ids[i], (int)sfi_vocab_size(t->vocab));
        total += bl;
    }
    char *o = malloc(total + 1);
    if (!o)
        return sfi_error_set(err, SFI_ENOMEM, "tokenizer: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t bl;
        const uint8_t *b = sfi_vocab_token_bytes(t->vocab, ids[i], &bl);
        memcpy(o + k, b, bl);
        k += bl;
    }
    o[k] = '\0';
    *text = o;
    *len = k;
    return SFI_OK;
}

sfi_status sfi_token_ids_parse(const char *text, size_t len, const char *origin, int32_t **ids,
                               size_t *n, sfi_error *err)
{
    *ids = NULL;
    *n = 0;
    idvec out = {0};
    size_t i = 0, count = 0;
    for (;;) {
        while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' ||
                           text[i] == '\r' || text[i] == '\v' || text[i] == '\f'))
            i++;
        if (i == len)
            break;
        size_t w = i;
        while (i < len && !(text[i] == ' ' || text[i] == '\t' || text[i] == '\n' ||
                            text[i] == '\r' || text[i] == '\v' || text[i] == '\f'))
            i++;
        count++;
        /* 9 digits at most: every id fits in int32_t, and a longer number
         * cannot be a token of any vocabulary sfi loads. */
        int ok = i - w <= 9;
        long v = 0;
        for (size_t k = w; k < i && ok; k++) {
            ok = text[k] >= '0' && text[k] <= '9';
            v = v * 10 + (text[k] - '0');
        }
        if (!ok) {
            free(out.v);
            /* A NUL would end the quoted word early (and once ended the
             * whole list in a strtol loop: issue 20.6): name it. */
            const char *nul = memchr(text + w, '\0', i - w);
            if (nul)
                return sfi_error_set(err, SFI_EFORMAT,
                                     "%s: byte %zu is a NUL byte, not part of "
                                     "a decimal token id",
                                     origin, (size_t)(nul - text));
            int digits = 1;
            for (size_t k = w; k < i; k++)
                digits &= text[k] >= '0' && text[k] <= '9';
            if (digits)
                return sfi_error_set(err, SFI_EFORMAT,
                                     "%s: id %zu: '%.*s' is too large for a "
                                     "token id (at most 9 digits)",
                                     origin, count, (int)(i - w > 40 ? 40 : i - w), text + w);
            return sfi_error_set(err, SFI_EFORMAT, "%s: id %zu: '%.*s' is not a decimal token id",
                                 origin, count, (int)(i - w > 40 ? 40 : i - w), text + w);
        }
        if (idvec_push(&out, (int32_t)v)) {
            free(out.v);
            return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", origin);
        }
    }
    if (!out.v && !(out.v = malloc(sizeof *out.v)))
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", origin);
    *ids = out.v;
    *n = out.n;
    return SFI_OK;
}
