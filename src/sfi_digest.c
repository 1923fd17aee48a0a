/* SHA-256 through OpenSSL's EVP interface; see sfi_digest.h. */
#include <config.h>

#include "sfi_digest.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

sfi_status sfi_hasher_init(sfi_hasher *h, sfi_error *err)
{
    h->ctx = NULL;
    h->failed = 0;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c)
        return sfi_error_set(err, SFI_ENOMEM, "sha256: out of memory");
    if (EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(c);
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "sha256: libcrypto refused to initialise SHA-256");
    }
    h->ctx = c;
    return SFI_OK;
}

void sfi_hasher_update(sfi_hasher *h, const void *data, size_t n)
{
    if (!h->ctx) {
        h->failed = 1;
        return;
    }
    if (n && EVP_DigestUpdate((EVP_MD_CTX *)h->ctx, data, n) != 1)
        h->failed = 1;
}

/* Chunked so the byte-order conversion needs no allocation. */
#define CHUNK 256

void sfi_hasher_update_f32(sfi_hasher *h, const float *x, size_t n)
{
    uint8_t buf[CHUNK * 4];
    while (n) {
        size_t m = n < CHUNK ? n : CHUNK;
        for (size_t i = 0; i < m; i++) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            buf[4 * i + 0] = (uint8_t)u;
            buf[4 * i + 1] = (uint8_t)(u >> 8);
            buf[4 * i + 2] = (uint8_t)(u >> 16);
            buf[4 * i + 3] = (uint8_t)(u >> 24);
        }
        sfi_hasher_update(h, buf, 4 * m);
        x += m;
        n -= m;
    }
}

void sfi_hasher_update_i32(sfi_hasher *h, const int32_t *x, size_t n)
{
    uint8_t buf[CHUNK * 4];
    while (n) {
        size_t m = n < CHUNK ? n : CHUNK;
        for (size_t i = 0; i < m; i++) {
            uint32_t u = (uint32_t)x[i];
            for (int b = 0; b < 4; b++)
                buf[4 * i + (size_t)b] = (uint8_t)(u >> (8 * b));
        }
        sfi_hasher_update(h, buf, 4 * m);
        x += m;
        n -= m;
    }
}

void sfi_hasher_update_i64(sfi_hasher *h, const int64_t *x, size_t n)
{
    uint8_t buf[CHUNK * 8];
    while (n) {
        size_t m = n < CHUNK ? n : CHUNK;
        for (size_t i = 0; i < m; i++) {
            uint64_t u = (uint64_t)x[i];
            for (int b = 0; b < 8; b++)
                buf[8 * i + (size_t)b] = (uint8_t)(u >> (8 * b));
        }
        sfi_hasher_update(h, buf, 8 * m);
        x += m;
        n -= m;
    }
}

void sfi_hasher_update_str(sfi_hasher *h, const char *s)
{
    sfi_hasher_update(h, s, strlen(s) + 1);
}

static void to_hex(const uint8_t *raw, char *hex)
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < SFI_DIGEST_LEN; i++) {
        hex[2 * i] = digits[raw[i] >> 4];
        hex[2 * i + 1] = digits[raw[i] & 15];
    }
    hex[SFI_DIGEST_HEX_LEN] = '\0';
}

sfi_status sfi_hasher_final_hex(sfi_hasher *h, char hex[SFI_DIGEST_HEX_LEN + 1], uint8_t *raw,
                                sfi_error *err)
{
    uint8_t md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    hex[0] = '\0';
    if (!h->ctx || h->failed) {
        sfi_hasher_free(h);
        return sfi_error_set(err, SFI_EINVAL, "sha256: hasher not initialised or an update failed");
    }
    int ok = EVP_DigestFinal_ex((EVP_MD_CTX *)h->ctx, md, &len) == 1 && len == SFI_DIGEST_LEN;
    sfi_hasher_free(h);
    if (!ok)
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "sha256: libcrypto failed to finish the digest");
    to_hex(md, hex);
    if (raw)
        memcpy(raw, md, SFI_DIGEST_LEN);
    return SFI_OK;
}

void sfi_hasher_free(sfi_hasher *h)
{
    if (h->ctx)
        EVP_MD_CTX_free((EVP_MD_CTX *)h->ctx);
    h->ctx = NULL;
}

sfi_status sfi_digest_buffer_hex(const void *data, size_t n, char hex[SFI_DIGEST_HEX_LEN + 1],
                                 sfi_error *err)
{
    sfi_hasher h;
    sfi_status st = sfi_hasher_init(&h, err);
    if (st != SFI_OK)
        return st;
    sfi_hasher_update(&h, data, n);
    return sfi_hasher_final_hex(&h, hex, NULL, err);
}

sfi_status sfi_digest_f32_hex(const float *x, size_t n, char hex[SFI_DIGEST_HEX_LEN + 1],
                              sfi_error *err)
{
    sfi_hasher h;
    sfi_status st = sfi_hasher_init(&h, err);
    if (st != SFI_OK)
        return st;
    sfi_hasher_update_f32(&h, x, n);
    return sfi_hasher_final_hex(&h, hex, NULL, err);
}

sfi_status sfi_digest_file_hex(const char *path, char hex[SFI_DIGEST_HEX_LEN + 1], sfi_error *err)
{
    hex[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f)
        return sfi_error_set(err, SFI_EIO, "%s: cannot open: %s", path, strerror(errno));
    sfi_hasher h;
    sfi_status st = sfi_hasher_init(&h, err);
    if (st != SFI_OK) {
        fclose(f);
        return sfi_error_prefix(err, "%s", path);
    }
    static const size_t bufsz = 1 << 16;
    uint8_t buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, bufsz, f)) > 0)
        sfi_hasher_update(&h, buf, got);
    if (ferror(f)) {
        int e = errno;
        fclose(f);
        sfi_hasher_free(&h);
        return sfi_error_set(err, SFI_EIO, "%s: read error: %s", path, e ? strerror(e) : "unknown");
    }
    fclose(f);
    st = sfi_hasher_final_hex(&h, hex, NULL, err);
    if (st != SFI_OK)
        sfi_error_prefix(err, "%s", path);
    return st;
}
