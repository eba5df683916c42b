/* SPDX-License-Identifier: MIT */
/*
 * minimal.c — the smallest complete kvpage program (README.md shows it).
 *
 * One store for a small model shape, one sequence: a 40-token prompt is
 * appended to every layer and prefilled (causal attention), then one decode
 * step appends a token and attends over all 41. Every key is the same
 * vector, so every token gets the same attention weight and the decode
 * output must be the mean of the values: the program checks that.
 *
 * Build: cc minimal.c $(pkg-config --cflags --libs kvpage)
 */
#include <kvpage/kvpage.h>
#include <stdio.h>

enum { LAYERS = 2, Q_HEADS = 4, KV_HEADS = 2, HEAD_DIM = 64, PROMPT = 40 };

#define TRY(call)                                                           \
    do {                                                                    \
        int rc_ = (call);                                                   \
        if (rc_) {                                                          \
            fprintf(stderr, "%s: %s (%d)\n", #call, kv_strerror(rc_), rc_); \
            return 1;                                                       \
        }                                                                   \
    } while (0)

/* keys and values: [tokens][KV_HEADS][HEAD_DIM]; queries, outputs:
 * [rows][Q_HEADS][HEAD_DIM] */
static float k[PROMPT + 1][KV_HEADS][HEAD_DIM], v[PROMPT + 1][KV_HEADS][HEAD_DIM];
static float q[PROMPT][Q_HEADS][HEAD_DIM], out[PROMPT][Q_HEADS][HEAD_DIM];

int main(void)
{
    kv_config_t cfg = kv_config_default(); /* sets struct_size and version */
    cfg.n_layers = LAYERS;
    cfg.n_q_heads = Q_HEADS;
    cfg.n_kv_heads = KV_HEADS;
    cfg.head_dim = HEAD_DIM;
    cfg.host_pages = 64; /* pool capacity in pages, fixed */
    kv_store_t *st;
    TRY(kv_store_create(&cfg, &st)); /* 0 or a negative KV_E* code */

    for (int t = 0; t <= PROMPT; t++)
        for (int h = 0; h < KV_HEADS; h++)
            for (int d = 0; d < HEAD_DIM; d++) {
                k[t][h][d] = 0.5f;
                v[t][h][d] = (float)t;
            }
    for (int r = 0; r < PROMPT; r++)
        for (int h = 0; h < Q_HEADS; h++)
            for (int d = 0; d < HEAD_DIM; d++)
                q[r][h][d] = 0.25f;

    kv_seq_id_t seq;
    TRY(kv_seq_create(st, &seq));
    /* the prompt: per layer, append its keys/values, then attend */
    for (uint32_t layer = 0; layer < LAYERS; layer++) {
        TRY(kv_append(st, seq, layer, PROMPT, KV_DTYPE_F32, k, v, NULL));
        kv_prefill_t pf = {.layer = layer, .seq = seq, .n_new = PROMPT,
                           .q = &q[0][0][0], .out = &out[0][0][0]};
        TRY(kv_attn_prefill(st, &pf));
    }
    /* one decode step: append the new token, then one batched call per
     * layer (here a batch of one sequence) */
    for (uint32_t layer = 0; layer < LAYERS; layer++) {
        TRY(kv_append(st, seq, layer, 1, KV_DTYPE_F32, k[PROMPT], v[PROMPT], NULL));
        kv_decode_t d = {.layer = layer, .batch = 1, .seqs = &seq,
                         .q = &q[0][0][0], .out = &out[0][0][0]};
        TRY(kv_attn_decode(st, &d));
    }
    float want = PROMPT / 2.0f, err = 0; /* the mean of 0, 1, ..., PROMPT */
    for (int h = 0; h < Q_HEADS; h++)
        for (int d = 0; d < HEAD_DIM; d++) {
            float e = out[0][h][d] > want ? out[0][h][d] - want : want - out[0][h][d];
            err = e > err ? e : err;
        }
    printf("decode output %.4f, expected %.4f (largest error %.2g)\n", out[0][0][0],
           want, err);

    TRY(kv_seq_free(st, seq));
    kv_store_destroy(st);
    return err < 1e-3f ? 0 : 1;
}
