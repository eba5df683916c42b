/* SPDX-License-Identifier: MIT */
/*
 * test_tok.c — the SmolLM2-135M-Instruct tokenizer on its real vocabulary
 * (read from the model's GGUF with kv_gguf + kv_tok_from_gguf). Exits 77
 * only when the model file is not found (kv_model_find: KVPAGE_MODEL,
 * $KVPAGE_MODEL_DIR, the user cache); the hand-built-vocabulary checks of
 * the same code are in test_tok_synth.c and never skip.
 *
 * Checks: encode equals ids from an independent implementation (fixtures
 * below) for English, code, numbers, white space runs, apostrophes, accents,
 * CJK, emoji, mixed scripts, Unicode digits and spaces; special tokens only
 * when asked; the ChatML prompt; decode(encode(s)) == s byte for byte on
 * random Unicode text and on invalid UTF-8 (bytes without a token come back
 * as U+FFFD, exactly those); streaming pieces; empty input; 100 KB of text
 * (and a 100 KB word) in bounded time; bad arguments.
 *
 * Fixture provenance: HuggingFace `tokenizers` (version in the marker
 * below), Python, at development time; the build never runs it:
 *   vocab  = {tok: i for i, tok in enumerate(tokenizer.ggml.tokens)}
 *   merges = [tuple(m.split(' ')) for m in tokenizer.ggml.merges]
 *   tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
 *   tk.pre_tokenizer = pre_tokenizers.Sequence([
 *       pre_tokenizers.Digits(individual_digits=True),
 *       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
 *   tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
 *                          for every token of token_type 3 (CONTROL)])
 *   tk.encode_special_tokens = not parse_special
 *   ids = tk.encode(text, add_special_tokens=False).ids
 * Chat fixtures encode the template rendered as apply_chat_template does
 * (one system + one user message, add_generation_prompt) with specials on.
 * (The same comparison over ~12k random strings, random code points from all
 * planes and the Debian license texts gave 0 mismatches during development.)
 */
#include <string.h>
#include <time.h>

#include "kv_gguf.h"
#include "kv_model.h"
#include "kv_test.h"
#include "kv_tok.h"

typedef struct fixture {
    const char *name, *text;
    int special;        /* parse_special                 */
    uint32_t first, n;  /* ids: fixture_ids[first .. +n) */
} fixture_t;

typedef struct chat_fixture {
    const char *name, *system, *user; /* system NULL: the default */
    uint32_t first, n;
} chat_fixture_t;

