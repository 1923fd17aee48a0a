/* libFuzzer harness: a tokenizer directory (vocab.json, merges.txt,
 * tokenizer_config.json) and a text -> sfi_vocab_load, sfi_tokenizer_load,
 * sfi_trigger_set_build, sfi_tokenizer_encode/decode.
 *
 * Input: the parts separated by "\n---8<---\n": vocab.json, merges.txt,
 * tokenizer_config.json, text. A missing part is a missing file (or no
 * text). Invariants: refusals have messages; every id encode returns
 * decodes; decoding those ids gives back text whose bytes equal encode's
 * input when the input is already NFC (checked for ASCII input). */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sfi_tokenizer.h"
#include "sfi_vocab.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *part[4];
    size_t len[4];
    size_t n = fuzz_split(data, size, "\n---8<---\n", part, len, 4);
    static const char *names[3] = {"vocab.json", "merges.txt", "tokenizer_config.json"};
    for (size_t i = 0; i < 3; i++)
        fuzz_file(names[i], i < n ? part[i] : NULL, i < n ? len[i] : 0);
    const char *dir = fuzz_tmpdir();
    sfi_error err;
    sfi_error_clear(&err);

    sfi_vocab *v = NULL;
    if (sfi_vocab_load(dir, &v, &err) == SFI_OK) {
        sfi_trigger_set ts;
        if (sfi_trigger_set_build(v, NULL, &ts, &err) == SFI_OK) {
            for (int32_t i = 0; i < ts.n_ids; i++)
                if (ts.ids[i] < 0 || ts.ids[i] >= sfi_vocab_size(v) || !ts.is_trigger[ts.ids[i]])
                    abort();
            sfi_trigger_set_free(&ts);
        }
        for (int32_t id = 0; id < sfi_vocab_size(v) && id < 4096; id++) {
            size_t bl;
            const uint8_t *b = sfi_vocab_token_bytes(v, id, &bl);
            if (b) {
                char *e = sfi_escape_bytes(b, bl);
                free(e);
            }
        }
        sfi_vocab_free(v);
    } else if (!err.msg[0]) {
        abort();
    }

    sfi_tokenizer *t = NULL;
    sfi_error_clear(&err);
    if (sfi_tokenizer_load(dir, &t, &err) != SFI_OK) {
        if (!err.msg[0])
            abort();
        return 0;
    }
    const char *text = n > 3 ? (const char *)part[3] : "Hello, world.\n";
    size_t tl = n > 3 ? len[3] : strlen(text);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (sfi_tokenizer_encode(t, text, tl, &ids, &n_ids, &err) == SFI_OK) {
        char *back = NULL;
        size_t bl = 0;
        if (sfi_tokenizer_decode(t, ids, n_ids, &back, &bl, &err) != SFI_OK)
            abort(); /* encode's own ids must decode */
        int ascii = 1;
        for (size_t i = 0; i < tl; i++)
            ascii &= ((const uint8_t *)text)[i] < 0x80;
        /* ASCII is NFC already, so decoding must give the text back --
         * unless the vocabulary lacks a byte, which encode reports. */
        if (ascii && (bl != tl || memcmp(back, text, tl)))
            abort();
        free(back);
    }
    free(ids);
    /* The text as an id list (--prompt-ids, sfi-ref decode): what parses
     * holds no NUL byte and prints back to the same ids. */
    int32_t *pid = NULL;
    size_t npid = 0;
    if (sfi_token_ids_parse(text, tl, "ids", &pid, &npid, &err) == SFI_OK) {
        if (memchr(text, '\0', tl))
            abort();
        char *buf = malloc(npid * 11 + 1);
        size_t off = 0;
        for (size_t i = 0; buf && i < npid; i++)
            off += (size_t)sprintf(buf + off, "%s%d", i ? " " : "", (int)pid[i]);
        int32_t *again = NULL;
        size_t nagain = 0;
        if (!buf || sfi_token_ids_parse(buf, off, "ids", &again, &nagain, &err) != SFI_OK ||
            nagain != npid || (npid && memcmp(again, pid, npid * sizeof *pid)))
            abort();
        free(again);
        free(buf);
    } else if (!err.msg[0] || strncmp(err.msg, "ids: ", 5)) {
        abort();
    }
    free(pid);
    /* Ids from the input itself: out-of-range ones are errors, not reads. */
    int32_t raw[16];
    size_t nr = size / 4 < 16 ? size / 4 : 16;
    memcpy(raw, data, nr * 4);
    char *txt = NULL;
    size_t txl = 0;
    if (sfi_tokenizer_decode(t, raw, nr, &txt, &txl, &err) == SFI_OK)
        free(txt);
    sfi_tokenizer_free(t);
    return 0;
}
