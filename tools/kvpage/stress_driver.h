/* SPDX-License-Identifier: MIT */
/*
 * stress_driver.h — the serving loop simulated by `kvpage stress`: a store
 * with a small pool, live sequences with their shadows, a queue of waiting
 * requests, and every public call made through stress_call, which handles
 * running out of memory like a serving engine does.
 *
 * stress_call issues one public call (one "op"). On KV_ENOMEM it first
 * verifies that the failed call changed nothing (all-or-nothing calls: the
 * statistics, the touched sequence's lengths and contents; prefill_end /
 * step_end, which are done-or-untouched per list: the store invariants and
 * the sequence's contents), then preempts the newest other sequence (frees
 * it and puts its request back at the head of the queue: recompute later)
 * and retries; when no sequence newer than the call's own is left it
 * returns KV_ENOMEM and the caller preempts its own sequence (or drops the
 * request when it is alone: it cannot fit). KV_ELIMIT (max_seqs) is returned to
 * the caller, which defers. Offload calls may also answer what the page file
 * can (-ENOSPC from a full file: nothing changed; I/O errors from balance
 * and sync), returned to the caller; kv_seq_wait's result always is (the
 * caller checks it: stress_verify_wait). Any other error is a violation.
 *
 * One iteration (stress_step.c, stress_driver_step) runs the
 * phases arrive, admit (create, policy, prefill, prefill_end, forks for
 * parallel sampling), decode (every layer: append one token per running
 * sequence, one batched kv_attn_decode; then step_end), finish, and the
 * random events of the event table (abort, branch; with a page file:
 * offload, prefetch, balance, sync). With a page file an iteration starts
 * by settling (kv_seq_wait) every sequence with I/O in flight
 * (stress_offload.c): only sequences whose pages are all resident decode.
 *
 * Determinism: everything depends only on the config (seed included); the
 * same config gives the same ops in the same order. With a page file the
 * driver decides only on results of calls that wait for the I/O they need
 * (kv_seq_wait, balance, sync, free), never on how far I/O got; injected
 * faults follow the order in which transfers reach the shim, which the
 * pread I/O queue keeps and io_uring may not.
 *
 * Ownership: the driver owns the store, the verifier, the slots, the queue
 * and its scratch; it borrows cfg->mix.
 */
#ifndef STRESS_DRIVER_H
#define STRESS_DRIVER_H

#include <stdint.h>
#include <stdio.h>

#include "kvpage/kvpage.h"
#include "stress_gen.h"
#include "stress_mix.h"
#include "stress_prefix.h"
#include "stress_verify.h"

#define STRESS_PREFILL_ROWS 32u /* query rows of one kv_attn_prefill, at most */

/* The public calls the driver makes, counted per kind. */
typedef enum stress_op {
    STRESS_OP_CREATE = 0,    /* kv_seq_create        */
    STRESS_OP_SET_POLICY,    /* kv_seq_set_policy    */
    STRESS_OP_APPEND,        /* kv_append            */
    STRESS_OP_ATTN_PREFILL,  /* kv_attn_prefill      */
    STRESS_OP_PREFILL_END,   /* kv_seq_prefill_end   */
    STRESS_OP_ATTN_DECODE,   /* kv_attn_decode       */
    STRESS_OP_STEP_END,      /* kv_seq_step_end      */
    STRESS_OP_FORK,          /* kv_seq_fork          */
    STRESS_OP_FREE,          /* kv_seq_free          */
    STRESS_OP_OFFLOAD,       /* kv_seq_offload       */
    STRESS_OP_PREFETCH,      /* kv_seq_prefetch      */
    STRESS_OP_WAIT,          /* kv_seq_wait          */
    STRESS_OP_BALANCE,       /* kv_store_offload_balance */
    STRESS_OP_SYNC,          /* kv_store_offload_sync */
    STRESS_OP_PREFIX_MATCH,  /* kv_seq_prefix_match   */
    STRESS_OP_PREFIX_PUBLISH, /* kv_seq_prefix_publish */
    STRESS_OP_CTX_MATCH,     /* kv_seq_prefix_match_compressed   */
    STRESS_OP_CTX_PUBLISH,   /* kv_seq_prefix_publish_compressed */
    STRESS_OP_COUNT
} stress_op_t;

