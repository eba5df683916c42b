/* SPDX-License-Identifier: MIT */
/*
 * kv_gguf.c — parsing and validation of a GGUF file (see kv_gguf.h).
 *
 * Layout (GGUF v2/v3, little-endian):
 *   "GGUF" u32 version u64 n_tensors u64 n_kv
 *   n_kv x { string key, u32 type, value }
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset }
 *   padding to `general.alignment` (default 32), then the tensor data; each
 *   tensor's offset is relative to the data start and a multiple of the alignment.
 *   string = u64 len + bytes; array = u32 elem type + u64 n + elements.
 *
 * Every read goes through a cursor that checks the bytes are there first.
 * Counts are bounded by what the remaining bytes could possibly hold before
 * anything is allocated, so a hostile header cannot make us allocate much.
 * Keys and tensor names are kept in sorted index arrays (duplicates rejected,
 * lookups by binary search).
 */
#include "kv_gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_KEY 65535u
#define GGUF_MAX_DEPTH 3 /* nested arrays accepted up to this depth */

struct kv_gguf {
    const uint8_t *base;      /* the file bytes                         */
    size_t size;              /* bytes                                  */
    int mapped;               /* 1: base is our mmap (unmap on close)   */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_off;        /* start of the tensor data section       */
    uint64_t n_kv;
    kv_gguf_kv_t *kv;         /* [n_kv], file order                     */
    uint64_t *kv_sorted;      /* [n_kv] indices sorted by key           */
    uint64_t n_tensors;
    kv_gguf_tensor_t *tensors;/* [n_tensors], file order                */
    uint64_t *t_sorted;       /* [n_tensors] indices sorted by name     */
};

/* ---- tensor type table ----------------------------------------------- */

static const struct {
    uint32_t type, block, block_bytes;
    const char *name;
} ttypes[] = {
    {KV_GGML_F32, 1, 4, "F32"},      {KV_GGML_F16, 1, 2, "F16"},
    {KV_GGML_Q4_0, 32, 18, "Q4_0"},  {KV_GGML_Q4_1, 32, 20, "Q4_1"},
    {KV_GGML_Q5_0, 32, 22, "Q5_0"},  {KV_GGML_Q5_1, 32, 24, "Q5_1"},
    {KV_GGML_Q8_0, 32, 34, "Q8_0"},  {KV_GGML_Q8_1, 32, 36, "Q8_1"},
    {KV_GGML_Q2_K, 256, 84, "Q2_K"}, {KV_GGML_Q3_K, 256, 110, "Q3_K"},
    {KV_GGML_Q4_K, 256, 144, "Q4_K"}, {KV_GGML_Q5_K, 256, 176, "Q5_K"},
    {KV_GGML_Q6_K, 256, 210, "Q6_K"}, {KV_GGML_Q8_K, 256, 292, "Q8_K"},
    {KV_GGML_I8, 1, 1, "I8"},        {KV_GGML_I16, 1, 2, "I16"},
    {KV_GGML_I32, 1, 4, "I32"},      {KV_GGML_I64, 1, 8, "I64"},
    {KV_GGML_F64, 1, 8, "F64"},      {KV_GGML_BF16, 1, 2, "BF16"},
};

static int ttype_index(uint32_t type)
{
    for (size_t i = 0; i < sizeof ttypes / sizeof ttypes[0]; i++)
        if (ttypes[i].type == type)
            return (int)i;
    return -1;
}

const char *kv_gguf_ttype_name(uint32_t type)
{
    int i = ttype_index(type);
    return i < 0 ? "?" : ttypes[i].name;
}

uint32_t kv_gguf_ttype_block(uint32_t type)
{
    int i = ttype_index(type);
    return i < 0 ? 0 : ttypes[i].block;
}

uint32_t kv_gguf_ttype_block_bytes(uint32_t type)
{
    int i = ttype_index(type);
    return i < 0 ? 0 : ttypes[i].block_bytes;
}

/* ---- the cursor ------------------------------------------------------ */

typedef struct cursor {
    const uint8_t *p;
    size_t size, pos;
    char *err;
    size_t err_len;
} cursor_t;

static int fail(cursor_t *c, int code, const char *fmt, ...)
{
    if (c->err && c->err_len) {
        char msg[KV_GGUF_ERR_LEN];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(c->err, c->err_len, "gguf: %s (at byte %zu of %zu)", msg, c->pos, c->size);
    }
    return code;
}

