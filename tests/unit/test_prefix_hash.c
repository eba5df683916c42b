/* SPDX-License-Identifier: MIT */
/*
 * test_prefix_hash.c — the chained block hashes of prefix/kv_prefix_hash.h:
 *   - known answers: the encodings and digests of docs/prefix.md, computed
 *     independently (Python's hashlib over the documented bytes);
 *   - the chain: one call over a prompt equals calls over its pieces given
 *     the right parent; a change in block k changes hashes k.. and no other;
 *   - salt separation, and every other fingerprint field separating;
 *   - the encoding is injective on crafted near-collisions (bytes moved
 *     between fields, between the salt and the tokens, a first block vs a
 *     block chained on an all-zero parent) and on random pairs;
 *   - every bad input, and every allocation failure of create.
 */
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "prefix/kv_prefix_hash.h"

/* SHA-256("SmolLM2-135M"), the model fingerprint of the known answers. */
static const char *kat_model_hex =
    "64d3e3fae1fb9932aa35f265cea57cd7ff9efaba978c928feaf361a77df9cb46";

static void unhex(const char *hex, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
}

static int hash_is(const kv_prefix_hash_t *h, const char *hex)
{
    uint8_t want[32];
    unhex(hex, want, 32);
    return memcmp(h->b, want, 32) == 0;
}

static kv_prefix_fp_t fp_make(const uint8_t *model, size_t model_len, const char *state,
                              const char *salt, uint32_t block)
{
    kv_prefix_fp_t fp = {.model = model, .model_len = model_len, .n_layers = 30,
                         .n_kv_heads = 3, .head_dim = 64, .page_bytes = 4096,
                         .block_tokens = block, .state = state,
                         .state_len = state ? strlen(state) : 0, .salt = salt,
                         .salt_len = salt ? strlen(salt) : 0};
    return fp;
}

static kv_prefix_hasher_t *hasher(const kv_prefix_fp_t *fp)
{
    kv_prefix_hasher_t *h = NULL;
    CHECK_OK(kv_prefix_hash_create(fp, &h));
    return h;
}

