/* SPDX-License-Identifier: MIT */
/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader (model/kv_gguf*)
 * and what is built on its metadata (kv_tok_from_gguf).
 *
 * Input: the bytes of a GGUF file, read with kv_gguf_open_mem (libFuzzer
 * hands over a heap copy of exactly `size` bytes, so ASan sees any read past
 * the end). Properties: a rejected file gets a negative code and a message;
 * an accepted one keeps every promise of kv_gguf.h — each entry, string and
 * array element can be read (every byte is touched), lookups by key and by
 * tensor name find the same entries, every tensor's data lies inside the
 * input with nbytes matching its type and shape, tensors do not overlap,
 * the first row of each dequantizable tensor decodes; and the tokenizer glue
 * either refuses the metadata or yields a tokenizer that round-trips text.
 * Build and run: fuzz/build.sh (see fuzz/README.md).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_gguf.h"
#include "kv_tok.h"
#ifndef FUZZ_GGUF_NO_QUANT /* set by build.sh when kv_quant*.c cannot be built */
#include "kv_quant.h"
#endif

static volatile uint64_t sink; /* keeps the byte touches */

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_gguf: property failed: %s\n", what);
        abort();
    }
}

static void touch(const void *p, uint64_t n)
{
    const uint8_t *b = p;
    uint64_t s = 0;
    for (uint64_t i = 0; i < n; i++)
        s += b[i];
    sink += s;
}

static int inside(const uint8_t *base, size_t size, const void *p, uint64_t n)
{
    const uint8_t *q = p;
    return q >= base && q <= base + size && n <= (uint64_t)(base + size - q);
}

static void walk_kv(const kv_gguf_t *g, const uint8_t *data, size_t size)
{
    static kv_gguf_str_t views[4096];
    for (uint64_t i = 0; i < kv_gguf_n_kv(g); i++) {
        const kv_gguf_kv_t *kv = kv_gguf_kv_at(g, i);
        check(kv != NULL, "kv_at inside n_kv");
        check(inside(data, size, kv->key.ptr, kv->key.len), "key inside the file");
        check(inside(data, size, kv->data, kv->data_len), "value inside the file");
        touch(kv->key.ptr, kv->key.len);
        touch(kv->data, kv->data_len);
        if (kv->key.len < 512 && !memchr(kv->key.ptr, 0, (size_t)kv->key.len)) {
            char key[512];
            memcpy(key, kv->key.ptr, (size_t)kv->key.len);
            key[kv->key.len] = 0;
            check(kv_gguf_find(g, key) == kv, "find by key gives the same entry");
        }
        if (kv->type == KV_GGUF_ARRAY && kv->arr_type == KV_GGUF_STRING) {
            uint64_t n = kv->arr_n < 4096 ? kv->arr_n : 4096;
            int64_t got = kv_gguf_arr_strings(kv, views, n);
            check(got == (int64_t)n, "string array elements");
            for (int64_t j = 0; j < got; j++) {
                check(inside(data, size, views[j].ptr, views[j].len), "string inside the file");
                touch(views[j].ptr, views[j].len);
            }
        }
        if (kv->type == KV_GGUF_ARRAY &&
            (kv->arr_type == KV_GGUF_I32 || kv->arr_type == KV_GGUF_U32)) {
            for (uint64_t j = 0; j < kv->arr_n && j < 4096; j++) {
                int64_t v;
                check(kv_gguf_arr_int(kv, j, &v) == 0, "int array element");
                sink += (uint64_t)v;
            }
        }
    }
    check(kv_gguf_kv_at(g, kv_gguf_n_kv(g)) == NULL, "kv_at past the end is NULL");
}