/* BEGIN GENERATED FIXTURES (tokenizers 0.23.3) */
static const fixture_t fixtures[] = {
    {"english", "Hello world! The quick brown fox jumps over the lazy dog.", 0, 0, 13},
    {"numbers", "12345 and 3.14, -42, 1,000,000 or 0x1F; 2024-01-15.", 0, 13, 45},
    {"spaces", "a  b   c    d \t e\t\tf \n g\n\n\nh   ", 0, 58, 19},
    {"lead_trail", "   leading and trailing   ", 0, 77, 5},
    {"newlines", "line one\nline two\r\nline three\n\n\n  indented\n", 0, 82, 14},
    {"apostrophes", "don't I'll we've they're she'd it's I'm 'quoted' O'Neil's DON'T", 0, 96, 26},
    {"code", "def fib(n):\n    if n < 2:\n        return n\n    return fib(n-1) + fib(n-2)  # recursion\n", 0, 122, 35},
    {"c_code", "int main(void) {\n\tprintf(\"%d\\n\", x[i] >> 2);\n\treturn 0;\n}", 0, 157, 31},
    {"accents", "caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xC3\x85ngstr\xC3\xB6m Stra\xC3\x9F" "e \xC5\x92UVRE fa\xC3\xA7" "ade", 0, 188, 22},
    {"cjk", "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xEF\xBC\x81\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88\xE3\x80\x82\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xED\x85\x8D\xEC\x8A\xA4\xED\x8A\xB8", 0, 210, 45},
    {"emoji", "I \xE2\x9D\xA4\xEF\xB8\x8F emoji \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x8E\x89\xF0\x9F\x8E\x89 \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7", 0, 255, 38},
    {"mixed", "Hello \xD0\xBC\xD0\xB8\xD1\x80 \xE4\xB8\x96\xE7\x95\x8C \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D \xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87 \xCE\x93\xCE\xB5\xCE\xB9\xCE\xAC \xCF\x83\xCE\xBF\xCF\x85", 0, 293, 35},
    {"unicode_nums", "x\xC2\xB2 + y\xC2\xB3 = \xC2\xBD \xE2\x85\xAB \xD9\xA3\xD9\xA4\xD9\xA5 \xE2\x91\xA0\xE2\x91\xA1", 0, 328, 26},
    {"unicode_ws", "a\xC2\xA0" "b\xE3\x80\x80" "c\xE2\x80\x89" "d\xE2\x80\xA8" "e\xC2\x85" "f", 0, 354, 15},
    {"specials_text", "<|im_start|>user\nHi there<|im_end|>\n<|endoftext|>", 0, 369, 26},
    {"punct", "!!! ??? ... --- ((( ))) [[[ ]]] {{{ }}} ''' \"\"\" @#$%^&*", 0, 395, 26},
    {"url", "https://example.com/path?query=1&x=y#frag user@example.org", 0, 421, 22},
    {"long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism", 0, 443, 20},
    {"json", "{\"name\": \"SmolLM2\", \"params\": 135000000, \"ok\": true}", 0, 463, 28},
    {"markdown", "# Title\n\n* item one\n* item two\n\n```python\nprint('hi')\n```\n", 0, 491, 23},
    {"single_space", " ", 0, 514, 1},
    {"single_char", "a", 0, 515, 1},
    {"tabs_only", "\t\t\t", 0, 516, 1},
    {"combining", "e\xCC\x81 n\xCC\x83 a\xCC\x88\xCC\x84", 0, 517, 11},
    {"specials_parsed", "<|im_start|>user\nHi there<|im_end|>\n<|endoftext|>", 1, 528, 8},
};
static const chat_fixture_t chat_fixtures[] = {
    {"chat_default", NULL, "What is the capital of France?", 536, 37},
    {"chat_custom", "  Be brief.\n\n", "\n\nList 3 primes:  2, 3, 5 ", 573, 34},
};
static const int32_t fixture_ids[] = {
    19556, 905, 17, 378, 2365, 6354, 16438, 27003, 690, 260,
    23790, 2767, 30, 33, 34, 35, 36, 37, 284, 216,
    35, 30, 33, 36, 28, 731, 36, 34, 28, 216,
    33, 28, 32, 32, 32, 28, 32, 32, 32, 355,
    216, 32, 104, 33, 54, 43, 216, 34, 32, 34,
    36, 29, 32, 33, 29, 33, 37, 30, 81, 216,
    278, 256, 265, 333, 287, 216, 197, 297, 197, 197,
    86, 3717, 310, 1116, 198, 88, 333, 256, 2899, 284,
    35079, 333, 1311, 582, 198, 1311, 827, 201, 198, 1311,
    1296, 1116, 3805, 641, 6574, 198, 12420, 982, 339, 3060,
    392, 3543, 502, 2316, 1041, 6737, 357, 506, 339, 5248,
    637, 385, 5036, 23, 492, 23, 47917, 506, 422, 2154,
    23, 68, 1604, 3987, 24, 94, 727, 472, 585, 304,
    2067, 216, 34, 42, 448, 1003, 304, 472, 1003, 3987,
    24, 94, 29, 33, 25, 1232, 3987, 24, 94, 29,
    34, 25, 216, 907, 24149, 285, 198, 591, 1085, 24,
    32439, 25, 1662, 198, 197, 3272, 86, 23901, 84, 76,
    94, 1002, 1792, 75, 89, 77, 21420, 216, 34, 4258,
    198, 197, 5406, 216, 32, 43, 198, 109, 83, 1939,
    2756, 15486, 46494, 412, 2756, 5422, 2756, 5549, 223, 863,
    1321, 45682, 19144, 34878, 85, 18811, 236, 19539, 3256, 40852,
    18645, 250, 48392, 138, 12831, 7906, 240, 178, 239, 230,
    8083, 219, 23274, 115, 40993, 179, 120, 248, 26453, 11100,
    224, 10391, 251, 10391, 134, 11100, 226, 19076, 33085, 246,
    181, 130, 251, 183, 240, 129, 48138, 223, 231, 183,
    228, 114, 184, 228, 133, 57, 4636, 247, 114, 31752,
    649, 33777, 15107, 235, 231, 10813, 233, 138, 15107, 232,
    227, 10813, 232, 227, 15107, 235, 118, 321, 231, 10813,
    235, 119, 321, 231, 10813, 235, 117, 15107, 225, 121,
    10813, 225, 132, 19556, 41337, 7872, 9175, 216, 7906, 240,
    178, 239, 230, 36395, 20602, 44626, 31462, 10805, 12960, 119,
    31838, 23970, 162, 247, 12335, 118, 35090, 38770, 16525, 26293,
    30581, 5664, 237, 14240, 12001, 26112, 32437, 39963, 104, 19133,
    1232, 329, 39050, 446, 216, 16738, 216, 173, 223, 121,
    216, 164, 113, 164, 114, 164, 115, 216, 173, 235,
    250, 173, 235, 111, 81, 15442, 82, 12109, 218, 83,
    321, 227, 84, 321, 118, 85, 141, 223, 86, 44,
    108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 665,
    44, 108, 306, 79, 486, 108, 46, 198, 44, 108,
    486, 1714, 2692, 108, 46, 29646, 9148, 16693, 4563, 21749,
    365, 5134, 216, 7754, 17763, 75, 6329, 7896, 1662, 39876,
    4029, 17859, 7855, 1620, 3394, 19, 20, 21, 78, 22,
    26, 4687, 1742, 7434, 30, 824, 31, 1537, 47, 8433,
    45, 33, 22, 104, 45, 105, 19, 28082, 2914, 48,
    7434, 30, 2295, 64, 10304, 258, 12715, 814, 1936, 1513,
    371, 747, 37502, 21369, 4055, 406, 16842, 2469, 1598, 17889,
    30834, 358, 35050, 39428, 1245, 1799, 476, 9207, 308, 34519,
    34, 1002, 476, 5599, 1799, 216, 33, 35, 37, 32,
    32, 32, 32, 32, 32, 28, 476, 2231, 1799, 2629,
    109, 19, 7606, 198, 198, 26, 5033, 582, 198, 26,
    5033, 827, 198, 198, 3725, 5367, 198, 3272, 1305, 6004,
    1465, 198, 3725, 198, 216, 81, 27655, 85, 151, 219,
    304, 151, 221, 253, 151, 226, 151, 222, 1, 4093,
    198, 26843, 665, 2, 198, 0, 1, 9690, 198, 2683,
    359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28,
    7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198,
    1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1,
    520, 9531, 198, 1, 9690, 3805, 1934, 5453, 30, 1116,
    2, 198, 1, 4093, 1116, 198, 6106, 216, 35, 694,
    1014, 42, 256, 34, 28, 216, 35, 28, 216, 37,
    216, 2, 198, 1, 520, 9531, 198,
};
/* END GENERATED FIXTURES */

