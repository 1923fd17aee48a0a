/* Files in and out: the one way every sfi command reads a whole input
 * file and writes an output file.
 *
 * Reading (sfi_io_read): a size limit checked before allocating (regular
 * files) and while reading (pipes, /dev/stdin, character devices such as
 * /dev/zero, files growing under us), so a file can never make us allocate
 * more than the limit; a directory is named as such.
 *
 * Writing (sfi_out_*), the output rule (sfi-ref(1), sfi-sim(1), FILES):
 *   - a new path or an existing regular file is written to a temporary
 *     file in the same directory (PATH.tmpXXXXXX) and renamed over the
 *     path only when complete, so a failed or interrupted write never
 *     leaves half a file; an existing file keeps its permission bits, a new
 *     one gets 0666 less the umask; a file the user may not write is
 *     refused ("Permission denied"), not replaced;
 *   - a symbolic link is followed: the file it names is replaced the same
 *     way (the link stays a link); a dangling link is refused;
 *   - a character device (/dev/null, /dev/stdout, a terminal) or a FIFO is
 *     written through, never replaced;
 *   - a directory, block device or socket is refused with a message.
 * Temporary files are removed on failure and, once
 * sfi_io_cleanup_on_signals() has run, when SIGINT, SIGTERM, SIGHUP or
 * SIGPIPE ends the program; that function also ignores SIGXFSZ so that a
 * file size limit (ulimit -f) becomes a reported write error instead of a
 * silent kill. */
#ifndef SFI_IO_H
#define SFI_IO_H

#include <stddef.h>
#include <stdio.h>
#include "sfi_error.h"

/* Reads the whole file `path` into *out (malloc'd, NUL-terminated after
 * *len bytes). More than max bytes is SFI_ERANGE ("PATH: N bytes is too
 * large for a WHAT (limit MAX)"), a directory SFI_EIO ("PATH: is a
 * directory, not a WHAT"), a missing file SFI_ENOTFOUND. An empty file is
 * returned as such (*len = 0): the caller decides. */
SFI_NODISCARD sfi_status sfi_io_read(const char *path, size_t max, const char *what, char **out,
                                     size_t *len, sfi_error *err);

/* The same from an open stream (e.g. stdin); name is used in messages. */
SFI_NODISCARD sfi_status sfi_io_read_stream(FILE *f, const char *name, size_t max, const char *what,
                                            char **out, size_t *len, sfi_error *err);

/* An output file being written (see the rule above). */
typedef struct sfi_out sfi_out;

/* Checks the target and opens the temporary file (or the target itself
 * when it is written through). *f is the stream to write; it belongs to
 * the sfi_out. */
SFI_NODISCARD sfi_status sfi_out_open(const char *path, sfi_out **out, FILE **f, sfi_error *err);

/* Flushes and closes the stream and moves the temporary file into place
 * (fsync first when sync is set); frees o. On failure the target is left
 * as it was and the temporary file is removed. */
SFI_NODISCARD sfi_status sfi_out_commit(sfi_out *o, int sync, sfi_error *err);

/* Closes the stream and removes the temporary file; frees o. NULL is
 * allowed. */
void sfi_out_abort(sfi_out *o);

/* Writes len bytes to path under the output rule. */
SFI_NODISCARD sfi_status sfi_out_write(const char *path, const void *data, size_t len,
                                       sfi_error *err);

/* Checks, before a command does its work, that `path` can be written
 * under the output rule (the same test sfi_out_open makes: dangling links,
 * directories, sockets, block devices and read-only files refused) and, for
 * a file to be replaced, that its directory exists and is writable.
 * Catches "--png out/x.png" without out/ at once instead of after minutes
 * of computing; sfi_out_open checks again when writing. */
SFI_NODISCARD sfi_status sfi_out_check(const char *path, sfi_error *err);

/* The signal handling described above; for a program's main(). */
void sfi_io_cleanup_on_signals(void);

#endif
