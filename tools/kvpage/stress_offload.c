/* SPDX-License-Identifier: MIT */
/*
 * stress_offload.c — the page-file tier in `kvpage stress` (docs/stress.md,
 * "Offload"): the settle phase and the offload, prefetch, balance and sync
 * events of stress_step.c's tables, with the checks that go with them.
 *
 * A slot's pages are where its shadow's res says (stress_shadow.h):
 *   RESIDENT --offload--> WRITING --settle--> ON_FILE  (pages on the file)
 *                                         \-> RESIDENT (nothing went: pages
 *                                             shared or MERGED, or every
 *                                             write failed)
 *   ON_FILE --prefetch--> READING --settle--> RESIDENT (verified at once)
 *                                         \-> lost pages: prefetched again,
 *                                             up to STRESS_LOST_TRIES times,
 *                                             then freed (its request is
 *                                             requeued: recompute)
 * settle = kv_seq_wait (an op) + kv_seq_residency + stress_verify_wait: the
 * wait answers 0 or an I/O error, the residency adds up, a lost page is
 * never silent. A sequence that is wholly resident again must match its
 * shadow (bit-exact, or within its format's bound), so a page the store
 * hands back is right or its sequence reports an error: never wrong data.
 * Settled with pages on the file, it is probed: kv_append and kv_seq_fork
 * must answer KV_ENOTRES and change nothing, attention of each layer 0 or
 * KV_ENOTRES with at least one KV_ENOTRES (the verifier's kv_read does the
 * same per list). Balance may write any sequence: afterwards every resident
 * slot with pages on the file or I/O in flight is settled.
 *
 * Only results of calls that wait for their I/O (kv_seq_wait, balance,
 * sync) steer the driver, so a run stays deterministic (stress_driver.h).
 */
#include <errno.h>
#include <string.h>

#include "stress_driver.h"

static void off_context(stress_driver_t *d, const char *what)
{
    snprintf(d->vf.context, sizeof d->vf.context, "op %llu (%s)", (unsigned long long)d->ops,
             what);
}

static int off_call(stress_driver_t *d, stress_op_t op, int slot)
{
    stress_call_t c = {.op = op, .slot = slot};
    return stress_call(d, &c);
}

void stress_off_prefetch_slot(stress_driver_t *d, int i)
{
    if (off_call(d, STRESS_OP_PREFETCH, i))
        return;
    d->off.prefetches++;
    d->slots[i].sh.res = STRESS_RES_READING;
}

/* Slot i is settled with pages on the file: calls that need them must say
 * so (KV_ENOTRES) and change nothing. */
static void off_probe(stress_driver_t *d, int i)
{
    stress_slot_t *s = &d->slots[i];
    const kv_seq_id_t id = s->sh.id;
    off_context(d, "KV_ENOTRES probe");
    stress_shadow_values(&s->sh, d->cfg.seed, 0, 1, d->cfg.kv_heads, d->cfg.head_dim, d->k,
                         d->v, d->pos);
    stress_snap_take(&d->vf, &s->sh);
    int rc = kv_append(d->st, id, 0, 1, KV_DTYPE_F32, d->k, d->v, d->pos);
    if (rc == KV_ENOTRES) {
        d->off.enotres_checked++;
        stress_verify_unchanged(&d->vf, &s->sh);
    } else {
        stress_violation(&d->vf, "kv_append to seq %u, pages on the file, returned %d (%s), "
                         "not KV_ENOTRES", id, rc, kv_strerror(rc));
        if (rc == 0)
            stress_shadow_append(&s->sh, 0, 1); /* keep the shadow true */
    }
    kv_seq_id_t child;
    rc = kv_seq_fork(d->st, id, &child);
    if (rc == KV_ENOTRES) {
        d->off.enotres_checked++;
    } else {
        stress_violation(&d->vf, "kv_seq_fork of seq %u, pages on the file, returned %d (%s), "
                         "not KV_ENOTRES", id, rc, kv_strerror(rc));
        if (rc == 0)
            kv_seq_free(d->st, child);
    }
    uint32_t missing = 0;
    for (uint32_t l = 0; l < d->cfg.layers; l++) {
        stress_gen_fill(&d->rng, d->q, (size_t)d->cfg.q_heads * d->cfg.head_dim);
        kv_decode_t a = {.layer = l, .batch = 1, .seqs = &id, .q = d->q, .out = d->out};
        rc = kv_attn_decode(d->st, &a);
        if (rc == KV_ENOTRES)
            missing++;
        else if (rc == 0)
            stress_driver_check_out(d, s, l, d->out, 1);
        else if (rc != KV_ENOMEM) /* attention scratch */
            stress_violation(&d->vf, "kv_attn_decode of seq %u layer %u, pages on the file, "
                             "returned %d (%s)", id, l, rc, kv_strerror(rc));
    }
    d->off.enotres_checked += missing;
    if (missing == 0)
        stress_violation(&d->vf, "attention ran over every layer of seq %u although some of "
                         "its pages are on the file", id);
}

