/* SPDX-License-Identifier: MIT */
/*
 * kv_spec.h — "key=value" settings checked against a key table: the one
 * machinery behind the two small grammars of the public API, policies
 * (kv_policy_parse.c: "h2o:hh=0.1,rw=0.1+int4") and the memory-pressure
 * ladder (kv_store_pressure.c: "int4,evict:sink=4,recent=256"). Each grammar
 * splits its string into parts (a policy's methods, a ladder's steps) and
 * hands every "key=value" of a part to kv_spec_set; the key table says
 * everything else once: which part a key belongs to, its kind, range,
 * default, the field it sets, and so the error messages, the defaults and
 * the canonical text (kv_spec_describe).
 *
 * A table is a constant array of kv_spec_key_t; a part's keys are its rows in
 * table order (the order the canonical text lists them in). At most 64 rows
 * (one bit each in `seen`, which catches a key given twice).
 *
 * Errors: KV_EINVAL for anything malformed (not key=value, an unknown or
 * repeated key, a value that is not of the key's kind, a value breaking the
 * key's rule), KV_ERANGE for a well-formed value outside the key's range;
 * the message names the part, the key and the value. Nothing here allocates.
 */
#ifndef KV_SPEC_H
#define KV_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "kvpage/kvpage.h"

typedef enum kv_spec_kind {
    KV_SPEC_UINT,   /* decimal digits only, in [lo, hi]; field uint32_t or    */
                    /* uint64_t (size); with mult: value % mult == rem        */
    KV_SPEC_REAL,   /* a number (strtod) in [rlo, rhi]; field double          */
    KV_SPEC_AMOUNT, /* a fraction in [0, 1) or a whole number >= 1 (tokens),  */
                    /* at most 1e9; field kv_spec_amount_t                    */
    KV_SPEC_ENUM,   /* one of names[]; field uint32_t, the name's index       */
} kv_spec_kind_t;

/* A token budget: a fraction of the prompt length or a number of tokens. */
typedef struct kv_spec_amount {
    double v;     /* fraction in [0, 1) or whole tokens >= 1 */
    int is_ratio; /* 1: v is a fraction of the prompt        */
} kv_spec_amount_t;

typedef struct kv_spec_key {
    uint32_t part;            /* the part (method, step) it belongs to: the  */
                              /* grammar's own numbering                     */
    const char *name;         /* the key, e.g. "hh"                          */
    kv_spec_kind_t kind;
    size_t off, size;         /* the field: offsetof, sizeof in the object   */
    uint64_t lo, hi;          /* UINT: range                                 */
    double rlo, rhi;          /* REAL: range                                 */
    double dflt;              /* default: UINT and ENUM exact (< 2^53),      */
                              /* AMOUNT a fraction when < 1                  */
    uint32_t mult, rem;       /* UINT rule: value % mult == rem (0: none)    */
    const char *const *names; /* ENUM: the values, NULL-terminated           */
    uint32_t quiet;           /* 1: kv_spec_describe leaves it out while it  */
                              /* holds its default (a key added later, so    */
                              /* canonical texts without it stay the same)   */
} kv_spec_key_t;

/* Rows of a table: array and length. */
typedef struct kv_spec_table {
    const kv_spec_key_t *keys;
    uint32_t n;
} kv_spec_table_t;

/* Table initialisers: part, key name, the object's type and field, range or
 * names, default. */
#define KV_SPEC_FIELD(T, f) .off = offsetof(T, f), .size = sizeof(((T *)0)->f)
#define KV_SPEC_U(p, k, T, f, l, h, d)                                        \
    {.part = (p), .name = (k), .kind = KV_SPEC_UINT, KV_SPEC_FIELD(T, f),     \
     .lo = (l), .hi = (h), .dflt = (d)}
#define KV_SPEC_U_RULE(p, k, T, f, l, h, d, m, r)                             \
    {.part = (p), .name = (k), .kind = KV_SPEC_UINT, KV_SPEC_FIELD(T, f),     \
     .lo = (l), .hi = (h), .dflt = (d), .mult = (m), .rem = (r)}
#define KV_SPEC_R(p, k, T, f, l, h, d)                                        \
    {.part = (p), .name = (k), .kind = KV_SPEC_REAL, KV_SPEC_FIELD(T, f),     \
     .rlo = (l), .rhi = (h), .dflt = (d)}
#define KV_SPEC_A(p, k, T, f, d)                                              \
    {.part = (p), .name = (k), .kind = KV_SPEC_AMOUNT, KV_SPEC_FIELD(T, f),   \
     .dflt = (d)}
#define KV_SPEC_E(p, k, T, f, nm, d)                                          \
    {.part = (p), .name = (k), .kind = KV_SPEC_ENUM, KV_SPEC_FIELD(T, f),     \
     .names = (nm), .dflt = (d)}

/* printf into err (if err_len > 0); returns code. */
int kv_spec_err(int code, char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The index of name[0..len) in names[0..n) (entries may be NULL: never
 * match), or n when absent. */
uint32_t kv_spec_lookup(const char *const *names, uint32_t n, const char *name,
                        size_t len);

/* The row of key name[0..len) of part, or NULL. */
const kv_spec_key_t *kv_spec_find(kv_spec_table_t t, uint32_t part, const char *name,
                                  size_t len);

/* Set every key of part in obj to its default. */
void kv_spec_defaults(kv_spec_table_t t, uint32_t part, void *obj);

/* Parse s[0..len), "key=value", as a key of part (named part_name in
 * messages) into obj. *seen holds a bit per table row already given; the
 * row's bit is set. 0, KV_EINVAL or KV_ERANGE (file comment) with the
 * message in err. obj is written only on success. */
int kv_spec_set(kv_spec_table_t t, uint32_t part, const char *part_name, const char *s,
                size_t len, void *obj, uint64_t *seen, char *err, size_t err_len);

/* The value of key k in obj as a number: UINT and REAL as they are, AMOUNT
 * as given (a fraction < 1 or tokens), ENUM the index. */
double kv_spec_value(const kv_spec_key_t *k, const void *obj);

/* A bounded output buffer that remembers overflow. */
typedef struct kv_spec_buf {
    char *b;
    size_t len, at;
    int over;
} kv_spec_buf_t;

void kv_spec_printf(kv_spec_buf_t *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Append part's keys of obj as "k=v,k=v" in table order (nothing when part
 * has no keys): reals and fractions as the shortest decimal that parses
 * back to the same double ("0.2", not "%.17g"'s 0.20000000000000001), tokens and integers in decimal, ENUM the name. Returns how many
 * keys it wrote. */
uint32_t kv_spec_describe(kv_spec_table_t t, uint32_t part, const void *obj,
                          kv_spec_buf_t *out);

/* Append the names of part's keys, ", " separated, to out. */
void kv_spec_key_names(kv_spec_table_t t, uint32_t part, kv_spec_buf_t *out);

#endif /* KV_SPEC_H */