static int need(cursor_t *c, uint64_t n, const char *what)
{
    if (n > c->size - c->pos)
        return fail(c, KV_ECORRUPT, "truncated: %s needs %llu bytes, %zu left", what,
                    (unsigned long long)n, c->size - c->pos);
    return 0;
}

static int rd_u32(cursor_t *c, uint32_t *v, const char *what)
{
    int rc = need(c, 4, what);
    if (rc)
        return rc;
    memcpy(v, c->p + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int rd_u64(cursor_t *c, uint64_t *v, const char *what)
{
    int rc = need(c, 8, what);
    if (rc)
        return rc;
    memcpy(v, c->p + c->pos, 8);
    c->pos += 8;
    return 0;
}

static int rd_str(cursor_t *c, kv_gguf_str_t *s, const char *what)
{
    uint64_t len;
    int rc = rd_u64(c, &len, what);
    if (rc)
        return rc;
    if (len > c->size - c->pos)
        return fail(c, KV_ECORRUPT, "%s length %llu runs past the end of the file", what,
                    (unsigned long long)len);
    s->ptr = (const char *)c->p + c->pos;
    s->len = len;
    c->pos += (size_t)len;
    return 0;
}

/* Bytes of one scalar of a value type, 0 for string/array, -1 unknown. */
static int scalar_size(uint32_t t)
{
    static const int sz[KV_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < KV_GGUF_VTYPE_COUNT ? sz[t] : -1;
}

/* Skip over (and validate) one value of type t; arrays recurse. */
static int skip_value(cursor_t *c, uint32_t t, int depth, uint32_t *arr_type, uint64_t *arr_n)
{
    int sz = scalar_size(t);
    if (sz < 0)
        return fail(c, KV_ENOTSUP, "unknown metadata value type %u", t);
    if (sz > 0) {
        int rc = need(c, (uint64_t)sz, "metadata value");
        if (!rc)
            c->pos += (size_t)sz;
        return rc;
    }
    if (t == KV_GGUF_STRING) {
        kv_gguf_str_t s;
        return rd_str(c, &s, "metadata string");
    }
    /* array */
    if (depth >= GGUF_MAX_DEPTH)
        return fail(c, KV_ENOTSUP, "arrays nested deeper than %d", GGUF_MAX_DEPTH);
    uint32_t et;
    uint64_t n;
    int rc = rd_u32(c, &et, "array type");
    if (!rc)
        rc = rd_u64(c, &n, "array length");
    if (rc)
        return rc;
    int esz = scalar_size(et);
    if (esz < 0)
        return fail(c, KV_ENOTSUP, "unknown array element type %u", et);
    /* Every element takes at least one byte (strings: 8). */
    uint64_t min_el = esz > 0 ? (uint64_t)esz : (et == KV_GGUF_STRING ? 8u : 12u);
    if (n > (c->size - c->pos) / min_el)
        return fail(c, KV_ECORRUPT, "array of %llu elements cannot fit in the file",
                    (unsigned long long)n);
    if (arr_type)
        *arr_type = et;
    if (arr_n)
        *arr_n = n;
    if (esz > 0) {
        c->pos += (size_t)(n * (uint64_t)esz);
        return 0;
    }
    for (uint64_t i = 0; i < n; i++)
        if ((rc = skip_value(c, et, depth + 1, NULL, NULL)))
            return rc;
    return 0;
}

/* ---- sorted indices for lookups -------------------------------------- */

static int str_cmp(kv_gguf_str_t a, kv_gguf_str_t b)
{
    uint64_t n = a.len < b.len ? a.len : b.len;
    int r = n ? memcmp(a.ptr, b.ptr, (size_t)n) : 0;
    if (r)
        return r;
    return a.len < b.len ? -1 : a.len > b.len;
}

/* qsort has no context argument: sort (view, index) pairs instead. */
typedef struct keyed {
    kv_gguf_str_t s;
    uint64_t i;
} keyed_t;

static int keyed_cmp(const void *a, const void *b)
{
    return str_cmp(((const keyed_t *)a)->s, ((const keyed_t *)b)->s);
}

/* Sort n views into idx; fail on a duplicate. */
static int sort_names(cursor_t *c, const kv_gguf_str_t *(*get)(const kv_gguf_t *, uint64_t),
                      const kv_gguf_t *g, uint64_t n, uint64_t *idx, const char *what)
{
    if (!n)
        return 0;
    keyed_t *tmp = malloc(n * sizeof *tmp);
    if (!tmp)
        return fail(c, KV_ENOMEM, "out of memory");
    for (uint64_t i = 0; i < n; i++)
        tmp[i] = (keyed_t){*get(g, i), i};
    qsort(tmp, n, sizeof *tmp, keyed_cmp);
    int rc = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (i && !str_cmp(tmp[i - 1].s, tmp[i].s)) {
            int len = tmp[i].s.len > 64 ? 64 : (int)tmp[i].s.len;
            rc = fail(c, KV_ECORRUPT, "duplicate %s '%.*s'", what, len, tmp[i].s.ptr);
            break;
        }
        idx[i] = tmp[i].i;
    }
    free(tmp);
    return rc;
}

static const kv_gguf_str_t *kv_key(const kv_gguf_t *g, uint64_t i) { return &g->kv[i].key; }
static const kv_gguf_str_t *t_name(const kv_gguf_t *g, uint64_t i) { return &g->tensors[i].name; }

/* ---- parsing --------------------------------------------------------- */

static int parse_kv(kv_gguf_t *g, cursor_t *c)
{
    for (uint64_t i = 0; i < g->n_kv; i++) {
        kv_gguf_kv_t *kv = &g->kv[i];
        int rc = rd_str(c, &kv->key, "metadata key");
        if (rc)
            return rc;
        if (kv->key.len == 0 || kv->key.len > GGUF_MAX_KEY)
            return fail(c, KV_ECORRUPT, "metadata key %llu has length %llu",
                        (unsigned long long)i, (unsigned long long)kv->key.len);
        if ((rc = rd_u32(c, &kv->type, "metadata type")))
            return rc;
        size_t start = c->pos;
        if ((rc = skip_value(c, kv->type, 0, &kv->arr_type, &kv->arr_n)))
            return rc;
        if (kv->type == KV_GGUF_ARRAY)
            start += 12; /* past the element type and count */
        kv->data = c->p + start;
        kv->data_len = c->pos - start;
    }
    return 0;
}

static int parse_alignment(kv_gguf_t *g, cursor_t *c)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const kv_gguf_kv_t *a = kv_gguf_find(g, "general.alignment");
    if (!a)
        return 0;
    uint32_t v;
    if (a->type != KV_GGUF_U32)
        return fail(c, KV_ECORRUPT, "general.alignment is not a u32");
    memcpy(&v, a->data, 4);
    if (v == 0 || (v & (v - 1)) || v > (1u << 20))
        return fail(c, KV_ECORRUPT, "general.alignment %u is not a power of two <= 2^20", v);
    g->alignment = v;
    return 0;
}

static int parse_tensor_info(kv_gguf_t *g, cursor_t *c, kv_gguf_tensor_t *t, uint64_t i)
{
    int rc = rd_str(c, &t->name, "tensor name");
    if (rc)
        return rc;
    if (t->name.len == 0 || t->name.len >= KV_GGUF_MAX_NAME)
        return fail(c, KV_ECORRUPT, "tensor %llu has a name of length %llu",
                    (unsigned long long)i, (unsigned long long)t->name.len);
    if ((rc = rd_u32(c, &t->n_dims, "tensor n_dims")))
        return rc;
    if (t->n_dims == 0 || t->n_dims > KV_GGUF_MAX_DIMS)
        return fail(c, KV_ECORRUPT, "tensor '%.*s' has %u dims (1..%d)", (int)t->name.len,
                    t->name.ptr, t->n_dims, KV_GGUF_MAX_DIMS);
    uint64_t n = 1;
    for (uint32_t d = 0; d < KV_GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d < t->n_dims && (rc = rd_u64(c, &t->ne[d], "tensor dim")))
            return rc;
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX / n)
            return fail(c, KV_ECORRUPT, "tensor '%.*s': bad dim %u = %llu", (int)t->name.len,
                        t->name.ptr, d, (unsigned long long)t->ne[d]);
        n *= t->ne[d];
    }
    t->n_elems = n;
    if ((rc = rd_u32(c, &t->type, "tensor type")) || (rc = rd_u64(c, &t->offset, "tensor offset")))
        return rc;
    uint32_t blk = kv_gguf_ttype_block(t->type), bb = kv_gguf_ttype_block_bytes(t->type);
    if (!blk)
        return fail(c, KV_ENOTSUP, "tensor '%.*s' has unknown type %u", (int)t->name.len,
                    t->name.ptr, t->type);
    if (t->ne[0] % blk)
        return fail(c, KV_ECORRUPT, "tensor '%.*s': row of %llu is not a multiple of the %s "
                    "block (%u)", (int)t->name.len, t->name.ptr,
                    (unsigned long long)t->ne[0], kv_gguf_ttype_name(t->type), blk);
    if (n / blk > UINT64_MAX / bb)
        return fail(c, KV_ECORRUPT, "tensor '%.*s' is too large", (int)t->name.len, t->name.ptr);
    t->nbytes = n / blk * bb;
    if (t->offset % g->alignment)
        return fail(c, KV_ECORRUPT, "tensor '%.*s': offset %llu is not a multiple of the "
                    "alignment %u", (int)t->name.len, t->name.ptr,
                    (unsigned long long)t->offset, g->alignment);
    return 0;
}