static void test_known_answers(void)
{
    uint8_t model[32];
    unhex(kat_model_hex, model, 32);
    kv_prefix_fp_t fp = fp_make(model, 32, "fp16", "tenant-a", 16);
    static const char *e_hex =
        "4b56505801000000010000002000000064d3e3fae1fb9932aa35f265cea57cd7ff9efaba978c928f"
        "eaf361a77df9cb4602000000140000001e00000003000000400000000010000010000000030000"
        "000400000066703136040000000800000074656e616e742d61";
    uint8_t e[256], want[256];
    size_t n = 0;
    CHECK_OK(kv_prefix_hash_encode_extra(&fp, e, sizeof e, &n));
    CHECK_EQ(n, strlen(e_hex) / 2);
    unhex(e_hex, want, n);
    CHECK(memcmp(e, want, n) == 0);

    kv_prefix_hasher_t *h = hasher(&fp);
    kv_prefix_hash_t x, out[4];
    CHECK_OK(kv_prefix_hash_extra(h, &x));
    CHECK(hash_is(&x, "04202d0f965ece4e08867195e273b1ebc7504adf3f79a2fa8e82bf0fc650ff71"));
    uint32_t toks[50];
    for (uint32_t i = 0; i < 50; i++)
        toks[i] = i + 1;
    CHECK_EQ(kv_prefix_hash_blocks(h, NULL, toks, 50, out, 4), 3); /* 2 left over */
    CHECK(hash_is(&out[0], "d6a4868794d3d9eec0fabd76c39acf852af9f5cea969b689ed024d189402aa4f"));
    CHECK(hash_is(&out[1], "81a734e700339edcb483faa300b2671543beb5e02628b8cbb4cbd5ef991f142f"));
    CHECK(hash_is(&out[2], "3de4f830598aced1c62937155f371cdfae029585089c66a43e9cb181afc92b9a"));
    /* compressed-context end blocks (kind 2): tokens 33..40 after h_1, and
     * 1..5 with no full block (hashlib over the documented bytes) */
    kv_prefix_hash_t end, end2;
    CHECK_OK(kv_prefix_hash_end(h, &out[1], toks + 32, 8, &end));
    CHECK(hash_is(&end, "a6faed18d9033af5c0a16043bd6eabc0d417e19543e54d590395974bd03bd9f1"));
    CHECK_OK(kv_prefix_hash_end(h, NULL, toks, 5, &end));
    CHECK(hash_is(&end, "051ed6ed85dfa9c734051d02778c9170e46d400bf75d3c824a49c209b1f47b58"));
    /* an end of 0 tokens after a block is not that block, nor the end of
     * the same tokens as a first block */
    CHECK_OK(kv_prefix_hash_end(h, &out[0], NULL, 0, &end));
    CHECK(memcmp(&end, &out[0], sizeof end) != 0);
    CHECK_OK(kv_prefix_hash_end(h, NULL, NULL, 0, &end2));
    CHECK(memcmp(&end, &end2, sizeof end) != 0);
    CHECK_EQ(kv_prefix_hash_end(h, NULL, toks, 16, &end), KV_EINVAL); /* a full block */
    CHECK_EQ(kv_prefix_hash_end(h, NULL, NULL, 3, &end), KV_EINVAL);
    CHECK_EQ(kv_prefix_hash_end(h, NULL, toks, 3, NULL), KV_EINVAL);
    CHECK_EQ(kv_prefix_hash_end(NULL, NULL, toks, 3, &end), KV_EINVAL);
    kv_prefix_hash_destroy(h);

    fp.salt_len = 0; /* the same without a salt */
    h = hasher(&fp);
    CHECK_EQ(kv_prefix_hash_blocks(h, NULL, toks, 16, out, 4), 1);
    CHECK(hash_is(&out[0], "053ea60a101f0c89eb23ac2fc2e713a51700709da5943756f49ed2f9063c59ad"));
    kv_prefix_hash_destroy(h);

    /* one-token blocks, the largest token id, a one-byte model */
    uint8_t one = 1;
    kv_prefix_fp_t tiny = {.model = &one, .model_len = 1, .n_layers = 1, .n_kv_heads = 1,
                           .head_dim = 16, .page_bytes = 64, .block_tokens = 1};
    h = hasher(&tiny);
    uint32_t big = 0xffffffffu;
    CHECK_EQ(kv_prefix_hash_blocks(h, NULL, &big, 1, out, 1), 1);
    CHECK(hash_is(&out[0], "4c718846a7984671c8ac9d1fcc30addf554c857cb1ec5d9aa28aa12f6d450b02"));
    CHECK_EQ(kv_prefix_hash_block_tokens(h), 1);
    kv_prefix_hash_destroy(h);
}

#define N_TOK 4096
#define N_BLK (N_TOK / 16)

