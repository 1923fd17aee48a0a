/* Tokenizer vocabulary (Hugging Face byte-level BPE: vocab.json +
 * tokenizer_config.json's added tokens), decoded to raw bytes per token id,
 * and the trigger set of method.md section 3. */
#ifndef SFI_VOCAB_H
#define SFI_VOCAB_H

#include <stddef.h>
#include <stdint.h>
#include "sfi_error.h"

typedef struct sfi_vocab sfi_vocab;

/* Loads DIR/vocab.json and, when present, DIR/tokenizer_config.json. */
sfi_status sfi_vocab_load(const char *dir, sfi_vocab **out, sfi_error *err);
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

typedef struct {
    int32_t n_vocab;
    uint8_t *is_trigger; /* [n_vocab] 0/1 */
    int32_t *ids;        /* sorted member ids */
    int32_t n_ids;
} sfi_trigger_set;

/* Token ids whose decoded text, trailing spaces removed, ends with one of
 * chars, or whose text contains a newline (method.md section 3). */
sfi_status sfi_trigger_set_build(const sfi_vocab *v, const char *chars,
                                 sfi_trigger_set *out, sfi_error *err);
void sfi_trigger_set_free(sfi_trigger_set *t);

#endif