typedef struct span {
    uint64_t off, end;
    uint64_t i;
} span_t;

static int span_cmp(const void *a, const void *b)
{
    uint64_t x = ((const span_t *)a)->off, y = ((const span_t *)b)->off;
    return x < y ? -1 : x > y;
}

/* Every tensor's bytes lie inside the file and no two overlap. */
static int check_data(kv_gguf_t *g, cursor_t *c)
{
    uint64_t avail = g->size - g->data_off;
    span_t *sp = malloc(g->n_tensors * sizeof *sp);
    if (!sp)
        return fail(c, KV_ENOMEM, "out of memory");
    int rc = 0;
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) {
        kv_gguf_tensor_t *t = &g->tensors[i];
        if (t->offset > avail || t->nbytes > avail - t->offset) {
            rc = fail(c, KV_ECORRUPT, "tensor '%.*s' (%llu bytes at data offset %llu) lies "
                      "past the end of the file", (int)t->name.len, t->name.ptr,
                      (unsigned long long)t->nbytes, (unsigned long long)t->offset);
            break;
        }
        t->data = g->base + g->data_off + t->offset;
        sp[i] = (span_t){t->offset, t->offset + t->nbytes, i};
    }
    if (!rc) {
        qsort(sp, g->n_tensors, sizeof *sp, span_cmp);
        for (uint64_t i = 1; i < g->n_tensors; i++)
            if (sp[i].off < sp[i - 1].end) {
                const kv_gguf_tensor_t *a = &g->tensors[sp[i - 1].i], *b = &g->tensors[sp[i].i];
                rc = fail(c, KV_ECORRUPT, "tensors '%.*s' and '%.*s' overlap", (int)a->name.len,
                          a->name.ptr, (int)b->name.len, b->name.ptr);
                break;
            }
    }
    free(sp);
    return rc;
}

