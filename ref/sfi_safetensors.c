/* safetensors reader (mmap) and writer; see sfi_safetensors.h. */
#include <config.h>

#include "sfi_safetensors.h"
#include "sfi_io.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char *path;
    void *map;
    size_t map_len;
} st_file;

struct sfi_safetensors {
    char *origin;
    st_file *files;
    size_t n_files;
    sfi_st_tensor *tensors;
    size_t n_tensors;
};

const char *sfi_st_dtype_name(sfi_st_dtype d)
{
    switch (d) {
    case SFI_DT_F32: return "F32";
    case SFI_DT_F16: return "F16";
    case SFI_DT_BF16: return "BF16";
    }
    return "?";
}

size_t sfi_st_dtype_size(sfi_st_dtype d)
{
    return d == SFI_DT_F32 ? 4 : 2;
}

float sfi_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Exact: every f16 value (subnormals included) is representable in f32. */
float sfi_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        if (m == 0) {
            u = sign;
        } else {
            /* subnormal: normalize the mantissa */
            int shift = 0;
            while (!(m & 0x400)) {
                m <<= 1;
                shift++;
            }
            m &= 0x3ff;
            u = sign | (uint32_t)(127 - 15 + 1 - shift) << 23 | m << 13;
        }
    } else if (e == 31) {
        u = sign | 0x7f800000u | m << 13;
    } else {
        u = sign | (e + 127 - 15) << 23 | m << 13;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t sfi_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN, keeps sign */
    uint32_t round = 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)((u + round) >> 16);
}

void sfi_st_to_f32(const sfi_st_tensor *t, float *out)
{
    const unsigned char *p = t->data;
    /* memcpy per element: the data block is not aligned in general. Host
     * byte order is little-endian on every platform we build for. */
    switch (t->dtype) {
    case SFI_DT_F32: memcpy(out, p, t->numel * 4); break;
    case SFI_DT_BF16:
        for (uint64_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = sfi_bf16_to_f32(h);
        }
        break;
    case SFI_DT_F16:
        for (uint64_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = sfi_f16_to_f32(h);
        }
        break;
    }
}

static void st_file_close(st_file *f)
{
    if (f->map && f->map != MAP_FAILED)
        munmap(f->map, f->map_len);
    free(f->path);
    f->map = NULL;
    f->path = NULL;
}

void sfi_st_close(sfi_safetensors *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n_tensors; i++)
        free((char *)st->tensors[i].name);
    free(st->tensors);
    for (size_t i = 0; i < st->n_files; i++)
        st_file_close(&st->files[i]);
    free(st->files);
    free(st->origin);
    free(st);
}

size_t sfi_st_count(const sfi_safetensors *st)
{
    return st->n_tensors;
}
const sfi_st_tensor *sfi_st_tensor_at(const sfi_safetensors *st, size_t i)
{
    return i < st->n_tensors ? &st->tensors[i] : NULL;
}
const char *sfi_st_origin(const sfi_safetensors *st)
{
    return st->origin;
}

const sfi_st_tensor *sfi_st_find(const sfi_safetensors *st, const char *name)
{
    for (size_t i = 0; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, name))
            return &st->tensors[i];
    return NULL;
}

static int parse_dtype(const char *s, sfi_st_dtype *d)
{
    if (!strcmp(s, "F32"))
        *d = SFI_DT_F32;
    else if (!strcmp(s, "F16"))
        *d = SFI_DT_F16;
    else if (!strcmp(s, "BF16"))
        *d = SFI_DT_BF16;
    else
        return -1;
    return 0;
}

typedef struct {
    uint64_t b, e;
    size_t idx;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->b != y->b)
        return x->b < y->b ? -1 : 1;
    return x->e < y->e ? -1 : x->e > y->e ? 1 : 0;
}

/* open_one's phases: map the file, find its header, read each header entry
 * into a tensor, check that the tensors tile the data block. */