/* What happened to requests and sequences, counted per kind. */
typedef enum stress_ev {
    STRESS_EV_ARRIVED = 0, /* a request arrived (Poisson)                   */
    STRESS_EV_REJECTED,    /* the queue was full                            */
    STRESS_EV_ADMITTED,    /* prefilled and decoding                        */
    STRESS_EV_DEFERRED,    /* admission waited: pages or max_seqs           */
    STRESS_EV_PREEMPTED,   /* freed to make room, request requeued          */
    STRESS_EV_DROPPED,     /* did not fit even alone: request given up      */
    STRESS_EV_FINISHED,    /* all its output tokens decoded, freed          */
    STRESS_EV_ABORTED,     /* event: the client went away, freed            */
    STRESS_EV_SAMPLED,     /* forked for parallel sampling                  */
    STRESS_EV_BRANCHED,    /* event: forked mid-decode (beam-like branch)   */
    STRESS_EV_LOST,        /* pages stayed lost: freed, request requeued    */
    STRESS_EV_COUNT
} stress_ev_t;

const char *stress_op_name(stress_op_t op);
const char *stress_ev_name(stress_ev_t ev);

typedef struct stress_cfg {
    uint32_t layers, kv_heads, q_heads, head_dim; /* store shape          */
    uint64_t pool;          /* pool capacity, pages                        */
    uint32_t max_seqs;      /* store max_seqs                              */
    uint64_t seed;
    double rate;            /* mean arrivals per iteration          */
    uint64_t verify_every;  /* ops between full verifications (0: end only) */
    stress_dist_t dist;
    const stress_mix_t *mix; /* borrowed; parsed for `layers`              */
    const char *offload_path; /* page file to create (borrowed); NULL: off */
    uint32_t offload_pages; /* its slots                                   */
    uint32_t fault_ppm;     /* kv_config_t.offload_fault_ppm (seed: seed)  */
    int offload_pread;      /* KV_OFFLOAD_PREAD: the pread/pwrite I/O queue   */
    stress_pfx_cfg_t pfx;   /* shared prefixes (stress_prefix.c); off: 0s  */
} stress_cfg_t;

#define STRESS_LOST_TRIES 2u /* prefetches of a sequence with lost pages */
                             /* before it is freed                        */

/* What the offload events did (stress_offload.c). */
typedef struct stress_off_count {
    uint64_t offloads;    /* kv_seq_offload calls that returned 0          */
    uint64_t prefetches;  /* kv_seq_prefetch calls that returned 0         */
    uint64_t waits;       /* kv_seq_wait calls (settles)                   */
    uint64_t wait_errors; /* of those, returning an I/O error              */
    uint64_t balances;    /* kv_store_offload_balance calls                */
    uint64_t balance_pages; /* pages they wrote                            */
    uint64_t syncs;       /* kv_store_offload_sync calls                   */
    uint64_t sync_errors; /* of those, failing (I/O, -ENOSPC, KV_ENOMEM)   */
    uint64_t file_full;   /* kv_seq_offload answered -ENOSPC               */
    uint64_t enotres_checked; /* calls on non-resident sequences that      */
                          /* answered KV_ENOTRES as they must (probes and  */
                          /* verification reads)                           */
    uint64_t read_back;   /* sequences verified right after coming back    */
    uint64_t lost_reports; /* settles that found lost pages                */
    uint64_t pages_lost;  /* lost pages those found                        */
    uint64_t lost_recovered; /* retried prefetches that brought all back   */
    uint64_t lost_seqs;   /* sequences freed: pages still lost after       */
                          /* STRESS_LOST_TRIES prefetches                  */
} stress_off_count_t;

/* A request: what arrives, waits and is requeued on preemption. */
typedef struct stress_req {
    uint32_t len[2];  /* prompt, output tokens               */
    uint32_t samples; /* parallel samples (forks at admission) */
    uint32_t pol;     /* index into the mix                   */
    uint32_t waited;  /* iterations passed over at the head   */
    /* shared prefixes (stress_prefix.c; all 0 without --prefix-cache)      */
    int32_t sys;      /* system prompt its prompt starts with, -1: none   */
    uint32_t salt;    /* its salt (tenant)                                */
    uint64_t content; /* origin of its own prompt tokens (kept on requeue) */
    uint32_t published; /* tokens of its prompt an earlier incarnation    */
                        /* published                                      */
} stress_req_t;

