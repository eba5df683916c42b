/*
 * stress_driver.h — the engine simulated by `kvpage stress`: a store with a
 * small pool, live sequences with their shadows, a queue of waiting
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
 * the caller, which defers. Any other error is a violation.
 *
 * One engine iteration (stress_engine.c, stress_driver_step) runs the
 * phases arrive, admit (create, policy, prefill, prefill_end, forks for
 * parallel sampling), decode (every layer: append one token per running
 * sequence, one batched kv_attn_decode; then step_end), finish, and the
 * random events of the event table (abort, branch; offload/prefetch later).
 *
 * Determinism: everything depends only on the config (seed included); the
 * same config gives the same ops in the same order.
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
    STRESS_EV_COUNT
} stress_ev_t;

const char *stress_op_name(stress_op_t op);
const char *stress_ev_name(stress_ev_t ev);

typedef struct stress_cfg {
    uint32_t layers, kv_heads, q_heads, head_dim; /* store shape          */
    uint64_t pool;          /* pool capacity, pages                        */
    uint32_t max_seqs;      /* store max_seqs                              */
    uint64_t seed;
    double rate;            /* mean arrivals per engine iteration          */
    uint64_t verify_every;  /* ops between full verifications (0: end only) */
    stress_dist_t dist;
    const stress_mix_t *mix; /* borrowed; parsed for `layers`              */
} stress_cfg_t;

/* A request: what arrives, waits and is requeued on preemption. */
typedef struct stress_req {
    uint32_t len[2];  /* prompt, output tokens               */
    uint32_t samples; /* parallel samples (forks at admission) */
    uint32_t pol;     /* index into the mix                   */
    uint32_t waited;  /* iterations passed over at the head   */
} stress_req_t;

/* A live sequence (slots: [max_seqs + 1], so that creates can hit
 * KV_ELIMIT). */
typedef struct stress_slot {
    int used;
    int decoding;       /* prefill done: in the decode batch        */
    uint64_t order;     /* admission order: highest preempted first */
    stress_req_t req;   /* requeued as is when preempted            */
    uint32_t generated; /* output tokens decoded                    */
    stress_shadow_t sh;
} stress_slot_t;

/* One public call (see stress_call). */
typedef struct stress_call {
    stress_op_t op;
    int slot;          /* the sequence acted on, or -1                 */
    uint32_t layer;    /* APPEND, ATTN_*                               */
    uint32_t n;        /* APPEND: tokens; ATTN_PREFILL: rows           */
    uint32_t batch;    /* ATTN_DECODE: sequences in d->batch_slot      */
    int defer;         /* on KV_ENOMEM return at once (admission waits) */
    kv_seq_id_t out;   /* CREATE, FORK: the new sequence               */
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

/* One engine iteration (stress_engine.c). */
void stress_driver_step(stress_driver_t *d);
/* Verify every live sequence and the store now; returns violations found. */
uint64_t stress_driver_verify(stress_driver_t *d);
/* Final verification, free every sequence, check for leaks. Returns
 * violations + leaks found. */
uint64_t stress_driver_finish(stress_driver_t *d);

#endif /* STRESS_DRIVER_H */
