/* SPDX-License-Identifier: MIT */
/*
 * kv_policy_int.h — policies inside the store: the parsed policy (immutable
 * data), the per-sequence policy state the store keeps, and the functions the
 * store/kv_policy_*.c files share. Not part of the public API.
 *
 * Files: kv_policy_parse.c (string -> kv_policy_t, describe, values: the
 * method and key tables), kv_policy_info.c (kv_policy_info: what a policy
 * resolves to, in numbers),
 * kv_policy_state.c (the store's table of per-sequence states, set/fork/free,
 * statistics collection during attention), kv_policy_select.c (which tokens
 * a list keeps: StreamingLLM, H2O, SnapKV, MiniKV, SimLayerKV; list
 * compaction + CaM merging), kv_policy_run.c (kv_seq_prefill_end,
 * kv_seq_step_end).
 *
 * Invariants of a kv_pol_seq_t: vec[i] (i = layer * n_kv_heads + head) is
 * parallel to the list of (layer, head): entry t scores token t. Lists only
 * grow at their end between policy actions, so a vector is re-synced by
 * zero-extending (new tokens) or truncating (a caller's restore) before use;
 * policy compactions compact the vectors alongside.
 * Ownership: the store owns its table (struct kv_store.pol) and every state.
 */
#ifndef KV_POLICY_INT_H
#define KV_POLICY_INT_H

#include <stdint.h>

#include "kv_spec.h"
#include "kv_store_int.h"

/* Methods, in the order of the method table (kv_policy_parse.c) and of the
 * canonical spec; method m is bit 1u << m of kv_policy_t.methods and of the
 * public KV_POLICY_* bits. */
enum {
    KV_POL_M_FP16 = 0,
    KV_POL_M_STREAM,
    KV_POL_M_H2O,
    KV_POL_M_SNAPKV,
    KV_POL_M_MINIKV,
    KV_POL_M_SIM,
    KV_POL_M_MC,
    KV_POL_M_CAM,
    KV_POL_M_KIVI2,
    KV_POL_M_KIVI4,
    KV_POL_M_INT2,
    KV_POL_M_INT4,
    KV_POL_M_EATTN, /* later bits: canonical order is kv_policy_parse.c's */
    KV_POL_M_KVZIP,
    KV_POL_M_COUNT
};

enum { /* token selection, at most one per policy */
    KV_POL_SEL_NONE = 0,
    KV_POL_SEL_STREAM,
    KV_POL_SEL_H2O,
    KV_POL_SEL_SNAPKV,
    KV_POL_SEL_MINIKV,
    KV_POL_SEL_EATTN,
    KV_POL_SEL_KVZIP,
};

/* The selections that keep a budget of c tokens by scores in
 * kv_pol_seq_t.win, chosen once at prefill end (SnapKV, Expected
 * Attention, KVzip). */
static inline int kv_pol_sel_scored(uint32_t sel)
{
    return sel == KV_POL_SEL_SNAPKV || sel == KV_POL_SEL_EATTN || sel == KV_POL_SEL_KVZIP;
}

enum { KV_POL_ROPE_PAIRS = 0, KV_POL_ROPE_HALVES = 1 }; /* eattn: RoPE layout */

enum { KV_POL_SIM_DECODE = 0, KV_POL_SIM_PREFILL = 1 };

/* A token budget: a fraction of the prompt length (ratio) or tokens. */
typedef kv_spec_amount_t kv_pol_amount_t;

/* A parsed policy. The fields of a method's keys hold their values when
 * the method is in `methods` (the key table in kv_policy_parse.c says which
 * key sets which field, its range and default), else 0. */
