/* SPDX-License-Identifier: MIT */
/*
 * kv_model.h — the reference inference engine: a llama-architecture model
 * (SmolLM2-135M-Instruct, Q4_1 GGUF) whose attention runs through kvpage.
 *
 * The model is a client of the store like any other: it includes only
 * kvpage/kvpage.h. Per layer it appends the post-RoPE K/V of the new tokens
 * (kv_append, FP32) and asks the store for attention (kv_attn_prefill for a
 * chunk of prompt tokens, kv_attn_decode for a batch of sessions generating
 * one token each). A second attention path keeps K/V in a plain array of
 * FP16-rounded values inside the session and computes attention directly
 * ("dense"): it is the check of the paged path.
 *
 * Ownership: kv_model_t owns the mapped GGUF file, the norm weights (FP32
 * copies) and one repacked copy of each weight matrix, still quantized
 * (kv_quant.h: 8 rows interleaved, the same bytes per weight); the embedding
 * rows are read from the mapping. A session owns its scratch
 * activations, its dense K/V (dense mode) and its store sequence (paged
 * mode: freed with the session); it borrows the model and the store, which
 * must outlive it. Sessions of one store follow the store's threading rule:
 * calls that append (forward, decode, fork, free) are serialized by the
 * caller. Results are bit-identical for any n_threads (see kv_quant.h).
 *
 * Errors: 0 or a negative KV_E* code; a failed forward pass leaves the
 * session as it was (the tokens it had appended are compacted away) or, if
 * even that fails, marks it unusable (KV_ESTATE from then on).
 */
#ifndef KV_MODEL_H
#define KV_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kvpage/kvpage.h"

/* The file this model code is built and tested for. */
#define KV_MODEL_FILE_NAME "SmolLM2-135M-Instruct.Q4_1.gguf"
#define KV_MODEL_FILE_SIZE 98362432ull
#define KV_MODEL_FILE_SHA256 "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#define KV_MODEL_FETCH_HINT "fetch it with scripts/fetch_model.sh (or `make run`)"

typedef struct kv_model_hparams {
    uint32_t n_layers;    /* transformer blocks                       */
    uint32_t d_model;     /* embedding width                          */
    uint32_t n_q_heads;   /* query heads                              */
    uint32_t n_kv_heads;  /* key/value heads (GQA groups)             */
    uint32_t head_dim;    /* d_model / n_q_heads                      */
    uint32_t d_ff;        /* SwiGLU hidden width                      */
    uint32_t vocab;       /* rows of the (tied) output matrix         */
    uint32_t n_ctx;       /* trained context length, tokens           */
    float rope_theta;     /* RoPE base                                */
    float rms_eps;        /* RMSNorm epsilon                          */
} kv_model_hparams_t;

typedef struct kv_model kv_model_t;
typedef struct kv_model_session kv_model_session_t;

/* Load and validate a model (architecture "llama", every tensor present with
 * its expected shape and a supported type). err gets a one-line reason. */
int kv_model_load(const char *path, kv_model_t **out, char *err, size_t err_len);
void kv_model_free(kv_model_t *m);
const kv_model_hparams_t *kv_model_hparams(const kv_model_t *m);

/* Bytes of weights one decode step of one sequence reads: every packed
 * matrix (the output head included), the norms and one embedding row. A
 * decode step cannot be faster than this over the machine's read bandwidth
 * (kvbench-model reports that bound). 0 for NULL. */
uint64_t kv_model_decode_weight_bytes(const kv_model_t *m);

/* The underlying GGUF reader (for the tokenizer glue and tests). */
struct kv_gguf;
const struct kv_gguf *kv_model_gguf(const kv_model_t *m);

/* A store config for this model: shape, and a pool of host pages that holds
 * max_seqs sequences of max_tokens tokens each in FP16 pages of the default
 * size (plus one partly filled page per list per sequence). */
int kv_model_store_config(const kv_model_t *m, uint32_t max_tokens, uint32_t max_seqs,
                          uint32_t n_threads, kv_config_t *cfg);

/* ---- sessions --------------------------------------------------------- */

typedef struct kv_model_session_opts {
    kv_store_t *store;   /* paged: the store (its shape must be the model's); */
                         /* NULL: dense attention inside the session          */
    uint32_t max_ctx;    /* tokens this session may hold; 0 = hparams n_ctx   */
    uint32_t chunk;      /* rows per forward step (prompt chunk, decode       */
                         /* batch), <= 4096; 0 = 256                          */
    int n_threads;       /* model threads (matmuls, elementwise); 0 = one     */
                         /* per online CPU (the model's worker count)         */
} kv_model_session_opts_t;

