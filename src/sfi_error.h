/* Errors of libsfi: a status code plus a message that names the file, the
 * field and the problem. The library never exits or aborts; every fallible
 * function returns an sfi_status and fills an optional sfi_error. */
#ifndef SFI_ERROR_H
#define SFI_ERROR_H

#include <stdarg.h>

typedef enum {
    SFI_OK = 0,
    SFI_EINVAL,       /* a caller's argument or a user's value is wrong */
    SFI_EIO,          /* a file could not be opened, read or written */
    SFI_EFORMAT,      /* a file's contents do not follow their format */
    SFI_ENOMEM,       /* an allocation failed */
    SFI_ERANGE,       /* a value or size is outside what is allowed */
    SFI_ENOTFOUND,    /* a named thing (file, tensor, preset, key) is absent */
    SFI_EUNSUPPORTED, /* valid but not something sfi handles */
    SFI_EVERSION,     /* a file was written by a newer, incompatible version */
    SFI_ENODEVICE     /* no GPU where one was needed */
} sfi_status;

/* On a function returning sfi_status: a caller that drops the status gets a
 * warning (an error under --enable-werror). A status dropped on purpose is
 * taken with SFI_IGNORE_STATUS, next to a comment saying why: gcc does not
 * accept a (void) cast as taking the value. No-op for other compilers. */
#if defined(__GNUC__)
#define SFI_NODISCARD __attribute__((warn_unused_result))
#else
#define SFI_NODISCARD
#endif
#define SFI_IGNORE_STATUS(call)                                                                    \
    do {                                                                                           \
        if (call) {                                                                                \
        }                                                                                          \
    } while (0)

#define SFI_ERROR_MSG_MAX 1024

typedef struct {
    sfi_status code;
    char msg[SFI_ERROR_MSG_MAX];
} sfi_error;

/* Clears err (may be NULL). */
void sfi_error_clear(sfi_error *err);

/* Records code and a printf-style message in err (may be NULL) and returns
 * code, so callers can write `return sfi_error_set(err, SFI_EFORMAT, ...)`.
 * Convention for the message: "FILE: FIELD: problem" (leave out what does
 * not apply). */
sfi_status sfi_error_set(sfi_error *err, sfi_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to err's message (e.g. the file name an inner parser
 * did not know). Returns err's code. */
sfi_status sfi_error_prefix(sfi_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A short stable name for a code, e.g. "format". */
const char *sfi_status_name(sfi_status code);

#endif
