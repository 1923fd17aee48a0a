/* safetensors checkpoints: memory-mapped reader (single file or shards named
 * by model.safetensors.index.json) and a writer (temp file + rename).
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}, ...,
 * "__metadata__": {...}}, then the data block; offsets are relative to it.
 * The reader checks every entry (known dtype, shape product * dtype size ==
 * e - b, offsets inside the file, no overlap) before anything is used. */
#ifndef SFI_SAFETENSORS_H
#define SFI_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "sfi_error.h"

#define SFI_ST_MAX_DIMS 8
/* Headers larger than this are refused before allocating (the format's
 * reference implementation caps them at 100 MB too). */
#define SFI_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

typedef enum { SFI_DT_F32 = 0, SFI_DT_F16 = 1, SFI_DT_BF16 = 2 } sfi_st_dtype;

const char *sfi_st_dtype_name(sfi_st_dtype d); /* "F32", "F16", "BF16" */
size_t sfi_st_dtype_size(sfi_st_dtype d);

typedef struct {
    const char *name;
    sfi_st_dtype dtype;
    int ndim;
    int64_t shape[SFI_ST_MAX_DIMS];
    uint64_t numel;
    const void *data; /* inside the mapping; not aligned in general */
    uint64_t nbytes;
    const char *file; /* the file it lives in */
} sfi_st_tensor;

typedef struct sfi_safetensors sfi_safetensors;

/* path: a .safetensors file, a model.safetensors.index.json, or a
 * directory holding model.safetensors or model.safetensors.index.json. */
SFI_NODISCARD sfi_status sfi_st_open(const char *path, sfi_safetensors **out, sfi_error *err);
void sfi_st_close(sfi_safetensors *st);
size_t sfi_st_count(const sfi_safetensors *st);
const sfi_st_tensor *sfi_st_tensor_at(const sfi_safetensors *st, size_t i);
/* NULL when absent. */
const sfi_st_tensor *sfi_st_find(const sfi_safetensors *st, const char *name);
/* What the checkpoint was opened from (for messages). */
const char *sfi_st_origin(const sfi_safetensors *st);

/* Widens t (any dtype) to float32 exactly into out[numel]. */
void sfi_st_to_f32(const sfi_st_tensor *t, float *out);

/* Finds `name`, checks its shape equals shape[0..ndim) (and, when
 * want_dtype >= 0, its dtype), and widens it into a malloc'd float array;
 * a NaN or Inf element is an error (SFI_EFORMAT). Errors name the
 * checkpoint file and the tensor. */
SFI_NODISCARD sfi_status sfi_st_load_f32(const sfi_safetensors *st, const char *name, int ndim,
                                         const int64_t *shape, int want_dtype, float **out,
                                         sfi_error *err);

/* Exact conversions. */
float sfi_bf16_to_f32(uint16_t h);
float sfi_f16_to_f32(uint16_t h);
/* Round to nearest even; NaN stays NaN. */
uint16_t sfi_f32_to_bf16(float f);

/* Writer: tensors given as float32, stored as dtype (narrowed with round to
 * nearest even). Written to PATH.tmp.XXXXXX then renamed onto path, so path
 * is either the complete new file or untouched. */
typedef struct {
    const char *name;
    sfi_st_dtype dtype; /* F32 or BF16 */
    int ndim;
    int64_t shape[SFI_ST_MAX_DIMS];
    const float *data; /* numel floats */
} sfi_st_write_tensor;

SFI_NODISCARD sfi_status sfi_st_write(const char *path, const sfi_st_write_tensor *t, size_t n,
                                      sfi_error *err);

/* Streaming writer, for checkpoints too large to hold as float32 at once:
 * declare every tensor first (the header needs all shapes), then give the
 * data of each, in the declared order, with sfi_st_writer_put, whole or in
 * consecutive chunks (a chunk never spans two tensors). */
typedef struct sfi_st_writer sfi_st_writer;
SFI_NODISCARD sfi_status sfi_st_writer_open(const char *path, const sfi_st_write_tensor *decl,
                                            size_t n, sfi_st_writer **out, sfi_error *err);
SFI_NODISCARD sfi_status sfi_st_writer_put(sfi_st_writer *w, const float *data, uint64_t numel,
                                           sfi_error *err);
/* Renames onto the final path when every tensor was written; else error. */
SFI_NODISCARD sfi_status sfi_st_writer_commit(sfi_st_writer *w, sfi_error *err);
/* Removes the temp file (also safe after commit). Frees w. */
void sfi_st_writer_abort(sfi_st_writer *w);

#endif
