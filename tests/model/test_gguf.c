/* SPDX-License-Identifier: MIT */
/*
 * test_gguf.c — the GGUF reader, the weight formats and the model file.
 *
 * Checks:
 *   - binary16 decode of all 65536 values against a reference built from the
 *     field definitions, and encode(decode(h)) == h for every non-NaN half;
 *   - Q4_1 / Q8_0 / F16 blocks built by hand dequantize to the values the
 *     ggml layout defines; for each of the four types, the packed
 *     kv_q_matmul on a random matrix (37 rows: not a multiple of 8) is
 *     bit for bit the same across thread counts and batch sizes (a row
 *     alone = the same row in a batch of 11) and equals a double-precision
 *     reference: for Q4_1 / Q8_0 the reference of kv_quant.h's integer
 *     contract (activations quantized to int16 per block of 32 as defined
 *     there, rebuilt here independently), to 1e-6, and the exact FP product
 *     to 1e-4 (the activation rounding, ~1e-5 seen); for F16 / F32 the exact product
 *     to 1e-6. The scalar path gives the same bits as the SIMD one for
 *     Q4_1 / Q8_0 and agrees with the reference for all four;
 *   - SHA-256 known-answer vectors (FIPS 180-4 examples);
 *   - a small GGUF file built here (v3 and v2, every value type, nested
 *     arrays, four tensor types, custom alignment) parses with every value
 *     and tensor where it was written; every strict prefix of it and every
 *     single-byte corruption is handled (error or success, never a crash,
 *     never a read outside the buffer: the buffers are exactly sized so
 *     ASan sees any overrun); targeted corruptions (bad magic, versions,
 *     huge counts and lengths, unknown types, misaligned/past-EOF/
 *     overlapping tensors, bad dims, duplicates, bad alignment) give the
 *     expected error code and a message;
 *   - the real model file (skipped, exit 77, only when it was not fetched):
 *     hyperparameters, tensor shapes/types, tied output, the pinned SHA-256;
 *     truncated copies (header, metadata, tensor infos, data) written with
 *     mkstemp and cut with ftruncate, and patched copies (bad magic, huge
 *     string, bad tensor type, misaligned and past-EOF offsets, a renamed
 *     tensor, a changed hyperparameter) fail with clear errors; a copy of
 *     the pinned size with one byte changed fails the SHA-256 check, also
 *     when an older fetch record sits beside it; random mutations of its
 *     header never crash the reader.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv_gguf.h"
#include "kv_model_test.h"
#include "kv_quant.h"
#include "kv_quant_simd.h"
#include "kv_sha256.h"

/* ---- formats ------------------------------------------------------------ */