/* A live sequence (slots: [max_seqs + 1], so that creates can hit
 * KV_ELIMIT). */
typedef struct stress_slot {
    int used;
    int decoding;       /* prefill done: in the decode batch        */
    uint64_t order;     /* admission order: highest preempted first */
    stress_req_t req;   /* requeued as is when preempted            */
    uint32_t generated; /* output tokens decoded                    */
    uint32_t lost_tries; /* prefetches retried for lost pages        */
    stress_shadow_t sh; /* sh.res: where its pages are (offload)    */
} stress_slot_t;

/* One public call (see stress_call). */
typedef struct stress_call {
    stress_op_t op;
    int slot;          /* the sequence acted on, or -1                 */
    uint32_t layer;    /* APPEND, ATTN_*                               */
    uint32_t n;        /* APPEND: tokens; ATTN_PREFILL: rows           */
    uint32_t batch;    /* ATTN_DECODE: sequences in d->batch_slot      */
    int defer;         /* on KV_ENOMEM return at once (admission waits) */
                       /* (BALANCE returns the pages written, >= 0)    */
    kv_seq_id_t out;   /* CREATE, FORK: the new sequence               */
    uint32_t matched;  /* PREFIX_MATCH: tokens attached; PREFIX_PUBLISH: */
                       /* n (tokens of d->pfx.tok); returns the covered  */
                       /* CTX_*: in, the context's tokens; CTX_MATCH:    */
                       /* out, tokens installed                          */
} stress_call_t;

typedef struct stress_driver {
    stress_cfg_t cfg;
    kv_store_t *st;
    stress_verifier_t vf;
    uint64_t meta0;            /* meta_bytes after create + policy check */
    uint32_t tokens_per_page;  /* FP16 tokens per page                   */
    uint64_t rng, next_origin, next_order;
    stress_slot_t *slots;      /* [max_seqs]                             */
    uint32_t n_live, max_live;
    stress_req_t *queue;       /* ring [q_cap]                           */
    uint32_t q_head, q_len, q_cap;
    float *k, *v, *q, *out;    /* scratch: K/V [max_len][kv_heads][D],   */
                               /* Q/out [max_rows][q_heads][D]           */
    uint16_t *hk, *hv;         /* FP16 copies of k, v                    */
    int32_t *pos;              /* [max_len]                              */
    kv_seq_id_t *batch;        /* [max_seqs] decode batch                */
    uint32_t *batch_slot;      /* [max_seqs]                             */
    uint32_t *running;         /* [max_seqs] decode: this iteration's    */
    const stress_shadow_t **live; /* [max_seqs] for stress_verify_store  */
    uint64_t ops, op_count[STRESS_OP_COUNT], ev_count[STRESS_EV_COUNT];
    uint64_t alloc_failures;   /* calls that returned KV_ENOMEM          */
    uint64_t limit_failures;   /* calls that returned KV_ELIMIT          */
    uint64_t iterations, verify_runs, last_verify;
    stress_off_count_t off;    /* offload activity (stress_offload.c)    */
    stress_pfx_t pfx;          /* shared prefixes (stress_prefix.c)      */
    kv_stats_t final;          /* stress_driver_finish: after every free */
} stress_driver_t;

/* Open the store and check every policy of the mix attaches to it.
 * Returns 0, or a KV_E* code with a message in err (KV_ENOTSUP: a policy
 * this store cannot run, e.g. kivi2:r=64 with R = 128). */
int stress_driver_create(const stress_cfg_t *cfg, stress_driver_t *d, FILE *log, char *err,
                         size_t err_len);
void stress_driver_destroy(stress_driver_t *d);

/* One public call; see the top comment. Returns its final result. */
int stress_call(stress_driver_t *d, stress_call_t *c);

/* Free live slot i (an op); ev says why (STRESS_EV_COUNT: not counted).
 * Its request is requeued at the head when ev is PREEMPTED. */
