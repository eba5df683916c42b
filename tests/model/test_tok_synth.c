/* SPDX-License-Identifier: MIT */
/*
 * test_tok_synth.c — the tokenizer (model/kv_tok*) on a hand-built
 * vocabulary, so its core is tested without the model file: never skips.
 *
 * Vocabulary: ids 0..255 are the single bytes (GPT-2 mapped text, written
 * out here by hand from the published GPT-2 byte map for the few that
 * matter), then a handful of merges and special tokens. Expected ids are
 * derived by hand from the BPE rule (lowest merge rank first, leftmost on
 * ties) and the GPT-2 regex, not taken from the implementation.
 *
 * Checks: the byte map and UTF-8/character-class helpers; pre-tokenizer
 * pieces for both pre-tokenizers; merge order; special tokens (CONTROL only
 * when asked, USER_DEFINED always, UNKNOWN never, longest match); lossless
 * round trip of random byte strings; bytes without a token (U+FFFD, unk,
 * error); output sizing; bad configs and arguments; allocation failure at
 * every allocation of create/encode/chat without leaks; and the GGUF glue
 * (kv_tok_from_gguf) on small GGUF images built in memory.
 */
#include <stdlib.h>
#include <string.h>

#include "kv_gguf.h"
#include "kv_test.h"
#include "kv_tok.h"
#include "kv_tok_int.h"

/* ---- a counting allocator that can fail the n-th allocation ---------------- */

typedef struct counting {
    long live;     /* bytes allocated and not freed           */
    long calls;    /* allocations attempted                   */
    long fail_at;  /* fail the call with this number; 0 never */
} counting_t;

static void *c_alloc(void *ctx, size_t n)
{
    counting_t *c = ctx;
    if (++c->calls == c->fail_at)
        return NULL;
    void *p = malloc(n);
    if (p)
        c->live += (long)n;
    return p;
}

static void c_free(void *ctx, void *p, size_t n)
{
    counting_t *c = ctx;
    c->live -= (long)n;
    free(p);
}

/* ---- the synthetic vocabulary ---------------------------------------------- */

enum { MAX_TOK = 300, MAX_MERGE = 32 };

typedef struct synth {
    char text[MAX_TOK][16];
    kv_tok_str_t tokens[MAX_TOK];
    int32_t types[MAX_TOK];
    kv_tok_str_t merges[MAX_MERGE];
    uint32_t n, n_merges;
    kv_tok_config_t cfg;
} synth_t;