static double ref_half(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static void test_half(void)
{
    long bad_dec = 0, bad_rt = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kv_q_half_to_float((uint16_t)h);
        int e = (h >> 10) & 31;
        if (e == 31) {
            if ((h & 1023) ? !isnan(f) : !isinf(f))
                bad_dec++;
            continue;
        }
        if ((double)f != ref_half((uint16_t)h) || !!signbit(f) != (int)(h >> 15))
            bad_dec++;
        if (kv_q_float_to_half(f) != h)
            bad_rt++;
    }
    CHECK_EQ(bad_dec, 0);
    CHECK_EQ(bad_rt, 0);
    CHECK_EQ(kv_q_float_to_half(1e6f), 0x7c00);       /* overflow -> inf      */
    CHECK_EQ(kv_q_float_to_half(65519.0f), 0x7bff);   /* rounds down to max   */
    CHECK_EQ(kv_q_float_to_half(1.0f + 1.0f / 2048), 0x3c00); /* tie to even */
    CHECK_EQ(kv_q_float_to_half(1.0f + 3.0f / 2048), 0x3c02); /* tie to even */
    CHECK_EQ(kv_q_float_to_half(ldexpf(1, -25)), 0);  /* tie to even: 0     */
    CHECK_EQ(kv_q_float_to_half(ldexpf(1.5f, -25)), 1);
}

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static uint16_t get16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static void test_blocks(void)
{
    uint8_t q41[20], q80[34], f16[8];
    put16(q41, 0x3800); /* d = 0.5 */
    put16(q41 + 2, 0xbc00); /* m = -1 */
    for (int j = 0; j < 16; j++)
        q41[4 + j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    CHECK_OK(kv_q_dequant_row(KV_GGML_Q4_1, q41, y, 32));
    int bad = 0;
    for (int j = 0; j < 16; j++)
        bad += y[j] != j * 0.5f - 1 || y[j + 16] != (15 - j) * 0.5f - 1;
    CHECK_EQ(bad, 0);
    put16(q80, 0x3400); /* d = 0.25 */
    for (int j = 0; j < 32; j++)
        q80[2 + j] = (uint8_t)(int8_t)(j - 16);
    CHECK_OK(kv_q_dequant_row(KV_GGML_Q8_0, q80, y, 32));
    bad = 0;
    for (int j = 0; j < 32; j++)
        bad += y[j] != (j - 16) * 0.25f;
    CHECK_EQ(bad, 0);
    uint16_t hv[4] = {0x3c00, 0xc000, 0x0001, 0x7bff};
    memcpy(f16, hv, 8);
    CHECK_OK(kv_q_dequant_row(KV_GGML_F16, f16, y, 4));
    CHECK(y[0] == 1.0f && y[1] == -2.0f && y[2] == ldexpf(1, -24) && y[3] == 65504.0f);
    /* Wrong sizes and types are refused. */
    CHECK_EQ(kv_q_dequant_row(KV_GGML_Q4_1, q41, y, 16), KV_EINVAL);
    CHECK_EQ(kv_q_dequant_row(KV_GGML_Q4_K, q41, y, 256), KV_EINVAL);
    CHECK_EQ(kv_q_row_bytes(KV_GGML_Q4_1, 64), 40);
    CHECK_EQ(kv_q_row_bytes(KV_GGML_Q8_0, 576), 612);
}

/* kv_quant.h's integer contract for one file-layout row of Q4_1 / Q8_0 and
 * one activation row, in double: per block of 32, dx = max|x| / 32767, codes
 * round-to-even(x * (1 / dx)), sum_b dw * dx * sum_j q_j qx_j (+ m * sum x). */
static double int_ref(uint32_t type, const uint8_t *wrow, const float *x, uint32_t cols)
{
    const size_t bb = kv_q_row_bytes(type, 32);
    double acc = 0;
    for (uint32_t b = 0; b < cols / 32; b++) {
        const uint8_t *blk = wrow + b * bb;
        const float *xb = x + 32 * b;
        float amax = 0;
        double sx = 0;
        for (int j = 0; j < 32; j++) {
            amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
            sx += xb[j];
        }
        const float dx = amax / 32767.0f, id = dx != 0.0f ? 1.0f / dx : 0.0f;
        long isum = 0;
        for (int j = 0; j < 32; j++) {
            long qx = lrintf(xb[j] * id);
            long qw = type == KV_GGML_Q4_1 ? (blk[4 + j % 16] >> (4 * (j / 16))) & 15
                                           : (int8_t)blk[2 + j];
            isum += qw * qx;
        }
        acc += (double)kv_q_half_to_float(get16(blk)) * dx * (double)isum;
        if (type == KV_GGML_Q4_1)
            acc += (double)kv_q_half_to_float(get16(blk + 2)) * sx;
    }
    return acc;
}

/* One matrix type: random blocks, x; packed matmul against a double
 * reference, bit-identical across threads and batch sizes, and the scalar
 * path (no SIMD) close to the SIMD one. */
static void matmul_case(uint32_t type, uint64_t *rs, kv_workers_t *workers)
{
    enum { R = 37, C = 96, N = 11 };
    const size_t rb = kv_q_row_bytes(type, C);
    uint8_t *w = malloc(R * rb);
    float *x = malloc(N * C * sizeof *x), *y1 = malloc(N * R * 4), *y2 = malloc(N * R * 4);
    float *y3 = malloc(N * R * 4), *row = malloc(C * 4);
    for (size_t i = 0; i < R * rb; i++)
        w[i] = (uint8_t)kv_test_rand(rs);
    /* Sane scales (and finite F16/F32 values). */
    for (uint32_t r = 0; r < R; r++)
        for (uint32_t b = 0; b < C / 32; b++) {
            uint8_t *blk = w + r * rb + b * kv_q_row_bytes(type, 32);
            if (type == KV_GGML_Q4_1 || type == KV_GGML_Q8_0)
                put16(blk, kv_q_float_to_half(0.01f + 0.05f * kv_test_randf(rs)));
            if (type == KV_GGML_Q4_1)
                put16(blk + 2, kv_q_float_to_half(0.4f * kv_test_randf(rs)));
            for (int k = 0; k < 32 && type == KV_GGML_F16; k++)
                put16(blk + 2 * k, kv_q_float_to_half(kv_test_randf(rs)));
            for (int k = 0; k < 32 && type == KV_GGML_F32; k++) {
                float f = kv_test_randf(rs);
                memcpy(blk + 4 * k, &f, 4);
            }
        }
    for (int i = 0; i < N * C; i++)
        x[i] = kv_test_randf(rs);
    kv_q_mat_t m;
    CHECK_OK(kv_q_mat_init(&m, type, R, C, w, R * rb));
    CHECK_EQ(kv_q_mat_init(&m, type, R, C, w, R * rb - 1), KV_ERANGE);
    CHECK_EQ(kv_q_matmul(&m, x, N, y1, R, NULL, 1), KV_EINVAL); /* not packed yet */
    CHECK_OK(kv_q_pack(&m));
    CHECK_OK(kv_q_matmul(&m, x, N, y1, R, NULL, 1));
    CHECK_OK(kv_q_matmul(&m, x, N, y2, R, workers, 3));
    CHECK(!memcmp(y1, y2, N * R * 4));
    /* Every row alone, and in a batch of 2, gives the same bits. */
    int same = 1;
    for (int t = 0; t < N; t++) {
        CHECK_OK(kv_q_matmul(&m, x + t * C, 1, y3, R, workers, 2));
        same &= !memcmp(y3, y1 + t * R, R * 4);
    }
    CHECK_OK(kv_q_matmul(&m, x + 4 * C, 2, y3, R, workers, 0));
    same &= !memcmp(y3, y1 + 4 * R, 2 * R * 4);
    CHECK(same);
    double worst = 0, worst_scalar = 0, worst_fp = 0;
    kv_q_set_simd(0);
    CHECK_OK(kv_q_matmul(&m, x, N, y2, R, workers, 2));
    kv_q_set_simd(1);
    const int integer = type == KV_GGML_Q4_1 || type == KV_GGML_Q8_0;
    if (integer) /* the same integer sums and fmaf sequence: the same bits */
        CHECK(!memcmp(y1, y2, N * R * 4));
    for (int r = 0; r < R; r++) {
        kv_q_dequant_row(type, w + r * rb, row, C);
        for (int t = 0; t < N; t++) {
            double ref = 0, mag = 0, fp = 0;
            for (int k = 0; k < C; k++) {
                fp += (double)row[k] * x[t * C + k];
                mag += fabs((double)row[k] * x[t * C + k]);
            }
            ref = integer ? int_ref(type, w + r * rb, x + t * C, C) : fp;
            double e = fabs(ref - y1[t * R + r]) / (mag + 1e-30);
            double es = fabs(ref - y2[t * R + r]) / (mag + 1e-30);
            double ef = fabs(fp - y1[t * R + r]) / (mag + 1e-30);
            worst = e > worst ? e : worst;
            worst_scalar = es > worst_scalar ? es : worst_scalar;
            worst_fp = ef > worst_fp ? ef : worst_fp;
        }
    }
    printf("matmul type %u: vs contract %.3g (scalar %.3g), vs exact FP %.3g\n", type, worst,
           worst_scalar, worst_fp);
    CHECK(worst < 1e-6);
    CHECK(worst_scalar < 1e-6);
    CHECK(worst_fp < (integer ? 1e-4 : 1e-6));
    kv_q_mat_release(&m);
    free(w), free(x), free(y1), free(y2), free(y3), free(row);
}

static void test_matmul(void)
{
    uint64_t rs = 7;
    kv_workers_t *workers = NULL;
    CHECK_OK(kv_workers_create(3, &workers));
    CHECK_EQ(kv_workers_size(workers), 3);
    const uint32_t types[] = {KV_GGML_Q4_1, KV_GGML_Q8_0, KV_GGML_F16, KV_GGML_F32};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        matmul_case(types[i], &rs, workers);
    kv_workers_destroy(workers);
    float a[24], b[24];
    for (int i = 0; i < 24; i++)
        a[i] = kv_test_randf(&rs), b[i] = kv_test_randf(&rs);
    double ref = 0;
    for (int i = 0; i < 24; i++)
        ref += (double)a[i] * b[i];
    CHECK(fabs(kv_q_dot_f32(a, b, 24) - ref) < 1e-5);
}

static void test_sha256(void)
{
    static const struct {
        const char *msg;
        const char *hex;
    } kat[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    uint8_t d[32];
    char hex[65];
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        kv_sha256_t s;
        kv_sha256_init(&s);
        /* Feed in uneven pieces to exercise the partial-block path. */
        size_t n = strlen(kat[i].msg);
        for (size_t o = 0; o < n; o += 7)
            kv_sha256_update(&s, kat[i].msg + o, n - o < 7 ? n - o : 7);
        kv_sha256_final(&s, d);
        kv_sha256_hex(d, hex);
        CHECK(!strcmp(hex, kat[i].hex));
    }
    kv_sha256_t s;
    kv_sha256_init(&s);
    char a[1000];
    memset(a, 'a', sizeof a);
    for (int i = 0; i < 1000; i++)
        kv_sha256_update(&s, a, sizeof a);
    kv_sha256_final(&s, d);
    kv_sha256_hex(d, hex);
    CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
}

/* ---- a GGUF writer for synthetic files ------------------------------------ */

typedef struct gb {
    uint8_t *p;
    size_t n, cap;
} gb_t;

static void gb_put(gb_t *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            exit(1);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void gb_u8(gb_t *b, uint8_t v) { gb_put(b, &v, 1); }
static void gb_u32(gb_t *b, uint32_t v) { gb_put(b, &v, 4); }
static void gb_u64(gb_t *b, uint64_t v) { gb_put(b, &v, 8); }
static void gb_str(gb_t *b, const char *s)
{
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}
static void gb_pad(gb_t *b, size_t a)
{
    while (b->n % a)
        gb_u8(b, 0);
}

/* Knobs that make the built file malformed in one specific way. */
typedef struct spec {
    uint32_t version;          /* 3 */
    uint64_t n_kv_add;         /* added to the true kv count */
    uint64_t n_t_add;          /* added to the true tensor count */
    uint32_t alignment;        /* 0: no general.alignment key (default 32) */
    uint64_t arch_len;         /* nonzero: the length written for "llama" */
    uint32_t odd_vtype;        /* nonzero: the type tag of test.u8 */
    uint32_t t1_type;          /* nonzero: tensor 1's type */
    int64_t t2_off_delta;      /* added to tensor 2's offset */
    uint32_t t0_ndims;         /* nonzero: tensor 0's n_dims */
    int t0_no_dims;            /* tensor 0 has n_dims 0 */
    uint64_t t0_dim0;          /* nonzero: tensor 0's ne[0] */
    int dup_key, dup_tensor;
    uint32_t t3_ne0;           /* nonzero: tensor 3's ne[0] */
    uint64_t strs_n;           /* nonzero: element count of test.strs */
} spec_t;

#define NT 4
static const char *const t_names[NT] = {"tok.a", "tok.b", "tok.c", "tok.d"};
static const uint32_t t_types[NT] = {KV_GGML_F32, KV_GGML_Q8_0, KV_GGML_Q4_1, KV_GGML_F16};
static const uint64_t t_ne[NT][2] = {{8, 1}, {32, 2}, {64, 1}, {4, 2}};
static const uint32_t t_dims[NT] = {1, 2, 1, 2};

static size_t t_bytes(int i)
{
    uint64_t n = t_ne[i][0] * t_ne[i][1];
    return n / kv_gguf_ttype_block(t_types[i]) * kv_gguf_ttype_block_bytes(t_types[i]);
}

static gb_t build(const spec_t *sp)
{
    gb_t b = {0};
    const uint32_t align = sp->alignment ? sp->alignment : 32;
    uint64_t n_kv = 16 + (sp->alignment ? 1 : 0) + (sp->dup_key ? 1 : 0);
    gb_put(&b, "GGUF", 4);
    gb_u32(&b, sp->version ? sp->version : 3);
    gb_u64(&b, NT + sp->n_t_add);
    gb_u64(&b, n_kv + sp->n_kv_add);
    /* metadata */
    gb_str(&b, "general.architecture");
    gb_u32(&b, KV_GGUF_STRING);
    gb_u64(&b, sp->arch_len ? sp->arch_len : 5);
    gb_put(&b, "llama", 5);
    if (sp->alignment) {
        gb_str(&b, "general.alignment");
        gb_u32(&b, KV_GGUF_U32);
        gb_u32(&b, sp->alignment);
    }
    gb_str(&b, "test.u8");
    gb_u32(&b, sp->odd_vtype ? sp->odd_vtype : KV_GGUF_U8);
    gb_u8(&b, 200);
    gb_str(&b, "test.i8"), gb_u32(&b, KV_GGUF_I8), gb_u8(&b, (uint8_t)-5);
    gb_str(&b, "test.u16"), gb_u32(&b, KV_GGUF_U16), gb_u8(&b, 0x34), gb_u8(&b, 0x12);
    gb_str(&b, "test.i16"), gb_u32(&b, KV_GGUF_I16), gb_u8(&b, 0xff), gb_u8(&b, 0xff);
    gb_str(&b, "test.u32"), gb_u32(&b, KV_GGUF_U32), gb_u32(&b, 4000000000u);
    gb_str(&b, "test.i32"), gb_u32(&b, KV_GGUF_I32), gb_u32(&b, (uint32_t)-7);
    float f = 1.5f;
    gb_str(&b, "test.f32"), gb_u32(&b, KV_GGUF_F32), gb_put(&b, &f, 4);
    gb_str(&b, "test.bool"), gb_u32(&b, KV_GGUF_BOOL), gb_u8(&b, 1);
    gb_str(&b, "test.u64"), gb_u32(&b, KV_GGUF_U64), gb_u64(&b, 1ull << 40);
    gb_str(&b, "test.i64"), gb_u32(&b, KV_GGUF_I64), gb_u64(&b, (uint64_t)-3);
    double d = 2.25;
    gb_str(&b, "test.f64"), gb_u32(&b, KV_GGUF_F64), gb_put(&b, &d, 8);
    gb_str(&b, "test.strs"), gb_u32(&b, KV_GGUF_ARRAY), gb_u32(&b, KV_GGUF_STRING);
    gb_u64(&b, sp->strs_n ? sp->strs_n : 3);
    gb_str(&b, "ab"), gb_str(&b, ""), gb_str(&b, "h\xc3\xa9llo");
    gb_str(&b, "test.ints"), gb_u32(&b, KV_GGUF_ARRAY), gb_u32(&b, KV_GGUF_I32), gb_u64(&b, 3);
    gb_u32(&b, 1), gb_u32(&b, (uint32_t)-2), gb_u32(&b, 3);
    gb_str(&b, "test.nested"), gb_u32(&b, KV_GGUF_ARRAY), gb_u32(&b, KV_GGUF_ARRAY);
    gb_u64(&b, 2);
    gb_u32(&b, KV_GGUF_U8), gb_u64(&b, 2), gb_u8(&b, 1), gb_u8(&b, 2);
    gb_u32(&b, KV_GGUF_U8), gb_u64(&b, 1), gb_u8(&b, 3);
    gb_str(&b, "test.z_last"), gb_u32(&b, KV_GGUF_BOOL), gb_u8(&b, 0);
    if (sp->dup_key)
        gb_str(&b, "test.i8"), gb_u32(&b, KV_GGUF_I8), gb_u8(&b, 1);
    /* tensor infos */
    uint64_t off = 0, offs[NT];
    for (int i = 0; i < NT; i++) {
        offs[i] = off;
        off = (off + t_bytes(i) + align - 1) / align * align;
    }
    for (int i = 0; i < NT; i++) {
        gb_str(&b, sp->dup_tensor && i == 1 ? t_names[0] : t_names[i]);
        uint32_t nd = i == 0 && sp->t0_ndims ? sp->t0_ndims : t_dims[i];
        if (i == 0 && sp->t0_no_dims)
            nd = 0;
        gb_u32(&b, nd);
        for (uint32_t k = 0; k < nd; k++) {
            uint64_t ne = k < 2 ? t_ne[i][k] : 1;
            if (i == 0 && k == 0 && sp->t0_dim0)
                ne = sp->t0_dim0;
            if (i == 3 && k == 0 && sp->t3_ne0)
                ne = sp->t3_ne0;
            gb_u64(&b, ne);
        }
        gb_u32(&b, i == 1 && sp->t1_type ? sp->t1_type : t_types[i]);
        gb_u64(&b, offs[i] + (uint64_t)(i == 2 ? sp->t2_off_delta : 0));
    }
    gb_pad(&b, align);
    size_t data0 = b.n;
    for (int i = 0; i < NT; i++) {
        while (b.n < data0 + offs[i])
            gb_u8(&b, 0);
        for (size_t k = 0; k < t_bytes(i); k++)
            gb_u8(&b, (uint8_t)(i * 64 + k)); /* a pattern we can check */
    }
    return b;
}

/* Parse a private, exactly sized copy of buf[0..n). */
static int parse_copy(const uint8_t *buf, size_t n, char *err, size_t el)
{
    uint8_t *c = malloc(n ? n : 1);
    if (!c)
        exit(1);
    memcpy(c, buf, n);
    kv_gguf_t *g = NULL;
    int rc = kv_gguf_open_mem(c, n, &g, err, el);
    if (!rc) {
        /* Walk everything it hands out: ASan checks it lies in the buffer. */
        volatile uint8_t sink = 0;
        for (uint64_t i = 0; i < kv_gguf_n_tensors(g); i++) {
            const kv_gguf_tensor_t *t = kv_gguf_tensor_at(g, i);
            for (uint64_t k = 0; k < t->nbytes; k++)
                sink ^= ((const uint8_t *)t->data)[k];
        }
        for (uint64_t i = 0; i < kv_gguf_n_kv(g); i++) {
            const kv_gguf_kv_t *kv = kv_gguf_kv_at(g, i);
            for (uint64_t k = 0; k < kv->data_len; k++)
                sink ^= kv->data[k];
        }
        (void)sink;
        kv_gguf_close(g);
    }
    free(c);
    return rc;
}

static int parse_spec(const spec_t *sp, char *err, size_t el)
{
    gb_t b = build(sp);
    int rc = parse_copy(b.p, b.n, err, el);
    free(b.p);
    return rc;
}

static void test_synthetic_values(uint32_t version, uint32_t alignment)
{
    spec_t sp = {.version = version, .alignment = alignment};
    gb_t b = build(&sp);
    char err[KV_GGUF_ERR_LEN];
    kv_gguf_t *g = NULL;
    CHECK_OK(kv_gguf_open_mem(b.p, b.n, &g, err, sizeof err));
    if (!g) {
        fprintf(stderr, "%s\n", err);
        free(b.p);
        return;
    }
    CHECK_EQ(kv_gguf_version(g), version);
    CHECK_EQ(kv_gguf_alignment(g), alignment ? alignment : 32);
    CHECK_EQ(kv_gguf_n_tensors(g), NT);
    uint32_t u;
    float f;
    int bl;
    kv_gguf_str_t s;
    CHECK(!kv_gguf_get_u32(g, "test.u8", &u) && u == 200);
    CHECK(!kv_gguf_get_u32(g, "test.u16", &u) && u == 0x1234);
    CHECK(!kv_gguf_get_u32(g, "test.u32", &u) && u == 4000000000u);
    CHECK_EQ(kv_gguf_get_u32(g, "test.i8", &u), KV_ERANGE);   /* -5 */
    CHECK_EQ(kv_gguf_get_u32(g, "test.i16", &u), KV_ERANGE);  /* -1 */
    CHECK_EQ(kv_gguf_get_u32(g, "test.u64", &u), KV_ERANGE);  /* 2^40 */
    CHECK_EQ(kv_gguf_get_u32(g, "test.f32", &u), KV_EINVAL);
    CHECK_EQ(kv_gguf_get_u32(g, "no.such.key", &u), KV_ENOENT);
    CHECK(!kv_gguf_get_f32(g, "test.f32", &f) && f == 1.5f);
    CHECK(!kv_gguf_get_f32(g, "test.f64", &f) && f == 2.25f);
    CHECK(!kv_gguf_get_bool(g, "test.bool", &bl) && bl == 1);
    CHECK(!kv_gguf_get_bool(g, "test.z_last", &bl) && bl == 0);
    CHECK(!kv_gguf_get_str(g, "general.architecture", &s) && kv_gguf_str_eq(s, "llama"));
    const kv_gguf_kv_t *arr = NULL;
    CHECK_OK(kv_gguf_get_arr(g, "test.strs", KV_GGUF_STRING, &arr));
    kv_gguf_str_t v[4];
    CHECK_EQ(kv_gguf_arr_strings(arr, v, 4), 3);
    CHECK(kv_gguf_str_eq(v[0], "ab") && kv_gguf_str_eq(v[1], "") &&
          kv_gguf_str_eq(v[2], "h\xc3\xa9llo"));
    CHECK_EQ(kv_gguf_get_arr(g, "test.strs", KV_GGUF_I32, &arr), KV_EINVAL);
    CHECK_OK(kv_gguf_get_arr(g, "test.ints", KV_GGUF_I32, &arr));
    int64_t iv;
    CHECK(!kv_gguf_arr_int(arr, 1, &iv) && iv == -2);
    CHECK_EQ(kv_gguf_arr_int(arr, 3, &iv), KV_ERANGE);
    const kv_gguf_kv_t *nest = kv_gguf_find(g, "test.nested");
    CHECK(nest && nest->type == KV_GGUF_ARRAY && nest->arr_type == KV_GGUF_ARRAY &&
          nest->arr_n == 2);
    for (int i = 0; i < NT; i++) {
        const kv_gguf_tensor_t *t = kv_gguf_tensor(g, t_names[i]);
        CHECK(t != NULL);
        if (!t)
            continue;
        CHECK_EQ(t->type, t_types[i]);
        CHECK_EQ(t->ne[0], t_ne[i][0]);
        CHECK_EQ(t->ne[1], t_ne[i][1]);
        CHECK_EQ(t->nbytes, t_bytes(i));
        CHECK_EQ(((uintptr_t)t->data - (uintptr_t)b.p) % kv_gguf_alignment(g), 0);
        CHECK_EQ(((const uint8_t *)t->data)[5], (uint8_t)(i * 64 + 5));
    }
    CHECK(kv_gguf_tensor(g, "tok.e") == NULL);
    kv_gguf_close(g);
    free(b.p);
}

#define ANY_ERROR 1 /* expect(): any negative code will do */

static void expect(const spec_t *sp, int want, const char *needle, const char *what)
{
    char err[KV_GGUF_ERR_LEN] = "";
    int rc = parse_spec(sp, err, sizeof err);
    int rc_ok = want == ANY_ERROR ? rc < 0 : rc == want;
    int msg_ok = want == 0 || (strstr(err, needle) && !strncmp(err, "gguf: ", 6));
    if (!rc_ok || !msg_ok)
        fprintf(stderr, "case '%s': rc %d (want %d), err '%s' (want '%s')\n", what, rc, want,
                err, needle);
    CHECK(rc_ok);
    CHECK(msg_ok);
}

static void test_synthetic_errors(void)
{
    expect(&(spec_t){.version = 1}, KV_ENOTSUP, "version 1", "v1");
    expect(&(spec_t){.version = 4}, KV_ENOTSUP, "unknown GGUF version", "v4");
    expect(&(spec_t){.version = 3u << 24}, KV_ENOTSUP, "big-endian", "big endian");
    expect(&(spec_t){.n_kv_add = 1ull << 60}, KV_ECORRUPT, "cannot fit", "huge n_kv");
    expect(&(spec_t){.n_t_add = 1ull << 40}, KV_ECORRUPT, "cannot fit", "huge n_tensors");
    expect(&(spec_t){.n_kv_add = 1}, ANY_ERROR, "", "one kv too many");
    expect(&(spec_t){.arch_len = 1ull << 62}, KV_ECORRUPT, "past the end", "huge string");
    expect(&(spec_t){.strs_n = 1ull << 61}, KV_ECORRUPT, "cannot fit", "huge array");
    expect(&(spec_t){.strs_n = 4}, ANY_ERROR, "", "array one too long");
    expect(&(spec_t){.odd_vtype = 13}, KV_ENOTSUP, "value type 13", "bad value type");
    expect(&(spec_t){.t1_type = 99}, KV_ENOTSUP, "unknown type 99", "bad tensor type");
    expect(&(spec_t){.t1_type = 4}, KV_ENOTSUP, "unknown type 4", "removed tensor type");
    expect(&(spec_t){.t2_off_delta = 1}, KV_ECORRUPT, "alignment", "misaligned offset");
    expect(&(spec_t){.t2_off_delta = 4096}, KV_ECORRUPT, "past the end", "offset past EOF");
    expect(&(spec_t){.t2_off_delta = -32}, KV_ECORRUPT, "overlap", "overlapping tensors");
    expect(&(spec_t){.t0_ndims = 5}, KV_ECORRUPT, "dims", "5 dims");
    expect(&(spec_t){.t0_no_dims = 1}, KV_ECORRUPT, "dims", "0 dims");
    expect(&(spec_t){.t0_dim0 = 0xffffffffffffull}, KV_ECORRUPT, "past the end", "dim too large");
    expect(&(spec_t){.t0_dim0 = 1ull << 63}, KV_ECORRUPT, "bad dim", "dim > INT64_MAX");
    expect(&(spec_t){.t3_ne0 = 0}, 0, "", "control: valid");
    expect(&(spec_t){.dup_key = 1}, KV_ECORRUPT, "duplicate metadata key", "dup key");
    expect(&(spec_t){.dup_tensor = 1}, KV_ECORRUPT, "duplicate tensor", "dup tensor");
    expect(&(spec_t){.alignment = 48}, KV_ECORRUPT, "power of two", "alignment 48");
    /* tok.b's rows of 32 are not whole Q4_K blocks (256). */
    expect(&(spec_t){.t1_type = KV_GGML_Q4_K}, KV_ECORRUPT, "block", "row not whole blocks");
    char err[KV_GGUF_ERR_LEN];
    kv_gguf_t *g = NULL;
    CHECK_EQ(kv_gguf_open_mem(NULL, 10, &g, err, sizeof err), KV_EINVAL);
    CHECK_EQ(kv_gguf_open_mem("GGUF", 4, NULL, err, sizeof err), KV_EINVAL);
    CHECK(kv_gguf_open("/nonexistent/dir/x.gguf", &g, err, sizeof err) < 0 && !g);
}

/* Every strict prefix fails; every single-byte change is survived. */
static void test_synthetic_mutations(void)
{
    spec_t sp = {.alignment = 64};
    gb_t b = build(&sp);
    char err[KV_GGUF_ERR_LEN];
    long prefix_ok = 0, prefix_no_msg = 0, ok = 0, failed = 0;
    for (size_t n = 0; n < b.n; n++) {
        err[0] = 0;
        int rc = parse_copy(b.p, n, err, sizeof err);
        prefix_ok += rc == 0;
        prefix_no_msg += rc != 0 && strncmp(err, "gguf: ", 6) != 0;
    }
    CHECK_EQ(prefix_ok, 0);
    CHECK_EQ(prefix_no_msg, 0);
    CHECK_OK(parse_copy(b.p, b.n, err, sizeof err));
    for (size_t i = 0; i < b.n; i++)
        for (int flip = 0; flip < 3; flip++) {
            static const uint8_t x[3] = {0xff, 0x80, 0x01};
            b.p[i] ^= x[flip];
            int rc = parse_copy(b.p, b.n, err, sizeof err);
            b.p[i] ^= x[flip];
            ok += rc == 0;
            failed += rc < 0;
        }
    CHECK_EQ(ok + failed, 3 * (long)b.n);
    CHECK(failed > 0);
    free(b.p);
}

/* ---- the real file ---------------------------------------------------------- */

static void test_real_contents(const char *path)
{
    char err[512];
    kv_gguf_t *g = NULL;
    CHECK_OK(kv_gguf_open(path, &g, err, sizeof err));
    if (!g)
        return;
    CHECK_EQ(kv_gguf_version(g), 3);
    CHECK_EQ(kv_gguf_n_tensors(g), 272);
    CHECK_EQ(kv_gguf_alignment(g), 32);
    long by_type[32] = {0};
    for (uint64_t i = 0; i < kv_gguf_n_tensors(g); i++) {
        const kv_gguf_tensor_t *t = kv_gguf_tensor_at(g, i);
        if (t->type < 32)
            by_type[t->type]++;
        CHECK(kv_q_supported(t->type));
    }
    CHECK_EQ(by_type[KV_GGML_Q4_1], 210);
    CHECK_EQ(by_type[KV_GGML_Q8_0], 1);
    CHECK_EQ(by_type[KV_GGML_F32], 61);
    const kv_gguf_tensor_t *e = kv_gguf_tensor(g, "token_embd.weight");
    CHECK(e && e->type == KV_GGML_Q8_0 && e->ne[0] == 576 && e->ne[1] == 49152);
    const kv_gguf_tensor_t *dn = kv_gguf_tensor(g, "blk.29.ffn_down.weight");
    CHECK(dn && dn->type == KV_GGML_Q4_1 && dn->ne[0] == 1536 && dn->ne[1] == 576);
    const kv_gguf_tensor_t *k = kv_gguf_tensor(g, "blk.7.attn_k.weight");
    CHECK(k && k->ne[0] == 576 && k->ne[1] == 192);
    CHECK(kv_gguf_tensor(g, "output.weight") == NULL); /* tied output head */
    const kv_gguf_kv_t *toks = NULL;
    CHECK_OK(kv_gguf_get_arr(g, "tokenizer.ggml.tokens", KV_GGUF_STRING, &toks));
    if (toks) {
        CHECK_EQ(toks->arr_n, 49152);
        kv_gguf_str_t v[3];
        CHECK_EQ(kv_gguf_arr_strings(toks, v, 3), 3);
        CHECK(kv_gguf_str_eq(v[2], "<|im_end|>"));
    }
    kv_gguf_str_t pre;
    CHECK(!kv_gguf_get_str(g, "tokenizer.ggml.pre", &pre) && kv_gguf_str_eq(pre, "smollm"));
    kv_gguf_close(g);

    kv_model_t *m = NULL;
    CHECK_OK(kv_model_load(path, &m, err, sizeof err));
    if (!m)
        return;
    const kv_model_hparams_t *hp = kv_model_hparams(m);
    CHECK_EQ(hp->n_layers, 30);
    CHECK_EQ(hp->d_model, 576);
    CHECK_EQ(hp->n_q_heads, 9);
    CHECK_EQ(hp->n_kv_heads, 3);
    CHECK_EQ(hp->head_dim, 64);
    CHECK_EQ(hp->d_ff, 1536);
    CHECK_EQ(hp->vocab, 49152);
    CHECK_EQ(hp->n_ctx, 8192);
    CHECK(hp->rope_theta == 100000.0f);
    CHECK(fabsf(hp->rms_eps - 1e-5f) < 1e-9f);
    kv_model_free(m);
}

static int write_all(int fd, const void *p, size_t n, off_t off)
{
    const uint8_t *c = p;
    while (n) {
        ssize_t w = pwrite(fd, c, n, off);
        if (w <= 0)
            return -1;
        c += w, n -= (size_t)w, off += w;
    }
    return 0;
}

/* Patch bytes at off in the temp copy, run the model loader, restore. */
static void patched(int fd, const char *tmp, const uint8_t *orig, size_t off, const void *bytes,
                    size_t n, int want, const char *needle, const char *what)
{
    char err[512] = "";
    if (write_all(fd, bytes, n, (off_t)off))
        exit(1);
    kv_model_t *m = NULL;
    int rc = kv_model_load(tmp, &m, err, sizeof err);
    if (rc != want || !strstr(err, needle))
        fprintf(stderr, "case '%s': rc %d (want %d), err '%s' (want '%s')\n", what, rc, want,
                err, needle);
    CHECK_EQ(rc, want);
    CHECK(strstr(err, needle) != NULL);
    kv_model_free(m);
    if (write_all(fd, orig + off, n, (off_t)off))
        exit(1);
}

static void test_real_damage(const char *path)
{
    char err[512];
    kv_gguf_t *g = NULL;
    CHECK_OK(kv_gguf_open(path, &g, err, sizeof err));
    if (!g)
        return;
    const size_t size = (size_t)kv_gguf_file_size(g);
    kv_gguf_close(g);
    int src = open(path, O_RDONLY);
    uint8_t *orig = malloc(size);
    if (src < 0 || !orig || pread(src, orig, size, 0) != (ssize_t)size)
        exit(1);
    close(src);

    /* Parsed over orig, every pointer is an offset into orig. */
    CHECK_OK(kv_gguf_open_mem(orig, size, &g, err, sizeof err));
    if (!g) {
        free(orig);
        return;
    }
    const kv_gguf_tensor_t *t0 = kv_gguf_tensor_at(g, 0);
    const kv_gguf_tensor_t *t_last = kv_gguf_tensor_at(g, kv_gguf_n_tensors(g) - 1);
    const size_t data0 = (size_t)((const uint8_t *)t0->data - orig) - (size_t)t0->offset;
    const kv_gguf_kv_t *arch = kv_gguf_find(g, "general.architecture");
    const kv_gguf_kv_t *blocks = kv_gguf_find(g, "llama.block_count");
    const kv_gguf_kv_t *toks = kv_gguf_find(g, "tokenizer.ggml.tokens");
    const kv_gguf_kv_t *merges = kv_gguf_find(g, "tokenizer.ggml.merges");
    const kv_gguf_tensor_t *tq = kv_gguf_tensor(g, "blk.0.attn_q.weight");
    /* A tensor info: name bytes, then n_dims, ne[], type, offset. */
    size_t tl_info = (size_t)((const uint8_t *)t_last->name.ptr - orig) + t_last->name.len;
    size_t tl_type = tl_info + 4 + 8 * t_last->n_dims, tl_off = tl_type + 4;
    size_t arch_len_at = (size_t)(arch->data - orig);
    size_t blocks_at = (size_t)(blocks->data - orig);
    size_t tq_name_at = (size_t)((const uint8_t *)tq->name.ptr - orig);
    size_t toks_mid = (size_t)(toks->data - orig) + (size_t)toks->data_len / 2;
    size_t merges_mid = (size_t)(merges->data - orig) + (size_t)merges->data_len / 2;

    /* Quick in-memory truncations at many offsets (exactly sized copies). */
    const size_t cuts[] = {0, 3, 4, 8, 16, 23, 24, 40, arch_len_at + 3, toks_mid, merges_mid,
                           tl_info - 2, tl_off + 4, data0 - 1, data0, data0 + 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        err[0] = 0;
        int rc = parse_copy(orig, cuts[i], err, sizeof err);
        CHECK_EQ(rc, KV_ECORRUPT);
        int clear = strstr(err, "truncated") || strstr(err, "past the end") ||
                    strstr(err, "cannot fit");
        if (!clear)
            fprintf(stderr, "cut at %zu: '%s'\n", cuts[i], err);
        CHECK(clear);
    }

    /* The same through real files: one full copy, cut shorter and shorter. */
    char tmp[] = "/tmp/kvpage_test_gguf_XXXXXX";
    int fd = mkstemp(tmp);
    CHECK(fd >= 0);
    if (fd < 0 || write_all(fd, orig, size, 0)) {
        free(orig);
        kv_gguf_close(g);
        return;
    }
    const size_t file_cuts[] = {size - 1, (size_t)t_last->offset + data0 + 17, size / 2,
                                data0 + 100, data0, tl_off, merges_mid, toks_mid, 100, 10, 2};
    for (size_t i = 0; i < sizeof file_cuts / sizeof file_cuts[0]; i++) {
        CHECK(ftruncate(fd, (off_t)file_cuts[i]) == 0);
        kv_model_t *m = NULL;
        err[0] = 0;
        int rc = kv_model_load(tmp, &m, err, sizeof err);
        CHECK_EQ(rc, KV_ECORRUPT);
        CHECK(strncmp(err, "gguf: ", 6) == 0);
        kv_model_free(m);
    }
    /* Empty file. */
    CHECK(ftruncate(fd, 0) == 0);
    kv_gguf_t *g2 = NULL;
    CHECK(kv_gguf_open(tmp, &g2, err, sizeof err) < 0 && !g2);

    /* Patched copies. */
    CHECK(write_all(fd, orig, size, 0) == 0);
    uint64_t huge = 1ull << 62, off_eof = size, mis = t_last->offset + 2;
    uint32_t bad_type = 77, layers31 = 31;
    patched(fd, tmp, orig, 0, "GGUX", 4, KV_ECORRUPT, "magic", "bad magic");
    patched(fd, tmp, orig, arch_len_at, &huge, 8, KV_ECORRUPT, "past the end", "huge string");
    patched(fd, tmp, orig, tl_type, &bad_type, 4, KV_ENOTSUP, "unknown type 77", "bad type");
    patched(fd, tmp, orig, tl_off, &off_eof, 8, KV_ECORRUPT, "past the end", "offset > EOF");
    patched(fd, tmp, orig, tl_off, &mis, 8, KV_ECORRUPT, "alignment", "misaligned");
    patched(fd, tmp, orig, tq_name_at + 13, "Q", 1, KV_ECORRUPT,
            "'blk.0.attn_q.weight' is missing", "renamed tensor");
    patched(fd, tmp, orig, blocks_at, &layers31, 4, KV_ECORRUPT, "blk.30.", "31 layers");
    /* The unpatched copy loads again (the restores were exact). */
    kv_model_t *m = NULL;
    CHECK_OK(kv_model_load(tmp, &m, err, sizeof err));
    kv_model_free(m);
    /* A damaged copy of the pinned size fails the pinned hash. */
    CHECK(write_all(fd, "X", 1, (off_t)(size - 1)) == 0);
    CHECK_EQ(kv_model_verify(tmp, 1, err, sizeof err), KV_ECORRUPT);
    CHECK(strstr(err, "SHA-256") != NULL && strstr(err, "fetch_model.sh") != NULL);
    /* A fetch record (<file>.sha256) older than the file vouches for nothing. */
    char side[sizeof tmp + 8];
    snprintf(side, sizeof side, "%s.sha256", tmp);
    FILE *rec = fopen(side, "w");
    CHECK(rec != NULL);
    if (rec) {
        fprintf(rec, "%s  x\n", KV_MODEL_FILE_SHA256);
        fclose(rec);
        struct stat rs_st;
        CHECK(stat(side, &rs_st) == 0);
        struct timespec later[2] = {rs_st.st_mtim, rs_st.st_mtim};
        later[0].tv_sec += 2;
        later[1].tv_sec += 2;
        CHECK(futimens(fd, later) == 0);
        CHECK_EQ(kv_model_verify(tmp, 1, err, sizeof err), KV_ECORRUPT);
        unlink(side);
    }
    CHECK(ftruncate(fd, (off_t)(size - 1)) == 0);
    CHECK_EQ(kv_model_verify(tmp, 1, err, sizeof err), KV_ECORRUPT);
    CHECK(strstr(err, "bytes") != NULL);
    CHECK_OK(kv_model_verify(tmp, 0, err, sizeof err)); /* not ours: not judged here */
    close(fd);
    unlink(tmp);

    /* Random bit flips in the metadata and tensor infos of a full copy. */
    uint64_t rs = 99;
    uint8_t *mut = malloc(size);
    if (!mut)
        exit(1);
    memcpy(mut, orig, size);
    long survived = 0;
    const int iters = 150;
    for (int it = 0; it < iters; it++) {
        size_t at[4];
        for (int j = 0; j < 4; j++) {
            at[j] = (size_t)(kv_test_rand(&rs) % data0);
            mut[at[j]] ^= (uint8_t)(1u << (kv_test_rand(&rs) % 8));
        }
        kv_gguf_t *gm = NULL;
        int rc = kv_gguf_open_mem(mut, size, &gm, err, sizeof err);
        survived += rc <= 0;
        kv_gguf_close(gm);
        for (int j = 3; j >= 0; j--)
            mut[at[j]] = orig[at[j]];
    }
    CHECK_EQ(survived, iters);
    free(mut);
    kv_gguf_close(g);
    free(orig);
}

int main(void)
{
    test_half();
    test_blocks();
    test_matmul();
    test_sha256();
    test_synthetic_values(3, 0);
    test_synthetic_values(2, 64);
    test_synthetic_errors();
    test_synthetic_mutations();

    /* Without the model file: report the checks above, then skip. */
    char path[4096];
    if (kvt_find_model(path, sizeof path)) {
        if (kv_test_fail_)
            return kv_test_end();
        KV_TEST_SKIP("the model file is not there (scripts/fetch_model.sh fetches it)");
    }
    test_real_contents(path);
    test_real_damage(path);
    char err[512];
    CHECK_OK(kv_model_verify(path, 1, err, sizeof err));
    return kv_test_end();
}