struct kv_policy {
    uint32_t sel;             /* KV_POL_SEL_*                                */
    uint32_t sink;            /* streamingllm, kvzip: sink tokens            */
    kv_pol_amount_t hh;       /* h2o/minikv heavy hitters; snapkv budget c;  */
                              /* streamingllm unused                         */
    kv_pol_amount_t recent;   /* streamingllm recent; h2o/minikv/eattn rw    */
    uint32_t window, kernel;  /* snapkv: w observation rows, k pool kernel   */
    uint32_t pyramid;         /* minikv: 0 = uniform, else the divisor       */
    uint32_t fmt;             /* kept tokens' format: FP16, INT4, INT2       */
    uint32_t fmt_given;       /* 1: a format part (kivi2/4, int2/4) given     */
    uint32_t fmt_kivi;        /* 1: spelled kivi2/kivi4                      */
    uint32_t residual;        /* r: FP16 residual tokens (must = store's R)  */
    uint32_t rot;             /* rot=1: INT pages stored rotated (target    */
                              /* fmt | KV_FMT_ROT; kv_pol_target)           */
    uint32_t methods;         /* bit 1u << KV_POL_M_* per method given       */
    /* AdaKV (h2o, snapkv, minikv, eattn, kvzip: ada=1): a layer's heavy    */
    /* budget shared by its kv heads (kv_pol_ada_split); ada=2 (snapkv,      */
    /* eattn, kvzip): the sequence's, shared by every list of every layer    */
    uint32_t ada;             /* 0 off, 1 per layer, 2 across layers         */
    double ada_alpha;         /* floor per list: alpha * the uniform budget  */
    /* Expected Attention (kv_policy_eattn.c); c -> hh, w -> window          */
    uint32_t ea_sink;         /* first tokens always kept, rows not counted  */
    uint32_t ea_future;       /* future positions RoPE is averaged over      */
    double ea_theta;          /* RoPE base of the engine's keys/queries      */
    uint32_t ea_rope;         /* KV_POL_ROPE_*: pair layout of RoPE          */
    uint32_t ea_cov;          /* 1: covariance term                          */
    uint32_t ea_vnorm;        /* 1: scores times ||v||                       */
    /* SimLayerKV */
    uint32_t sim;             /* 1: on                                       */
    double sim_delta;         /* lazy when mass > delta                      */
    uint32_t sim_w, sim_sink, sim_rows, sim_mode;
    /* MiniCache */
    uint32_t mc;
    double mc_from, mc_t, mc_gamma;
    uint32_t mc_every;        /* merge a pair's new tokens every N tokens    */
    /* CaM */
    uint32_t cam;
    uint32_t cam_m;
    uint64_t cam_seed;
    uint32_t cam_force;       /* test hook: mask always 1                    */
};

/* The list target the policy's INT format sets: fmt, | KV_FMT_ROT with
 * rot=1 (an FP16 fmt is never rotated). */
static inline uint32_t kv_pol_target(const struct kv_policy *p)
{
    return p->fmt | (p->rot && p->fmt != KV_FMT_FP16 ? KV_FMT_ROT : 0u);
}

/* A growable float vector (scores of one list). */
typedef struct kv_pol_vec {
    float *v;     /* [cap]                */
    uint32_t n;   /* entries in use       */
    uint32_t cap;
} kv_pol_vec_t;

/* What a sequence's policy needs from attention right now. */
enum {
    KV_POL_WANT_ACC = 1,   /* accumulated attention, every query row         */
    KV_POL_WANT_WIN = 2,   /* prefill: the last `window` rows (snapkv)       */
    KV_POL_WANT_SIM = 4,   /* simlayerkv mass (its rows / first decode row)  */
    KV_POL_WANT_Q = 8,     /* prefill: query moments (eattn)                 */
    KV_POL_WANT_ZIP = 16,  /* a KVzip scoring pass (kv_policy_kvzip.c)       */
};

