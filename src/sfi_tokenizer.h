/* Text <-> token ids with a Hugging Face Qwen2/Qwen3 tokenizer directory
 * (vocab.json + merges.txt + tokenizer_config.json): byte-level BPE, the
 * same steps as Hugging Face's Qwen2Tokenizer:
 *   1. added tokens (tokenizer_config.json's added_tokens_decoder, special
 *      or not) are matched literally first, leftmost-longest;
 *   2. the text between them is NFC-normalized;
 *   3. split by Qwen's pre-tokenization pattern (PCRE2, UTF + Unicode
 *      properties);
 *   4. each piece's bytes go through the GPT-2 byte-to-unicode mapping and
 *      are merged by merges.txt's ranks (lowest rank first, leftmost first).
 * Decoding concatenates the tokens' bytes (added tokens included). */
#ifndef SFI_TOKENIZER_H
#define SFI_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "sfi_error.h"
#include "sfi_vocab.h"

typedef struct sfi_tokenizer sfi_tokenizer;

/* Loads DIR/vocab.json, DIR/merges.txt and, when present,
 * DIR/tokenizer_config.json. Errors name the file (and line) and problem. */
SFI_NODISCARD sfi_status sfi_tokenizer_load(const char *dir, sfi_tokenizer **out, sfi_error *err);
void sfi_tokenizer_free(sfi_tokenizer *t);

/* The vocabulary inside (owned by t). */
const sfi_vocab *sfi_tokenizer_vocab(const sfi_tokenizer *t);

/* Token ids of text[0..len) (need not be NUL-terminated) into a malloc'd
 * array *ids of *n ids (non-NULL even when *n == 0; caller frees). Text that
 * is not valid UTF-8 is an error naming the byte offset. Thread-safe: t is
 * only read. */
SFI_NODISCARD sfi_status sfi_tokenizer_encode(const sfi_tokenizer *t, const char *text, size_t len,
                                              int32_t **ids, size_t *n, sfi_error *err);

/* The bytes of ids[0..n) concatenated into a malloc'd, NUL-terminated
 * *text of *len bytes (caller frees). The bytes need not be valid UTF-8
 * (a character may be split across ids). An id outside the vocabulary or a
 * hole is an error naming its index. */
SFI_NODISCARD sfi_status sfi_tokenizer_decode(const sfi_tokenizer *t, const int32_t *ids, size_t n,
                                              char **text, size_t *len, sfi_error *err);

/* Parses whitespace-separated decimal token ids (the output of sfi-ref
 * encode; --prompt-ids files) from text[0..len) into a malloc'd *ids of *n
 * (non-NULL even when empty; caller frees). origin names the input in
 * messages, e.g. "prompt.ids" -> "prompt.ids: id 3: 'x1' is not a decimal
 * token id". Ids are not checked against a vocabulary here (decode does). */
SFI_NODISCARD sfi_status sfi_token_ids_parse(const char *text, size_t len, const char *origin,
                                             int32_t **ids, size_t *n, sfi_error *err);

/* Qwen2/Qwen3's pre-tokenization pattern (Hugging Face's PRETOKENIZE_REGEX). */
extern const char sfi_qwen_pretokenize_pattern[];

#endif
