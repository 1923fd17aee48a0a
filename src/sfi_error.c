#include "sfi_error.h"

#include <stdio.h>
#include <string.h>

void sfi_error_clear(sfi_error *err)
{
    if (!err)
        return;
    err->code = SFI_OK;
    err->msg[0] = '\0';
}

sfi_status sfi_error_set(sfi_error *err, sfi_status code, const char *fmt, ...)
{
    if (!err)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

sfi_status sfi_error_prefix(sfi_error *err, const char *fmt, ...)
{
    if (!err)
        return SFI_OK;
    char prefix[SFI_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* Twice the room, then cut to the message size: truncation is wanted. */
    char joined[2 * SFI_ERROR_MSG_MAX + 2];
    snprintf(joined, sizeof joined, "%s: %s", prefix, err->msg);
    memcpy(err->msg, joined, SFI_ERROR_MSG_MAX - 1);
    err->msg[SFI_ERROR_MSG_MAX - 1] = '\0';
    return err->code;
}

const char *sfi_status_name(sfi_status code)
{
    switch (code) {
    case SFI_OK: return "ok";
    case SFI_EINVAL: return "invalid";
    case SFI_EIO: return "io";
    case SFI_EFORMAT: return "format";
    case SFI_ENOMEM: return "memory";
    case SFI_ERANGE: return "range";
    case SFI_ENOTFOUND: return "not-found";
    case SFI_EUNSUPPORTED: return "unsupported";
    case SFI_EVERSION: return "version";
    case SFI_ENODEVICE: return "no-device";
    }
    return "unknown";
}
