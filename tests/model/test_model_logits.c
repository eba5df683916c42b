/* SPDX-License-Identifier: MIT */
/*
 * test_model_logits.c — the model's attention through FP16 pages against
 * its dense-attention path, determinism, forks and rollback.
 *
 * Two levels of comparison, because K/V are rounded to FP16 in both paths
 * and rounding is discontinuous: a last-bit difference in an early layer
 * (the store and the dense path add in different orders) flips the FP16
 * rounding of some later K/V elements by half an ulp (~5e-4 relative), and
 * that propagates. Measured with this engine on this prompt: the dense path
 * against itself with double-precision attention differs end to end by 5e-4
 * (max |dlogit| / max |logit|) with FP16 K/V but by 4e-6 with FP32 K/V;
 * FP16 against FP32 K/V differ by 1.4e-3; paged against dense by 2.6e-3
 * (||d|| / ||logits|| up to 5e-3 on the system-prompt rows). So:
 *   - per layer, on identical inputs (the store's K/V read back, the same
 *     q), the store's prefill and decode attention equal a double-precision
 *     reference to 1e-5 relative: the exact check of the store (it measures
 *     ~1e-6);
 *   - end to end, for every prompt row and 12 greedy decode steps, bounds
 *     a few times that FP16 noise floor: max |d| / max |logit| <= 1e-2,
 *     ||d|| / ||logits|| <= 1e-2, KL(dense || paged) <= 5e-4 nats, the same
 *     argmax wherever it is not a near-tie, and greedy decoding chooses the
 *     same tokens. (The values seen are printed.)
 * The prompt in one chunk and in chunks of 16 gives the same rows (within
 * the same bounds), and asking for the last 3 rows only gives those rows'
 * exact bits. Greedy output and logits are bit-identical across runs and
 * across thread counts (1 vs 2, engine and store; paged and dense); a fork decoded in a batch with
 * its parent gives the parent's logits bit for bit; bad token ids and
 * context overflow are refused without changing the session; a forward pass
 * that runs out of pages mid-way (KV_ENOMEM) leaves the session and the
 * store exactly as before, and the session works afterwards.
 */
#include "kv_model_test.h"

#define CTX 128

typedef struct cmp_stats {
    double worst_rel;  /* max over rows of max|d| / max|ref|             */
    double worst_l2;   /* max over rows of ||d||_2 / ||ref||_2           */
    double worst_abs;  /* max |d|                                        */
    double worst_kl;   /* max over rows of KL(softmax(ref) || softmax(x)) */
    long argmax_diff;  /* rows whose argmax differs (clear winners only) */
} cmp_stats_t;

/* Compare rows of x against ref. An argmax difference counts only where the
 * reference's top-2 gap is over 10x the row's max |d| (else it is a tie). */
static void cmp_rows(const float *x_all, const float *ref_all, uint32_t rows, uint32_t V,
                     cmp_stats_t *c)
{
    for (uint32_t r = 0; r < rows; r++) {
        const float *x = x_all + (size_t)r * V, *y = ref_all + (size_t)r * V;
        double md = 0, mx = 0, d2 = 0, y2 = 0, zx = 0, zy = 0, kl = 0;
        float xm = x[kv_model_argmax(x, V)], ym = y[kv_model_argmax(y, V)];
        for (uint32_t i = 0; i < V; i++) {
            double d = fabs((double)x[i] - y[i]);
            md = d > md ? d : md;
            mx = fabs(y[i]) > mx ? fabs(y[i]) : mx;
            d2 += d * d;
            y2 += (double)y[i] * y[i];
            zx += exp((double)x[i] - xm);
            zy += exp((double)y[i] - ym);
        }
        for (uint32_t i = 0; i < V; i++) {
            double ly = (double)y[i] - ym - log(zy), lx = (double)x[i] - xm - log(zx);
            kl += exp(ly) * (ly - lx);
        }
        c->worst_abs = md > c->worst_abs ? md : c->worst_abs;
        c->worst_rel = md / mx > c->worst_rel ? md / mx : c->worst_rel;
        c->worst_l2 = sqrt(d2 / y2) > c->worst_l2 ? sqrt(d2 / y2) : c->worst_l2;
        c->worst_kl = kl > c->worst_kl ? kl : c->worst_kl;
        int32_t top = kv_model_argmax(y, V);
        float second = -INFINITY;
        for (uint32_t i = 0; i < V; i++)
            if ((int32_t)i != top && y[i] > second)
                second = y[i];
        if (y[top] - second > 10 * md)
            c->argmax_diff += kv_model_argmax(x, V) != top;
    }
}

