/* SPDX-License-Identifier: MIT */
/*
 * stress_verify.h — the verifier of `kvpage stress`: compares a store,
 * through the public API only, against the shadow records of its live
 * sequences, and counts violations.
 *
 * What is checked (each failing item is one violation, its first instance
 * printed to the log with the context string):
 *   stress_verify_seq      every (layer, kv_head) list of one sequence:
 *                          length, positions, K and V, as its
 *                          stress_check_t says (stress_mix.h); where the
 *                          driver offloaded it (shadow res), a list may
 *                          answer KV_ENOTRES instead, and at least one
 *                          must once its pages are known to be on the file;
 *   stress_verify_same     two sequences hold bit-identical lists (a fork
 *                          right after kv_seq_fork);
 *   stress_verify_digest   (not a check) a 64-bit digest of one sequence's
 *                          lists, to compare with one taken earlier
 *                          (compressed contexts, stress_prefix.h);
 *   stress_verify_store    kv_store_check() == 0, pages_used + pages_free ==
 *                          capacity, pages_used == the sum of pages by
 *                          format, kv_bytes == the sum of bytes by format,
 *                          n_seqs == live shadows, tokens == the sum of the
 *                          live lists' lengths, and every live sequence;
 *   stress_snap_take +     a failed call changed nothing: the statistics
 *   stress_verify_unchanged  (pages used/free/by format, sequences, tokens,
 *                          metadata bytes; with prefix nodes evicted by the
 *                          call's refused page, pages used less the pages
 *                          they freed, sequences, tokens) and the touched
 *                          sequence's list
 *                          lengths equal the snapshot, and its contents
 *                          still match its shadow;
 *   stress_verify_wait     after kv_seq_wait: its result is 0 or an I/O
 *                          error, the residency adds up, and a lost page is
 *                          never silent (kv_seq_wait reported an error);
 *   stress_verify_empty    leaks once every sequence is freed (counted in
 *                          leaks, not violations): pages, tokens,
 *                          sequences, metadata, page-file slots.
 *
 * Ownership: the verifier borrows the store; it owns its scratch buffers
 * (grown as lists grow; stress_verifier_destroy frees them).
 */
#ifndef STRESS_VERIFY_H
#define STRESS_VERIFY_H

#include <stdint.h>
#include <stdio.h>

#include "kvpage/kvpage.h"
#include "stress_shadow.h"

typedef struct stress_verifier {
    const kv_store_t *st;   /* borrowed                                     */
    uint64_t seed;          /* of the generated values                      */
    uint32_t n_layers, n_kv_heads, head_dim;
    float *k, *v, *k2, *v2; /* scratch: [cap][head_dim]                     */
    float *ek, *ev;         /* expected token: [head_dim]                   */
    int32_t *pos, *pos2;    /* scratch: [cap]                               */
    uint8_t *seen;          /* scratch: [cap] positions seen (permutations) */
    uint32_t cap;           /* tokens the scratch holds                     */
    kv_stats_t snap;        /* stress_snap_take: statistics before a call   */
    uint32_t *snap_len;     /* [2][n_layers * n_kv_heads]: lengths then, now */
    int snap_seq;           /* snap_len is valid                            */
    uint64_t violations;    /* total found                                  */
    uint64_t leaks;         /* total found by stress_verify_empty           */
    uint64_t reads;         /* kv_read calls made                           */
    uint64_t tokens;        /* tokens compared with their appended values   */
    uint64_t by_norm;       /* of those, accepted as merged (norms kept)    */
    uint64_t enotres;       /* lists that answered KV_ENOTRES (offloaded)   */
    uint64_t skipped;       /* lists not read: their page-in in flight      */
    double max_err[5];      /* largest |read - appended| seen, by bits      */
                            /* (0, 2, 4; drift and CaM values excluded)     */
    FILE *log;              /* where violations are described (or NULL)     */
    uint32_t logged, max_log; /* messages printed / at most                 */
    char context[160];      /* prefixed to each message (op number, call)   */
} stress_verifier_t;

/* Returns 0, or KV_ENOMEM (scratch), or the error of kv_store_config. */
int stress_verifier_init(stress_verifier_t *vf, const kv_store_t *st, uint64_t seed,
                         FILE *log);
void stress_verifier_destroy(stress_verifier_t *vf);

/* Count one violation and describe it (printf-style). */
void stress_violation(stress_verifier_t *vf, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Count one leak (vf->leaks) and describe it (printf-style). */
void stress_leak(stress_verifier_t *vf, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Each returns the number of violations it found (also added to
 * vf->violations; stress_verify_empty adds to vf->leaks instead). */
uint64_t stress_verify_seq(stress_verifier_t *vf, const stress_shadow_t *s);
uint64_t stress_verify_same(stress_verifier_t *vf, kv_seq_id_t a, kv_seq_id_t b);
/* FNV-1a over every (layer, kv_head) list of seq in order: its length, then
 * kv_read's positions, K and V. Returns 0 with *digest (never 0), or the
 * error of kv_seq_len / kv_read, or KV_ENOMEM (scratch). */
int stress_verify_digest(stress_verifier_t *vf, kv_seq_id_t seq, uint64_t *digest);
uint64_t stress_verify_store(stress_verifier_t *vf, const stress_shadow_t *const *live,
                             uint32_t n_live);
/* Snapshot the statistics and (s non-NULL) s's list lengths before a call. */
void stress_snap_take(stress_verifier_t *vf, const stress_shadow_t *s);
/* After a call that failed: everything in the snapshot is as it was, and s
 * (non-NULL) still matches its shadow. */
uint64_t stress_verify_unchanged(stress_verifier_t *vf, const stress_shadow_t *s);
/* After kv_seq_wait(s) returned wait_rc and kv_seq_residency gave *r: the
 * result is 0 or an I/O error (KV_EIO, KV_ECORRUPT, -errno); nothing is in
 * flight; pages == resident + on_file; lost <= on_file; lost > 0 only with
 * an error (never a silent loss). */
uint64_t stress_verify_wait(stress_verifier_t *vf, const stress_shadow_t *s, int wait_rc,
                            const kv_residency_t *r);
/* 1 if rc is what I/O can return: KV_EIO, KV_ECORRUPT or -errno. */
int stress_io_error(int rc);
/* After every sequence was freed: no page, token, sequence or metadata byte
 * beyond meta0 (meta_bytes right after kv_store_create) is left, and no
 * page-file slot or page on the file, in flight or lost. */
uint64_t stress_verify_empty(stress_verifier_t *vf, uint64_t meta0);

#endif /* STRESS_VERIFY_H */