#define FIXTURE_N(a) (sizeof(a) / sizeof((a)[0]))

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* s with every byte that has no token replaced by U+FFFD: what decode(encode(s))
 * must give. out has room for 3 * n. */
static size_t expected_round_trip(const kv_tok_t *t, const char *s, size_t n, char *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (kv_tok_byte_ok(t, (uint8_t)s[i])) {
            out[k++] = s[i];
        } else {
            memcpy(out + k, "\xEF\xBF\xBD", 3);
            k += 3;
        }
    }
    return k;
}

/* decode(encode(s)) compared with expected_round_trip(s); also through pieces. */
static int round_trips(const kv_tok_t *t, const char *s, size_t n, int special)
{
    size_t cap = n + 8, nids = 0, len = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    char *back = malloc(3 * n + 8), *want = malloc(3 * n + 8);
    int ok = ids && back && want;
    ok = ok && kv_tok_encode(t, s, n, special, ids, cap, &nids) == 0;
    ok = ok && kv_tok_decode(t, ids, nids, back, 3 * n + 8, &len) == 0;
    size_t wl = ok ? expected_round_trip(t, s, n, want) : 0;
    ok = ok && len == wl && memcmp(back, want, wl) == 0;
    size_t k = 0;
    for (size_t i = 0; ok && i < nids; i++) {
        const char *p;
        size_t pl;
        ok = kv_tok_piece(t, ids[i], &p, &pl) == 0 && k + pl <= wl && memcmp(want + k, p, pl) == 0;
        k += pl;
    }
    ok = ok && k == wl;
    free(ids);
    free(back);
    free(want);
    return ok;
}

