/* SPDX-License-Identifier: MIT */
/*
 * kv_gguf.h — a validating, read-only reader of GGUF files (versions 2 and 3).
 *
 * The file (or a caller's buffer) is mapped read-only and parsed once with a
 * bounds-checked cursor: every count, string and array length, tensor shape,
 * type, offset and alignment is checked against the file size before it is
 * used, so a malformed file is rejected with an error code and a message and
 * nothing past its end is ever read. After a successful open, every string,
 * array and tensor the reader hands out points into the mapping and is known
 * to lie entirely inside it; tensors do not overlap one another.
 *
 * Ownership: kv_gguf_t owns the mapping (kv_gguf_open) or borrows the
 * caller's buffer (kv_gguf_open_mem, which must outlive it) and owns its
 * key/tensor tables. Strings are views (pointer + length), not NUL-terminated.
 * Errors: KV_ECORRUPT (malformed), KV_ENOTSUP (a version, value or tensor type
 * this reader does not know), KV_ENOMEM, KV_EINVAL, KV_ENOENT (no such key /
 * tensor), -errno from open/mmap. Little-endian files on little-endian hosts.
 */
#ifndef KV_GGUF_H
#define KV_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "kvpage/kvpage.h"

/* Metadata value types (numbers from the GGUF specification). */
typedef enum kv_gguf_vtype {
    KV_GGUF_U8 = 0, KV_GGUF_I8 = 1, KV_GGUF_U16 = 2, KV_GGUF_I16 = 3,
    KV_GGUF_U32 = 4, KV_GGUF_I32 = 5, KV_GGUF_F32 = 6, KV_GGUF_BOOL = 7,
    KV_GGUF_STRING = 8, KV_GGUF_ARRAY = 9, KV_GGUF_U64 = 10, KV_GGUF_I64 = 11,
    KV_GGUF_F64 = 12,
    KV_GGUF_VTYPE_COUNT = 13,
} kv_gguf_vtype_t;

/* Tensor element types this reader knows the block layout of (ggml_type
 * numbers). kv_quant.h says which of them can be dequantized. */
typedef enum kv_gguf_ttype {
    KV_GGML_F32 = 0, KV_GGML_F16 = 1, KV_GGML_Q4_0 = 2, KV_GGML_Q4_1 = 3,
    KV_GGML_Q5_0 = 6, KV_GGML_Q5_1 = 7, KV_GGML_Q8_0 = 8, KV_GGML_Q8_1 = 9,
    KV_GGML_Q2_K = 10, KV_GGML_Q3_K = 11, KV_GGML_Q4_K = 12, KV_GGML_Q5_K = 13,
    KV_GGML_Q6_K = 14, KV_GGML_Q8_K = 15, KV_GGML_I8 = 24, KV_GGML_I16 = 25,
    KV_GGML_I32 = 26, KV_GGML_I64 = 27, KV_GGML_F64 = 28, KV_GGML_BF16 = 30,
} kv_gguf_ttype_t;

#define KV_GGUF_MAX_DIMS 4
#define KV_GGUF_MAX_NAME 256   /* longest tensor name accepted, bytes      */
#define KV_GGUF_ERR_LEN 256    /* a useful size for the err buffers below  */

typedef struct kv_gguf_str {
    const char *ptr;  /* into the mapping; not NUL-terminated */
    uint64_t len;     /* bytes                                */
} kv_gguf_str_t;

/* One metadata entry. For an array, data points at its first element (for
 * strings: the first u64 length prefix) and data_len covers all elements. */
typedef struct kv_gguf_kv {
    kv_gguf_str_t key;
    uint32_t type;        /* kv_gguf_vtype_t                              */
    uint32_t arr_type;    /* element type when type == ARRAY              */
    uint64_t arr_n;       /* elements when type == ARRAY, else 0          */
    const uint8_t *data;  /* the value's bytes (after the type tags)      */
    uint64_t data_len;    /* bytes of the value                           */
} kv_gguf_kv_t;

