/* Whole-file reads with a size limit, and output files under one rule
 * (sfi_io.h). */
#include <config.h>

#include "sfi_io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Reading                                                             */

/* Reads f to its end into a buffer that never exceeds max + 2 bytes: at
 * most max + 1 bytes of content (one byte past the limit tells "too large"
 * from "exactly the limit") plus the terminating NUL. hint: the size the
 * file claims (0 when unknown), the first allocation. */
static sfi_status read_all(FILE *f, const char *name, size_t max, const char *what,
                           size_t hint, char **out, size_t *len, sfi_error *err)
{
    size_t alloc = hint ? (hint < max ? hint : max) + 2 : (max < 65536 ? max + 2 : 65536);
    size_t n = 0;
    char *buf = malloc(alloc);
    if (!buf)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", name);
    for (;;) {
        if (n == alloc - 1) {
            if (n > max)
                break;
            size_t na = alloc > (max + 2) / 2 ? max + 2 : alloc * 2;
            char *nb = realloc(buf, na);
            if (!nb) {
                free(buf);
                return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", name);
            }
            buf = nb;
            alloc = na;
        }
        size_t r = fread(buf + n, 1, alloc - 1 - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) {
                int e = errno;
                free(buf);
                return sfi_error_set(err, SFI_EIO, "%s: read error: %s", name, strerror(e));
            }
            break;
        }
    }
    if (n > max) {
        free(buf);
        return sfi_error_set(err, SFI_ERANGE, "%s: more than %zu bytes is too large for %s",
                             name, max, what);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return SFI_OK;
}

sfi_status sfi_io_read(const char *path, size_t max, const char *what, char **out,
                       size_t *len, sfi_error *err)
{
    if (!path || !what || !out || !len)
        return sfi_error_set(err, SFI_EINVAL, "sfi_io_read: NULL argument");
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sfi_error_set(err, errno == ENOENT ? SFI_ENOTFOUND : SFI_EIO,
                             "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return sfi_error_set(err, SFI_EIO, "%s: %s", path, strerror(e));
    }
    if (S_ISDIR(sb.st_mode)) {
        close(fd);
        return sfi_error_set(err, SFI_EIO, "%s: is a directory, not %s", path, what);
    }
    size_t hint = 0;
    if (S_ISREG(sb.st_mode)) {
        if ((unsigned long long)sb.st_size > (unsigned long long)max) {
            close(fd);
            return sfi_error_set(err, SFI_ERANGE, "%s: %lld bytes is too large for %s (limit %zu)",
                                 path, (long long)sb.st_size, what, max);
        }
        hint = (size_t)sb.st_size;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return sfi_error_set(err, SFI_EIO, "%s: %s", path, strerror(e));
    }
    sfi_status st = read_all(f, path, max, what, hint, out, len, err);
    fclose(f);
    return st;
}

sfi_status sfi_io_read_stream(FILE *f, const char *name, size_t max, const char *what,
                              char **out, size_t *len, sfi_error *err)
{
    if (!f || !name || !what || !out || !len)
        return sfi_error_set(err, SFI_EINVAL, "sfi_io_read_stream: NULL argument");
    *out = NULL;
    *len = 0;
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode))
        return sfi_error_set(err, SFI_EIO, "%s: is a directory, not %s", name, what);
    return read_all(f, name, max, what, 0, out, len, err);
}