static void test_fixtures(const kv_tok_t *t)
{
    int32_t ids[256];
    for (size_t i = 0; i < FIXTURE_N(fixtures); i++) {
        const fixture_t *f = &fixtures[i];
        size_t n = 0;
        int rc = kv_tok_encode(t, f->text, strlen(f->text), f->special, ids, 256, &n);
        CHECK_OK(rc);
        CHECK_EQ(n, f->n);
        size_t j = 0;
        while (j < n && j < f->n && ids[j] == fixture_ids[f->first + j])
            j++;
        if (rc || n != f->n || j < n) {
            fprintf(stderr, "fixture %s: differs at id %zu (got %d, want %d)\n", f->name, j,
                    j < n ? ids[j] : -1, j < f->n ? fixture_ids[f->first + j] : -1);
            CHECK(0);
        }
        CHECK(round_trips(t, f->text, strlen(f->text), f->special));
    }
}

static void test_chat(const kv_tok_t *t)
{
    int32_t ids[256];
    for (size_t i = 0; i < FIXTURE_N(chat_fixtures); i++) {
        const chat_fixture_t *f = &chat_fixtures[i];
        size_t n = 0, need = 0;
        CHECK_OK(kv_tok_chat(t, f->system, f->user, NULL, 0, &need));
        CHECK_OK(kv_tok_chat(t, f->system, f->user, ids, 256, &n));
        CHECK_EQ(n, f->n);
        CHECK_EQ(need, n);
        CHECK(n == f->n && memcmp(ids, fixture_ids + f->first, n * sizeof *ids) == 0);
        CHECK_EQ(ids[0], 1); /* <|im_start|> */
        int starts = 0, ends = 0;
        for (size_t j = 0; j < n; j++) {
            starts += ids[j] == 1;
            ends += ids[j] == 2;
        }
        CHECK_EQ(starts, 3);
        CHECK_EQ(ends, 2);
        /* the reply turn change is the prompt's tail, as encoded there */
        int32_t reply[16];
        size_t nr = 0;
        CHECK_OK(kv_tok_chat_reply(t, reply, 16, &nr));
        CHECK(nr >= 4 && nr < n && !memcmp(reply, ids + n - nr, nr * sizeof *reply));
        CHECK_EQ(kv_tok_chat_reply(t, reply, nr - 1, &need), KV_ERANGE);
        CHECK_EQ(kv_tok_chat(t, f->system, f->user, ids, n - 1, &need), KV_ERANGE);
        CHECK_EQ(need, n);
        CHECK_OK(kv_tok_chat(t, f->system, f->user, ids, 256, &n));
        /* streaming: the pieces spell the rendered prompt */
        char text[512];
        size_t len = 0;
        CHECK_OK(kv_tok_decode(t, ids, n, text, sizeof text, &len));
        const char *sys = f->system ? f->system : KV_TOK_DEFAULT_SYSTEM;
        char want[512];
        int wl = snprintf(want, sizeof want,
                          "<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n"
                          "<|im_start|>assistant\n",
                          sys, f->user);
        CHECK(len == (size_t)wl && memcmp(text, want, len) == 0);
    }
    /* a user typing a marker gets text, not the control token */
    size_t n = 0;
    CHECK_OK(kv_tok_chat(t, "", "<|im_end|>", ids, 256, &n));
    int markers = 0;
    for (size_t i = 0; i < n; i++)
        markers += ids[i] == 2;
    CHECK_EQ(markers, 2); /* after the system and the user message only */
}

static void test_specials(const kv_tok_t *t)
{
    int32_t ids[64];
    size_t n = 0;
    CHECK_EQ(kv_tok_bos(t), 1);
    CHECK_EQ(kv_tok_eos(t), 2);
    CHECK_EQ(kv_tok_type(t, 1), KV_TOK_CONTROL);
    CHECK_EQ(kv_tok_type(t, 100), KV_TOK_NORMAL);
    int32_t id = -1;
    CHECK_OK(kv_tok_find(t, "<|im_end|>", 10, &id));
    CHECK_EQ(id, 2);
    CHECK_OK(kv_tok_find(t, "<|endoftext|>", 13, &id));
    CHECK_EQ(id, 0);

    CHECK_OK(kv_tok_encode(t, "<|im_start|>", 12, 1, ids, 64, &n));
    CHECK(n == 1 && ids[0] == 1);
    CHECK_OK(kv_tok_encode(t, "<|im_start|>", 12, 0, ids, 64, &n));
    int has = 0;
    for (size_t i = 0; i < n; i++)
        has |= kv_tok_type(t, ids[i]) == KV_TOK_CONTROL;
    CHECK(n > 1 && !has);
    CHECK_OK(kv_tok_encode(t, "<|im_start", 10, 1, ids, 64, &n));
    has = 0;
    for (size_t i = 0; i < n; i++)
        has |= ids[i] == 1;
    CHECK(n > 1 && !has);
    /* every control token's text parses back to itself */
    int all = 1;
    for (int32_t i = 0; i < (int32_t)kv_tok_n_vocab(t); i++) {
        if (kv_tok_type(t, i) != KV_TOK_CONTROL)
            continue;
        const char *p;
        size_t len;
        all &= kv_tok_piece(t, i, &p, &len) == 0 &&
                kv_tok_encode(t, p, len, 1, ids, 64, &n) == 0 && n == 1 && ids[0] == i;
    }
    CHECK(all);
}

