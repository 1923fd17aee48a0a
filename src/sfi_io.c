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
static sfi_status read_all(FILE *f, const char *name, size_t max, const char *what, size_t hint,
                           char **out, size_t *len, sfi_error *err)
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
        return sfi_error_set(err, SFI_ERANGE, "%s: more than %zu bytes is too large for %s", name,
                             max, what);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return SFI_OK;
}

sfi_status sfi_io_read(const char *path, size_t max, const char *what, char **out, size_t *len,
                       sfi_error *err)
{
    if (!path || !what || !out || !len)
        return sfi_error_set(err, SFI_EINVAL, "sfi_io_read: NULL argument");
    *out = NULL;
    *len = 0;
    /* O_NONBLOCK for the open only: a FIFO nobody writes to reads as empty
     * instead of hanging the command; reads then block as usual (a pipe
     * or process substitution with a writer is read whole). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return sfi_error_set(err, errno == ENOENT ? SFI_ENOTFOUND : SFI_EIO, "%s: cannot open: %s",
                             path, strerror(errno));
    int fl = fcntl(fd, F_GETFL);
    if (fl != -1)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
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

sfi_status sfi_io_read_stream(FILE *f, const char *name, size_t max, const char *what, char **out,
                              size_t *len, sfi_error *err)
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

/* ------------------------------------------------------------------ */
/* Writing                                                             */

/* Temporary files in progress, for the signal handler: written whole
 * (a pointer) before the file is created and cleared before it is freed. */
#define SFI_IO_TEMPS 16
static char *volatile temps[SFI_IO_TEMPS];

static int temp_register(char *p)
{
    for (int i = 0; i < SFI_IO_TEMPS; i++)
        if (!temps[i]) {
            temps[i] = p;
            return i;
        }
    return -1; /* not removed on a signal, but still on failure */
}

static void temp_unregister(int slot)
{
    if (slot >= 0)
        temps[slot] = NULL;
}

static void on_fatal_signal(int sig)
{
    int e = errno;
    for (int i = 0; i < SFI_IO_TEMPS; i++) {
        char *p = temps[i];
        if (p)
            unlink(p);
    }
    errno = e;
    /* SA_RESETHAND restored the default action; it takes effect when the
     * handler returns. */
    raise(sig);
}

void sfi_io_cleanup_on_signals(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler == SIG_IGN)
            continue; /* nohup and the like: leave ignored signals ignored */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESETHAND;
        sigaction(sigs[i], &sa, NULL);
    }
    signal(SIGXFSZ, SIG_IGN);
}

struct sfi_out {
    char *path; /* as the caller named it, for messages */
    char *dest; /* the regular file to replace (a symlink's target) */
    char *tmp;  /* NULL when written through */
    int slot;
    FILE *f;
};

static void out_free(sfi_out *o)
{
    if (!o)
        return;
    temp_unregister(o->slot);
    free(o->path);
    free(o->dest);
    free(o->tmp);
    free(o);
}

static const char *kind_refused(mode_t m)
{
    if (S_ISDIR(m))
        return "is a directory";
    if (S_ISBLK(m))
        return "is a block device; not writing to it";
    if (S_ISSOCK(m))
        return "is a socket; not writing to it";
    return "is not a regular file, device or FIFO; not writing to it";
}

/* What the output rule makes of path: the file to replace or write
 * through (*dest, malloc'd: a symbolic link's target), whether it is
 * written through (device, FIFO), and the mode a replacement gets; or why
 * it is refused. One function for sfi_out_open and sfi_out_check. */
static sfi_status out_target(const char *path, char **dest, int *through, mode_t *mode,
                             sfi_error *err)
{
    *dest = NULL;
    *through = 0;
    if (!path || !*path)
        return sfi_error_set(err, SFI_EINVAL, "empty output file name");
    struct stat sb;
    int exists = lstat(path, &sb) == 0;
    if (!exists && errno != ENOENT)
        return sfi_error_set(err, SFI_EIO, "%s: %s", path, strerror(errno));
    char *d = NULL;
    if (exists && S_ISLNK(sb.st_mode)) {
        /* Follow the link: replace the file it names, keep the link. */
        if (!(d = realpath(path, NULL)))
            return errno == ENOENT
                       ? sfi_error_set(err, SFI_EIO,
                                       "%s: a dangling symbolic link; not "
                                       "writing through it",
                                       path)
                       : sfi_error_set(err, SFI_EIO, "%s: cannot follow the symbolic link: %s",
                                       path, strerror(errno));
        if (stat(d, &sb) != 0) {
            sfi_status st = sfi_error_set(err, SFI_EIO, "%s: %s: %s", path, d, strerror(errno));
            free(d);
            return st;
        }
    } else if (!(d = strdup(path))) {
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    }
    sfi_status st = SFI_OK;
    if (exists && (S_ISCHR(sb.st_mode) || S_ISFIFO(sb.st_mode))) {
        /* /dev/null, /dev/stdout, a terminal, a pipe: write through. */
        *through = 1;
        if (access(d, W_OK) != 0)
            st = sfi_error_set(err, SFI_EIO, "%s: cannot open for writing: %s", path,
                               strerror(errno));
    } else if (exists && !S_ISREG(sb.st_mode)) {
        st = sfi_error_set(err, SFI_EIO, "%s: %s", path, kind_refused(sb.st_mode));
    } else if (exists && access(d, W_OK) != 0) {
        /* Replacing is a write: a file the user may not write (chmod a-w)
         * is refused as open(O_WRONLY) would refuse it, although the
         * rename in a writable directory would go through. */
        st = sfi_error_set(err, SFI_EIO, "%s: cannot write: %s", path, strerror(errno));
    } else if (exists) {
        *mode = sb.st_mode & 0777;
    } else {
        mode_t um = umask(0);
        umask(um);
        *mode = 0666 & ~um;
    }
    if (st)
        free(d);
    else
        *dest = d;
    return st;
}

