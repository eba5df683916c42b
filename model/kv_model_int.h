/* SPDX-License-Identifier: MIT */
/*
 * kv_model_int.h — internal: the structures behind kv_model.h and the
 * pieces the forward pass is built from (elementwise ops, attention).
 * Only model/ includes this.
 */
#ifndef KV_MODEL_INT_H
#define KV_MODEL_INT_H

#include "kv_gguf.h"
#include "kv_model.h"
#include "kv_quant.h"

typedef struct kv_model_layer_w {
    float *attn_norm;               /* [d_model], owned FP32 copy    */
    float *ffn_norm;                /* [d_model], owned FP32 copy    */
    kv_q_mat_t wq;                  /* [n_q_heads * head_dim][d_model] */
    kv_q_mat_t wk, wv;              /* [n_kv_heads * head_dim][d_model] */
    kv_q_mat_t wo;                  /* [d_model][n_q_heads * head_dim] */
    kv_q_mat_t gate, up;            /* [d_ff][d_model]               */
    kv_q_mat_t down;                /* [d_model][d_ff]               */
} kv_model_layer_w_t;

struct kv_model {
    kv_gguf_t *g;                   /* owns the mapping               */
    kv_model_hparams_t hp;
    kv_model_layer_w_t *layers;     /* [n_layers]                     */
    float *out_norm;                /* [d_model]                      */
    kv_q_mat_t embd;                /* [vocab][d_model] token_embd    */
    kv_q_mat_t out;                 /* [vocab][d_model] output head   */
                                    /* (token_embd when tied)         */
    double *inv_freq;               /* [head_dim / 2] theta^(-2i/hd)  */
    kv_workers_t *workers;          /* worker threads (one per CPU)   */
};

/* Activations of one forward step of up to `chunk` rows. */
typedef struct kv_model_scratch {
    float *x;      /* [chunk][d_model] residual stream          */
    float *h;      /* [chunk][d_model] normed input             */
    float *q;      /* [chunk][n_q * hd]                         */
    float *k, *v;  /* [chunk][n_kv * hd]                        */
    float *att;    /* [chunk][n_q * hd] attention output        */
    float *f1, *f2;/* [chunk][d_ff] gate, up                    */
    float *rope;   /* [chunk][hd]: cos, then sin, of pos * inv_freq[i], */
                   /* i < hd / 2 (kv_model_rope_table, once per step) */
    int32_t *pos;  /* [chunk] row positions                     */
    kv_seq_id_t *seqs; /* [chunk] store sequence of each row (decode) */
} kv_model_scratch_t;

struct kv_model_session {
    const kv_model_t *m;            /* borrowed                            */
    kv_store_t *store;              /* borrowed; NULL in dense mode        */
    kv_seq_id_t seq;                /* paged: the store sequence (owned)   */
    uint32_t pos;                   /* tokens processed                    */
    uint32_t max_ctx, chunk;
    uint32_t n_threads;             /* of the model's workers used         */
    int broken;                     /* nonzero: a failed step left it bad  */
    kv_model_hook_t hook;
    int has_hook;
    kv_model_scratch_t sc;
    void *sc_mem;                   /* one block behind sc                 */
    /* dense mode: K/V per layer, [dcap][n_kv * hd], FP16-rounded floats */
    float **dk, **dv;               /* [n_layers]                          */
    uint32_t dcap;                  /* rows allocated per layer            */
    float *dscore;                  /* [dscore_rows][dscore_len] scores,   */
                                    /* one row per worker (dense_unit)     */
    uint32_t dscore_rows, dscore_len;
};

/* One forward step: `n` rows, either one session's consecutive tokens
 * (prompt chunk, batch == 1) or one token for each of `batch` == n sessions. */
typedef struct kv_model_step {
    kv_model_session_t *const *sess; /* [batch]                          */
    uint32_t batch, n;
    int prompt;                      /* 1: prompt chunk of sess[0]       */
    const int32_t *tokens;           /* [n]                              */
} kv_model_step_t;

/* ---- ops (kv_model_ops.c): rows in parallel on the workers ------------- */
void kv_model_rmsnorm(const float *x, const float *w, float *y, uint32_t n, uint32_t d,
                      float eps, kv_workers_t *workers, uint32_t n_threads);
void kv_model_rope_table(const int32_t *pos, uint32_t n, uint32_t hd, const double *inv_freq,
                         float *tab);
void kv_model_rope(float *x, uint32_t n, uint32_t heads, uint32_t hd, const float *tab,
                   kv_workers_t *workers, uint32_t n_threads);
void kv_model_swiglu(float *gate, const float *up, uint32_t n, size_t d,
                     kv_workers_t *workers, uint32_t n_threads);
void kv_model_add(float *x, const float *y, size_t n);

/* ---- attention (kv_model_attn.c) ------------------------------------- */
/* Append the step's K/V at layer l and compute attention into sc->att. */
int kv_model_attn(const kv_model_step_t *st, kv_model_scratch_t *sc, uint32_t layer);
/* Rollback support: the list lengths of a session (paged: [n_layers][n_kv]
 * into lens; dense: nothing) and cutting them back to a snapshot. */
int kv_model_snapshot(const kv_model_session_t *s, uint32_t *lens);
int kv_model_restore(kv_model_session_t *s, const uint32_t *lens, uint32_t pos);

/* Format a message into err (if err_len > 0) and return code: the model
 * model's way of returning an error value with its explanation. */
int kv_model_errf(char *err, size_t err_len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* KV_MODEL_INT_H */