/* What a hook sees of one layer of one forward step. */
typedef struct kv_model_layer_io {
    uint32_t layer;
    uint32_t n;                       /* query rows (prompt chunk or batch) */
    uint32_t batch;                   /* sessions: 1 for a prompt chunk     */
    kv_model_session_t *const *sess;  /* [batch]                            */
    const int32_t *pos;               /* [n] position of each row           */
    const float *q;                   /* [n][n_q_heads][head_dim] post-RoPE */
    const float *k, *v;               /* [n][n_kv_heads][head_dim]          */
    /* The pre hook may ask the store for attention statistics (paged only;
     * see kvpage.h): for a prompt chunk `stats` (+stride, row0), for a decode
     * batch `batch_stats`. NULL = none. */
    float *stats;
    uint32_t stats_stride;
    uint32_t stats_row0;
    float *const *batch_stats;
} kv_model_layer_io_t;

/* Hooks run on the calling thread; a nonzero return aborts the forward
 * step, which restores the session(s) and returns that value. */
typedef struct kv_model_hook {
    /* Before the layer's attention (paged: after its K/V were appended to
     * the store, so statistics requested here cover the new tokens). */
    int (*pre_attn)(void *user, kv_model_layer_io_t *io);
    /* After attention; out: [n][n_q_heads][head_dim]. */
    int (*post_attn)(void *user, const kv_model_layer_io_t *io, const float *out);
    void *user;
} kv_model_hook_t;

int kv_model_session_create(const kv_model_t *m, const kv_model_session_opts_t *opts,
                            kv_model_session_t **out);
/* Frees the session and its store sequence. NULL is a no-op. */
void kv_model_session_free(kv_model_session_t *s);

/* A new session with the same tokens: paged sessions share pages with
 * kv_seq_fork (copy-on-write), dense ones copy their arrays. */
int kv_model_session_fork(const kv_model_session_t *s, kv_model_session_t **out);

/* A paged session over a sequence the caller filled itself: seq (of
 * opts->store, which is required) already holds the K/V of positions
 * 0..pos-1 at every layer, e.g. a prompt whose forward pass ran in another
 * session and whose K/V the caller appended again (kvpage eval shares one
 * prompt pass among policies this way). The session takes seq over (frees
 * it with itself) and continues at position pos. Errors: KV_EINVAL,
 * KV_ENOENT (seq not live), KV_ERANGE (pos > max_ctx), KV_ENOMEM; on error
 * seq stays the caller's. */
int kv_model_session_adopt(const kv_model_t *m, const kv_model_session_opts_t *opts,
                           kv_seq_id_t seq, uint32_t pos, kv_model_session_t **out);

/* Prefix cache (kvpage.h, "prefix cache"): on a paged session that has
 * processed nothing, attach the longest cached prefix of tokens[0..n)
 * (kv_seq_prefix_match) and continue from there: *matched tokens are
 * processed (the next position), the caller forwards tokens[*matched..n).
 * Errors as kv_seq_prefix_match; KV_ENOTSUP for a dense session,
 * KV_ESTATE when the session is not empty. */
int kv_model_session_prefix(kv_model_session_t *s, const int32_t *tokens, uint32_t n,
                            const void *salt, size_t salt_len, uint32_t *matched);
/* The same for a compressed context (kv_seq_prefix_match_compressed): on a
 * hit *matched = n and the session is past its prefill end at position n
 * (forward the rest, then kv_seq_step_end); 0 on a miss. */
int kv_model_session_context(kv_model_session_t *s, const int32_t *tokens, uint32_t n,
                             const void *salt, size_t salt_len, uint32_t *matched);

/* Tokens the session has processed (= the next position). */
uint32_t kv_model_session_pos(const kv_model_session_t *s);
/* The store sequence (paged) or KV_ENOTSUP (dense). */
int kv_model_session_seq(const kv_model_session_t *s, kv_seq_id_t *seq);
/* Install (copy) a hook, or remove it with NULL. */
void kv_model_session_set_hook(kv_model_session_t *s, const kv_model_hook_t *hook);

/* Run n tokens through the model, appending them to the session's cache, in
 * chunks of opts.chunk tokens (prompt attention: kv_attn_prefill).
 *   logits: NULL, or [n_out][vocab]: the logits of the last n_out tokens
 *   (n_out <= n). Token ids must be < vocab; pos + n <= max_ctx (KV_ELIMIT).
 */
int kv_model_forward(kv_model_session_t *s, const int32_t *tokens, uint32_t n, float *logits,
                     uint32_t n_out);

/* One token for each of `batch` sessions at once (matmuls batched; paged
 * attention: one kv_attn_decode over all of them). All sessions must be
 * distinct and either all dense or all in one store; batch <= the first
 * session's chunk. logits: NULL or [batch][vocab]. */
int kv_model_decode_batch(kv_model_session_t *const *sess, uint32_t batch, const int32_t *tokens,
                          float *logits);

/* kv_model_decode_batch for one session. */
int kv_model_decode(kv_model_session_t *s, int32_t token, float *logits);

/* ---- sampling --------------------------------------------------------- */

/* Argmax (lowest id on ties) of logits[0..vocab). */
int32_t kv_model_argmax(const float *logits, uint32_t vocab);