static void test_chain(void)
{
    uint8_t model[32] = {7};
    kv_prefix_fp_t fp = fp_make(model, 32, "int4", "s", 16);
    kv_prefix_hasher_t *h = hasher(&fp);
    static uint32_t toks[N_TOK];
    static kv_prefix_hash_t all[N_BLK], part[N_BLK], mod[N_BLK];
    uint64_t seed = 1;
    for (int i = 0; i < N_TOK; i++)
        toks[i] = (uint32_t)kv_test_rand(&seed) % 49152;
    CHECK_EQ(kv_prefix_hash_blocks(h, NULL, toks, N_TOK, all, N_BLK), N_BLK);

    /* pieces at block boundaries, each chained on the last hash before it */
    size_t cuts[] = {0, 16, 48, 1024, 1040, 4000, N_TOK};
    for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++) {
        size_t b0 = cuts[c] / 16, len = cuts[c + 1] - cuts[c];
        int got = kv_prefix_hash_blocks(h, b0 ? &part[b0 - 1] : NULL, toks + cuts[c], len,
                                        part + b0, N_BLK - b0);
        CHECK_EQ(got, (int)(len / 16));
    }
    CHECK(memcmp(all, part, sizeof all) == 0);
    /* cap limits the count */
    CHECK_EQ(kv_prefix_hash_blocks(h, NULL, toks, N_TOK, part, 5), 5);
    CHECK(memcmp(all, part, 5 * sizeof all[0]) == 0);

    /* a change in block k changes exactly the hashes k.. */
    int k_list[] = {0, 1, 100, N_BLK - 1};
    for (int ki = 0; ki < 4; ki++) {
        int k = k_list[ki];
        toks[16 * k + 5] ^= 1;
        CHECK_EQ(kv_prefix_hash_blocks(h, NULL, toks, N_TOK, mod, N_BLK), N_BLK);
        toks[16 * k + 5] ^= 1;
        int same = 0, diff = 0;
        for (int b = 0; b < N_BLK; b++) {
            int eq = memcmp(&mod[b], &all[b], 32) == 0;
            same += b < k && eq;
            diff += b >= k && !eq;
        }
        CHECK_EQ(same, k);
        CHECK_EQ(diff, N_BLK - k);
    }
    /* two hashers with the same fingerprint agree; the input is untouched */
    kv_prefix_hasher_t *h2 = hasher(&fp);
    CHECK_EQ(kv_prefix_hash_blocks(h2, NULL, toks, N_TOK, mod, N_BLK), N_BLK);
    CHECK(memcmp(mod, all, sizeof all) == 0);
    kv_prefix_hash_destroy(h2);
    kv_prefix_hash_destroy(h);
}

/* The first block's hash under fingerprint fp. */
static kv_prefix_hash_t first_hash(const kv_prefix_fp_t *fp, const uint32_t *toks)
{
    kv_prefix_hash_t out;
    memset(&out, 0, sizeof out);
    kv_prefix_hasher_t *h = hasher(fp);
    if (h)
        CHECK_EQ(kv_prefix_hash_blocks(h, NULL, toks, fp->block_tokens, &out, 1), 1);
    kv_prefix_hash_destroy(h);
    return out;
}

static void test_separation(void)
{
    uint8_t model[32] = {1, 2, 3}, model2[32] = {1, 2, 4};
    uint32_t toks[16] = {5, 6, 7};
    const char *salts[] = {NULL, "a", "b", "tenant-1", "tenant-2", "tenant-1 "};
    enum { NS = 6 };
    kv_prefix_hash_t hs[NS];
    for (int i = 0; i < NS; i++) {
        kv_prefix_fp_t fp = fp_make(model, 32, "fp16", salts[i], 16);
        hs[i] = first_hash(&fp, toks);
    }
    for (int i = 0; i < NS; i++)
        for (int j = i + 1; j < NS; j++)
            CHECK(memcmp(&hs[i], &hs[j], 32) != 0);
    /* the same salt gives the same hash */
    kv_prefix_fp_t fp = fp_make(model, 32, "fp16", "a", 16);
    kv_prefix_hash_t again = first_hash(&fp, toks);
    CHECK(memcmp(&again, &hs[1], 32) == 0);
    /* a salt with a NUL byte differs from its prefix */
    fp.salt = "a\0";
    fp.salt_len = 2;
    again = first_hash(&fp, toks);
    CHECK(memcmp(&again, &hs[1], 32) != 0);

    /* every other field separates too: model, each shape field, state */
    kv_prefix_fp_t base = fp_make(model, 32, "fp16", "a", 16), v[7];
    for (int i = 0; i < 7; i++)
        v[i] = base;
    v[0].model = model2;
    v[1].n_layers++;
    v[2].n_kv_heads++;
    v[3].head_dim++;
    v[4].page_bytes++;
    v[5].state = "int4";
    v[6].model_len = 31;
    for (int i = 0; i < 7; i++) {
        kv_prefix_hash_t o = first_hash(&v[i], toks);
        CHECK(memcmp(&o, &hs[1], 32) != 0);
    }
}