static int cmp_span(const void *a, const void *b)
{
    const kv_gguf_tensor_t *x = *(const kv_gguf_tensor_t *const *)a;
    const kv_gguf_tensor_t *y = *(const kv_gguf_tensor_t *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static void walk_tensors(const kv_gguf_t *g, const uint8_t *data, size_t size)
{
    uint64_t n = kv_gguf_n_tensors(g);
    const kv_gguf_tensor_t **order = malloc((n ? n : 1) * sizeof *order);
    check(order != NULL, "malloc");
    for (uint64_t i = 0; i < n; i++) {
        const kv_gguf_tensor_t *t = kv_gguf_tensor_at(g, i);
        check(t != NULL, "tensor_at inside n_tensors");
        order[i] = t;
        check(t->n_dims >= 1 && t->n_dims <= KV_GGUF_MAX_DIMS, "n_dims");
        uint64_t ne = 1;
        for (uint32_t d = 0; d < KV_GGUF_MAX_DIMS; d++)
            ne *= t->ne[d];
        check(ne == t->n_elems, "n_elems is the product of ne");
        uint32_t blk = kv_gguf_ttype_block(t->type), bb = kv_gguf_ttype_block_bytes(t->type);
        check(blk > 0 && t->n_elems % blk == 0 && t->nbytes == t->n_elems / blk * bb,
              "nbytes matches type and shape");
        check(inside(data, size, t->data, t->nbytes), "tensor data inside the file");
        check(t->offset % kv_gguf_alignment(g) == 0, "tensor offset aligned");
        touch(t->name.ptr, t->name.len);
        touch(t->data, t->nbytes);
        if (t->name.len < KV_GGUF_MAX_NAME && !memchr(t->name.ptr, 0, (size_t)t->name.len)) {
            char name[KV_GGUF_MAX_NAME + 1];
            memcpy(name, t->name.ptr, (size_t)t->name.len);
            name[t->name.len] = 0;
            check(kv_gguf_tensor(g, name) == t, "find by name gives the same tensor");
        }
#ifndef FUZZ_GGUF_NO_QUANT
        /* the first row of a type the model multiplies decodes in bounds */
        uint64_t cols = t->ne[0];
        if (kv_q_supported(t->type) && cols > 0 && cols <= 65536 &&
            kv_q_row_bytes(t->type, (size_t)cols) > 0 &&
            kv_q_row_bytes(t->type, (size_t)cols) <= t->nbytes) {
            float *row = malloc((size_t)cols * sizeof *row);
            check(row != NULL, "malloc");
            check(kv_q_dequant_row(t->type, t->data, row, (size_t)cols) == 0, "dequant row");
            touch(row, cols * sizeof *row);
            free(row);
        }
#endif
    }
    check(kv_gguf_tensor_at(g, n) == NULL, "tensor_at past the end is NULL");
    qsort(order, (size_t)n, sizeof *order, cmp_span);
    for (uint64_t i = 1; i < n; i++)
        check(order[i - 1]->offset + order[i - 1]->nbytes <= order[i]->offset,
              "tensors do not overlap");
    free(order);
}

static void try_tokenizer(const kv_gguf_t *g)
{
    static const char text[] = "Hello 123 <|im_start|>caf\xC3\xA9\n\n  x";
    kv_tok_t *t = NULL;
    char err[KV_GGUF_ERR_LEN] = "";
    int rc = kv_tok_from_gguf(g, &t, err, sizeof err);
    if (rc != 0) {
        check(rc < 0 && t == NULL && err[0] != 0, "tokenizer refusal has a code and a message");
        return;
    }
    int32_t ids[3 * sizeof text];
    char small[3 * sizeof text];
    size_t n = 0, len = 0, len2 = 0;
    rc = kv_tok_encode(t, text, sizeof text - 1, 1, ids, sizeof ids / sizeof *ids, &n);
    if (rc == 0) {
        /* pieces may be long (an unk token of any text): size first, then
         * decode into exactly that; a smaller buffer is KV_ERANGE */
        check(kv_tok_decode(t, ids, n, NULL, 0, &len) == 0, "decode size query");
        char *back = malloc(len ? len : 1);
        check(back != NULL, "decode buffer");
        check(kv_tok_decode(t, ids, n, back, len, &len2) == 0 && len2 == len, "decode");
        touch(back, len);
        free(back);
        rc = kv_tok_decode(t, ids, n, small, sizeof small, &len2);
        check(len > sizeof small ? rc == KV_ERANGE : rc == 0, "decode into a short buffer");
    } else {
        /* only a vocabulary that can spell neither a byte nor U+FFFD, nor has unk */
        check(rc == KV_EINVAL, "encode error other than an unencodable byte");
    }
    kv_tok_destroy(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kv_gguf_t *g = NULL;
    char err[KV_GGUF_ERR_LEN] = "";
    int rc = kv_gguf_open_mem(data, size, &g, err, sizeof err);
    if (rc != 0) {
        check(rc < 0 && g == NULL && err[0] != 0, "rejection has a code and a message");
        return 0;
    }
    check(kv_gguf_file_size(g) == size, "file size");
    check(kv_gguf_version(g) == 2 || kv_gguf_version(g) == 3, "version");
    uint32_t a = kv_gguf_alignment(g);
    check(a > 0 && (a & (a - 1)) == 0, "alignment a power of two");
    walk_kv(g, data, size);
    walk_tensors(g, data, size);
    try_tokenizer(g);
    kv_gguf_close(g);
    return 0;
}