/* UTF-8 of a code point < 0x800 */
static size_t utf8_2(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static int32_t add_token(synth_t *s, const char *text, int32_t type)
{
    uint32_t id = s->n++;
    strcpy(s->text[id], text);
    s->tokens[id] = (kv_tok_str_t){.ptr = s->text[id], .len = strlen(text)};
    s->types[id] = type;
    return (int32_t)id;
}

static void add_merge(synth_t *s, const char *m)
{
    s->merges[s->n_merges++] = (kv_tok_str_t){.ptr = m, .len = strlen(m)};
}

/* Ids of the non-byte tokens, in the order synth_init adds them. */
enum {
    T_BC = 256, T_AB, T_AA, T_GT, T_HE, T_GTHE, T_AAA, T_QR_UNUSED,
    T_S, T_S_LONG, T_U, T_UNK, T_COUNT
};

static void synth_init(synth_t *s, kv_tok_pre_t pre)
{
    memset(s, 0, sizeof *s);
    for (uint32_t b = 0; b < 256; b++) {
        char buf[4] = {0};
        utf8_2(kv_tok_byte_cp((uint8_t)b), buf);
        add_token(s, buf, KV_TOK_NORMAL);
    }
    /* by hand: U+0120 'Ġ' is the GPT-2 code point of ' ' */
    CHECK(strcmp(s->text[' '], "\xC4\xA0") == 0);
    add_token(s, "bc", KV_TOK_NORMAL);                  /* T_BC   */
    add_token(s, "ab", KV_TOK_NORMAL);                  /* T_AB   */
    add_token(s, "aa", KV_TOK_NORMAL);                  /* T_AA   */
    add_token(s, "\xC4\xA0t", KV_TOK_NORMAL);           /* T_GT: " t"      */
    add_token(s, "he", KV_TOK_NORMAL);                  /* T_HE   */
    add_token(s, "\xC4\xA0the", KV_TOK_NORMAL);         /* T_GTHE: " the"  */
    add_token(s, "aaa", KV_TOK_NORMAL);                 /* T_AAA  */
    add_token(s, "xyz", KV_TOK_UNUSED);                 /* T_QR_UNUSED     */
    add_token(s, "<|s|>", KV_TOK_CONTROL);              /* T_S    */
    add_token(s, "<|s|>!", KV_TOK_CONTROL);             /* T_S_LONG        */
    add_token(s, "<u>", KV_TOK_USER_DEFINED);           /* T_U    */
    add_token(s, "<unk>", KV_TOK_UNKNOWN);              /* T_UNK  */
    add_merge(s, "b c");           /* rank 0 */
    add_merge(s, "a b");           /* rank 1 */
    add_merge(s, "a a");           /* rank 2 */
    add_merge(s, "\xC4\xA0 t");    /* rank 3 */
    add_merge(s, "h e");           /* rank 4 */
    add_merge(s, "\xC4\xA0t he");  /* rank 5 */
    add_merge(s, "aa a");          /* rank 6 */
    add_merge(s, "q r");           /* "qr" is no token: skipped */
    add_merge(s, "a zz");          /* "zz" is no token: skipped */
    add_merge(s, "ab");            /* no separator: skipped     */
    add_merge(s, "b a");           /* "ba" is no token: skipped */
    s->cfg = (kv_tok_config_t){
        .n_tokens = s->n, .tokens = s->tokens, .types = s->types,
        .n_merges = s->n_merges, .merges = s->merges,
        .bos_id = -1, .eos_id = T_S, .unk_id = -1, .pre = pre,
    };
}

static int encode_is(const kv_tok_t *t, const char *text, int special, const int32_t *want,
                     size_t n_want)
{
    int32_t ids[64];
    size_t n = 0;
    int rc = kv_tok_encode(t, text, strlen(text), special, ids, 64, &n);
    int ok = rc == 0 && n == n_want && memcmp(ids, want, n * sizeof *ids) == 0;
    if (!ok) {
        fprintf(stderr, "encode \"%s\" (special %d): rc %d, got", text, special, rc);
        for (size_t i = 0; i < n && i < 64; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    return ok;
}

#define ENC_IS(t, text, special, ...)                                             \
    do {                                                                          \
        static const int32_t want_[] = {__VA_ARGS__};                             \
        CHECK(encode_is(t, text, special, want_, sizeof want_ / sizeof *want_));  \
    } while (0)

/* ---- characters ------------------------------------------------------------ */

static void test_chars(void)
{
    /* GPT-2 byte map, values from the published table */
    CHECK_EQ(kv_tok_byte_cp(' '), 0x120);
    CHECK_EQ(kv_tok_byte_cp('\n'), 0x10A);
    CHECK_EQ(kv_tok_byte_cp('\t'), 0x109);
    CHECK_EQ(kv_tok_byte_cp(0x00), 0x100);
    CHECK_EQ(kv_tok_byte_cp(0x7F), 0x121);
    CHECK_EQ(kv_tok_byte_cp(0xA0), 0x142);
    CHECK_EQ(kv_tok_byte_cp(0xAD), 0x143);
    CHECK_EQ(kv_tok_byte_cp('a'), 'a');
    CHECK_EQ(kv_tok_byte_cp(0xFF), 0xFF);
    int bijective = 1;
    for (int b = 0; b < 256; b++)
        bijective &= kv_tok_cp_byte(kv_tok_byte_cp((uint8_t)b)) == b;
    CHECK(bijective);
    CHECK_EQ(kv_tok_cp_byte(' '), -1);
    CHECK_EQ(kv_tok_cp_byte(0x144), -1);
    CHECK_EQ(kv_tok_cp_byte(KV_TOK_CP_INVALID), -1);

    /* strict UTF-8 */
    static const struct {
        const char *s;
        size_t len;
        uint32_t cp;
    } u[] = {
        {"A", 1, 'A'}, {"\xC3\xA9", 2, 0xE9}, {"\xE4\xB8\xAD", 3, 0x4E2D},
        {"\xF0\x9F\x91\x8D", 4, 0x1F44D}, {"\xF4\x8F\xBF\xBF", 4, 0x10FFFF},
        {"\xC0\x80", 1, KV_TOK_CP_INVALID},          /* overlong     */
        {"\xE0\x80\x80", 1, KV_TOK_CP_INVALID},      /* overlong     */
        {"\xED\xA0\x80", 1, KV_TOK_CP_INVALID},      /* surrogate    */
        {"\xF4\x90\x80\x80", 1, KV_TOK_CP_INVALID},  /* > U+10FFFF   */
        {"\xE4\xB8", 1, KV_TOK_CP_INVALID},          /* truncated    */
        {"\x80", 1, KV_TOK_CP_INVALID},              /* continuation */
        {"\xFF", 1, KV_TOK_CP_INVALID},
    };
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        uint32_t cp = 0;
        size_t k = kv_tok_utf8_next((const uint8_t *)u[i].s, strlen(u[i].s), 0, &cp);
        CHECK_EQ(k, u[i].len);
        CHECK_EQ(cp, u[i].cp);
    }

    /* character classes (Unicode facts) */
    CHECK_EQ(kv_tok_ucat('a'), KV_TOK_CAT_L);
    CHECK_EQ(kv_tok_ucat(0xE9), KV_TOK_CAT_L);     /* é */
    CHECK_EQ(kv_tok_ucat(0x4E2D), KV_TOK_CAT_L);   /* 中 */
    CHECK_EQ(kv_tok_ucat(0x05D0), KV_TOK_CAT_L);   /* א */
    CHECK_EQ(kv_tok_ucat('7'), KV_TOK_CAT_N);
    CHECK_EQ(kv_tok_ucat(0xFF15), KV_TOK_CAT_N);   /* fullwidth 5 (Nd) */
    CHECK_EQ(kv_tok_ucat(0xBD), KV_TOK_CAT_N);     /* ½ (No) */
    CHECK_EQ(kv_tok_ucat(0x216B), KV_TOK_CAT_N);   /* Ⅻ (Nl) */
    CHECK_EQ(kv_tok_ucat(' '), KV_TOK_CAT_WS);
    CHECK_EQ(kv_tok_ucat('\v'), KV_TOK_CAT_WS);
    CHECK_EQ(kv_tok_ucat(0x85), KV_TOK_CAT_WS);
    CHECK_EQ(kv_tok_ucat(0x3000), KV_TOK_CAT_WS);
    CHECK_EQ(kv_tok_ucat(0x200A), KV_TOK_CAT_WS);
    CHECK_EQ(kv_tok_ucat(0x200B), KV_TOK_CAT_OTHER); /* zero width space: not White_Space */
    CHECK_EQ(kv_tok_ucat(0x1C), KV_TOK_CAT_OTHER);   /* not White_Space */
    CHECK_EQ(kv_tok_ucat('!'), KV_TOK_CAT_OTHER);
    CHECK_EQ(kv_tok_ucat(0x0301), KV_TOK_CAT_OTHER); /* combining acute (Mn) */
    CHECK_EQ(kv_tok_ucat(0x1F44D), KV_TOK_CAT_OTHER);
    CHECK_EQ(kv_tok_ucat(0x10FFFF), KV_TOK_CAT_OTHER);
    CHECK_EQ(kv_tok_ucat(KV_TOK_CP_INVALID), KV_TOK_CAT_OTHER);

    /* the generated table's invariants */
    int sorted = kv_tok_ucd_n > 100;
    for (uint32_t i = 0; i < kv_tok_ucd_n; i++) {
        const kv_tok_urange_t *r = &kv_tok_ucd_ranges[i];
        sorted &= r->first <= r->last && r->last < 0x110000u;
        sorted &= r->cat == KV_TOK_CAT_L || r->cat == KV_TOK_CAT_N;
        if (i)
            sorted &= kv_tok_ucd_ranges[i - 1].last < r->first;
    }
    CHECK(sorted);
}

/* ---- pre-tokenizer --------------------------------------------------------- */

/* Pieces of text joined by '\x01' equal `want` (pieces separated by '\x01'). */
static int pieces_are(kv_tok_pre_t pre, const char *text, const char *want)
{
    char got[256];
    size_t k = 0, start, n, expect_start = 0;
    kv_tok_pre_it_t it;
    int ok = 1;

    kv_tok_pre_init(&it, pre, (const uint8_t *)text, strlen(text));
    while (kv_tok_pre_next(&it, &start, &n)) {
        ok &= start == expect_start && n > 0;
        expect_start = start + n;
        if (k)
            got[k++] = '\x01';
        memcpy(got + k, text + start, n);
        k += n;
    }
    got[k] = 0;
    ok &= expect_start == strlen(text) && strcmp(got, want) == 0;
    if (!ok)
        fprintf(stderr, "pieces of \"%s\" (pre %d): got \"%s\"\n", text, pre, got);
    return ok;
}

static void test_pre(void)
{
    const kv_tok_pre_t G = KV_TOK_PRE_GPT2, S = KV_TOK_PRE_SMOLLM;
    CHECK(pieces_are(G, "Hello world", "Hello\x01 world"));
    CHECK(pieces_are(G, "Hello  world", "Hello\x01 \x01 world"));
    CHECK(pieces_are(G, "a\n\nb", "a\x01\n\x01\n\x01" "b"));
    CHECK(pieces_are(G, "a \nb", "a\x01 \x01\n\x01" "b"));
    CHECK(pieces_are(G, "a  ", "a\x01  "));
    CHECK(pieces_are(G, "   x", "  \x01 x"));
    CHECK(pieces_are(G, " ", " "));
    CHECK(pieces_are(G, "x's y'll z'S", "x\x01's\x01 y\x01'll\x01 z\x01'\x01S"));
    CHECK(pieces_are(G, "don't!", "don\x01't\x01!"));
    CHECK(pieces_are(G, "a 123 b45", "a\x01 123\x01 b\x01" "45"));
    CHECK(pieces_are(G, "x += 1;", "x\x01 +=\x01 1\x01;"));
    CHECK(pieces_are(G, "\t\tx", "\t\x01\t\x01x"));
    CHECK(pieces_are(G, "caf\xC3\xA9 \xE4\xB8\xAD!", "caf\xC3\xA9\x01 \xE4\xB8\xAD\x01!"));
    CHECK(pieces_are(G, "\xFF\xFE a", "\xFF\xFE\x01 a"));           /* invalid = OTHER */
    CHECK(pieces_are(G, "a\xC3(", "a\x01\xC3("));
    /* smollm: every \p{N} is a piece; the regex runs on the stretches between */
    CHECK(pieces_are(S, "a 123 b45", "a\x01 \x01" "1\x01" "2\x01" "3\x01 b\x01" "4\x01" "5"));
    CHECK(pieces_are(S, "3.14", "3\x01.\x01" "1\x01" "4"));
    CHECK(pieces_are(S, "a  1", "a\x01  \x01" "1"));  /* "  " ends its stretch */
    CHECK(pieces_are(S, "x\xC2\xBD!", "x\x01\xC2\xBD\x01!"));  /* ½ is \p{N} */
    CHECK(pieces_are(S, "Hello  world", "Hello\x01 \x01 world"));

    kv_tok_pre_t p;
    CHECK_OK(kv_tok_pre_from_name("smollm", 6, &p));
    CHECK_EQ(p, KV_TOK_PRE_SMOLLM);
    CHECK_OK(kv_tok_pre_from_name("gpt2", 4, &p));
    CHECK_EQ(p, KV_TOK_PRE_GPT2);
    CHECK_EQ(kv_tok_pre_from_name("smollm2", 7, &p), KV_ENOTSUP);
    CHECK_EQ(kv_tok_pre_from_name("smollm", 5, &p), KV_ENOTSUP);
    CHECK_EQ(kv_tok_pre_from_name("llama-bpe", 9, &p), KV_ENOTSUP);
    CHECK_EQ(kv_tok_pre_from_name(NULL, 0, &p), KV_EINVAL);
}

/* ---- BPE and specials ------------------------------------------------------ */

static void test_bpe(void)
{
    synth_t s;
    kv_tok_t *t = NULL;
    synth_init(&s, KV_TOK_PRE_SMOLLM);
    CHECK_OK(kv_tok_create(&s.cfg, &t));
    if (!t)
        return;
    CHECK_EQ(kv_tok_n_vocab(t), T_COUNT);

    ENC_IS(t, "ab", 0, T_AB);
    ENC_IS(t, "abc", 0, 'a', T_BC);             /* "b c" (rank 0) before "a b" */
    ENC_IS(t, "aaa", 0, T_AAA);                 /* aa+a, then "aa a" */
    ENC_IS(t, "aaaa", 0, T_AA, T_AA);           /* leftmost first: aa aa */
    ENC_IS(t, "aaaaa", 0, T_AA, T_AAA);         /* aa aa a, then aa+a at the end */
    ENC_IS(t, " the", 0, T_GTHE);
    ENC_IS(t, "the", 0, 't', T_HE);
    ENC_IS(t, "qr", 0, 'q', 'r');               /* skipped merge */
    ENC_IS(t, "ba", 0, 'b', 'a');
    ENC_IS(t, "xyz", 0, 'x', 'y', 'z');         /* UNUSED token never produced without merges */
    ENC_IS(t, "ab ab", 0, T_AB, ' ', T_AB);     /* " ab": no "Ġ a" merge */
    ENC_IS(t, "a1b", 0, 'a', '1', 'b');

    /* specials */
    ENC_IS(t, "<|s|>", 0, '<', '|', 's', '|', '>');
    ENC_IS(t, "<|s|>", 1, T_S);
    ENC_IS(t, "<|s|>!", 1, T_S_LONG);           /* longest at a position */
    ENC_IS(t, "<|s|>?", 1, T_S, '?');
    ENC_IS(t, "ab<|s|>ab", 1, T_AB, T_S, T_AB);
    ENC_IS(t, "<u>", 0, T_U);                   /* USER_DEFINED: always */
    ENC_IS(t, "a<u>a", 0, 'a', T_U, 'a');
    ENC_IS(t, "<unk>", 1, '<', 'u', 'n', 'k', '>'); /* UNKNOWN: never parsed */
    ENC_IS(t, "<|s|", 1, '<', '|', 's', '|');   /* a prefix is no match */

    size_t n = 99;
    CHECK_OK(kv_tok_encode(t, "", 0, 1, NULL, 0, &n));
    CHECK_EQ(n, 0);
    CHECK_OK(kv_tok_encode(t, NULL, 0, 1, NULL, 0, &n));
    CHECK_EQ(n, 0);

    /* pieces and decode */
    const char *p;
    size_t len;
    CHECK_OK(kv_tok_piece(t, T_GTHE, &p, &len));
    CHECK(len == 4 && memcmp(p, " the", 4) == 0);
    CHECK_OK(kv_tok_piece(t, T_S, &p, &len));
    CHECK(len == 5 && memcmp(p, "<|s|>", 5) == 0);
    CHECK_EQ(kv_tok_type(t, T_S), KV_TOK_CONTROL);
    CHECK_EQ(kv_tok_type(t, 'a'), KV_TOK_NORMAL);
    CHECK_EQ(kv_tok_type(t, T_COUNT), KV_ERANGE);
    CHECK_EQ(kv_tok_type(t, -1), KV_ERANGE);
    int32_t id = -7;
    CHECK_OK(kv_tok_find(t, "<|s|>", 5, &id));
    CHECK_EQ(id, T_S);
    CHECK_OK(kv_tok_find(t, " the", 4, &id));
    CHECK_EQ(id, T_GTHE);
    CHECK_EQ(kv_tok_find(t, "zz", 2, &id), KV_ENOENT);
    CHECK_EQ(kv_tok_eos(t), T_S);
    CHECK_EQ(kv_tok_bos(t), -1);

    /* lossless round trip of random bytes (every byte has a token), also
     * through pieces, for words longer than the stack scratch */
    uint64_t seed = 42;
    int ok = 1;
    static char text[2048], back[2048];
    static int32_t ids[4096];
    for (int iter = 0; iter < 3000 && ok; iter++) {
        size_t tl = (size_t)(kv_test_rand(&seed) % (iter % 100 == 0 ? 2000 : 48));
        int alpha = iter % 3 == 0; /* letters only: long words */
        for (size_t i = 0; i < tl; i++) {
            uint64_t r = kv_test_rand(&seed);
            text[i] = alpha ? (char)('a' + r % 3) : (char)(r & 0xFF);
        }
        size_t bl = 0;
        int special = iter & 1;
        ok &= kv_tok_encode(t, text, tl, special, ids, 4096, &n) == 0;
        ok &= kv_tok_decode(t, ids, n, back, sizeof back, &bl) == 0;
        ok &= bl == tl && memcmp(back, text, tl) == 0;
        size_t k = 0;
        for (size_t i = 0; i < n && ok; i++) {
            ok &= kv_tok_piece(t, ids[i], &p, &len) == 0 && k + len <= tl &&
                  memcmp(text + k, p, len) == 0;
            k += len;
        }
        ok &= k == tl;
        if (!ok)
            fprintf(stderr, "round trip failed at iteration %d (len %zu)\n", iter, tl);
    }
    CHECK(ok);
    kv_tok_destroy(t);
}

static void test_missing_bytes(void)
{
    synth_t s;
    kv_tok_t *t = NULL;
    int32_t ids[16];
    size_t n;

    /* byte 0xFF has no token (its slot holds "ÿÿ"): U+FFFD stands for it */
    synth_init(&s, KV_TOK_PRE_SMOLLM);
    strcpy(s.text[0xFF], "\xC3\xBF\xC3\xBF");
    s.tokens[0xFF].len = 4;
    CHECK_OK(kv_tok_create(&s.cfg, &t));
    if (t) {
        CHECK_EQ(kv_tok_byte_ok(t, 0xFF), 0);
        CHECK_EQ(kv_tok_byte_ok(t, 0xFE), 1);
        ENC_IS(t, "a\xFF" "b", 0, 'a', 0xEF, 0xBF, 0xBD, 'b');
        /* the two-byte token is unreachable: BPE starts from single bytes */
        ENC_IS(t, "\xFF\xFF", 0, 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD);
        ENC_IS(t, "\xFF", 0, 0xEF, 0xBF, 0xBD);
        char back[16];
        size_t bl;
        CHECK_OK(kv_tok_encode(t, "x\xFFy", 3, 0, ids, 16, &n));
        CHECK_OK(kv_tok_decode(t, ids, n, back, sizeof back, &bl));
        CHECK(bl == 5 && memcmp(back, "x\xEF\xBF\xBDy", 5) == 0);
        kv_tok_destroy(t);
        t = NULL;
    }
    /* ... and 0xEF too: U+FFFD cannot be spelled, unk stands in */
    strcpy(s.text[0xEF], "\xC3\xAF\xC3\xAF");
    s.tokens[0xEF].len = 4;
    s.cfg.unk_id = T_UNK;
    CHECK_OK(kv_tok_create(&s.cfg, &t));
    if (t) {
        ENC_IS(t, "a\xFF", 0, 'a', T_UNK);
        kv_tok_destroy(t);
        t = NULL;
    }
    /* ... and no unk: an error, and the output count untouched */
    s.cfg.unk_id = -1;
    CHECK_OK(kv_tok_create(&s.cfg, &t));
    if (t) {
        n = 1234;
        CHECK_EQ(kv_tok_encode(t, "a\xFF", 2, 0, ids, 16, &n), KV_EINVAL);
        CHECK_EQ(n, 1234);
        ENC_IS(t, "ab", 0, T_AB);
        kv_tok_destroy(t);
    }
}

/* ---- sizing, arguments, configs ---------------------------------------------- */

static void test_sizing_and_args(void)
{
    synth_t s;
    kv_tok_t *t = NULL;
    synth_init(&s, KV_TOK_PRE_SMOLLM);
    CHECK_OK(kv_tok_create(&s.cfg, &t));
    if (!t)
        return;
    int32_t ids[8];
    size_t n = 0, len = 0;
    const char *text = "ab abc the"; /* ab | Ġ a bc | Ġthe */

    CHECK_OK(kv_tok_encode(t, text, strlen(text), 0, NULL, 0, &n));
    size_t need = n;
    CHECK_EQ(need, 5);
    for (int i = 0; i < 8; i++)
        ids[i] = -5;
    CHECK_EQ(kv_tok_encode(t, text, strlen(text), 0, ids, 2, &n), KV_ERANGE);
    CHECK_EQ(n, need);
    CHECK_EQ(ids[0], T_AB);
    CHECK_EQ(ids[2], -5); /* nothing past cap */
    CHECK_EQ(kv_tok_encode(t, text, strlen(text), 0, ids, 0, &n), KV_ERANGE);
    CHECK_EQ(kv_tok_encode(NULL, text, 1, 0, ids, 8, &n), KV_EINVAL);
    CHECK_EQ(kv_tok_encode(t, NULL, 1, 0, ids, 8, &n), KV_EINVAL);
    CHECK_EQ(kv_tok_encode(t, text, 1, 0, NULL, 8, &n), KV_EINVAL);
    CHECK_EQ(kv_tok_encode(t, text, 1, 0, ids, 8, NULL), KV_EINVAL);

    /* decode: ids checked before anything is written */
    char out[16];
    memset(out, '#', sizeof out);
    int32_t bad[3] = {'a', T_COUNT, 'b'};
    len = 77;
    CHECK_EQ(kv_tok_decode(t, bad, 3, out, sizeof out, &len), KV_ERANGE);
    CHECK_EQ(len, 77);
    CHECK_EQ(out[0], '#');
    bad[1] = -1;
    CHECK_EQ(kv_tok_decode(t, bad, 3, out, sizeof out, &len), KV_ERANGE);
    int32_t good[3] = {T_GTHE, T_S, 'x'};
    CHECK_OK(kv_tok_decode(t, good, 3, NULL, 0, &len));
    CHECK_EQ(len, 10);
    CHECK_EQ(kv_tok_decode(t, good, 3, out, 6, &len), KV_ERANGE);
    CHECK_EQ(len, 10);
    CHECK(memcmp(out, " the<|", 6) == 0 && out[6] == '#');
    CHECK_OK(kv_tok_decode(t, good, 3, out, sizeof out, &len));
    CHECK(len == 10 && memcmp(out, " the<|s|>x", 10) == 0);
    CHECK_EQ(kv_tok_decode(t, NULL, 1, out, sizeof out, &len), KV_EINVAL);
    CHECK_EQ(kv_tok_decode(t, good, 1, NULL, 4, &len), KV_EINVAL);
    CHECK_OK(kv_tok_decode(t, NULL, 0, out, sizeof out, &len));
    CHECK_EQ(len, 0);

    const char *p;
    CHECK_EQ(kv_tok_piece(t, T_COUNT, &p, &len), KV_ERANGE);
    CHECK_EQ(kv_tok_piece(t, 0, NULL, &len), KV_EINVAL);
    CHECK_EQ(kv_tok_piece(NULL, 0, &p, &len), KV_EINVAL);
    /* the synthetic vocabulary has no <|im_start|> */
    CHECK_EQ(kv_tok_chat(t, NULL, "hi", ids, 8, &n), KV_ENOTSUP);
    CHECK_EQ(kv_tok_chat(t, NULL, NULL, ids, 8, &n), KV_EINVAL);
    kv_tok_destroy(t);
    kv_tok_destroy(NULL);
}

static void test_bad_configs(void)
{
    synth_t s;
    kv_tok_t *t = (kv_tok_t *)&s; /* a sentinel that must stay */
    kv_tok_t *const sentinel = t;

    synth_init(&s, KV_TOK_PRE_GPT2);
    kv_tok_config_t good = s.cfg;

#define BAD(field_change, code)                              \
    do {                                                     \
        s.cfg = good;                                        \
        field_change;                                        \
        CHECK_EQ(kv_tok_create(&s.cfg, &t), code);           \
        CHECK(t == sentinel);                                \
    } while (0)

    CHECK_EQ(kv_tok_create(NULL, &t), KV_EINVAL);
    CHECK_EQ(kv_tok_create(&good, NULL), KV_EINVAL);
    BAD(s.cfg.n_tokens = 0, KV_ERANGE);
    BAD(s.cfg.n_tokens = KV_TOK_MAX_VOCAB + 1, KV_ERANGE);
    BAD(s.cfg.tokens = NULL, KV_EINVAL);
    BAD(s.cfg.merges = NULL, KV_EINVAL);
    BAD(s.cfg.pre = KV_TOK_PRE_COUNT, KV_EINVAL);
    BAD(s.cfg.bos_id = (int32_t)s.n, KV_ERANGE);
    BAD(s.cfg.eos_id = -2, KV_ERANGE);
    BAD(s.cfg.unk_id = INT32_MAX, KV_ERANGE);
    BAD(s.cfg.alloc = c_alloc, KV_EINVAL);
    BAD(s.cfg.free = c_free, KV_EINVAL);
    BAD(s.types[5] = 0, KV_EINVAL);
    BAD(s.types[5] = 7, KV_EINVAL);
    s.types[5] = KV_TOK_NORMAL;
    BAD(s.tokens[7].len = KV_TOK_MAX_TOKEN_BYTES + 1, KV_ERANGE);
    s.tokens[7].len = strlen(s.text[7]);
    BAD(s.tokens[7].ptr = NULL, KV_EINVAL);
    s.tokens[7].ptr = s.text[7];
    /* a NORMAL token with a raw space is not GPT-2 mapped text */
    BAD(s.tokens[T_AB] = ((kv_tok_str_t){.ptr = "a b", .len = 3}), KV_EINVAL);
    s.tokens[T_AB] = (kv_tok_str_t){.ptr = s.text[T_AB], .len = 2};
    /* ... but as CONTROL text it is fine */
    s.cfg = good;
    s.types[T_AB] = KV_TOK_CONTROL;
    s.tokens[T_AB] = (kv_tok_str_t){.ptr = "a b", .len = 3};
    t = NULL;
    CHECK_OK(kv_tok_create(&s.cfg, &t));
    kv_tok_destroy(t);
#undef BAD
}

static void test_alloc_failures(void)
{
    synth_t s;
    counting_t c = {0};
    kv_tok_t *t = NULL;
    synth_init(&s, KV_TOK_PRE_SMOLLM);
    s.cfg.alloc = c_alloc;
    s.cfg.free = c_free;
    s.cfg.alloc_ctx = &c;

    /* every allocation of create fails once: ENOMEM and nothing leaked */
    int rc = KV_ENOMEM, clean = 1;
    long k;
    for (k = 1; k < 100 && rc == KV_ENOMEM; k++) {
        c = (counting_t){.fail_at = k};
        t = NULL;
        rc = kv_tok_create(&s.cfg, &t);
        if (rc == KV_ENOMEM)
            clean &= c.live == 0 && t == NULL;
    }
    CHECK(clean);
    CHECK_OK(rc);
    CHECK(k > 3); /* several allocations were really failed */
    if (!t)
        return;

    /* encode of a word longer than the stack scratch allocates; fail it */
    char word[300];
    memset(word, 'a', sizeof word);
    int32_t ids[400];
    size_t n = 0;
    long live = c.live;
    c.calls = 0;
    c.fail_at = 1;
    CHECK_EQ(kv_tok_encode(t, word, sizeof word, 0, ids, 400, &n), KV_ENOMEM);
    CHECK_EQ(c.live, live);
    c.fail_at = 2;
    c.calls = 0;
    CHECK_EQ(kv_tok_encode(t, word, sizeof word, 0, ids, 400, &n), KV_ENOMEM);
    CHECK_EQ(c.live, live);
    c.fail_at = 0;
    CHECK_OK(kv_tok_encode(t, word, sizeof word, 0, ids, 400, &n));
    CHECK_EQ(n, 150); /* every "a a" (rank 2) goes before any "aa a" (rank 6) */
    CHECK_EQ(c.live, live);
    kv_tok_destroy(t);
    CHECK_EQ(c.live, 0);
}

/* ---- GGUF glue ------------------------------------------------------------- */

typedef struct gbuf {
    uint8_t b[16384];
    size_t n;
    uint64_t n_kv;
} gbuf_t;

static void g_bytes(gbuf_t *g, const void *p, size_t n)
{
    memcpy(g->b + g->n, p, n);
    g->n += n;
}
static void g_u32(gbuf_t *g, uint32_t v) { g_bytes(g, &v, 4); }
static void g_u64(gbuf_t *g, uint64_t v) { g_bytes(g, &v, 8); }
static void g_str(gbuf_t *g, const char *s, size_t n)
{
    g_u64(g, n);
    g_bytes(g, s, n);
}
static void g_key(gbuf_t *g, const char *key, uint32_t type)
{
    g_str(g, key, strlen(key));
    g_u32(g, type);
    g->n_kv++;
}

/* A GGUF v3 image, no tensors: what = which defect to build in. */
enum { G_OK, G_NO_MODEL, G_LLAMA, G_BAD_PRE, G_TYPES_LEN, G_EOS_RANGE, G_TOKENS_U32, G_NO_MERGES };

static size_t build_gguf(gbuf_t *g, int what)
{
    static const char *const merges[] = {"a b", "b c"};
    gbuf_t kvs = {.n = 0};
    if (what != G_NO_MODEL) {
        g_key(&kvs, "tokenizer.ggml.model", KV_GGUF_STRING);
        g_str(&kvs, what == G_LLAMA ? "llama" : "gpt2", what == G_LLAMA ? 5 : 4);
    }
    g_key(&kvs, "tokenizer.ggml.pre", KV_GGUF_STRING);
    g_str(&kvs, what == G_BAD_PRE ? "qwen9" : "smollm", what == G_BAD_PRE ? 5 : 6);
    if (what == G_TOKENS_U32) {
        g_key(&kvs, "tokenizer.ggml.tokens", KV_GGUF_U32);
        g_u32(&kvs, 3);
    } else {
        g_key(&kvs, "tokenizer.ggml.tokens", KV_GGUF_ARRAY);
        g_u32(&kvs, KV_GGUF_STRING);
        g_u64(&kvs, 259);
        for (uint32_t b = 0; b < 256; b++) {
            char buf[4];
            g_str(&kvs, buf, utf8_2(kv_tok_byte_cp((uint8_t)b), buf));
        }
        g_str(&kvs, "ab", 2);
        g_str(&kvs, "bc", 2);
        g_str(&kvs, "<|e|>", 5);
    }
    g_key(&kvs, "tokenizer.ggml.token_type", KV_GGUF_ARRAY);
    g_u32(&kvs, KV_GGUF_I32);
    uint64_t nt = what == G_TYPES_LEN ? 258 : 259;
    g_u64(&kvs, nt);
    for (uint64_t i = 0; i < nt; i++)
        g_u32(&kvs, i == 258 ? KV_TOK_CONTROL : KV_TOK_NORMAL);
    if (what != G_NO_MERGES) {
        g_key(&kvs, "tokenizer.ggml.merges", KV_GGUF_ARRAY);
        g_u32(&kvs, KV_GGUF_STRING);
        g_u64(&kvs, 2);
        for (int i = 0; i < 2; i++)
            g_str(&kvs, merges[i], 3);
    }
    g_key(&kvs, "tokenizer.ggml.eos_token_id", KV_GGUF_U32);
    g_u32(&kvs, what == G_EOS_RANGE ? 259 : 258);

    g->n = 0;
    g_bytes(g, "GGUF", 4);
    g_u32(g, 3);
    g_u64(g, 0);        /* tensors */
    g_u64(g, kvs.n_kv); /* metadata entries */
    g_bytes(g, kvs.b, kvs.n);
    return g->n;
}

static void test_gguf_glue(void)
{
    static gbuf_t g;
    static const struct {
        int what, rc;
    } cases[] = {
        {G_OK, 0}, {G_NO_MODEL, KV_ENOENT}, {G_LLAMA, KV_ENOTSUP}, {G_BAD_PRE, KV_ENOTSUP},
        {G_TYPES_LEN, KV_ECORRUPT}, {G_EOS_RANGE, KV_ECORRUPT}, {G_TOKENS_U32, KV_ECORRUPT},
        {G_NO_MERGES, KV_ENOENT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = build_gguf(&g, cases[i].what);
        kv_gguf_t *r = NULL;
        char err[KV_GGUF_ERR_LEN] = "";
        int rc = kv_gguf_open_mem(g.b, n, &r, err, sizeof err);
        CHECK_OK(rc);
        if (rc) {
            fprintf(stderr, "gguf image %d: %s\n", cases[i].what, err);
            continue;
        }
        kv_tok_t *t = NULL;
        err[0] = 0;
        rc = kv_tok_from_gguf(r, &t, err, sizeof err);
        CHECK_EQ(rc, cases[i].rc);
        CHECK(rc == 0 ? t != NULL : (t == NULL && strlen(err) > 0));
        if (t) {
            ENC_IS(t, "abc <|e|>", 1, 256, 'c', ' ', 258); /* "a b" is rank 0 */
            ENC_IS(t, "12", 0, '1', '2'); /* smollm: digits split */
            CHECK_EQ(kv_tok_eos(t), 258);
            CHECK_EQ(kv_tok_bos(t), -1);
            kv_tok_destroy(t);
        }
        kv_gguf_close(r);
    }
    kv_tok_t *t = NULL;
    CHECK_EQ(kv_tok_from_gguf(NULL, &t, NULL, 0), KV_EINVAL);
}

int main(void)
{
    test_chars();
    test_pre();
    test_bpe();
    test_missing_bytes();
    test_sizing_and_args();
    test_bad_configs();
    test_alloc_failures();
    test_gguf_glue();
    return kv_test_end();
}