/* Encoding of (fingerprint, first block) pairs, as one byte string. */
static size_t encode_all(const kv_prefix_fp_t *fp, const kv_prefix_hash_t *parent,
                         const uint32_t *toks, uint8_t *buf, size_t cap)
{
    size_t ne = 0, nb = 0;
    CHECK_OK(kv_prefix_hash_encode_extra(fp, buf, cap, &ne));
    kv_prefix_hasher_t *h = hasher(fp);
    if (!h)
        return 0;
    CHECK_OK(kv_prefix_hash_encode_block(h, parent, toks, buf + ne, cap - ne, &nb));
    kv_prefix_hash_destroy(h);
    return ne + nb;
}

static int same_encoding(const kv_prefix_fp_t *a, const uint32_t *ta, const kv_prefix_fp_t *b,
                         const uint32_t *tb)
{
    static uint8_t ea[4096], eb[4096];
    size_t na = encode_all(a, NULL, ta, ea, sizeof ea);
    size_t nb = encode_all(b, NULL, tb, eb, sizeof eb);
    kv_prefix_hash_t ha = first_hash(a, ta), hb = first_hash(b, tb);
    int enc_same = na == nb && memcmp(ea, eb, na) == 0;
    int hash_same = memcmp(&ha, &hb, 32) == 0;
    CHECK_EQ(enc_same, hash_same); /* the digest follows the encoding */
    return enc_same || hash_same;
}

static void test_injective(void)
{
    uint8_t m[8] = "abcdefgh";
    uint32_t t1[2] = {0x41414141u, 2}, t2[2] = {2, 0};
    kv_prefix_fp_t a = fp_make(m, 2, "c", "", 2), b = fp_make(m, 1, "bc", "", 2);
    CHECK(!same_encoding(&a, t1, &b, t1)); /* a byte moved from model to state */
    a = fp_make(m, 4, "x", "", 2);
    b = fp_make(m, 4, "", "x", 2);
    CHECK(!same_encoding(&a, t1, &b, t1)); /* state <-> salt */
    /* salt bytes that spell a token id, the token moved out of the block */
    a = fp_make(m, 4, "", "AAAA", 2);
    b = fp_make(m, 4, "", "", 2);
    CHECK(!same_encoding(&a, t2, &b, t1));
    /* a salt that looks like the rest of an encoding (a fake field 5) */
    static const char fake[] = "\x05\0\0\0\x04\0\0\0AAAA";
    a = fp_make(m, 4, "", NULL, 2);
    a.salt = fake;
    a.salt_len = sizeof fake - 1;
    CHECK(!same_encoding(&a, t1, &b, t1));
    /* shape values swapped between fields */
    a = fp_make(m, 4, "", "", 2);
    b = a;
    b.n_layers = a.n_kv_heads;
    b.n_kv_heads = a.n_layers;
    CHECK(!same_encoding(&a, t1, &b, t1));
    /* block_tokens 2 with tokens {x, y} vs 1 with {x}: the count is encoded */
    b = a;
    b.block_tokens = 1;
    CHECK(!same_encoding(&a, t1, &b, t1));
    CHECK(same_encoding(&a, t1, &a, t1)); /* and equal inputs do agree */

    /* a first block vs the same tokens chained on an all-zero parent */
    kv_prefix_hasher_t *h = hasher(&a);
    kv_prefix_hash_t zero, o1, o2;
    memset(&zero, 0, sizeof zero);
    CHECK_EQ(kv_prefix_hash_blocks(h, NULL, t1, 2, &o1, 1), 1);
    CHECK_EQ(kv_prefix_hash_blocks(h, &zero, t1, 2, &o2, 1), 1);
    CHECK(memcmp(&o1, &o2, 32) != 0);
    kv_prefix_hash_destroy(h);

    /* random small inputs over a two-letter alphabet (many near-collisions):
     * the encodings are equal exactly when the inputs are */
    uint64_t seed = 42;
    int collisions = 0;
    for (int it = 0; it < 400; it++) {
        char f[2][2][4]; /* [input][state, salt][bytes] */
        size_t len[2][2], ml[2];
        uint32_t tk[2][2];
        kv_prefix_fp_t in[2];
        for (int i = 0; i < 2; i++) {
            for (int j = 0; j < 2; j++) {
                len[i][j] = kv_test_rand(&seed) % 4;
                for (int k = 0; k < 4; k++)
                    f[i][j][k] = (char)('A' + kv_test_rand(&seed) % 2);
            }
            ml[i] = 1 + kv_test_rand(&seed) % 2;
            tk[i][0] = (uint32_t)(kv_test_rand(&seed) % 2);
            tk[i][1] = 0x41414141u;
            in[i] = fp_make(m, ml[i], NULL, NULL, 2);
            in[i].state = f[i][0], in[i].state_len = len[i][0];
            in[i].salt = f[i][1], in[i].salt_len = len[i][1];
        }
        int equal_in = ml[0] == ml[1] && tk[0][0] == tk[1][0];
        for (int j = 0; j < 2; j++)
            equal_in = equal_in && len[0][j] == len[1][j] &&
                       memcmp(f[0][j], f[1][j], len[0][j]) == 0;
        collisions += same_encoding(&in[0], tk[0], &in[1], tk[1]) != equal_in;
    }
    CHECK_EQ(collisions, 0);
}