/* Opens and maps f->path; *fsize is the file's size. */
static sfi_status map_file(st_file *f, uint64_t *fsize, sfi_error *err)
{
    const char *path = f->path;
    /* O_NONBLOCK: a FIFO (which cannot be mapped anyway) must not hang us
     * waiting for a writer; it is refused below. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return sfi_error_set(err, errno == ENOENT ? SFI_ENOTFOUND : SFI_EIO, "%s: cannot open: %s",
                             path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return sfi_error_set(err, SFI_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return sfi_error_set(err, SFI_EIO, "%s: not a regular file", path);
    }
    *fsize = (uint64_t)sb.st_size;
    if (*fsize < 8) {
        close(fd);
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: truncated: %llu bytes, shorter than the 8-byte header length",
                             path, (unsigned long long)*fsize);
    }
    f->map_len = (size_t)*fsize;
    f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return sfi_error_set(err, SFI_EIO, "%s: cannot mmap: %s", path, strerror(errno));
    }
    return SFI_OK;
}

/* The header's length from the file's first 8 bytes (little-endian), checked
 * against the limit and against the bytes that follow. */
static sfi_status header_length(const char *path, const unsigned char *base, uint64_t fsize,
                                uint64_t *hlen_out, sfi_error *err)
{
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | base[i];
    if (hlen > SFI_ST_MAX_HEADER)
        return sfi_error_set(err, SFI_EFORMAT, "%s: header length %llu exceeds the %llu-byte limit",
                             path, (unsigned long long)hlen, (unsigned long long)SFI_ST_MAX_HEADER);
    if (hlen > fsize - 8)
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: truncated: header of %llu bytes but only %llu bytes follow", path,
                             (unsigned long long)hlen, (unsigned long long)(fsize - 8));
    *hlen_out = hlen;
    return SFI_OK;
}

/* Reads a "shape" array into t->ndim, t->shape and t->numel. 0 on success,
 * 1 for an entry that is not a non-negative integer, 2 for a product too
 * large. */
static int parse_shape(json_t *js, sfi_st_tensor *t)
{
    t->ndim = (int)json_array_size(js);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        json_t *x = json_array_get(js, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return 1;
        uint64_t dim = (uint64_t)json_integer_value(x);
        t->shape[d] = (int64_t)dim;
        /* products past the file size are refused anyway; stop before
         * overflowing */
        if (dim != 0 && numel > (UINT64_C(1) << 62) / dim)
            return 2;
        numel *= dim;
    }
    t->numel = numel;
    return 0;
}

/* Whether "data_offsets" is [begin, end] with 0 <= begin <= end. */
static int offsets_ok(json_t *jo)
{
    return json_is_array(jo) && json_array_size(jo) == 2 &&
           json_is_integer(json_array_get(jo, 0)) && json_is_integer(json_array_get(jo, 1)) &&
           json_integer_value(json_array_get(jo, 0)) >= 0 &&
           json_integer_value(json_array_get(jo, 1)) >= json_integer_value(json_array_get(jo, 0));
}

/* Reads the header entry key: val into *t (name and data left to the
 * caller) and its byte span [*b, *e) of the data block (data_len bytes). */
static sfi_status parse_entry(const char *path, const char *key, json_t *val, uint64_t data_len,
                              sfi_st_tensor *t, uint64_t *b, uint64_t *e, sfi_error *err)
{
    if (!json_is_object(val))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: entry is not an object", path, key);
    json_t *jd = json_object_get(val, "dtype");
    json_t *js = json_object_get(val, "shape");
    json_t *jo = json_object_get(val, "data_offsets");
    memset(t, 0, sizeof *t);
    if (!json_is_string(jd))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: missing dtype", path, key);
    if (parse_dtype(json_string_value(jd), &t->dtype))
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "%s: %s: dtype %s not supported (F32, F16, BF16 are)", path, key,
                             json_string_value(jd));
    if (!json_is_array(js) || json_array_size(js) > SFI_ST_MAX_DIMS)
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: shape missing or over %d dims", path, key,
                             SFI_ST_MAX_DIMS);
    int bad = parse_shape(js, t);
    if (bad)
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: %s", path, key,
                             bad == 1 ? "shape entries must be non-negative integers"
                                      : "shape too large");
    if (!offsets_ok(jo))
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: %s: data_offsets must be [begin, end], "
                             "0 <= begin <= end",
                             path, key);
    *b = (uint64_t)json_integer_value(json_array_get(jo, 0));
    *e = (uint64_t)json_integer_value(json_array_get(jo, 1));
    uint64_t want = t->numel * sfi_st_dtype_size(t->dtype);
    if (t->numel > (UINT64_C(1) << 61) || *e - *b != want)
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: %s: data_offsets span %llu bytes but shape x %s needs %llu", path,
                             key, (unsigned long long)(*e - *b), sfi_st_dtype_name(t->dtype),
                             (unsigned long long)want);
    if (*e > data_len)
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: %s: data_offsets [%llu, %llu] run past the data block "
                             "(%llu bytes; file truncated?)",
                             path, key, (unsigned long long)*b, (unsigned long long)*e,
                             (unsigned long long)data_len);
    t->nbytes = want;
    return SFI_OK;
}