typedef struct kv_gguf_tensor {
    kv_gguf_str_t name;
    uint32_t n_dims;                  /* 1..KV_GGUF_MAX_DIMS                  */
    uint64_t ne[KV_GGUF_MAX_DIMS];    /* elements per dim, ne[0] innermost;   */
                                      /* dims past n_dims are 1               */
    uint32_t type;                    /* kv_gguf_ttype_t                      */
    uint64_t offset;                  /* bytes from the start of the data     */
    uint64_t n_elems;                 /* product of ne                        */
    uint64_t nbytes;                  /* bytes of data                        */
    const void *data;                 /* into the mapping, nbytes long        */
} kv_gguf_tensor_t;

typedef struct kv_gguf kv_gguf_t;

/* Open and validate a GGUF file. *out is set only on success; err (may be
 * NULL) receives a one-line reason on failure. */
int kv_gguf_open(const char *path, kv_gguf_t **out, char *err, size_t err_len);

/* The same over a caller's buffer (borrowed; must outlive the reader). */
int kv_gguf_open_mem(const void *buf, size_t size, kv_gguf_t **out, char *err,
                     size_t err_len);

/* Release the reader (and unmap the file). NULL is a no-op. */
void kv_gguf_close(kv_gguf_t *g);

uint32_t kv_gguf_version(const kv_gguf_t *g);
uint64_t kv_gguf_n_kv(const kv_gguf_t *g);
uint64_t kv_gguf_n_tensors(const kv_gguf_t *g);
uint64_t kv_gguf_file_size(const kv_gguf_t *g);
uint32_t kv_gguf_alignment(const kv_gguf_t *g);

/* Entries by index (0..n-1; NULL past the end) or by key / name (NULL if
 * absent). */
const kv_gguf_kv_t *kv_gguf_kv_at(const kv_gguf_t *g, uint64_t i);
const kv_gguf_kv_t *kv_gguf_find(const kv_gguf_t *g, const char *key);
const kv_gguf_tensor_t *kv_gguf_tensor_at(const kv_gguf_t *g, uint64_t i);
const kv_gguf_tensor_t *kv_gguf_tensor(const kv_gguf_t *g, const char *name);

/* Typed scalar getters: KV_ENOENT if absent, KV_EINVAL if of another type.
 * get_u32 accepts any integer type whose value fits in uint32_t (else
 * KV_ERANGE); get_f32 accepts F32 and F64. */
int kv_gguf_get_u32(const kv_gguf_t *g, const char *key, uint32_t *out);
int kv_gguf_get_f32(const kv_gguf_t *g, const char *key, float *out);
int kv_gguf_get_bool(const kv_gguf_t *g, const char *key, int *out);
int kv_gguf_get_str(const kv_gguf_t *g, const char *key, kv_gguf_str_t *out);

/* An array entry of the given element type: KV_ENOENT if absent, KV_EINVAL
 * if not an array of elem_type. */
int kv_gguf_get_arr(const kv_gguf_t *g, const char *key, uint32_t elem_type,
                    const kv_gguf_kv_t **out);

/* The elements of a string array as views: out[0..min(n, arr_n)). Returns
 * the number filled or a negative KV_E* code (not a string array). */
int64_t kv_gguf_arr_strings(const kv_gguf_kv_t *kv, kv_gguf_str_t *out, uint64_t n);

/* Element i of an array of 32-bit integers (I32 or U32), as int64. */
int kv_gguf_arr_int(const kv_gguf_kv_t *kv, uint64_t i, int64_t *out);

/* Does the view equal the C string s? */
int kv_gguf_str_eq(kv_gguf_str_t v, const char *s);

/* Name of a tensor type ("Q4_1", ...) or "?"; block size (elements) and
 * bytes per block, 0 for an unknown type. */
const char *kv_gguf_ttype_name(uint32_t type);
uint32_t kv_gguf_ttype_block(uint32_t type);
uint32_t kv_gguf_ttype_block_bytes(uint32_t type);

#endif /* KV_GGUF_H */