static void print_cmp(const char *what, const cmp_stats_t *c)
{
    printf("%s: max abs %.3g, max rel %.3g, max l2 rel %.3g, max KL %.3g, "
           "argmax differences %ld\n", what, c->worst_abs, c->worst_rel, c->worst_l2,
           c->worst_kl, c->argmax_diff);
}

/* End-to-end bounds (see the top of the file for why not 1e-3). */
static void check_cmp(const cmp_stats_t *c)
{
    CHECK(c->worst_rel <= 1e-2);
    CHECK(c->worst_l2 <= 1e-2);
    CHECK(c->worst_kl <= 5e-4);
    CHECK_EQ(c->argmax_diff, 0);
}

static kv_store_t *new_store(const kv_model_t *m, uint32_t tokens, uint32_t seqs, uint32_t thr)
{
    kv_config_t cfg;
    kv_store_t *st = NULL;
    if (kv_model_store_config(m, tokens, seqs, thr, &cfg) || kv_store_create(&cfg, &st))
        exit(1);
    return st;
}

static kv_model_session_t *new_session(const kv_model_t *m, kv_store_t *st, uint32_t chunk,
                                       int threads)
{
    kv_model_session_opts_t o = {.store = st, .max_ctx = CTX, .chunk = chunk,
                                 .n_threads = threads};
    kv_model_session_t *s = NULL;
    if (kv_model_session_create(m, &o, &s))
        exit(1);
    return s;
}

/* ---- per-layer check of the store's attention ---------------------------- */

typedef struct layer_check {
    kv_store_t *store;
    const kv_model_hparams_t *hp;
    double worst;      /* max |out - ref| / max |ref| over all calls */
    long calls, failures;
} layer_check_t;

static int post_attn(void *user, const kv_model_layer_io_t *io, const float *out)
{
    layer_check_t *lc = user;
    const uint32_t hd = lc->hp->head_dim, nq = lc->hp->n_q_heads, nkv = lc->hp->n_kv_heads;
    const uint32_t group = nq / nkv;
    lc->calls++;
    for (uint32_t r = 0; r < io->n; r++) {
        kv_seq_id_t seq;
        kv_model_session_seq(io->sess[io->batch == 1 ? 0 : r], &seq);
        double mx = 0, md = 0;
        for (uint32_t g = 0; g < nkv; g++) {
            uint32_t len = 0;
            kv_seq_len(lc->store, seq, io->layer, g, &len);
            /* Row r sees every token up to its own (the new ones are last). */
            uint32_t upto = io->batch == 1 ? len - io->n + r + 1 : len;
            float *k = malloc((size_t)upto * hd * 4), *v = malloc((size_t)upto * hd * 4);
            double *p = malloc((size_t)upto * sizeof *p);
            if (!k || !v || !p || kv_read(lc->store, seq, io->layer, g, 0, upto, k, v, NULL)) {
                lc->failures++;
                free(k), free(v), free(p);
                return 0;
            }
            for (uint32_t h = g * group; h < (g + 1) * group; h++) {
                const float *q = io->q + ((size_t)r * nq + h) * hd;
                double m = -INFINITY, sum = 0;
                for (uint32_t j = 0; j < upto; j++) {
                    double d = 0;
                    for (uint32_t e = 0; e < hd; e++)
                        d += (double)q[e] * k[(size_t)j * hd + e];
                    p[j] = d / sqrt((double)hd);
                    m = p[j] > m ? p[j] : m;
                }
                for (uint32_t j = 0; j < upto; j++)
                    sum += (p[j] = exp(p[j] - m));
                for (uint32_t e = 0; e < hd; e++) {
                    double ref = 0;
                    for (uint32_t j = 0; j < upto; j++)
                        ref += p[j] * v[(size_t)j * hd + e];
                    ref /= sum;
                    double got = out[((size_t)r * nq + h) * hd + e];
                    md = fabs(got - ref) > md ? fabs(got - ref) : md;
                    mx = fabs(ref) > mx ? fabs(ref) : mx;
                }
            }
            free(k), free(v), free(p);
        }
        double rel = md / (mx > 0 ? mx : 1);
        lc->worst = rel > lc->worst ? rel : lc->worst;
    }
    return 0;
}