void stress_off_settle(stress_driver_t *d, int i)
{
    stress_slot_t *s = &d->slots[i];
    const stress_res_t was = s->sh.res;
    int rc = off_call(d, STRESS_OP_WAIT, i);
    d->off.waits++;
    d->off.wait_errors += rc != 0;
    off_context(d, "settle");
    kv_residency_t r;
    int qrc = kv_seq_residency(d->st, s->sh.id, &r);
    if (qrc) {
        stress_violation(&d->vf, "kv_seq_residency(seq %u): %s", s->sh.id, kv_strerror(qrc));
        return;
    }
    stress_verify_wait(&d->vf, &s->sh, rc, &r);
    if (r.lost) {
        d->off.lost_reports++;
        d->off.pages_lost += r.lost;
        s->sh.res = STRESS_RES_ON_FILE;
        stress_verify_seq(&d->vf, &s->sh); /* a lost page never reads as data */
        if (s->lost_tries < STRESS_LOST_TRIES) {
            s->lost_tries++;
            stress_off_prefetch_slot(d, i); /* a transient error may clear */
        } else {
            d->off.lost_seqs++;
            stress_driver_release(d, i, STRESS_EV_LOST);
        }
        return;
    }
    if (r.on_file == 0) {
        s->sh.res = STRESS_RES_RESIDENT;
        if (was == STRESS_RES_READING || rc) { /* read back, or writes failed */
            d->off.read_back += was == STRESS_RES_READING;
            d->off.lost_recovered += was == STRESS_RES_READING && s->lost_tries;
            s->lost_tries = 0;
            off_context(d, was == STRESS_RES_READING ? "read back" : "after failed writes");
            stress_verify_seq(&d->vf, &s->sh);
        }
        return;
    }
    s->sh.res = STRESS_RES_ON_FILE;
    off_probe(d, i);
}

void stress_off_settle_all(stress_driver_t *d)
{
    for (uint32_t i = 0; i <= d->cfg.max_seqs; i++) {
        const stress_slot_t *s = &d->slots[i];
        if (s->used && (s->sh.res == STRESS_RES_WRITING || s->sh.res == STRESS_RES_READING))
            stress_off_settle(d, (int)i);
    }
}

void stress_off_offload(stress_driver_t *d)
{
    int i = stress_driver_pick(d, STRESS_RES_RESIDENT);
    if (i < 0)
        return;
    int rc = off_call(d, STRESS_OP_OFFLOAD, i);
    if (rc == -ENOSPC)
        d->off.file_full++;
    if (rc)
        return;
    d->off.offloads++;
    d->slots[i].sh.res = STRESS_RES_WRITING;
    if (stress_rng_below(&d->rng, 2) == 0)
        stress_off_settle(d, i);
}

void stress_off_prefetch(stress_driver_t *d)
{
    int i = stress_driver_pick(d, STRESS_RES_ON_FILE);
    if (i < 0)
        return;
    stress_off_prefetch_slot(d, i);
    if (d->slots[i].sh.res == STRESS_RES_READING && stress_rng_below(&d->rng, 2) == 0)
        stress_off_settle(d, i);
}

void stress_off_balance(stress_driver_t *d)
{
    int rc = off_call(d, STRESS_OP_BALANCE, -1);
    d->off.balances++;
    if (rc > 0)
        d->off.balance_pages += (uint64_t)rc;
    /* which sequences went: balance chose them (least recently used) */
    for (uint32_t i = 0; i <= d->cfg.max_seqs; i++) {
        stress_slot_t *s = &d->slots[i];
        kv_residency_t r;
        if (!s->used || s->sh.res != STRESS_RES_RESIDENT ||
            kv_seq_residency(d->st, s->sh.id, &r) || (r.on_file == 0 && r.in_flight == 0))
            continue;
        s->sh.res = STRESS_RES_WRITING;
        stress_off_settle(d, (int)i);
    }
}

void stress_off_sync(stress_driver_t *d)
{
    int rc = off_call(d, STRESS_OP_SYNC, -1);
    d->off.syncs++;
    d->off.sync_errors += rc != 0;
}
