/* SHA-256 digests (OpenSSL libcrypto EVP) of buffers, files and float
 * arrays, as lowercase hex. The golden-digest tests, `sfi-ref digest`, the
 * run digest of `sfi-ref run` and the GPU checker all hash through here so
 * that the same values give the same digest everywhere.
 *
 * Floats and integers are hashed as their little-endian bytes (IEEE-754
 * binary32 bit pattern for floats), independent of the host's byte order,
 * so a digest pins the exact bits, not a printed rounding. */
#ifndef SFI_DIGEST_H
#define SFI_DIGEST_H

#include <stddef.h>
#include <stdint.h>
#include "sfi_error.h"

#define SFI_DIGEST_LEN 32                       /* raw SHA-256 bytes */
#define SFI_DIGEST_HEX_LEN (2 * SFI_DIGEST_LEN) /* hex chars, without NUL */

/* Incremental hasher. Initialise with sfi_hasher_init; finish with
 * sfi_hasher_final_hex (which also releases it) or drop it with
 * sfi_hasher_free. A zeroed struct is a valid "not initialised" value and
 * may be freed. */
typedef struct {
    void *ctx;  /* EVP_MD_CTX * */
    int failed; /* a previous update failed: final reports an error */
} sfi_hasher;

SFI_NODISCARD sfi_status sfi_hasher_init(sfi_hasher *h, sfi_error *err);
/* Raw bytes. */
void sfi_hasher_update(sfi_hasher *h, const void *data, size_t n);
/* n floats as 4 little-endian bytes each (bit pattern, -0.0 != 0.0, NaN
 * payloads kept). */
void sfi_hasher_update_f32(sfi_hasher *h, const float *x, size_t n);
/* n int32 / int64 as little-endian two's complement bytes. */
void sfi_hasher_update_i32(sfi_hasher *h, const int32_t *x, size_t n);
void sfi_hasher_update_i64(sfi_hasher *h, const int64_t *x, size_t n);
/* A NUL-terminated string's bytes followed by one 0 byte (so "ab","c" and
 * "a","bc" hash differently): for labelling sections of a digest. */
void sfi_hasher_update_str(sfi_hasher *h, const char *s);
/* Writes SFI_DIGEST_HEX_LEN hex chars + NUL into hex (and, when raw is not
 * NULL, the SFI_DIGEST_LEN raw bytes) and releases the hasher. */
SFI_NODISCARD sfi_status sfi_hasher_final_hex(sfi_hasher *h, char hex[SFI_DIGEST_HEX_LEN + 1],
                                              uint8_t *raw, sfi_error *err);
void sfi_hasher_free(sfi_hasher *h);

/* One-shot digests. */
SFI_NODISCARD sfi_status sfi_digest_buffer_hex(const void *data, size_t n,
                                               char hex[SFI_DIGEST_HEX_LEN + 1], sfi_error *err);
SFI_NODISCARD sfi_status sfi_digest_f32_hex(const float *x, size_t n,
                                            char hex[SFI_DIGEST_HEX_LEN + 1], sfi_error *err);
/* Streams the file (any size). Errors name the file. */
SFI_NODISCARD sfi_status sfi_digest_file_hex(const char *path, char hex[SFI_DIGEST_HEX_LEN + 1],
                                             sfi_error *err);

#endif
