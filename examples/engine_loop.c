/* SPDX-License-Identifier: MIT */
/*
 * engine_loop.c — kvpage driven the way an inference engine drives it.
 *
 * A batch of requests is prefilled one by one, then decoded together: each
 * step appends one token per sequence at every layer and makes one batched
 * attention call per layer. Request 0 forks right after its prompt (two
 * continuations of one prompt, e.g. parallel sampling): the child shares
 * every page copy-on-write. Sequences that grow past a limit are compacted
 * to a sliding window, the first SINK tokens and the newest WINDOW
 * (StreamingLLM-style), so memory stays bounded.
 *
 * The model is fake (keys, values and queries come from a small PRNG keyed
 * by request, position and layer); the store's work and these checks are
 * real:
 *   - a fork takes no page: pages_used is the same right after it;
 *   - parent and child, fed the same tokens, get bit-identical attention at
 *     every step and layer (while their pages are shared, and after the
 *     first append has given each its own tail page);
 *   - after a compaction a list holds SINK + WINDOW tokens with positions
 *     0..SINK-1 and the newest WINDOW;
 *   - kv_store_check passes; freeing every sequence returns every page.
 *
 * Build: cc engine_loop.c $(pkg-config --cflags --libs kvpage)
 */
#include <kvpage/kvpage.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    LAYERS = 4, Q_HEADS = 8, KV_HEADS = 2, HEAD_DIM = 64,
    N_REQ = 4,            /* requests; request 0 also gets a forked child  */
    N_SEQ = N_REQ + 1,    /* sequences decoded in each batch               */
    STEPS = 64,           /* decode steps                                  */
    SINK = 4, WINDOW = 96, /* what a compaction keeps                       */
    COMPACT_AT = SINK + WINDOW + 32, /* list length that triggers it       */
};

static const uint32_t prompt_len[N_REQ] = {100, 37, 64, 200};

#define KV_ELEMS (KV_HEADS * HEAD_DIM)
#define Q_ELEMS  (Q_HEADS * HEAD_DIM)