/* As the reference safetensors library checks: the tensors (spans sorted
 * here) fill the data block back to back, from its first byte to its last. */
static sfi_status check_tiling(const sfi_safetensors *st, const char *path, span *spans,
                               size_t n_spans, uint64_t data_len, sfi_error *err)
{
    qsort(spans, n_spans, sizeof *spans, span_cmp);
    uint64_t end = 0;
    for (size_t i = 0; i < n_spans; i++) {
        if (spans[i].b < end)
            return sfi_error_set(err, SFI_EFORMAT, "%s: tensors %s and %s overlap", path,
                                 st->tensors[spans[i - 1].idx].name,
                                 st->tensors[spans[i].idx].name);
        if (spans[i].b > end)
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: %llu unused bytes before tensor %s "
                                 "(the data block must hold the tensors back to back)",
                                 path, (unsigned long long)(spans[i].b - end),
                                 st->tensors[spans[i].idx].name);
        end = spans[i].e;
    }
    if (end != data_len)
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: %llu bytes follow the last tensor's data "
                             "(the data block is %llu bytes, its tensors end at %llu)",
                             path, (unsigned long long)(data_len - end),
                             (unsigned long long)data_len, (unsigned long long)end);
    return SFI_OK;
}

/* Appends the tensors of a parsed header (root) to st, their data in data
 * (data_len bytes) of file f. */
static sfi_status add_entries(sfi_safetensors *st, st_file *f, json_t *root,
                              const unsigned char *data, uint64_t data_len, sfi_error *err)
{
    const char *path = f->path;
    size_t n_new = json_object_size(root);
    sfi_st_tensor *nt = realloc(st->tensors, (st->n_tensors + n_new + 1) * sizeof *nt);
    if (!nt)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    st->tensors = nt;
    span *spans = calloc(n_new + 1, sizeof *spans);
    if (!spans)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    size_t n_spans = 0;
    sfi_status rc = SFI_OK;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (!strcmp(key, "__metadata__"))
            continue;
        sfi_st_tensor t;
        uint64_t b = 0, e = 0;
        rc = parse_entry(path, key, val, data_len, &t, &b, &e, err);
        if (rc != SFI_OK)
            break;
        if (sfi_st_find(st, key)) {
            rc = sfi_error_set(err, SFI_EFORMAT, "%s: %s: tensor appears twice in the checkpoint",
                               path, key);
            break;
        }
        t.name = strdup(key);
        if (!t.name) {
            rc = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
            break;
        }
        t.data = data + b;
        t.file = f->path;
        st->tensors[st->n_tensors++] = t;
        spans[n_spans].b = b;
        spans[n_spans].e = e;
        spans[n_spans].idx = st->n_tensors - 1;
        n_spans++;
    }
    if (rc == SFI_OK)
        rc = check_tiling(st, path, spans, n_spans, data_len, err);
    free(spans);
    return rc;
}

