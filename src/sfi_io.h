/* Files in: the one way every sfi command reads a whole input file.
 *
 * Reading (sfi_io_read): a size limit checked before allocating (regular
 * files) and while reading (pipes, /dev/stdin, character devices such as
 * /dev/zero, files growing under us), so a file can never make us allocate
 * more than the limit; a directory is named as such.
 */
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
sfi_status sfi_io_read(const char *path, size_t max, const char *what, char **out,
                       size_t *len, sfi_error *err);

/* The same from an open stream (e.g. stdin); name is used in messages. */
sfi_status sfi_io_read_stream(FILE *f, const char *name, size_t max, const char *what,
                              char **out, size_t *len, sfi_error *err);

#endif
