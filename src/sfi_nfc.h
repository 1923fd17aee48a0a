/* Unicode Normalization Form C, which Qwen's tokenizer applies to text
 * before pre-tokenization. Tables from src/gen_nfc_tables.py. */
#ifndef SFI_NFC_H
#define SFI_NFC_H

#include <stddef.h>
#include <stdint.h>

/* Reusable scratch of sfi_nfc (zero-initialize; free with
 * sfi_nfc_buf_free). */
typedef struct {
    uint32_t *cps;
    size_t cap;
    uint8_t *out;
    size_t out_cap;
    uint32_t *tmp; /* sorting scratch */
    size_t tmp_cap;
} sfi_nfc_buf;

/* NFC of the valid UTF-8 s[0..len): *out points at s itself when nothing
 * changes (e.g. ASCII), else into b. Returns 0, or -1 when out of memory. */
int sfi_nfc(const uint8_t *s, size_t len, sfi_nfc_buf *b, const uint8_t **out, size_t *outlen);
void sfi_nfc_buf_free(sfi_nfc_buf *b);

/* The Unicode version of the tables. */
const char *sfi_nfc_unicode_version(void);

#endif