typedef struct kv_pol_seq {
    kv_policy_t pol;         /* copy of the attached policy                  */
    uint32_t n_lists;        /* n_layers * n_kv_heads                        */
    uint32_t n_layers;
    uint32_t decoding;       /* 1 after kv_seq_prefill_end                   */
    uint32_t prompt_len;     /* T: list length at prefill end               */
    uint64_t steps;          /* kv_seq_step_end calls done                   */
    kv_pol_vec_t *acc;       /* [n_lists] accumulated attention (or NULL)    */
    kv_pol_vec_t *win;       /* [n_lists] snapkv window / eattn scores       */
    double *qmom;            /* eattn while prefilling: [n_layers][n_q_heads] */
                             /* [1 + D + D(D+1)/2] count, sum of pre-RoPE q, */
                             /* packed upper triangle of sum q q^T; NULL     */
                             /* once scored                                  */
    uint32_t ea_scored;      /* eattn: 1 once win holds the scores          */
    float ea_scale;          /* eattn: the prefill calls' softmax scale     */
    float *sim_mass;         /* [n_layers] mass measured (-1: not measured)  */
    uint8_t *lazy;           /* [n_layers] 1: lazy layer                     */
    uint32_t sim_decided;    /* 1: lazy layers decided                       */
    uint32_t *hh_layer;      /* [n_layers] resolved heavy budget per layer   */
    uint32_t *k_list;        /* ada=2: [n_lists] each list's share of the    */
                             /* sequence's budget (candidates kept), set     */
                             /* once per prefill end (k_set); else NULL      */
    uint32_t k_set;          /* ada=2: 1 once k_list holds the split         */
    uint8_t *target0;        /* [n_layers] each layer's target format when   */
                             /* the prefill end began (a compressed context's */
                             /* key names the state before it)               */
    uint32_t recent;         /* resolved recent / window tokens              */
    uint64_t rng;            /* CaM xorshift64 state, never 0                */
    /* KVzip: the owner's scores are win; a pass (a fork marked by          */
    /* kv_seq_score_begin) writes into its owner's                          */
    uint32_t zip_scored;     /* owner: 1 once a pass recorded a score        */
    uint32_t zip_pass;       /* pass: 1 (then the fields below are set)      */
    kv_seq_id_t zip_owner;   /* pass: the sequence whose scores it writes    */
    uint32_t zip_t0, zip_t1; /* pass: context tokens [t0, t1) it scores      */
    uint32_t zip_len;        /* pass: the owner's list length at begin (T)   */
} kv_pol_seq_t;

/* The store's table: one state pointer per sequence id. */
typedef struct kv_pol_table {
    kv_pol_seq_t **seqs;     /* [max_seqs], NULL where no policy             */
    uint32_t max_seqs;
    uint64_t bytes;          /* kv_mem bytes held by the table and states    */
} kv_pol_table_t;

/* ---- kv_policy_state.c ---------------------------------------------------- */

/* The state of seq, or NULL (no policy, no table). */
kv_pol_seq_t *kv_pol_get(const kv_store_t *s, kv_seq_id_t seq);
/* KV_POL_WANT_* bits the sequence needs from attention now. */
uint32_t kv_pol_wants(const kv_pol_seq_t *ps);
/* Store hooks (kv_store.c): free/fork a sequence's state, destroy all. */
void kv_pol_seq_drop(kv_store_t *s, kv_seq_id_t seq);
int kv_pol_seq_fork(kv_store_t *s, kv_seq_id_t parent, kv_seq_id_t child);
/* A copy of a state (a fork's: scores, statistics, decode counters; not a
 * scoring pass's marks), counted in the table's bytes; NULL without memory.
 * Free one that no sequence holds with kv_pol_state_free; kv_pol_state_put
 * gives one to seq (live), freeing the state seq had. The table exists. */
kv_pol_seq_t *kv_pol_state_dup(kv_store_t *s, const kv_pol_seq_t *src);
void kv_pol_state_free(kv_store_t *s, kv_pol_seq_t *ps);
void kv_pol_state_put(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps);
void kv_pol_table_destroy(kv_store_t *s);
uint64_t kv_pol_meta_bytes(const kv_store_t *s);
/* Attention with statistics collection for sequences with a policy. */
int kv_pol_attn_prefill(kv_store_t *s, const kv_prefill_t *a, kv_pol_seq_t *ps);
int kv_pol_attn_decode(kv_store_t *s, const kv_decode_t *a);
/* Free ps->qmom (eattn's query moments), NULL after. */
void kv_pol_qmom_free(kv_store_t *s, kv_pol_seq_t *ps);
/* Make v hold exactly n entries (zero-extending); KV_ENOMEM. */
int kv_pol_vec_resize(kv_store_t *s, kv_pol_vec_t *v, uint32_t n);

