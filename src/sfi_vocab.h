/* Tokenizer vocabulary (Hugging Face byte-level BPE: vocab.json +
 * tokenizer_config.json's added tokens), decoded to raw bytes per token id,
 * and the trigger set of sfi(7) TRIGGERS. */
#ifndef SFI_VOCAB_H
#define SFI_VOCAB_H

#include <stddef.h>
#include <stdint.h>
#include "sfi_error.h"

typedef struct sfi_vocab sfi_vocab;

/* Loads DIR/vocab.json and, when present, DIR/tokenizer_config.json. */
SFI_NODISCARD sfi_status sfi_vocab_load(const char *dir, sfi_vocab **out, sfi_error *err);
void sfi_vocab_free(sfi_vocab *v);

/* One past the largest id (ids without a token are holes: bytes == NULL). */
int32_t sfi_vocab_size(const sfi_vocab *v);
/* The token's decoded bytes (GPT-2 byte-to-unicode mapping undone; added
 * tokens as their UTF-8 content). NULL for a hole. */
const uint8_t *sfi_vocab_token_bytes(const sfi_vocab *v, int32_t id, size_t *len);
/* The token's string as stored in vocab.json (byte-level form, UTF-8). */
const char *sfi_vocab_token_text(const sfi_vocab *v, int32_t id);
/* Id of a vocab.json string, or -1. */
int32_t sfi_vocab_lookup(const sfi_vocab *v, const char *text);
int sfi_vocab_is_special(const sfi_vocab *v, int32_t id);
/* Added tokens (tokenizer_config.json's added_tokens_decoder, special or
 * not): matched literally in text before BPE. */
int sfi_vocab_is_added(const sfi_vocab *v, int32_t id);
int32_t sfi_vocab_added_count(const sfi_vocab *v);
int32_t sfi_vocab_added_id(const sfi_vocab *v, int32_t i); /* i-th, id order */

/* GPT-2 byte-level alphabet: the code point standing for byte b, and the
 * byte a code point stands for (-1 when it stands for none). */
uint32_t sfi_unicode_of_byte(uint8_t b);
int sfi_byte_of_unicode(uint32_t cp);
/* One strict UTF-8 character of s[0..len): its length, 0 when invalid. */
size_t sfi_utf8_decode(const uint8_t *s, size_t len, uint32_t *cp);

/* bytes as readable text (malloc'd, NUL-terminated; NULL on ENOMEM):
 * printable ASCII as is, \n \t \r \\ \" escaped, valid multi-byte UTF-8
 * kept, every other byte as \xHH. */
char *sfi_escape_bytes(const uint8_t *b, size_t n);

/* s[0..n) as valid UTF-8, for JSON and other text-only outputs: valid
 * characters (NUL included) kept, every byte that does not start one
 * replaced by U+FFFD. Decoded token bytes need not be valid (a byte-level
 * token may hold part of a character). malloc'd, NUL-terminated, length in
 * *out_n; NULL on ENOMEM. */
char *sfi_utf8_clean(const char *s, size_t n, size_t *out_n);

/* sfi(7) TRIGGERS's default: . ? ! ; and newline. */
#ifndef SFI_TRIGGER_CHARS_DEFAULT
#define SFI_TRIGGER_CHARS_DEFAULT ".?!;\n"
#endif

typedef struct {
    int32_t n_vocab;
    uint8_t *is_trigger; /* [n_vocab] 0/1 */
    int32_t *ids;        /* sorted member ids */
    int32_t n_ids;
} sfi_trigger_set;

/* Token ids whose decoded text, trailing spaces removed, ends with one of
 * chars (UTF-8 characters; NULL: SFI_TRIGGER_CHARS_DEFAULT), or whose text
 * contains a newline (sfi(7) TRIGGERS). Holes are never members. */
SFI_NODISCARD sfi_status sfi_trigger_set_build(const sfi_vocab *v, const char *chars,
                                               sfi_trigger_set *out, sfi_error *err);
void sfi_trigger_set_free(sfi_trigger_set *t);

#endif