static void test_layers(const kv_model_t *m, const int32_t *ids, uint32_t n)
{
    kv_store_t *st = new_store(m, CTX, 3, 1);
    kv_model_session_t *s = new_session(m, st, 16, 1);
    layer_check_t lc = {.store = st, .hp = kv_model_hparams(m)};
    kv_model_hook_t hook = {.post_attn = post_attn, .user = &lc};
    kv_model_session_set_hook(s, &hook);
    CHECK_OK(kv_model_forward(s, ids, n, NULL, 0)); /* 16-row chunks: earlier pages too */
    kv_model_session_t *f = NULL;
    CHECK_OK(kv_model_session_fork(s, &f)); /* inherits the hook */
    kv_model_session_t *both[2] = {s, f};
    int32_t toks[2] = {ids[3], ids[5]};
    CHECK_OK(kv_model_decode_batch(both, 2, toks, NULL)); /* batched kv_attn_decode */
    const uint32_t L = kv_model_hparams(m)->n_layers;
    CHECK_EQ(lc.calls, (long)((n + 15) / 16 + 1) * L);
    CHECK_EQ(lc.failures, 0);
    printf("per-layer attention, store vs double reference: worst relative error %.3g\n",
           lc.worst);
    CHECK(lc.worst < 1e-5);
    CHECK_OK(kv_store_check(st));
    kv_model_session_free(f);
    kv_model_session_free(s);
    kv_store_destroy(st);
}

/* ---- end to end: paged vs dense ------------------------------------------ */

static void test_paged_vs_dense(const kv_model_t *m, const int32_t *ids, uint32_t n)
{
    const uint32_t V = kv_model_hparams(m)->vocab;
    kv_store_t *st = new_store(m, CTX, 1, 1);
    kv_model_session_t *sp = new_session(m, st, 16, 1), *sd = new_session(m, NULL, 16, 1);
    float *lp = malloc((size_t)n * V * 4), *ld = malloc((size_t)n * V * 4);
    CHECK_OK(kv_model_forward(sp, ids, n, lp, n));
    CHECK_OK(kv_model_forward(sd, ids, n, ld, n));
    cmp_stats_t pre = {0};
    cmp_rows(lp, ld, n, V, &pre);
    print_cmp("prefill logits, paged vs dense, every prompt row", &pre);
    check_cmp(&pre);
    /* The same prompt in one chunk: rows land in the same places. */
    kv_store_t *st1 = new_store(m, CTX, 1, 1);
    kv_model_session_t *s1 = new_session(m, st1, 256, 1);
    float *l1 = malloc((size_t)n * V * 4);
    CHECK_OK(kv_model_forward(s1, ids, n, l1, n));
    cmp_stats_t ch = {0};
    cmp_rows(l1, lp, n, V, &ch);
    print_cmp("prefill logits, one chunk vs chunks of 16 (paged)", &ch);
    check_cmp(&ch);
    /* Only the last 3 rows asked for: the same bits as those rows above. */
    kv_model_session_free(s1);
    s1 = new_session(m, st1, 256, 1);
    float *l3 = malloc((size_t)3 * V * 4);
    CHECK_OK(kv_model_forward(s1, ids, n, l3, 3));
    CHECK(!memcmp(l3, l1 + (size_t)(n - 3) * V, (size_t)3 * V * 4));
    free(l3);
    free(l1);
    kv_model_session_free(s1);
    kv_store_destroy(st1);
    /* Greedy decoding on both. */
    cmp_stats_t dec = {0};
    int32_t tp = kv_model_argmax(lp + (size_t)(n - 1) * V, V), td = tp;
    long token_diff = 0;
    for (int i = 0; i < 12; i++) {
        CHECK_OK(kv_model_decode(sp, tp, lp));
        CHECK_OK(kv_model_decode(sd, td, ld));
        cmp_rows(lp, ld, 1, V, &dec);
        tp = kv_model_argmax(lp, V);
        td = kv_model_argmax(ld, V);
        token_diff += tp != td;
    }
    print_cmp("decode logits, paged vs dense, 12 greedy steps", &dec);
    check_cmp(&dec);
    CHECK_EQ(token_diff, 0);
    CHECK_EQ(kv_model_session_pos(sp), n + 12);
    kv_stats_t ss = {.struct_size = sizeof ss};
    CHECK_OK(kv_store_stats(st, &ss));
    const kv_model_hparams_t *hp = kv_model_hparams(m);
    CHECK_EQ(ss.tokens, (uint64_t)(n + 12) * hp->n_layers * hp->n_kv_heads);
    CHECK_EQ(ss.fp16_bytes, ss.tokens * 2 * hp->head_dim * 2);
    free(lp), free(ld);
    kv_model_session_free(sp);
    kv_model_session_free(sd);
    kv_store_destroy(st);
}