/* temp <= 0: argmax; else a draw from softmax(logits / temp) with the
 * caller's xorshift state (never 0). */
int32_t kv_model_sample(const float *logits, uint32_t vocab, float temp, uint64_t *rng);

/* -log softmax(logits)[target] (natural log). */
double kv_model_nll(const float *logits, uint32_t vocab, int32_t target);

/* ---- generation -------------------------------------------------------- */

typedef struct kv_model_gen_opts {
    uint32_t max_new;        /* most tokens to generate                      */
    float temp;              /* <= 0: greedy                                 */
    uint64_t seed;           /* sampling seed (temp > 0)                     */
    /* Called for each generated token before it is fed back; a nonzero
     * return stops generation (that token is kept). May be NULL. */
    int (*on_token)(void *user, int32_t id);
    void *user;
    /* Tokens that end generation (kept in the output, not fed back). */
    const int32_t *stop;
    uint32_t n_stop;
} kv_model_gen_opts_t;

typedef struct kv_model_gen_result {
    uint32_t n_prompt;       /* prompt tokens prefilled                      */
    uint32_t n_new;          /* tokens generated (out[0..n_new))             */
    uint32_t n_decoded;      /* decode steps run (tokens fed back)           */
    int stopped;             /* 1: a stop token or on_token ended it         */
    double prefill_s;        /* wall seconds of the prompt forward pass      */
    double decode_s;         /* wall seconds of the decode steps             */
} kv_model_gen_result_t;

/* Prefill `prompt` into the session, then sample up to max_new tokens into
 * out[] ([max_new]), feeding each back with kv_model_decode. */
int kv_model_generate(kv_model_session_t *s, const int32_t *prompt, uint32_t n_prompt,
                      const kv_model_gen_opts_t *o, int32_t *out, kv_model_gen_result_t *res);

/* ---- KVzip scoring ----------------------------------------------------- */

struct kv_tok;

/* KVzip's reconstruction passes (kv_seq_score_begin in kvpage.h) for a
 * paged session whose sequence holds the prompt ids[0..n) (pos == n) under
 * a kvzip policy, before kv_seq_prefill_end. For each chunk [c0, c1) of at
 * most `chunk` tokens of [from, n): a fork of the sequence is marked as a
 * scoring pass for [c0, c1) and runs "\n\nRepeat the previous context
 * exactly." (later chunks: "\n\nRepeat the part of the previous context
 * exactly, starting with" + the previous chunk's last 8 tokens), the chat
 * template's end of the user turn and assistant header, and ids[c0..c1)
 * through the model (no logits), then is freed; the session is unchanged.
 * Costs about one more prefill of the prompt (plus the store's scoring).
 * Errors: KV_EINVAL (NULL, pos != n, from >= n, chunk 0), KV_ENOTSUP (a
 * dense session; no ChatML markers in tok), those of kv_seq_score_begin,
 * kv_model_forward and kv_tok_encode. */
int kv_model_kvzip_score(kv_model_session_t *s, const struct kv_tok *tok, const int32_t *ids,
                         uint32_t n, uint32_t from, uint32_t chunk);

#define KV_MODEL_KVZIP_CHUNK 2048u /* prompt tokens per pass, as KVzip's */

/* Most tokens one reconstruction pass of a chunk of `chunk` tokens adds
 * beside the prompt (its instruction, quote, turn change and the chunk):
 * the room a store needs for a pass. */
uint32_t kv_model_kvzip_room(uint32_t chunk);

/* ---- finding the model file ------------------------------------------- */

/* The model path, in order: flag (if not NULL), env KVPAGE_MODEL (a file),
 * $KVPAGE_MODEL_DIR/<file>, ${XDG_CACHE_HOME:-$HOME/.cache}/kvpage/<file>.
 * Returns 0 with the path in out, or KV_ENOENT with a message in err that
 * says where it looked and how to fetch the model. *pinned is set to 1 when
 * the path is the default file name (so its size/hash must match). */
int kv_model_find(const char *flag, char *out, size_t out_len, int *pinned, char *err,
                  size_t err_len);

/* Check a model file before loading: a file of the pinned size must have the
 * pinned SHA-256 (and a pinned path must have the pinned size). The hash is
 * skipped when <path>.sha256 (written by scripts/fetch_model.sh) records the
 * pinned hash and is not older than the file. KV_ECORRUPT with a message
 * naming the fix otherwise; -errno if unreadable. */
int kv_model_verify(const char *path, int pinned, char *err, size_t err_len);

/* The SHA-256 of a model file as 64 hex digits and a NUL (a model
 * fingerprint for kv_config_t.prefix_model): the pinned hash without
 * reading the file when it is the pinned file as fetched (see
 * kv_model_verify), else computed. 0, KV_EINVAL, KV_ENOMEM, -errno. */
int kv_model_file_sha256(const char *path, int pinned, char hex[65]);

#endif /* KV_MODEL_H */
