/* NFC: full canonical decomposition, canonical ordering, canonical
 * composition (UAX #15), with Hangul done arithmetically. */
#include <config.h>

#include "sfi_nfc.h"

#include <stdlib.h>
#include <string.h>

#include "sfi_nfc_tables.h"
#include "sfi_vocab.h"

#define N_CCC (sizeof nfc_ccc / sizeof nfc_ccc[0])
#define N_DECOMP (sizeof nfc_decomp / sizeof nfc_decomp[0])
#define N_COMP (sizeof nfc_comp / sizeof nfc_comp[0])

enum {
    SBASE = 0xAC00,
    LBASE = 0x1100,
    VBASE = 0x1161,
    TBASE = 0x11A7,
    LCOUNT = 19,
    VCOUNT = 21,
    TCOUNT = 28,
    NCOUNT = VCOUNT * TCOUNT,
    SCOUNT = LCOUNT * NCOUNT
};

const char *sfi_nfc_unicode_version(void)
{
    return SFI_NFC_UNICODE_VERSION;
}

static int ccc_of(uint32_t cp)
{
    if (cp < 0x300)
        return 0;
    size_t lo = 0, hi = N_CCC;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (nfc_ccc[mid][0] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < N_CCC && nfc_ccc[lo][0] == cp ? (int)nfc_ccc[lo][1] : 0;
}

static const uint32_t *decomp_of(uint32_t cp, size_t *n)
{
    if (cp < 0xC0)
        return NULL;
    size_t lo = 0, hi = N_DECOMP;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (nfc_decomp[mid][0] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < N_DECOMP && nfc_decomp[lo][0] == cp) {
        *n = nfc_decomp[lo][2];
        return nfc_decomp_cps + nfc_decomp[lo][1];
    }
    return NULL;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
        b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = N_COMP;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (nfc_comp[mid][0] < a || (nfc_comp[mid][0] == a && nfc_comp[mid][1] < b))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < N_COMP && nfc_comp[lo][0] == a && nfc_comp[lo][1] == b ? nfc_comp[lo][2] : 0;
}

static int reserve(sfi_nfc_buf *b, size_t n)
{
    if (n <= b->cap)
        return 0;
    size_t cap = n + n / 2 + 64;
    uint32_t *c = realloc(b->cps, cap * sizeof *c);
    if (!c)
        return -1;
    b->cps = c;
    b->cap = cap;
    return 0;
}

static size_t put_utf8(uint8_t *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Stable sort of cps[r..e) by combining class in O(n + 256): a long run of
 * marks (hostile or broken text) must not cost O(n^2) as insertion sort
 * would. */
static int counting_sort(sfi_nfc_buf *b, size_t r, size_t e)
{
    size_t n = e - r;
    if (n > b->tmp_cap) {
        uint32_t *t = realloc(b->tmp, n * sizeof *t);
        if (!t)
            return -1;
        b->tmp = t;
        b->tmp_cap = n;
    }
    size_t start[257] = {0};
    for (size_t x = r; x < e; x++)
        start[ccc_of(b->cps[x]) + 1]++;
    for (int c = 1; c <= 256; c++)
        start[c] += start[c - 1];
    for (size_t x = r; x < e; x++)
        b->tmp[start[ccc_of(b->cps[x])]++] = b->cps[x];
    memcpy(b->cps + r, b->tmp, n * sizeof *b->tmp);
    return 0;
}

int sfi_nfc(const uint8_t *s, size_t len, sfi_nfc_buf *b, const uint8_t **out, size_t *outlen)
{
    size_t i = 0;
    /* Below U+0300 nothing reorders or composes except Latin-1 letters
     * followed by combining marks, which are >= U+0300: ASCII alone is
     * always NFC. */
    while (i < len && s[i] < 0x80)
        i++;
    if (i == len) {
        *out = s;
        *outlen = len;
        return 0;
    }
    /* 1. Full canonical decomposition. The longest full decomposition is
     * 4 code points, Hangul's 3. */
    size_t n = 0;
    if (reserve(b, 4 * len + 4))
        return -1;
    for (i = 0; i < len;) {
        uint32_t cp;
        size_t k = sfi_utf8_decode(s + i, len - i, &cp);
        if (!k) { /* callers validate; treat a stray byte as itself */
            cp = 0xFFFD;
            k = 1;
        }
        i += k;
        size_t dn;
        const uint32_t *d;
        if (cp >= SBASE && cp < SBASE + SCOUNT) {
            uint32_t si = cp - SBASE;
            b->cps[n++] = LBASE + si / NCOUNT;
            b->cps[n++] = VBASE + (si % NCOUNT) / TCOUNT;
            if (si % TCOUNT)
                b->cps[n++] = TBASE + si % TCOUNT;
        } else if ((d = decomp_of(cp, &dn)) != NULL) {
            memcpy(b->cps + n, d, dn * sizeof *d);
            n += dn;
        } else {
            b->cps[n++] = cp;
        }
    }
    /* 2. Canonical ordering: stable sort of each run of non-starters by
     * combining class. */
    for (size_t r = 0; r < n;) {
        if (ccc_of(b->cps[r]) == 0) {
            r++;
            continue;
        }
        size_t e = r;
        while (e < n && ccc_of(b->cps[e]) != 0)
            e++;
        if (e - r <= 32) {
            for (size_t x = r + 1; x < e; x++) {
                uint32_t c = b->cps[x];
                int cc = ccc_of(c);
                size_t y = x;
                while (y > r && ccc_of(b->cps[y - 1]) > cc) {
                    b->cps[y] = b->cps[y - 1];
                    y--;
                }
                b->cps[y] = c;
            }
        } else if (counting_sort(b, r, e)) {
            return -1;
        }
        r = e;
    }
    /* 3. Canonical composition: a character joins the last starter unless
     * a character between them has a class >= its own (blocked). */
    size_t m = 0;
    if (n) {
        size_t starter = 0;
        int last = ccc_of(b->cps[0]) ? 256 : 0;
        m = 1;
        for (size_t x = 1; x < n; x++) {
            uint32_t c = b->cps[x];
            int cc = ccc_of(c);
            /* Every second character of a composition is >= U+0300. */
            uint32_t comp = c >= 0x300 ? compose(b->cps[starter], c) : 0;
            if (comp && (last < cc || last == 0)) {
                b->cps[starter] = comp;
                continue;
            }
            if (cc == 0)
                starter = m;
            last = cc;
            b->cps[m++] = c;
        }
    }
    /* 4. Back to UTF-8. */
    if (4 * m + 1 > b->out_cap) {
        uint8_t *o = realloc(b->out, 4 * m + 1);
        if (!o)
            return -1;
        b->out = o;
        b->out_cap = 4 * m + 1;
    }
    size_t k = 0;
    for (size_t x = 0; x < m; x++)
        k += put_utf8(b->out + k, b->cps[x]);
    *out = b->out;
    *outlen = k;
    return 0;
}

void sfi_nfc_buf_free(sfi_nfc_buf *b)
{
    free(b->cps);
    free(b->out);
    free(b->tmp);
    memset(b, 0, sizeof *b);
}