static int parse(kv_gguf_t *g, cursor_t *c)
{
    uint32_t magic;
    int rc = rd_u32(c, &magic, "magic");
    if (rc)
        return rc;
    if (memcmp(c->p, "GGUF", 4))
        return fail(c, KV_ECORRUPT, "bad magic (not a GGUF file)");
    if ((rc = rd_u32(c, &g->version, "version")))
        return rc;
    if (g->version == 1)
        return fail(c, KV_ENOTSUP, "GGUF version 1 is not supported (2 and 3 are)");
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffffu) == 0 && (g->version >> 24) <= 3)
            return fail(c, KV_ENOTSUP, "big-endian GGUF files are not supported");
        return fail(c, KV_ENOTSUP, "unknown GGUF version %u (2 and 3 are supported)",
                    g->version);
    }
    if ((rc = rd_u64(c, &g->n_tensors, "tensor count")) || (rc = rd_u64(c, &g->n_kv, "kv count")))
        return rc;
    /* A key-value pair takes >= 13 bytes, a tensor info >= 32. */
    uint64_t left = c->size - c->pos;
    if (g->n_kv > left / 13)
        return fail(c, KV_ECORRUPT, "%llu metadata entries cannot fit in the file",
                    (unsigned long long)g->n_kv);
    if (g->n_tensors > left / 32)
        return fail(c, KV_ECORRUPT, "%llu tensors cannot fit in the file",
                    (unsigned long long)g->n_tensors);
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->kv_sorted = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv_sorted);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    g->t_sorted = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->t_sorted);
    if (!g->kv || !g->kv_sorted || !g->tensors || !g->t_sorted)
        return fail(c, KV_ENOMEM, "out of memory");
    if ((rc = parse_kv(g, c)) ||
        (rc = sort_names(c, kv_key, g, g->n_kv, g->kv_sorted, "metadata key")) ||
        (rc = parse_alignment(g, c)))
        return rc;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((rc = parse_tensor_info(g, c, &g->tensors[i], i)))
            return rc;
    if ((rc = sort_names(c, t_name, g, g->n_tensors, g->t_sorted, "tensor name")))
        return rc;
    uint64_t a = g->alignment;
    g->data_off = (c->pos + a - 1) / a * a;
    if (g->n_tensors && g->data_off > g->size)
        return fail(c, KV_ECORRUPT, "truncated: the tensor data section starts at %llu, "
                    "past the end", (unsigned long long)g->data_off);
    if (g->n_tensors)
        return check_data(g, c);
    return 0;
}