/* ---- determinism ---------------------------------------------------------- */

/* Greedy continuation of 16 tokens; the final logits into last. Paged, or
 * dense (attention rows on the model's workers, scores per worker). */
static void greedy(const kv_model_t *m, const int32_t *ids, uint32_t n, int threads, int dense,
                   int32_t *out, float *last)
{
    kv_store_t *st = dense ? NULL : new_store(m, CTX, 1, (uint32_t)threads);
    kv_model_session_t *s = new_session(m, st, 256, threads);
    kv_model_gen_opts_t o = {.max_new = 16};
    kv_model_gen_result_t r;
    CHECK_OK(kv_model_generate(s, ids, n, &o, out, &r));
    CHECK_EQ(r.n_new, 16);
    const uint32_t V = kv_model_hparams(m)->vocab;
    float *lg = malloc((size_t)V * 4);
    CHECK_OK(kv_model_decode(s, out[15], lg));
    memcpy(last, lg, (size_t)V * 4);
    free(lg);
    kv_model_session_free(s);
    kv_store_destroy(st);
}

static void test_determinism(const kv_model_t *m, const int32_t *ids, uint32_t n)
{
    const uint32_t V = kv_model_hparams(m)->vocab;
    int32_t a[16], b[16], c[16];
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4), *lc = malloc((size_t)V * 4);
    for (int dense = 0; dense < 2; dense++) {
        greedy(m, ids, n, 1, dense, a, la);
        greedy(m, ids, n, 1, dense, b, lb);
        greedy(m, ids, n, 2, dense, c, lc);
        CHECK(!memcmp(a, b, sizeof a));
        CHECK(!memcmp(la, lb, (size_t)V * 4));
        CHECK(!memcmp(a, c, sizeof a));
        CHECK(!memcmp(la, lc, (size_t)V * 4));
    }
    free(la), free(lb), free(lc);
}

/* ---- forks, bad input, rollback -------------------------------------------- */

static void test_fork(const kv_model_t *m, const int32_t *ids, uint32_t n)
{
    const uint32_t V = kv_model_hparams(m)->vocab;
    kv_store_t *st = new_store(m, CTX, 3, 1);
    kv_model_session_t *s = new_session(m, st, 256, 1), *f = NULL, *g = NULL;
    CHECK_OK(kv_model_forward(s, ids, n, NULL, 0));
    CHECK_OK(kv_model_session_fork(s, &f));
    CHECK_OK(kv_model_session_fork(s, &g));
    CHECK_EQ(kv_model_session_pos(f), n);
    float *two = malloc(2 * (size_t)V * 4), *one = malloc((size_t)V * 4);
    kv_model_session_t *pair[2] = {s, f};
    int32_t toks[2] = {ids[1], ids[1]};
    CHECK_OK(kv_model_decode_batch(pair, 2, toks, two));
    CHECK_OK(kv_model_decode(g, ids[1], one));
    CHECK(!memcmp(two, two + V, (size_t)V * 4));
    CHECK(!memcmp(two, one, (size_t)V * 4));
    kv_model_session_t *dup[2] = {s, s};
    CHECK_EQ(kv_model_decode_batch(dup, 2, toks, two), KV_EINVAL);
    CHECK_OK(kv_store_check(st));
    free(two), free(one);
    kv_model_session_free(g);
    kv_model_session_free(f);
    kv_model_session_free(s);
    kv_stats_t ss = {.struct_size = sizeof ss};
    CHECK_OK(kv_store_stats(st, &ss));
    CHECK_EQ(ss.pages_used, 0);
    kv_store_destroy(st);
}