/* Prefix-cache hit (kv_store_prefix.c): the acc vectors become a node's
 * statistics snapshot snap ([n_lists][n] floats, list i = layer *
 * n_kv_heads + head), in two steps so that the match stays all or nothing:
 * stage copies snap into new blocks (*out; KV_ENOMEM with nothing held,
 * KV_EINVAL without acc vectors or for n = 0); commit (cannot fail) puts
 * them in place of the vectors, each then holding exactly n entries;
 * unstage frees a staged set that is not committed (NULL-safe). */
int kv_pol_acc_stage(const kv_pol_seq_t *ps, const float *snap, uint32_t n, float ***out);
void kv_pol_acc_commit(kv_store_t *s, kv_pol_seq_t *ps, float **staged, uint32_t n);
void kv_pol_acc_unstage(const kv_pol_seq_t *ps, float **staged, uint32_t n);

/* ---- kv_policy_select.c --------------------------------------------------- */

/* Keep list indices keep[0..n_keep) of (seq, layer, head): compacts the list
 * and the state's vectors; with CaM, merges the evicted tokens' values into
 * the recent window first (win_tokens: size of the recent window after the
 * compaction). On error nothing changed. */
int kv_pol_keep(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps,
                uint32_t layer, uint32_t head, const uint32_t *keep,
                uint32_t n_keep, uint32_t win_tokens);
/* Top-k selection: writes into keep (sorted) the indices of the k highest
 * scores among [0, n_cand) (ties: lower index first), then the indices
 * [n_cand, n); returns how many. keep: [n]. scratch: [n_cand] uint32. */
uint32_t kv_pol_topk_keep(const float *score, uint32_t n_cand, uint32_t n,
                          uint32_t k, uint32_t *keep, uint32_t *scratch);
/* SnapKV pooling: out[i] = max of in[j], |i - j| <= kernel / 2, j < n. */
void kv_pol_maxpool(const float *in, uint32_t n, uint32_t kernel, float *out);
/* MiniKV pyramid budget of layer l of L for mean budget h and divisor p. */
uint32_t kv_pol_pyramid(uint32_t h, uint32_t p, uint32_t l, uint32_t L);
/* A policy amount resolved against prompt length T. */
uint32_t kv_pol_amount(kv_pol_amount_t a, uint32_t T);
/* The selection's budgets for prompt length T, as kv_seq_prefill_end fixes
 * them: heavy hitters (snapkv: its c) before any pyramid, and the recent
 * window (at least 1 token, but for snapkv). */
void kv_pol_budgets(const kv_policy_t *p, uint32_t T, uint32_t *hh, uint32_t *recent);
/* MiniCache: the lower layer of the first merged pair of n_layers
 * (pairs (S, S+1), (S+2, S+3), ... below n_layers). */
uint32_t kv_pol_merge_first(const kv_policy_t *p, uint32_t n_layers);
/* Selection of one layer's lists at prefill end or after a decode step
 * (per list; with ada=1 one budget for the layer; with ada=2 each list's
 * share of the sequence's budget, ps->k_list). */
int kv_pol_select_layer(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps,
                        uint32_t layer, int at_prefill);
/* ada=2, at the prefill end before the first kv_pol_select_layer: split
 * the sequence's budget (n_lists x the uniform k) over all its lists with
 * kv_pol_ada_split into ps->k_list, once (k_set: a retried prefill end
 * keeps the split). 0 (also when ada != 2 or already split) or KV_ENOMEM
 * (nothing changed). */