static void test_bad_input(void)
{
    uint8_t m[32] = {0};
    uint32_t toks[32] = {0};
    kv_prefix_fp_t fp = fp_make(m, 32, "x", "y", 16), bad;
    kv_prefix_hasher_t *h = (kv_prefix_hasher_t *)&fp; /* must stay untouched */
    CHECK_EQ(kv_prefix_hash_create(NULL, &h), KV_EINVAL);
    CHECK_EQ(kv_prefix_hash_create(&fp, NULL), KV_EINVAL);
    bad = fp, bad.model = NULL;
    CHECK_EQ(kv_prefix_hash_create(&bad, &h), KV_EINVAL);
    bad = fp, bad.model_len = 0;
    CHECK_EQ(kv_prefix_hash_create(&bad, &h), KV_EINVAL);
    bad = fp, bad.state = NULL;
    CHECK_EQ(kv_prefix_hash_create(&bad, &h), KV_EINVAL);
    bad = fp, bad.salt = NULL;
    CHECK_EQ(kv_prefix_hash_create(&bad, &h), KV_EINVAL);
    bad = fp, bad.block_tokens = 0;
    CHECK_EQ(kv_prefix_hash_create(&bad, &h), KV_ERANGE);
    bad = fp, bad.block_tokens = KV_PREFIX_MAX_BLOCK_TOKENS + 1;
    CHECK_EQ(kv_prefix_hash_create(&bad, &h), KV_ERANGE);
    bad = fp, bad.salt_len = KV_PREFIX_MAX_FIELD_BYTES + 1;
    CHECK_EQ(kv_prefix_hash_create(&bad, &h), KV_ERANGE);
    bad = fp, bad.model_len = KV_PREFIX_MAX_FIELD_BYTES + 1;
    CHECK_EQ(kv_prefix_hash_create(&bad, &h), KV_ERANGE);
    bad = fp, bad.state_len = KV_PREFIX_MAX_FIELD_BYTES + 1;
    CHECK_EQ(kv_prefix_hash_create(&bad, &h), KV_ERANGE);
    CHECK(h == (kv_prefix_hasher_t *)&fp);

    h = hasher(&fp);
    kv_prefix_hash_t out[2], x;
    CHECK_EQ(kv_prefix_hash_blocks(NULL, NULL, toks, 32, out, 2), KV_EINVAL);
    CHECK_EQ(kv_prefix_hash_blocks(h, NULL, NULL, 32, out, 2), KV_EINVAL);
    CHECK_EQ(kv_prefix_hash_blocks(h, NULL, toks, 32, NULL, 2), KV_EINVAL);
    CHECK_EQ(kv_prefix_hash_blocks(h, NULL, NULL, 15, NULL, 2), 0); /* nothing to hash */
    CHECK_EQ(kv_prefix_hash_blocks(h, NULL, toks, 32, NULL, 0), 0);
    CHECK_EQ(kv_prefix_hash_extra(NULL, &x), KV_EINVAL);
    CHECK_EQ(kv_prefix_hash_extra(h, NULL), KV_EINVAL);
    CHECK_EQ(kv_prefix_hash_block_tokens(NULL), 0);
    uint8_t buf[8];
    size_t len = 0;
    CHECK_EQ(kv_prefix_hash_encode_block(h, NULL, toks, buf, sizeof buf, &len), KV_ERANGE);
    CHECK_EQ(len, 80 + 64);
    CHECK_EQ(kv_prefix_hash_encode_block(h, NULL, toks, NULL, 0, NULL), KV_EINVAL);
    CHECK_EQ(kv_prefix_hash_encode_block(NULL, NULL, toks, NULL, 0, &len), KV_EINVAL);
    CHECK_EQ(kv_prefix_hash_encode_block(h, NULL, NULL, NULL, 0, &len), KV_EINVAL);
    CHECK_EQ(kv_prefix_hash_encode_extra(&fp, buf, sizeof buf, &len), KV_ERANGE);
    CHECK_EQ(len, 8 + 32 + 32 + 20 + 1 + 1);
    CHECK_EQ(kv_prefix_hash_encode_extra(&fp, buf, sizeof buf, NULL), KV_EINVAL);
    CHECK_EQ(kv_prefix_hash_encode_extra(NULL, buf, sizeof buf, &len), KV_EINVAL);
    kv_prefix_hash_destroy(h);
    kv_prefix_hash_destroy(NULL);

    /* the largest block */
    bad = fp, bad.block_tokens = KV_PREFIX_MAX_BLOCK_TOKENS;
    h = hasher(&bad);
    uint32_t *big = calloc(KV_PREFIX_MAX_BLOCK_TOKENS, 4);
    CHECK(big != NULL);
    if (h && big)
        CHECK_EQ(kv_prefix_hash_blocks(h, NULL, big, KV_PREFIX_MAX_BLOCK_TOKENS, out, 2), 1);
    free(big);
    kv_prefix_hash_destroy(h);
}

static void test_alloc_failures(void)
{
    uint8_t m[32] = {9};
    kv_prefix_fp_t fp = fp_make(m, 32, "fp16", "salt", 16);
    uint64_t live = kv_mem_live_bytes();
    int failed = 0, ok = 0;
    for (uint64_t n = 1; n < 20 && !ok; n++) {
        kv_prefix_hasher_t *h = NULL;
        kv_fault_arm(n);
        int rc = kv_prefix_hash_create(&fp, &h);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        if (fired) {
            CHECK_EQ(rc, KV_ENOMEM);
            CHECK(h == NULL);
            CHECK_EQ(kv_mem_live_bytes(), live);
            failed++;
        } else {
            CHECK_OK(rc);
            ok = 1;
        }
        kv_prefix_hash_destroy(h);
    }
    CHECK(ok);
    CHECK_EQ(failed, 2); /* the hasher, the encoding buffer */
    CHECK_EQ(kv_mem_live_bytes(), live);
}

int main(void)
{
    test_known_answers();
    test_chain();
    test_separation();
    test_injective();
    test_bad_input();
    test_alloc_failures();
    return kv_test_end();
}