/* Maps one file and appends its tensors to st (file index fi). */
static sfi_status open_one(sfi_safetensors *st, size_t fi, sfi_error *err)
{
    st_file *f = &st->files[fi];
    const char *path = f->path;
    uint64_t fsize = 0, hlen = 0;
    sfi_status rc = map_file(f, &fsize, err);
    if (rc != SFI_OK)
        return rc;
    const unsigned char *base = f->map;
    rc = header_length(path, base, fsize, &hlen, err);
    if (rc != SFI_OK)
        return rc;
    uint64_t data_len = fsize - 8 - hlen;
    const unsigned char *data = base + 8 + hlen;

    json_error_t je;
    json_t *root = json_loadb((const char *)base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return sfi_error_set(err, SFI_EFORMAT, "%s: header is not valid JSON: %s (at byte %d)",
                             path, je.text, je.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return sfi_error_set(err, SFI_EFORMAT, "%s: header is not a JSON object", path);
    }
    rc = add_entries(st, f, root, data, data_len, err);
    json_decref(root);
    return rc;
}

static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

static int ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static char *dir_of(const char *path)
{
    const char *s = strrchr(path, '/');
    if (!s)
        return strdup(".");
    size_t n = (size_t)(s - path);
    char *d = malloc(n + 2);
    if (!d)
        return NULL;
    if (n == 0) {
        strcpy(d, "/");
    } else {
        memcpy(d, path, n);
        d[n] = 0;
    }
    return d;
}

static sfi_status add_file(sfi_safetensors *st, char *path, sfi_error *err)
{
    st_file *nf = realloc(st->files, (st->n_files + 1) * sizeof *nf);
    if (!nf) {
        free(path);
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    }
    st->files = nf;
    st->files[st->n_files].path = path;
    st->files[st->n_files].map = NULL;
    st->files[st->n_files].map_len = 0;
    st->n_files++;
    return open_one(st, st->n_files - 1, err);
}

/* A real index (Qwen3-235B: ~19k tensors) is a few MB; a bigger file is
 * refused before jansson reads it all into memory. */
#define SFI_ST_MAX_INDEX ((off_t)64 << 20)

static sfi_status open_index(sfi_safetensors *st, const char *index, sfi_error *err)
{
    struct stat isb;
    if (stat(index, &isb) == 0 && S_ISREG(isb.st_mode) && isb.st_size > SFI_ST_MAX_INDEX)
        return sfi_error_set(err, SFI_ERANGE,
                             "%s: %lld bytes is too large for an index "
                             "(limit %lld)",
                             index, (long long)isb.st_size, (long long)SFI_ST_MAX_INDEX);
    json_error_t je;
    json_t *root = json_load_file(index, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return sfi_error_set(err, exists(index) ? SFI_EFORMAT : SFI_ENOTFOUND, "%s: %s (line %d)",
                             index, je.text, je.line);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        json_decref(root);
        return sfi_error_set(err, SFI_EFORMAT, "%s: weight_map missing or empty", index);
    }
    char *dir = dir_of(index);
    if (!dir) {
        json_decref(root);
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    }
    sfi_status rc = SFI_OK;
    const char *key;
    json_t *val;
    /* Open each shard once, in first-mention order. */
    json_object_foreach(wm, key, val)
    {
        if (!json_is_string(val)) {
            rc = sfi_error_set(err, SFI_EFORMAT, "%s: weight_map: %s: not a file name", index, key);
            break;
        }
        const char *fn = json_string_value(val);
        if (strchr(fn, '/') || !strcmp(fn, "..") || !*fn) {
            rc = sfi_error_set(err, SFI_EFORMAT,
                               "%s: weight_map: %s: shard '%s' must be a plain file name", index,
                               key, fn);
            break;
        }
        char *p = path_join(dir, fn);
        if (!p) {
            rc = sfi_error_set(err, SFI_ENOMEM, "out of memory");
            break;
        }
        int seen = 0;
        for (size_t i = 0; i < st->n_files; i++)
            if (!strcmp(st->files[i].path, p))
                seen = 1;
        if (seen) {
            free(p);
            continue;
        }
        rc = add_file(st, p, err);
        if (rc)
            break;
    }
    if (rc == SFI_OK) {
        json_object_foreach(wm, key, val)
        {
            const sfi_st_tensor *t = sfi_st_find(st, key);
            char *p = path_join(dir, json_string_value(val));
            if (!t) {
                rc = sfi_error_set(err, SFI_ENOTFOUND,
                                   "%s: tensor %s listed in weight_map is not in %s", index, key,
                                   p ? p : json_string_value(val));
            } else if (p && strcmp(t->file, p)) {
                rc = sfi_error_set(err, SFI_EFORMAT, "%s: tensor %s is in %s, weight_map says %s",
                                   index, key, t->file, p);
            }
            free(p);
            if (rc)
                break;
        }
    }
    if (rc == SFI_OK && st->n_tensors != json_object_size(wm))
        rc =
            sfi_error_set(err, SFI_EFORMAT, "%s: the shards hold %zu tensors, weight_map lists %zu",
                          index, st->n_tensors, json_object_size(wm));
    free(dir);
    json_decref(root);
    return rc;
}

sfi_status sfi_st_open(const char *path, sfi_safetensors **out, sfi_error *err)
{
    *out = NULL;
    sfi_safetensors *st = calloc(1, sizeof *st);
    if (!st)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    sfi_status rc;
    char *file = NULL;
    int index = 0;
    if (is_dir(path)) {
        char *single = path_join(path, "model.safetensors");
        char *idx = path_join(path, "model.safetensors.index.json");
        if (!single || !idx) {
            free(single);
            free(idx);
            sfi_st_close(st);
            return sfi_error_set(err, SFI_ENOMEM, "out of memory");
        }
        if (exists(single)) {
            file = single;
            free(idx);
        } else if (exists(idx)) {
            file = idx;
            index = 1;
            free(single);
        } else {
            free(single);
            free(idx);
            sfi_st_close(st);
            return sfi_error_set(err, SFI_ENOTFOUND,
                                 "%s: neither model.safetensors nor "
                                 "model.safetensors.index.json is there",
                                 path);
        }
    } else {
        file = strdup(path);
        if (!file) {
            sfi_st_close(st);
            return sfi_error_set(err, SFI_ENOMEM, "out of memory");
        }
        index = ends_with(path, ".json");
    }
    st->origin = strdup(file);
    if (!st->origin) {
        free(file);
        sfi_st_close(st);
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    }
    if (index) {
        rc = open_index(st, file, err);
        free(file);
    } else {
        rc = add_file(st, file, err);
    }
    if (rc) {
        sfi_st_close(st);
        return rc;
    }
    *out = st;
    return SFI_OK;
}

sfi_status sfi_st_load_f32(const sfi_safetensors *st, const char *name, int ndim,
                           const int64_t *shape, int want_dtype, float **out, sfi_error *err)
{
    *out = NULL;
    const sfi_st_tensor *t = sfi_st_find(st, name);
    if (!t)
        return sfi_error_set(err, SFI_ENOTFOUND, "%s: tensor %s is missing", st->origin, name);
    int same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = t->shape[d] == shape[d];
    if (!same) {
        char got[160] = "", want[160] = "";
        size_t gl = 0, wl = 0;
        for (int d = 0; d < t->ndim && gl < sizeof got - 24; d++)
            gl += (size_t)snprintf(got + gl, sizeof got - gl, "%s%lld", d ? ", " : "",
                                   (long long)t->shape[d]);
        for (int d = 0; d < ndim && wl < sizeof want - 24; d++)
            wl += (size_t)snprintf(want + wl, sizeof want - wl, "%s%lld", d ? ", " : "",
                                   (long long)shape[d]);
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: tensor %s has shape [%s], the config needs [%s]", t->file, name,
                             got, want);
    }
    if (want_dtype >= 0 && (int)t->dtype != want_dtype)
        return sfi_error_set(err, SFI_EFORMAT, "%s: tensor %s is %s, expected %s", t->file, name,
                             sfi_st_dtype_name(t->dtype),
                             sfi_st_dtype_name((sfi_st_dtype)want_dtype));
    float *buf = malloc(t->numel ? t->numel * sizeof(float) : 1);
    if (!buf)
        return sfi_error_set(err, SFI_ENOMEM, "%s: tensor %s: out of memory (%llu floats)", t->file,
                             name, (unsigned long long)t->numel);
    sfi_st_to_f32(t, buf);
    /* A NaN or Inf weight turns every activation it touches into NaN: the
     * model prints garbage (argmax of NaN logits) instead of failing. */
    for (uint64_t i = 0; i < t->numel; i++)
        if (!isfinite(buf[i])) {
            sfi_status st =
                sfi_error_set(err, SFI_EFORMAT,
                              "%s: tensor %s: element %llu is %s; "
                              "weights must be finite",
                              t->file, name, (unsigned long long)i, isnan(buf[i]) ? "NaN" : "Inf");
            free(buf);
            return st;
        }
    *out = buf;
    return SFI_OK;
}