int kv_pol_select_split(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps);
/* SimLayerKV trim of one list to sink + last w (if longer). */
int kv_pol_sim_trim(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps,
                    uint32_t layer, uint32_t head);

/* ---- kv_policy_eattn.c ---------------------------------------------------- */

/* Doubles of one layer's query moments: n_q_heads * (1 + D + D(D+1)/2). */
size_t kv_pol_eattn_mom_len(const kv_store_t *s);
/* Add the pre-RoPE queries of a successful kv_attn_prefill call (a) to
 * ps->qmom (w = 0: every row at position >= sink, all calls; w > 0: the
 * last w rows of this call replace the layer's moments). Allocates nothing. */
void kv_pol_eattn_observe(const kv_store_t *s, kv_pol_seq_t *ps, const kv_prefill_t *a);
/* Rotate x[D] by RoPE at position pos (inverse: by -pos), in place. */
void kv_pol_rope(double *x, uint32_t D, double pos, double theta, uint32_t layout,
                 int inverse);
/* Future-query statistics from one head's moments (kv_pol_seq_t.qmom): mu[D]
 * and cov[D*D] (full, symmetric; NULL: none) of the pre-RoPE queries,
 * rotated by the mean RoPE rotation over positions [p0, p0 + future). */
void kv_pol_eattn_stats(const double *mom, uint32_t D, double theta, uint32_t layout,
                        double p0, uint32_t future, double *mu, double *cov);
/* Expected-attention scores of keys k[n][D] (values v[n][D]) for G query
 * heads with statistics mu[G][D], cov[G][D*D] (NULL: mean only): per head
 * softmax over tokens >= sink of scale mu.k + scale^2/2 k^T cov k, mean
 * over the G heads, times ||v|| (vnorm); tokens < sink score +inf.
 * scratch: [n] doubles. */
void kv_pol_eattn_score(const float *k, const float *v, uint32_t n, uint32_t D, uint32_t G,
                        const double *mu, const double *cov, double scale, uint32_t sink,
                        int vnorm, float *out, double *scratch);
/* At prefill end: every list's scores into ps->win, then frees qmom
 * (ea_scored = 1). On error (KV_ENOMEM) nothing is scored. */
int kv_pol_eattn_prepare(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps);

/* AdaKV: split a layer's heavy budget H * k over its H heads. score[h]
 * scores n_cand[h] candidates of head h; k_out[h] receives that head's
 * share: its top floor(alpha * k) (at most n_cand[h]) plus the heads' best
 * of the rest, H * k in all (or every candidate if fewer). scratch: u64s
 * for the sum of n_cand. Ties: lower head, then lower index. */
void kv_pol_ada_split(const float *const *score, const uint32_t *n_cand, uint32_t H,
                      uint32_t k, double alpha, uint32_t *k_out, uint64_t *scratch);

/* ---- kv_policy_kvzip.c ---------------------------------------------------- */

/* A scoring pass's prefill call a (on a pass sequence, ps its state): the
 * KVzip score of each context token of [zip_t0, zip_t1) (the largest
 * probability a row of a at or past zip_len and a q head of its group
 * gives it, softmax over the sinks, [t0, t1) and the pass's own tokens up
 * to the row) max-accumulated into the owner's win vectors. Allocates
 * scratch (KV_ENOMEM, nothing changed); KV_ESTATE when the owner is gone,
 * decoding or no longer T long. Idempotent (a retry gives the same). */
int kv_pol_kvzip_observe(kv_store_t *s, const kv_prefill_t *a, const kv_pol_seq_t *ps);
/* At prefill end: every list's scores sized to its length, the first
 * `sink` tokens +inf. KV_ESTATE when no pass scored a prompt longer than
 * the budget; KV_ENOMEM. */
int kv_pol_kvzip_prepare(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps);

/* ---- test hooks ----------------------------------------------------------- */

/* CaM: force the Bernoulli mask to 1 (on != 0) in a parsed policy. */
void kv_pol_test_cam_force(kv_policy_t *p, int on);

#endif /* KV_POLICY_INT_H */