sfi_status sfi_out_open(const char *path, sfi_out **out, FILE **f, sfi_error *err)
{
    if (!out || !f)
        return sfi_error_set(err, SFI_EINVAL, "sfi_out_open: NULL argument");
    *out = NULL;
    *f = NULL;
    int through = 0;
    mode_t mode = 0;
    char *dest = NULL;
    sfi_status st = out_target(path, &dest, &through, &mode, err);
    if (st)
        return st;
    sfi_out *o = calloc(1, sizeof *o);
    if (!o || !(o->path = strdup(path))) {
        free(o);
        free(dest);
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    }
    o->slot = -1;
    o->dest = dest;
    if (through) {
        int fd = open(o->dest, O_WRONLY | O_NOCTTY | O_CLOEXEC);
        if (fd < 0 || !(o->f = fdopen(fd, "wb"))) {
            st = sfi_error_set(err, SFI_EIO, "%s: cannot open for writing: %s", path,
                               strerror(errno));
            if (fd >= 0)
                close(fd);
            goto fail;
        }
        *out = o;
        *f = o->f;
        return SFI_OK;
    }
    size_t n = strlen(o->dest) + sizeof ".tmpXXXXXX";
    if (!(o->tmp = malloc(n))) {
        st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    snprintf(o->tmp, n, "%s.tmpXXXXXX", o->dest);
    o->slot = temp_register(o->tmp);
    int fd = mkstemp(o->tmp);
    if (fd < 0) {
        st = sfi_error_set(err, SFI_EIO, "%s: cannot create: %s", path, strerror(errno));
        temp_unregister(o->slot);
        o->slot = -1;
        free(o->tmp);
        o->tmp = NULL;
        goto fail;
    }
    if (fchmod(fd, mode) != 0 || !(o->f = fdopen(fd, "wb"))) {
        st = sfi_error_set(err, SFI_EIO, "%s: cannot create: %s", path, strerror(errno));
        close(fd);
        unlink(o->tmp);
        goto fail;
    }
    *out = o;
    *f = o->f;
    return SFI_OK;
fail:
    out_free(o);
    return st;
}

sfi_status sfi_out_commit(sfi_out *o, int sync, sfi_error *err)
{
    if (!o)
        return sfi_error_set(err, SFI_EINVAL, "sfi_out_commit: NULL argument");
    int bad = fflush(o->f) != 0 || ferror(o->f);
    int e = bad ? errno : 0;
    if (!bad && sync && o->tmp && fsync(fileno(o->f)) != 0) {
        bad = 1;
        e = errno;
    }
    if (fclose(o->f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    o->f = NULL;
    sfi_status st = SFI_OK;
    if (bad) {
        st = sfi_error_set(err, SFI_EIO, "%s: cannot write: %s", o->path,
                           e ? strerror(e) : "write error");
    } else if (o->tmp) {
        /* The target may have changed kind since sfi_out_open. */
        struct stat sb;
        if (lstat(o->dest, &sb) == 0 && !S_ISREG(sb.st_mode))
            st = sfi_error_set(err, SFI_EIO, "%s: %s", o->path,
                               S_ISLNK(sb.st_mode) ? "became a symbolic link while being "
                                                     "written; not replacing it"
                                                   : kind_refused(sb.st_mode));
        else if (rename(o->tmp, o->dest) != 0)
            st = sfi_error_set(err, SFI_EIO, "%s: cannot move into place: %s", o->path,
                               strerror(errno));
    }
    if (st != SFI_OK && o->tmp)
        unlink(o->tmp);
    out_free(o);
    return st;
}

void sfi_out_abort(sfi_out *o)
{
    if (!o)
        return;
    if (o->f)
        fclose(o->f);
    if (o->tmp)
        unlink(o->tmp);
    out_free(o);
}

sfi_status sfi_out_write(const char *path, const void *data, size_t len, sfi_error *err)
{
    sfi_out *o;
    FILE *f;
    sfi_status st = sfi_out_open(path, &o, &f, err);
    if (st)
        return st;
    if (len && fwrite(data, 1, len, f) != len) {
        int e = errno;
        sfi_out_abort(o);
        return sfi_error_set(err, SFI_EIO, "%s: cannot write: %s", path, strerror(e));
    }
    return sfi_out_commit(o, 0, err);
}

sfi_status sfi_out_check(const char *path, sfi_error *err)
{
    /* The whole rule on the target (dangling links, sockets, devices,
     * read-only files), then the directory the temporary file goes to. */
    char *dest = NULL;
    int through = 0;
    mode_t mode = 0;
    sfi_status st = out_target(path, &dest, &through, &mode, err);
    if (st || through) {
        free(dest);
        return st;
    }
    const char *slash = strrchr(dest, '/');
    char *dir = slash ? strndup(dest, slash == dest ? 1 : (size_t)(slash - dest)) : strdup(".");
    if (!dir) {
        free(dest);
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    }
    struct stat sb;
    if (stat(dir, &sb) != 0)
        st = sfi_error_set(err, SFI_EIO, "%s: directory %s: %s", path, dir, strerror(errno));
    else if (!S_ISDIR(sb.st_mode))
        st = sfi_error_set(err, SFI_EIO, "%s: %s is not a directory", path, dir);
    else if (access(dir, W_OK | X_OK) != 0)
        st = sfi_error_set(err, SFI_EIO, "%s: cannot write in directory %s: %s", path, dir,
                           strerror(errno));
    free(dir);
    free(dest);
    return st;
}