/* ---- writer ---- */

struct sfi_st_writer {
    char *path;
    sfi_out *out; /* the output rule of sfi_io.h */
    FILE *fp;
    sfi_st_write_tensor *decl;
    size_t n, next;
    uint64_t left; /* values of decl[next] still to come */
};

static uint64_t numel_of(const sfi_st_write_tensor *t)
{
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (uint64_t)t->shape[d];
    return n;
}

void sfi_st_writer_abort(sfi_st_writer *w)
{
    if (!w)
        return;
    sfi_out_abort(w->out);
    free(w->path);
    free(w->decl);
    free(w);
}

sfi_status sfi_st_writer_open(const char *path, const sfi_st_write_tensor *decl, size_t n,
                              sfi_st_writer **out, sfi_error *err)
{
    *out = NULL;
    json_t *root = json_object();
    json_t *meta = json_object();
    if (!root || !meta) {
        json_decref(root);
        json_decref(meta);
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    }
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const sfi_st_write_tensor *t = &decl[i];
        if (t->dtype != SFI_DT_F32 && t->dtype != SFI_DT_BF16) {
            json_decref(root);
            return sfi_error_set(err, SFI_EINVAL, "%s: %s: writer stores F32 or BF16 only", path,
                                 t->name);
        }
        if (t->ndim < 0 || t->ndim > SFI_ST_MAX_DIMS || json_object_get(root, t->name)) {
            json_decref(root);
            return sfi_error_set(err, SFI_EINVAL, "%s: %s: bad rank or duplicate name", path,
                                 t->name);
        }
        json_t *e = json_object(), *sh = json_array(), *o = json_array();
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(sh, json_integer(t->shape[d]));
        uint64_t nb = numel_of(t) * sfi_st_dtype_size(t->dtype);
        json_array_append_new(o, json_integer((json_int_t)off));
        json_array_append_new(o, json_integer((json_int_t)(off + nb)));
        off += nb;
        json_object_set_new(e, "dtype", json_string(sfi_st_dtype_name(t->dtype)));
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "data_offsets", o);
        json_object_set_new(root, t->name, e);
    }
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!hdr)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    size_t hl = strlen(hdr);
    size_t pad = (8 - hl % 8) % 8; /* keep the data block 8-byte aligned */
    sfi_st_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->path = strdup(path);
        w->decl = malloc((n ? n : 1) * sizeof *w->decl);
    }
    if (!w || !w->path || !w->decl) {
        free(hdr);
        sfi_st_writer_abort(w);
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    }
    memcpy(w->decl, decl, n * sizeof *decl);
    w->n = n;
    sfi_status st = sfi_out_open(path, &w->out, &w->fp, err);
    if (st) {
        free(hdr);
        sfi_st_writer_abort(w);
        return st;
    }
    uint64_t total = hl + pad;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)(total >> (8 * i));
    int ok = fwrite(len8, 1, 8, w->fp) == 8 && fwrite(hdr, 1, hl, w->fp) == hl;
    for (size_t i = 0; ok && i < pad; i++)
        ok = fputc(' ', w->fp) != EOF;
    free(hdr);
    if (!ok) {
        sfi_st_writer_abort(w);
        return sfi_error_set(err, SFI_EIO, "%s: write failed: %s", path, strerror(errno));
    }
    *out = w;
    return SFI_OK;
}

