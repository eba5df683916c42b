/* SPDX-License-Identifier: MIT */
/*
 * kv_gguf_get.c — typed access to GGUF metadata values (see kv_gguf.h).
 *
 * The parser already proved every value's bytes lie inside the file, so
 * these only check types and ranges. Values are read with memcpy (the file
 * gives no alignment guarantee for metadata).
 */
#include <string.h>

#include "kv_gguf.h"

static int find_typed(const kv_gguf_t *g, const char *key, const kv_gguf_kv_t **out)
{
    if (!g || !key || !out)
        return KV_EINVAL;
    *out = kv_gguf_find(g, key);
    return *out ? 0 : KV_ENOENT;
}

/* Integer value of a scalar of integer type t at p. */
static int read_int(uint32_t t, const uint8_t *p, int64_t *s, uint64_t *u, int *is_signed)
{
    *is_signed = 1;
    switch (t) {
    case KV_GGUF_U8: *u = p[0]; *is_signed = 0; return 0;
    case KV_GGUF_I8: { int8_t v; memcpy(&v, p, 1); *s = v; return 0; }
    case KV_GGUF_U16: { uint16_t v; memcpy(&v, p, 2); *u = v; *is_signed = 0; return 0; }
    case KV_GGUF_I16: { int16_t v; memcpy(&v, p, 2); *s = v; return 0; }
    case KV_GGUF_U32: { uint32_t v; memcpy(&v, p, 4); *u = v; *is_signed = 0; return 0; }
    case KV_GGUF_I32: { int32_t v; memcpy(&v, p, 4); *s = v; return 0; }
    case KV_GGUF_U64: { uint64_t v; memcpy(&v, p, 8); *u = v; *is_signed = 0; return 0; }
    case KV_GGUF_I64: { int64_t v; memcpy(&v, p, 8); *s = v; return 0; }
    default: return KV_EINVAL;
    }
}

int kv_gguf_get_u32(const kv_gguf_t *g, const char *key, uint32_t *out)
{
    const kv_gguf_kv_t *kv;
    int rc = find_typed(g, key, &kv);
    if (rc)
        return rc;
    int64_t s = 0;
    uint64_t u = 0;
    int sg;
    if ((rc = read_int(kv->type, kv->data, &s, &u, &sg)))
        return rc;
    if (sg) {
        if (s < 0)
            return KV_ERANGE;
        u = (uint64_t)s;
    }
    if (u > UINT32_MAX)
        return KV_ERANGE;
    if (out)
        *out = (uint32_t)u;
    return 0;
}

int kv_gguf_get_f32(const kv_gguf_t *g, const char *key, float *out)
{
    const kv_gguf_kv_t *kv;
    int rc = find_typed(g, key, &kv);
    if (rc)
        return rc;
    if (kv->type == KV_GGUF_F32) {
        memcpy(out, kv->data, 4);
        return 0;
    }
    if (kv->type == KV_GGUF_F64) {
        double d;
        memcpy(&d, kv->data, 8);
        *out = (float)d;
        return 0;
    }
    return KV_EINVAL;
}

int kv_gguf_get_bool(const kv_gguf_t *g, const char *key, int *out)
{
    const kv_gguf_kv_t *kv;
    int rc = find_typed(g, key, &kv);
    if (rc)
        return rc;
    if (kv->type != KV_GGUF_BOOL)
        return KV_EINVAL;
    *out = kv->data[0] != 0;
    return 0;
}

int kv_gguf_get_str(const kv_gguf_t *g, const char *key, kv_gguf_str_t *out)
{
    const kv_gguf_kv_t *kv;
    int rc = find_typed(g, key, &kv);
    if (rc)
        return rc;
    if (kv->type != KV_GGUF_STRING)
        return KV_EINVAL;
    uint64_t len;
    memcpy(&len, kv->data, 8);
    out->ptr = (const char *)kv->data + 8;
    out->len = len;
    return 0;
}

int kv_gguf_get_arr(const kv_gguf_t *g, const char *key, uint32_t elem_type,
                    const kv_gguf_kv_t **out)
{
    const kv_gguf_kv_t *kv;
    int rc = find_typed(g, key, &kv);
    if (rc)
        return rc;
    if (kv->type != KV_GGUF_ARRAY || kv->arr_type != elem_type)
        return KV_EINVAL;
    *out = kv;
    return 0;
}

int64_t kv_gguf_arr_strings(const kv_gguf_kv_t *kv, kv_gguf_str_t *out, uint64_t n)
{
    if (!kv || (!out && n) || kv->type != KV_GGUF_ARRAY || kv->arr_type != KV_GGUF_STRING)
        return KV_EINVAL;
    const uint8_t *p = kv->data;
    uint64_t m = n < kv->arr_n ? n : kv->arr_n;
    for (uint64_t i = 0; i < m; i++) {
        uint64_t len;
        memcpy(&len, p, 8); /* validated by the parser: in bounds */
        out[i].ptr = (const char *)p + 8;
        out[i].len = len;
        p += 8 + len;
    }
    return (int64_t)m;
}

int kv_gguf_arr_int(const kv_gguf_kv_t *kv, uint64_t i, int64_t *out)
{
    if (!kv || !out || kv->type != KV_GGUF_ARRAY)
        return KV_EINVAL;
    if (kv->arr_type != KV_GGUF_I32 && kv->arr_type != KV_GGUF_U32)
        return KV_EINVAL;
    if (i >= kv->arr_n)
        return KV_ERANGE;
    if (kv->arr_type == KV_GGUF_I32) {
        int32_t v;
        memcpy(&v, kv->data + 4 * i, 4);
        *out = v;
    } else {
        uint32_t v;
        memcpy(&v, kv->data + 4 * i, 4);
        *out = v;
    }
    return 0;
}