#define TRY(call)                                                           \
    do {                                                                    \
        int rc_ = (call);                                                   \
        if (rc_) {                                                          \
            fprintf(stderr, "%s: %s (%d)\n", #call, kv_strerror(rc_), rc_); \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

#define CHECK(cond)                                                 \
    do {                                                            \
        if (!(cond)) {                                              \
            fprintf(stderr, "check failed: %s (line %d)\n", #cond, \
                    __LINE__);                                      \
            exit(1);                                                \
        }                                                           \
    } while (0)

/* The fake model: n values in [-1, 1) from (request, position, layer, what). */
static void fake(float *x, size_t n, uint32_t req, uint32_t pos, uint32_t layer,
                 uint32_t what)
{
    uint64_t s = ((uint64_t)req << 48) ^ ((uint64_t)pos << 20) ^ (layer << 4) ^ what;
    s = s * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)(s >> 40) / (float)(1u << 23) - 1.0f;
    }
}

/* Keys and values of tokens [pos, pos+n) of one layer: [n][KV_HEADS][HEAD_DIM]. */
static void fake_kv(float *k, float *v, uint32_t req, uint32_t pos, uint32_t n,
                    uint32_t layer)
{
    for (uint32_t t = 0; t < n; t++) {
        fake(k + (size_t)t * KV_ELEMS, KV_ELEMS, req, pos + t, layer, 1);
        fake(v + (size_t)t * KV_ELEMS, KV_ELEMS, req, pos + t, layer, 2);
    }
}

static kv_stats_t stats(const kv_store_t *st)
{
    kv_stats_t s = {.struct_size = sizeof s};
    TRY(kv_store_stats(st, &s));
    return s;
}

/* Keep the first SINK and the newest WINDOW tokens of every list of seq
 * once a list reaches COMPACT_AT tokens; check what stays. Returns 1 if it
 * compacted. */
static int maybe_compact(kv_store_t *st, kv_seq_id_t seq)
{
    uint32_t len;
    TRY(kv_seq_len(st, seq, 0, 0, &len));
    if (len < COMPACT_AT)
        return 0;
    uint32_t keep[SINK + WINDOW];
    for (uint32_t i = 0; i < SINK; i++)
        keep[i] = i;
    for (uint32_t i = 0; i < WINDOW; i++)
        keep[SINK + i] = len - WINDOW + i;
    for (uint32_t layer = 0; layer < LAYERS; layer++)
        for (uint32_t h = 0; h < KV_HEADS; h++) {
            int32_t before[WINDOW], pos[SINK + WINDOW];
            TRY(kv_read(st, seq, layer, h, len - WINDOW, WINDOW, NULL, NULL, before));
            TRY(kv_compact(st, seq, layer, h, keep, SINK + WINDOW));
            uint32_t n;
            TRY(kv_seq_len(st, seq, layer, h, &n));
            CHECK(n == SINK + WINDOW);
            TRY(kv_read(st, seq, layer, h, 0, n, NULL, NULL, pos));
            for (uint32_t i = 0; i < SINK; i++)
                CHECK(pos[i] == (int32_t)i);
            CHECK(memcmp(pos + SINK, before, sizeof before) == 0);
        }
    return 1;
}

int main(void)
{
    kv_config_t cfg = kv_config_default();
    cfg.n_layers = LAYERS;
    cfg.n_q_heads = Q_HEADS;
    cfg.n_kv_heads = KV_HEADS;
    cfg.head_dim = HEAD_DIM;
    cfg.host_pages = 4096;
    kv_store_t *st;
    TRY(kv_store_create(&cfg, &st));

    static float k[256 * KV_ELEMS], v[256 * KV_ELEMS];
    static float q[256 * Q_ELEMS], out[256 * Q_ELEMS];
    kv_seq_id_t seq[N_SEQ];
    uint32_t req_of[N_SEQ], seen[N_SEQ]; /* request feeding the sequence; tokens */

    /* Prefill: each request's prompt, layer by layer. */
    for (uint32_t r = 0; r < N_REQ; r++) {
        TRY(kv_seq_create(st, &seq[r]));
        req_of[r] = r;
        seen[r] = prompt_len[r];
        for (uint32_t layer = 0; layer < LAYERS; layer++) {
            fake_kv(k, v, r, 0, prompt_len[r], layer);
            TRY(kv_append(st, seq[r], layer, prompt_len[r], KV_DTYPE_F32, k, v, NULL));
            fake(q, (size_t)prompt_len[r] * Q_ELEMS, r, 0, layer, 3);
            kv_prefill_t pf = {.layer = layer, .seq = seq[r], .n_new = prompt_len[r],
                               .q = q, .out = out};
            TRY(kv_attn_prefill(st, &pf));
        }
    }

    /* Fork request 0: the child shares every page; it is fed the same tokens
     * as its parent below, so both must attend identically. */
    uint64_t used = stats(st).pages_used;
    TRY(kv_seq_fork(st, seq[0], &seq[N_REQ]));
    CHECK(stats(st).pages_used == used);
    req_of[N_REQ] = 0;
    seen[N_REQ] = seen[0];

    /* Decode: one token per sequence per step, one batched call per layer. */
    uint32_t compactions = 0;
    for (uint32_t step = 0; step < STEPS; step++) {
        for (uint32_t layer = 0; layer < LAYERS; layer++) {
            for (uint32_t i = 0; i < N_SEQ; i++) {
                fake_kv(k, v, req_of[i], seen[i], 1, layer);
                TRY(kv_append(st, seq[i], layer, 1, KV_DTYPE_F32, k, v, NULL));
                fake(q + (size_t)i * Q_ELEMS, Q_ELEMS, req_of[i], seen[i], layer, 3);
            }
            kv_decode_t d = {.layer = layer, .batch = N_SEQ, .seqs = seq, .q = q,
                             .out = out};
            TRY(kv_attn_decode(st, &d));
            CHECK(memcmp(out, out + (size_t)N_REQ * Q_ELEMS, Q_ELEMS * sizeof *out) == 0);
        }
        for (uint32_t i = 0; i < N_SEQ; i++)
            seen[i]++;
        kv_stats_t s = stats(st);
        /* Parent and child compact at the same step, so they stay alike.
         * (Compacting them costs pages at first: the tokens they keep from
         * shared pages go to fresh pages of each, and the shared ones are
         * released only when both have compacted.) */
        uint32_t n = 0;
        for (uint32_t i = 0; i < N_SEQ; i++)
            n += (uint32_t)maybe_compact(st, seq[i]);
        if (n)
            CHECK(stats(st).tokens < s.tokens);
        compactions += n;
    }

    kv_stats_t s = stats(st);
    uint64_t total_seen = 0;
    for (uint32_t i = 0; i < N_SEQ; i++)
        total_seen += seen[i];
    printf("%u sequences, %u decode steps, %u compactions: %llu tokens seen, %llu held; "
           "%llu pages used (peak %llu), %llu KiB\n",
           N_SEQ, STEPS, compactions, (unsigned long long)total_seen,
           (unsigned long long)(s.tokens / (LAYERS * KV_HEADS)),
           (unsigned long long)s.pages_used, (unsigned long long)s.pages_peak,
           (unsigned long long)(s.kv_bytes >> 10));
    CHECK(compactions > 0);
    TRY(kv_store_check(st));
    for (uint32_t i = 0; i < N_SEQ; i++)
        TRY(kv_seq_free(st, seq[i]));
    CHECK(stats(st).pages_used == 0);
    kv_store_destroy(st);
    return 0;
}