static void free_tables(kv_gguf_t *g)
{
    free(g->kv);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->t_sorted);
}

static int open_common(const uint8_t *base, size_t size, int mapped, kv_gguf_t **out,
                       char *err, size_t err_len)
{
    kv_gguf_t *g = calloc(1, sizeof *g);
    cursor_t c = {.p = base, .size = size, .err = err, .err_len = err_len};
    if (!g)
        return fail(&c, KV_ENOMEM, "out of memory");
    g->base = base;
    g->size = size;
    g->mapped = mapped;
    int rc = parse(g, &c);
    if (rc) {
        free_tables(g);
        free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int kv_gguf_open_mem(const void *buf, size_t size, kv_gguf_t **out, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = 0;
    if (!out || (!buf && size)) {
        if (err && err_len)
            snprintf(err, err_len, "gguf: invalid argument");
        return KV_EINVAL;
    }
    return open_common(buf, size, 0, out, err, err_len);
}

int kv_gguf_open(const char *path, kv_gguf_t **out, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = 0;
    if (!path || !out) {
        if (err && err_len)
            snprintf(err, err_len, "gguf: invalid argument");
        return KV_EINVAL;
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block */
    if (fd < 0) {
        int e = errno;
        if (err && err_len)
            snprintf(err, err_len, "gguf: cannot open '%s': %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        int e = errno;
        close(fd);
        if (err && err_len)
            snprintf(err, err_len, "gguf: '%s' is %s", path,
                     e ? strerror(e) : "empty or not a regular file");
        return e ? -e : KV_ECORRUPT;
    }
    size_t size = (size_t)st.st_size;
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) {
        if (err && err_len)
            snprintf(err, err_len, "gguf: cannot map '%s': %s", path, strerror(e));
        return -e;
    }
    int rc = open_common(m, size, 1, out, err, err_len);
    if (rc)
        munmap(m, size);
    return rc;
}

void kv_gguf_close(kv_gguf_t *g)
{
    if (!g)
        return;
    if (g->mapped)
        munmap((void *)g->base, g->size);
    free_tables(g);
    free(g);
}

/* ---- accessors ------------------------------------------------------- */

uint32_t kv_gguf_version(const kv_gguf_t *g) { return g->version; }
uint64_t kv_gguf_n_kv(const kv_gguf_t *g) { return g->n_kv; }
uint64_t kv_gguf_n_tensors(const kv_gguf_t *g) { return g->n_tensors; }
uint64_t kv_gguf_file_size(const kv_gguf_t *g) { return g->size; }
uint32_t kv_gguf_alignment(const kv_gguf_t *g) { return g->alignment; }

const kv_gguf_kv_t *kv_gguf_kv_at(const kv_gguf_t *g, uint64_t i)
{
    return g && i < g->n_kv ? &g->kv[i] : NULL;
}

const kv_gguf_tensor_t *kv_gguf_tensor_at(const kv_gguf_t *g, uint64_t i)
{
    return g && i < g->n_tensors ? &g->tensors[i] : NULL;
}

/* Binary search of a sorted index (sorting is done before any lookup). */
static int64_t lookup(const kv_gguf_t *g, const uint64_t *idx, uint64_t n,
                      const kv_gguf_str_t *(*get)(const kv_gguf_t *, uint64_t), const char *s)
{
    kv_gguf_str_t key = {s, strlen(s)};
    uint64_t lo = 0, hi = n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int r = str_cmp(*get(g, idx[mid]), key);
        if (!r)
            return (int64_t)idx[mid];
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

const kv_gguf_kv_t *kv_gguf_find(const kv_gguf_t *g, const char *key)
{
    if (!g || !key)
        return NULL;
    int64_t i = lookup(g, g->kv_sorted, g->n_kv, kv_key, key);
    return i < 0 ? NULL : &g->kv[i];
}

const kv_gguf_tensor_t *kv_gguf_tensor(const kv_gguf_t *g, const char *name)
{
    if (!g || !name)
        return NULL;
    int64_t i = lookup(g, g->t_sorted, g->n_tensors, t_name, name);
    return i < 0 ? NULL : &g->tensors[i];
}

int kv_gguf_str_eq(kv_gguf_str_t v, const char *s)
{
    size_t n = strlen(s);
    return v.len == n && (n == 0 || !memcmp(v.ptr, s, n));
}