/* Random text from code points of many scripts, white space and digits,
 * mixed with raw bytes that are not UTF-8 at all. */
static size_t random_text(uint64_t *seed, char *out, size_t max, int raw)
{
    static const uint32_t pick[][2] = {
        {0x20, 0x7E}, {0x20, 0x20}, {0x0A, 0x0A}, {0x09, 0x0D}, {0x30, 0x39},
        {0xA0, 0x24F}, {0x370, 0x3FF}, {0x400, 0x4FF}, {0x590, 0x6FF}, {0x900, 0x97F},
        {0x2000, 0x206F}, {0x3000, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3},
        {0xFF00, 0xFFEF}, {0x1F300, 0x1FAFF}, {0x10000, 0x10FFFF},
    };
    size_t k = 0;
    while (k + 4 < max) {
        uint64_t r = kv_test_rand(seed);
        if (raw && r % 7 == 0) {
            out[k++] = (char)(r >> 8);
            continue;
        }
        const uint32_t *rg = pick[(r >> 8) % (sizeof pick / sizeof pick[0])];
        uint32_t cp = rg[0] + (uint32_t)((r >> 16) % (rg[1] - rg[0] + 1));
        if (cp >= 0xD800 && cp <= 0xDFFF)
            cp = 'x';
        if (cp < 0x80) {
            out[k++] = (char)cp;
        } else if (cp < 0x800) {
            out[k++] = (char)(0xC0 | cp >> 6);
            out[k++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out[k++] = (char)(0xE0 | cp >> 12);
            out[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[k++] = (char)(0x80 | (cp & 0x3F));
        } else {
            out[k++] = (char)(0xF0 | cp >> 18);
            out[k++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            out[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[k++] = (char)(0x80 | (cp & 0x3F));
        }
        if ((r >> 40) % 16 == 0)
            break;
    }
    return k;
}

static void test_round_trip(const kv_tok_t *t)
{
    static const char *const invalid[] = {
        "\xC3\x28", "\xE2\x82", "\xED\xA0\x80", "\x80\xBF", "abc\xC3", "\xF0\x9F\x91",
        "\xC0\xAF", "\xF5\x80\x80\x80", "\xFF\xFE\xFD", "a\x04" "b\x1D" "c", "\xF1\x80\x80\x80",
    };
    for (size_t i = 0; i < FIXTURE_N(invalid); i++)
        CHECK(round_trips(t, invalid[i], strlen(invalid[i]), 0));

    /* which bytes lack a token: the 21 the header lists, no others */
    static const uint8_t missing[] = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2};
    int n_ok = 0, listed = 1;
    for (int b = 0; b < 256; b++)
        n_ok += kv_tok_byte_ok(t, (uint8_t)b);
    for (size_t i = 0; i < sizeof missing; i++)
        listed &= !kv_tok_byte_ok(t, missing[i]);
    for (int b = 0xF5; b <= 0xFF; b++)
        listed &= !kv_tok_byte_ok(t, (uint8_t)b);
    CHECK_EQ(n_ok, 256 - 21);
    CHECK(listed);
    /* a byte without a token becomes U+FFFD's tokens, exactly */
    int32_t a[8], b[8];
    size_t na = 0, nb = 0;
    CHECK_OK(kv_tok_encode(t, "\xFF", 1, 0, a, 8, &na));
    CHECK_OK(kv_tok_encode(t, "\xEF\xBF\xBD", 3, 0, b, 8, &nb));
    CHECK(na == nb && na > 0 && memcmp(a, b, na * sizeof *a) == 0);

    uint64_t seed = 7;
    static char text[4096];
    int ok = 1;
    for (int i = 0; i < 400 && ok; i++) {
        size_t n = random_text(&seed, text, sizeof text, i & 1);
        ok &= round_trips(t, text, n, i % 3 == 0);
        if (!ok)
            fprintf(stderr, "round trip failed on random text %d (%zu bytes)\n", i, n);
    }
    CHECK(ok);
}

static void test_long(const kv_tok_t *t)
{
    static const char *const words[] = {
        "the", "kvpage", "store", "keeps", "pages", "of", "keys", "and", "values", ",", ".",
        "\n", "\n\n", "  ", "2024", "3.14", "caf\xC3\xA9", "\xE4\xB8\x96\xE7\x95\x8C", "don't",
        "(x)", "\t", "\xF0\x9F\x91\x8D",
    };
    const size_t n = 100 * 1024;
    char *text = malloc(n + 64);
    CHECK(text != NULL);
    if (!text)
        return;
    uint64_t seed = 3;
    size_t k = 0;
    while (k < n) {
        const char *w = words[kv_test_rand(&seed) % FIXTURE_N(words)];
        size_t wl = strlen(w);
        memcpy(text + k, w, wl);
        k += wl;
        text[k++] = ' ';
    }
    double t0 = now_ms();
    size_t need = 0;
    CHECK_OK(kv_tok_encode(t, text, k, 0, NULL, 0, &need));
    double ms = now_ms() - t0;
    printf("encode of %zu bytes: %zu tokens in %.1f ms\n", k, need, ms);
    CHECK(need > k / 8 && need < k);
    CHECK(ms < 5000.0); /* ~10 ms in a normal build; generous for sanitizers */
    CHECK(round_trips(t, text, k, 0));

    /* one 100 KB "word" of letters, and one of punctuation */
    memset(text, 'q', n);
    t0 = now_ms();
    CHECK(round_trips(t, text, n, 0));
    memset(text, '!', n);
    CHECK(round_trips(t, text, n, 0));
    ms = now_ms() - t0;
    printf("two 100 KB words: %.1f ms\n", ms);
    CHECK(ms < 10000.0);
    free(text);
}

static void test_args(const kv_tok_t *t)
{
    int32_t ids[4];
    size_t n = 5;
    CHECK_OK(kv_tok_encode(t, "", 0, 1, ids, 4, &n));
    CHECK_EQ(n, 0);
    CHECK_OK(kv_tok_encode(t, NULL, 0, 0, ids, 4, &n));
    CHECK_EQ(n, 0);
    CHECK_OK(kv_tok_decode(t, ids, 0, NULL, 0, &n));
    CHECK_EQ(n, 0);
    CHECK_EQ(kv_tok_encode(t, "hello world, again", 18, 0, ids, 1, &n), KV_ERANGE);
    CHECK(n > 1);
    CHECK_EQ(kv_tok_encode(t, NULL, 3, 0, ids, 4, &n), KV_EINVAL);
    int32_t bad = (int32_t)kv_tok_n_vocab(t);
    char out[4];
    CHECK_EQ(kv_tok_decode(t, &bad, 1, out, 4, &n), KV_ERANGE);
    CHECK_EQ(kv_tok_type(t, bad), KV_ERANGE);
    CHECK_EQ(kv_tok_chat(t, NULL, NULL, ids, 4, &n), KV_EINVAL);
    CHECK_EQ(kv_tok_chat(NULL, NULL, "x", ids, 4, &n), KV_EINVAL);
}

int main(void)
{
    char path[4096], err[512];
    int pinned = 0;
    int rc = kv_model_find(NULL, path, sizeof path, &pinned, err, sizeof err);
    if (rc == KV_ENOENT)
        KV_TEST_SKIP(err);
    CHECK_OK(rc);
    if (rc)
        return kv_test_end();

    kv_gguf_t *g = NULL;
    kv_tok_t *t = NULL;
    CHECK_OK(rc = kv_gguf_open(path, &g, err, sizeof err));
    if (rc) {
        fprintf(stderr, "%s\n", err);
        return kv_test_end();
    }
    double t0 = now_ms();
    CHECK_OK(rc = kv_tok_from_gguf(g, &t, err, sizeof err));
    printf("tokenizer built in %.1f ms\n", now_ms() - t0);
    kv_gguf_close(g); /* the tokenizer keeps copies of what it needs */
    if (rc) {
        fprintf(stderr, "%s\n", err);
        return kv_test_end();
    }
    CHECK_EQ(kv_tok_n_vocab(t), 49152);

    test_fixtures(t);
    test_chat(t);
    test_specials(t);
    test_round_trip(t);
    test_long(t);
    test_args(t);
    kv_tok_destroy(t);
    return kv_test_end();
}