void stress_driver_release(stress_driver_t *d, int i, stress_ev_t ev);
/* A free slot index, or -1. */
int stress_driver_free_slot(const stress_driver_t *d);
/* Queue a request at the back (or the front); 0, or -1 when full. */
int stress_driver_enqueue(stress_driver_t *d, const stress_req_t *r, int front);

/* Attention output rows of slot s at layer: finite, within its values'
 * bound (a violation otherwise). */
void stress_driver_check_out(stress_driver_t *d, const stress_slot_t *s, uint32_t layer,
                             const float *out, uint32_t rows);
/* A random live, decoding slot whose pages are where `res` says (-1: any);
 * or -1. */
int stress_driver_pick(stress_driver_t *d, int res);

/* The offload tier (stress_offload.c). settle_all: kv_seq_wait every slot
 * with I/O in flight and act on what came back (resident again: verified;
 * lost: retried, then freed; on the file: KV_ENOTRES probes). The others
 * are events: offload a random resident sequence, prefetch a random one on
 * the file, balance, sync. */
void stress_off_settle_all(stress_driver_t *d);
void stress_off_offload(stress_driver_t *d);
void stress_off_prefetch(stress_driver_t *d);
void stress_off_balance(stress_driver_t *d);
void stress_off_sync(stress_driver_t *d);
/* One slot: start bringing slot i back from the file (READING; on KV_ENOMEM
 * with nobody left to preempt it stays there); wait for slot i's I/O and
 * act on where its pages are now. */
void stress_off_prefetch_slot(stress_driver_t *d, int i);
void stress_off_settle(stress_driver_t *d, int i);

/* Shared prefixes (stress_prefix.c; no-ops without cfg.pfx.on). init:
 * the system prompts, the bound table, the scratch (KV_ENOMEM). draw: a
 * new request's system prompt, salt and content (len[0] grows by L_j).
 * shadow: slot s's new shadow (sequence id) from its request: system
 * prompt, own tokens, then the incarnation `origin` for the decode (without
 * prefixes: stress_shadow_init with origin). fingerprint: the store's model
 * fingerprint for this run (unique per run: a shared remote never serves an
 * earlier run's values). match: the store's
 * longest cached prefix for slot i, checked (top of stress_prefix.h), the
 * shadow advanced to it; returns the tokens matched. publish: the first n
 * prompt tokens of slot i (after each prefill chunk). drain: after every
 * sequence is freed, the cache holds every used page and gives them all up
 * under pressure (*meta0, the metadata baseline, grows by the cache's
 * hash table if that is all it kept); returns the leaks found. */
int stress_pfx_init(stress_driver_t *d);
void stress_pfx_destroy(stress_pfx_t *p);
void stress_pfx_draw(stress_driver_t *d, stress_req_t *r);
void stress_pfx_shadow(stress_driver_t *d, stress_slot_t *s, kv_seq_id_t id, uint64_t origin);
const char *stress_pfx_fingerprint(stress_driver_t *d);
uint32_t stress_pfx_match(stress_driver_t *d, int i);
void stress_pfx_publish(stress_driver_t *d, int i, uint32_t n);
uint64_t stress_pfx_drain(stress_driver_t *d, uint64_t *meta0);
/* Compressed contexts (cfg.pfx.compressed; stress_prefix.h). ctx: the
 * context length (the system prompt's L_j) when request r takes that path,
 * else 0. ctx_match: match slot i's context, checked against the digest
 * of its publisher and the shadow advanced to it on a hit; returns the
 * tokens installed (L_j or 0). ctx_publish: after slot i's prefill_end of
 * its context; records the digest when a node was made. */
uint32_t stress_pfx_ctx(const stress_driver_t *d, const stress_req_t *r);
uint32_t stress_pfx_ctx_match(stress_driver_t *d, int i);
void stress_pfx_ctx_publish(stress_driver_t *d, int i);

/* One iteration (stress_step.c). */
void stress_driver_step(stress_driver_t *d);
/* Verify every live sequence and the store now; returns violations found. */
uint64_t stress_driver_verify(stress_driver_t *d);
/* Settle all I/O, final verification, free every sequence, check for
 * leaks (final = the statistics then). Returns violations + leaks found. */
uint64_t stress_driver_finish(stress_driver_t *d);

#endif /* STRESS_DRIVER_H */