static void lens_of(kv_store_t *st, kv_model_session_t *s, const kv_model_hparams_t *hp,
                    uint32_t want, long *wrong)
{
    kv_seq_id_t seq;
    kv_model_session_seq(s, &seq);
    for (uint32_t l = 0; l < hp->n_layers; l++)
        for (uint32_t h = 0; h < hp->n_kv_heads; h++) {
            uint32_t len = 99999;
            kv_seq_len(st, seq, l, h, &len);
            *wrong += len != want;
        }
}

static void test_errors_and_rollback(const kv_model_t *m, const int32_t *ids, uint32_t n)
{
    const kv_model_hparams_t *hp = kv_model_hparams(m);
    const uint32_t V = hp->vocab;
    /* Pages for 32 tokens per list (2 pages each): a 40-token prompt cannot fit. */
    kv_config_t cfg;
    kv_model_store_config(m, 16, 1, 1, &cfg);
    cfg.host_pages = (uint64_t)hp->n_layers * hp->n_kv_heads * 2;
    kv_store_t *st = NULL;
    CHECK_OK(kv_store_create(&cfg, &st));
    if (!st)
        return;
    kv_model_session_t *s = new_session(m, st, 256, 1);
    int32_t bad[2] = {ids[0], (int32_t)V};
    CHECK_EQ(kv_model_forward(s, bad, 2, NULL, 0), KV_ERANGE);
    bad[1] = -1;
    CHECK_EQ(kv_model_decode(s, -1, NULL), KV_ERANGE);
    CHECK_EQ(kv_model_forward(s, bad, 2, NULL, 0), KV_ERANGE);
    CHECK_EQ(kv_model_session_pos(s), 0);
    CHECK(n >= 40);
    CHECK_EQ(kv_model_forward(s, ids, 40, NULL, 0), KV_ENOMEM);
    long wrong = 0;
    lens_of(st, s, hp, 0, &wrong);
    CHECK_EQ(wrong, 0);
    CHECK_EQ(kv_model_session_pos(s), 0);
    CHECK_OK(kv_store_check(st));
    kv_stats_t ss = {.struct_size = sizeof ss};
    kv_store_stats(st, &ss);
    CHECK_EQ(ss.pages_used, 0);
    /* 20 tokens fit; 20 more do not, and roll back to 20. */
    float *l1 = malloc((size_t)V * 4), *l2 = malloc((size_t)V * 4);
    CHECK_OK(kv_model_forward(s, ids, 20, l1, 1));
    CHECK_EQ(kv_model_forward(s, ids + 20, 20, NULL, 0), KV_ENOMEM);
    wrong = 0;
    lens_of(st, s, hp, 20, &wrong);
    CHECK_EQ(wrong, 0);
    CHECK_EQ(kv_model_session_pos(s), 20);
    CHECK_OK(kv_store_check(st));
    /* It still works, and gives what a fresh session gives. */
    CHECK_OK(kv_model_decode(s, ids[20], l1));
    kv_model_session_t *d = new_session(m, NULL, 256, 1);
    CHECK_OK(kv_model_forward(d, ids, 21, l2, 1));
    cmp_stats_t c = {0};
    cmp_rows(l1, l2, 1, V, &c);
    check_cmp(&c);
    /* Context limit. */
    kv_model_session_opts_t o = {.max_ctx = 8, .n_threads = 1};
    kv_model_session_t *tiny = NULL;
    CHECK_OK(kv_model_session_create(m, &o, &tiny));
    CHECK_EQ(kv_model_forward(tiny, ids, 9, NULL, 0), KV_ELIMIT);
    CHECK_OK(kv_model_forward(tiny, ids, 8, NULL, 0));
    CHECK_EQ(kv_model_decode(tiny, ids[0], NULL), KV_ELIMIT);
    kv_model_session_free(tiny);
    free(l1), free(l2);
    kv_model_session_free(d);
    kv_model_session_free(s);
    kv_store_destroy(st);
}

int main(void)
{
    kv_tok_t *tok = NULL;
    kv_model_t *m = kvt_load(&tok);
    uint32_t n = 0;
    int32_t *ids = kvt_chat(tok, "Name the three primary colors and say why they matter.", &n);
    printf("prompt: %u tokens\n", n);
    test_layers(m, ids, n);
    test_paged_vs_dense(m, ids, n);
    test_determinism(m, ids, n);
    test_fork(m, ids, n);
    test_errors_and_rollback(m, ids, n);
    free(ids);
    kv_tok_destroy(tok);
    kv_model_free(m);
    return kv_test_end();
}