sfi_status sfi_st_writer_put(sfi_st_writer *w, const float *data, uint64_t numel, sfi_error *err)
{
    /* skip empty tensors: they have no data to give */
    while (w->next < w->n && w->left == 0 && numel_of(&w->decl[w->next]) == 0)
        w->next++;
    if (w->next >= w->n)
        return sfi_error_set(err, SFI_EINVAL, "%s: more tensors than declared", w->path);
    const sfi_st_write_tensor *t = &w->decl[w->next];
    if (w->left == 0)
        w->left = numel_of(t);
    if (numel > w->left)
        return sfi_error_set(err, SFI_EINVAL, "%s: %s: %llu values given, %llu remain", w->path,
                             t->name, (unsigned long long)numel, (unsigned long long)w->left);
    int ok = 1;
    if (t->dtype == SFI_DT_F32) {
        ok = fwrite(data, 4, numel, w->fp) == numel;
    } else {
        uint16_t buf[4096];
        for (uint64_t i = 0; ok && i < numel; i += 4096) {
            size_t m = numel - i < 4096 ? (size_t)(numel - i) : 4096;
            for (size_t j = 0; j < m; j++)
                buf[j] = sfi_f32_to_bf16(data[i + j]);
            ok = fwrite(buf, 2, m, w->fp) == m;
        }
    }
    if (!ok)
        return sfi_error_set(err, SFI_EIO, "%s: write failed: %s", w->path, strerror(errno));
    w->left -= numel;
    if (w->left == 0)
        w->next++;
    return SFI_OK;
}

sfi_status sfi_st_writer_commit(sfi_st_writer *w, sfi_error *err)
{
    while (w->next < w->n && w->left == 0 && numel_of(&w->decl[w->next]) == 0)
        w->next++;
    if (w->next != w->n)
        return sfi_error_set(err, SFI_EINVAL, "%s: %zu of %zu tensors written", w->path, w->next,
                             w->n);
    sfi_out *o = w->out;
    w->out = NULL;
    w->fp = NULL;
    return sfi_out_commit(o, 1, err);
}

sfi_status sfi_st_write(const char *path, const sfi_st_write_tensor *t, size_t n, sfi_error *err)
{
    sfi_st_writer *w;
    sfi_status rc = sfi_st_writer_open(path, t, n, &w, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < n && !rc; i++)
        rc = sfi_st_writer_put(w, t[i].data, numel_of(&t[i]), err);
    if (!rc)
        rc = sfi_st_writer_commit(w, err);
    sfi_st_writer_abort(w);
    return rc;
}
