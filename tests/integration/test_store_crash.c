/* SPDX-License-Identifier: MIT */
/*
 * test_store_crash.c — kill -9 at random moments, then restart: every
 * acknowledged sequence comes back bit-exact, and nothing comes back wrong.
 *
 *   test_store_crash [KILLS [SEED]]     (defaults: 120 kills, seed 1)
 *
 * Each round forks a child that opens the store's page file (creates it
 * when there is none) and runs a random workload through the public API --
 * create + append (FP16, INT4, INT2 sequences), kv_seq_offload (waited for
 * or not), kv_seq_prefetch + wait (checked bit-exact in the child),
 * kv_seq_free, kv_store_offload_sync, kv_store_destroy + reopen -- until
 * this process kills it with SIGKILL after a random delay. Before each call
 * the child tells us through a pipe (one write() per message: atomic) what
 * it is about to do: the phase; a new sequence's recipe (seed, kind,
 * tokens) before its appends and "done" after them; "touch" before a
 * prefetch or free; and after each successful sync the set of sequences
 * wholly on the file (the acknowledgement: those are durable).
 *
 * After the kill we open the file (KV_OFFLOAD_OPEN) and check every
 * restored sequence against a reference built in a store without a page
 * file from the recipes (kv_read of every list, bit for bit):
 *   - restored bit-exact: it equals one finished recipe of its id (a crash
 *     rolls back to the last sync, so an older incarnation is fine);
 *   - reported lost: kv_seq_wait after its prefetch returned an error (its
 *     slots were reused after the sync that recorded it), or it was not
 *     restored and counted in kv_stats.seqs_dropped;
 *   - silently wrong: restored, read back fine, and equal to no recipe of
 *     its id -- must be 0;
 *   - acknowledged and lost: in the last acknowledgement, not touched since,
 *     yet not restored bit-exact -- must be 0 (its slots were never freed).
 * Then the survivors go back to the file, we sync (our own
 * acknowledgement), destroy, and the next child starts from there. Every
 * 16th round starts without a file and kills within a few milliseconds, so
 * some kills land inside the first kv_store_create: the next create must
 * replace the "<path>.new" left (counted). Kill moments are counted by the
 * child's last phase. One JSON line of figures at the end. The fork, pipe
 * and kill are tests/kv_test_crash.h's.
 */
#include <fcntl.h>
#include <sys/stat.h>

#include "kv_test_crash.h"
#include "test_offload_util.h"

#define L     2u   /* layers    */
#define H     2u   /* kv heads  */
#define D     32u  /* head dim  */
#define NL    (L * H)
#define MAXQ  64u  /* max_seqs  */
#define CANDS 32   /* recipes remembered per id */
#define MAXTOK 160u

enum { K_FP16 = 0, K_INT4 = 1, K_INT2 = 2 };
enum { PH_OPEN, PH_CREATE_FILE, PH_CREATE, PH_APPEND, PH_OFFLOAD, PH_PREFETCH, PH_FREE,
       PH_SYNC, PH_DESTROY, PH_COUNT };
static const char *const g_phase[PH_COUNT] = {"open", "create_file", "seq_create", "append",
                                              "offload", "prefetch", "free", "sync",
                                              "destroy"};
enum { M_DEF = 1, M_DONE, M_TOUCH, M_ACK };

typedef struct recipe {
    uint64_t seed;
    uint32_t kind, n;
} recipe_t;

typedef struct msg {          /* child -> parent, one write() each */
    kvt_crash_hdr_t h;        /* type M_*, id                       */
    recipe_t r;               /* M_DEF                              */
    uint64_t set;             /* M_ACK: ids wholly on the file      */
} msg_t;

/* What the parent knows; a forked child starts from a copy. */
typedef struct model {
    recipe_t cand[MAXQ][CANDS]; /* finished recipes each id may hold */
    uint32_t n_cand[MAXQ];
    recipe_t pending[MAXQ];     /* defined, not yet finished          */
    uint64_t acked;             /* last acknowledgement, minus touched */
    int file;                   /* 1: the page file exists            */
} model_t;

static char g_path[4096];
static model_t g_m;
static void take(void *model, const void *msg);
static kvt_crash_t g_crash = {.msg_size = sizeof(msg_t), .take = take, .child_model = &g_m};

/* ---- recipes ------------------------------------------------------------------ */

static float val(uint64_t seed, uint32_t l, uint32_t t, uint32_t h, uint32_t d, int kv)
{
    uint64_t s = seed ^ ((uint64_t)l << 56) ^ ((uint64_t)t << 24) ^ ((uint64_t)h << 16) ^
                 ((uint64_t)d << 4) ^ (uint64_t)kv;
    return (float)((int)(kv_test_rand(&s) & 2047) - 1024) / 1024.0f;
}

/* Build recipe r into the empty sequence seq: per layer the format, the
 * appends in seed-drawn chunks, then the quantization. */
static int build(kv_store_t *st, kv_seq_id_t seq, const recipe_t *r)
{
    static float k[MAXTOK * H * D], v[MAXTOK * H * D];
    uint64_t cs = r->seed * 31 + 7;
    for (uint32_t l = 0; l < L; l++) {
        int rc;
        if (r->kind != K_FP16 &&
            (rc = kv_seq_set_format(st, seq, l, r->kind == K_INT4 ? KV_FMT_INT4 : KV_FMT_INT2)))
            return rc;
        for (uint32_t t = 0; t < r->n;) {
            uint32_t c = 1 + (uint32_t)(kv_test_rand(&cs) % 48);
            if (c > r->n - t)
                c = r->n - t;
            for (uint32_t i = 0; i < c; i++)
                for (uint32_t h = 0; h < H; h++)
                    for (uint32_t d = 0; d < D; d++) {
                        k[(i * H + h) * D + d] = val(r->seed, l, t + i, h, d, 0);
                        v[(i * H + h) * D + d] = val(r->seed, l, t + i, h, d, 1);
                    }
            if ((rc = kv_append(st, seq, l, c, KV_DTYPE_F32, k, v, NULL)))
                return rc;
            t += c;
        }
        if (r->kind != K_FP16 && (rc = kv_seq_quantize(st, seq, l, 16)))
            return rc;
    }
    return 0;
}

static kv_store_t *g_ref; /* no page file: recipes are built here */

/* 1 if seq in st holds exactly recipe r. */
static int holds(const kv_store_t *st, kv_seq_id_t seq, const recipe_t *r)
{
    kv_seq_id_t q;
    if (kv_seq_create(g_ref, &q))
        return 0;
    int ok = build(g_ref, q, r) == 0 && kvt_seq_same(g_ref, q, st, seq, L, H, D);
    kv_seq_free(g_ref, q);
    return ok;
}

static kv_config_t config(uint32_t flags)
{
    kv_config_t c = kv_config_default();
    c.n_layers = L;
    c.n_q_heads = H;
    c.n_kv_heads = H;
    c.head_dim = D;
    c.host_pages = 4096;
    c.max_seqs = MAXQ;
    c.n_threads = 1;
    c.residual = 32;
    c.offload_path = g_path;
    c.offload_pages = (flags & KV_OFFLOAD_OPEN) ? 0 : 2048;
    c.offload_qd = 16;
    c.offload_flags = flags;
    return c;
}

/* ---- the child ------------------------------------------------------------------ */

/* Tell the parent (the child's model takes it too). */
static void say(uint32_t type, uint32_t id, const recipe_t *r, uint64_t set)
{
    msg_t m = {.h = {.type = type, .id = id}, .set = set};
    if (r)
        m.r = *r;
    kvt_crash_say(&g_crash, &m);
}

#define CHILD_CHECK(cond, rc_) KVT_CHILD_CHECK(&g_crash, cond, rc_)

/* The live ids as a bit set. */
static uint64_t live_set(const kv_store_t *st)
{
    kv_seq_id_t ids[MAXQ];
    uint32_t n = 0;
    uint64_t set = 0;
    kv_store_seqs(st, ids, MAXQ, &n);
    for (uint32_t i = 0; i < n && i < MAXQ; i++)
        set |= 1ull << ids[i];
    return set;
}

/* Ids wholly on the file (a record is written for exactly these). */
static uint64_t on_file_set(kv_store_t *st)
{
    kv_seq_id_t ids[MAXQ];
    uint32_t n = 0;
    uint64_t set = 0;
    kv_store_seqs(st, ids, MAXQ, &n);
    for (uint32_t i = 0; i < n; i++) {
        kv_residency_t r;
        if (kv_seq_residency(st, ids[i], &r) == 0 && r.pages && r.on_file == r.pages &&
            !r.lost && !r.in_flight)
            set |= 1ull << ids[i];
    }
    return set;
}

static kv_store_t *child_open(void)
{
    kvt_crash_phase(&g_crash, g_m.file ? PH_OPEN : PH_CREATE_FILE);
    kv_config_t c = config(g_m.file ? KV_OFFLOAD_OPEN : 0);
    kv_store_t *st = NULL;
    int rc = kv_store_create(&c, &st);
    CHILD_CHECK(rc == 0, rc);
    g_m.file = 1;
    /* everything acknowledged and untouched is back */
    CHILD_CHECK((live_set(st) & g_m.acked) == g_m.acked, 0);
    return st;
}

static int sync_ack(kv_store_t *st)
{
    kvt_crash_phase(&g_crash, PH_SYNC);
    int rc = kv_store_offload_sync(st);
    CHILD_CHECK(rc == 0 || rc == -ENOSPC, rc);
    if (rc == 0)
        say(M_ACK, 0, NULL, on_file_set(st));
    return rc;
}

static void child_main(void *arg)
{
    uint64_t s = *(const uint64_t *)arg;
    kv_store_t *st = child_open();
    for (;;) {
        kv_seq_id_t ids[MAXQ];
        uint32_t n = 0;
        kv_store_seqs(st, ids, MAXQ, &n);
        uint32_t dice = (uint32_t)(kv_test_rand(&s) % 100);
        kv_seq_id_t pick = n ? ids[kv_test_rand(&s) % n] : 0;
        kv_residency_t res = {0};
        if (n)
            CHILD_CHECK(kv_seq_residency(st, pick, &res) == 0, 0);
        if (n < 4)
            dice = 0;
        if (dice < 30 && n < 20) { /* a new sequence */
            kvt_crash_phase(&g_crash, PH_CREATE);
            kv_seq_id_t q;
            int rc = kv_seq_create(st, &q);
            CHILD_CHECK(rc == 0, rc);
            recipe_t r = {.seed = kv_test_rand(&s), .kind = (uint32_t)(kv_test_rand(&s) % 3),
                          .n = 17 + (uint32_t)(kv_test_rand(&s) % (MAXTOK - 16))};
            say(M_DEF, q, &r, 0);
            kvt_crash_phase(&g_crash, PH_APPEND);
            rc = build(st, q, &r);
            CHILD_CHECK(rc == 0, rc);
            say(M_DONE, q, NULL, 0);
        } else if (dice < 55 && n && res.resident == res.pages && !res.in_flight) {
            kvt_crash_phase(&g_crash, PH_OFFLOAD);
            int rc = kv_seq_offload(st, pick);
            CHILD_CHECK(rc == 0 || rc == -ENOSPC, rc);
            if (kv_test_rand(&s) & 1)
                CHILD_CHECK((rc = kv_seq_wait(st, pick)) == 0, rc);
        } else if (dice < 70 && n && res.on_file) {
            say(M_TOUCH, pick, NULL, 0);
            kvt_crash_phase(&g_crash, PH_PREFETCH);
            int rc = kv_seq_prefetch(st, pick);
            CHILD_CHECK(rc == 0, rc);
            CHILD_CHECK((rc = kv_seq_wait(st, pick)) == 0, rc);
            int ok = 0;
            for (uint32_t c = 0; c < g_m.n_cand[pick] && !ok; c++)
                ok = holds(st, pick, &g_m.cand[pick][c]);
            CHILD_CHECK(ok, 0);
        } else if (dice < 70) { /* not applicable to pick: settle it */
            int rc = kv_seq_wait(st, pick);
            CHILD_CHECK(rc == 0, rc);
        } else if (dice < 78 && n) {
            say(M_TOUCH, pick, NULL, 0);
            kvt_crash_phase(&g_crash, PH_FREE);
            int rc = kv_seq_free(st, pick);
            CHILD_CHECK(rc == 0, rc);
        } else if (dice < 92) {
            int rc = kv_seq_wait(st, pick);
            CHILD_CHECK(rc == 0, rc);
        } else if (dice < 97) {
            sync_ack(st);
        } else if (dice < 100) {
            int rc = sync_ack(st);
            uint64_t want = on_file_set(st);
            kvt_crash_phase(&g_crash, PH_DESTROY);
            kv_store_destroy(st);
            st = child_open();
            if (rc == 0) /* exactly what was wholly on the file comes back */
                CHILD_CHECK(live_set(st) == want, 0);
        }
    }
}

/* ---- the parent ----------------------------------------------------------------- */

typedef struct figures {
    long kills, by_phase[PH_COUNT], restored_exact, reported_lost, dropped, wrong,
        acked_lost, half_made, acked_checked, busy_retries, rounds_no_file;
} figures_t;

static void take(void *model, const void *msg)
{
    model_t *m = model;
    const msg_t *g = msg;
    const uint32_t id = g->h.id;
    switch (g->h.type) {
    case M_DEF: m->pending[id] = g->r; break;
    case M_DONE: {
        uint32_t *n = &m->n_cand[id];
        if (*n == CANDS) { /* keep the newest */
            memmove(m->cand[id], m->cand[id] + 1, (CANDS - 1) * sizeof(recipe_t));
            (*n)--;
        }
        m->cand[id][(*n)++] = m->pending[id];
        break;
    }
    case M_TOUCH: m->acked &= ~(1ull << id); break;
    case M_ACK: m->acked = g->set; break;
    default: break;
    }
}

/* Open after a kill, check, put the survivors back on the file, sync. */
static void verify(model_t *m, figures_t *f)
{
    kv_config_t c = config(KV_OFFLOAD_OPEN);
    kv_store_t *st = NULL;
    int rc = kvt_crash_open(&c, &st, &f->busy_retries);
    if (rc == -ENOENT) { /* killed before the first create finished */
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s%s", g_path, KV_OFFLOAD_NEW_SUFFIX);
        f->half_made += access(tmp, F_OK) == 0;
        CHECK_EQ(m->acked, 0);
        memset(m, 0, sizeof *m);
        return;
    }
    CHECK_OK(rc);
    if (rc)
        return;
    kv_stats_t s0 = {.struct_size = sizeof s0};
    kv_store_stats(st, &s0);
    f->dropped += (long)s0.seqs_dropped;
    kv_seq_id_t ids[MAXQ];
    uint32_t n = 0;
    uint64_t got = 0, good = 0;
    kv_store_seqs(st, ids, MAXQ, &n);
    for (uint32_t i = 0; i < n; i++) {
        kv_seq_id_t q = ids[i];
        got |= 1ull << q;
        CHECK_OK(kv_seq_prefetch(st, q));
        if (kv_seq_wait(st, q) != 0) {
            kv_residency_t r;
            CHECK_OK(kv_seq_residency(st, q, &r));
            CHECK(r.lost > 0); /* reported: counted, never read */
            f->reported_lost++;
            CHECK(!(m->acked >> q & 1));
            f->acked_lost += m->acked >> q & 1;
            CHECK_OK(kv_seq_free(st, q));
            continue;
        }
        int match = -1;
        for (uint32_t k = 0; k < m->n_cand[q] && match < 0; k++)
            if (holds(st, q, &m->cand[q][k]))
                match = (int)k;
        if (match < 0) {
            fprintf(stderr, "seq %u restored with contents of no recipe of its id\n", q);
            f->wrong++;
            CHECK_OK(kv_seq_free(st, q));
            continue;
        }
        f->restored_exact++;
        m->cand[q][0] = m->cand[q][match];
        m->n_cand[q] = 1;
        good |= 1ull << q;
    }
    for (uint32_t q = 0; q < MAXQ; q++)
        if (m->acked >> q & 1) {
            f->acked_checked++;
            if (!(good >> q & 1)) {
                fprintf(stderr, "acknowledged seq %u not restored\n", q);
                f->acked_lost += !(got >> q & 1);
            }
        }
    CHECK_EQ(m->acked & ~good, 0);
    /* survivors back to the file (at most 16 kept), then our own ack */
    uint32_t kept = 0;
    for (uint32_t q = 0; q < MAXQ; q++) {
        if (!(good >> q & 1))
            continue;
        if (++kept > 16) {
            CHECK_OK(kv_seq_free(st, q));
            good &= ~(1ull << q);
            continue;
        }
        CHECK_OK(kv_seq_offload(st, q));
    }
    for (uint32_t q = 0; q < MAXQ; q++)
        if (good >> q & 1)
            CHECK_OK(kv_seq_wait(st, q));
    CHECK_OK(kv_store_offload_sync(st));
    CHECK_OK(kv_store_check(st));
    kv_store_destroy(st);
    for (uint32_t q = 0; q < MAXQ; q++)
        if (!(good >> q & 1))
            m->n_cand[q] = 0;
    m->acked = good;
    m->file = 1;
}

int main(int argc, char **argv)
{
    long kills = argc > 1 ? atol(argv[1]) : 120;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : 1;
    kvt_dir_t dir;
    kvt_dir_make(&dir);
    kvt_path(&dir, "crash.kvp", g_path);
    kv_config_t rc_cfg = config(0);
    rc_cfg.offload_path = NULL;
    rc_cfg.offload_pages = rc_cfg.offload_qd = 0;
    rc_cfg.max_seqs = 4;
    rc_cfg.host_pages = 256;
    CHECK_OK(kv_store_create(&rc_cfg, &g_ref));
    figures_t f = {0};
    double t0 = kvt_now_s();
    uint64_t s = seed;
    for (long round = 0; round < kills; round++) {
        int early = round % 16 == 5; /* no file, kill within a few ms */
        if (early) {
            kv_offload_unlink(g_path);
            memset(&g_m, 0, sizeof g_m);
            f.rounds_no_file++;
        }
        double delay = early ? (double)(kv_test_rand(&s) % 4000) * 1e-6
                             : (double)(kv_test_rand(&s) % 150000) * 1e-6;
        uint64_t child_seed = kv_test_rand(&s);
        model_t m = g_m;
        int phase = -1;
        if (kvt_crash_round(&g_crash, child_main, &child_seed, &m, delay, &phase)) {
            fprintf(stderr, "round %ld failed\n", round);
            CHECK(0);
            break;
        }
        f.kills++;
        if (phase >= 0)
            f.by_phase[phase]++;
        verify(&m, &f);
        g_m = m;
        if (round % 20 == 19)
            fprintf(stderr, "%ld kills, %ld restored bit-exact, %ld reported lost, %ld wrong\n",
                    f.kills, f.restored_exact, f.reported_lost, f.wrong);
    }
    CHECK_EQ(f.wrong, 0);
    CHECK_EQ(f.acked_lost, 0);
    CHECK(f.kills == kills);
    printf("{\"kills\":%ld,\"kills_by_phase\":{", f.kills);
    for (int i = 0; i < PH_COUNT; i++)
        printf("%s\"%s\":%ld", i ? "," : "", g_phase[i], f.by_phase[i]);
    printf("},\"restored_exact\":%ld,\"acked_checked\":%ld,\"reported_lost\":%ld,"
           "\"seqs_dropped\":%ld,\"silently_wrong\":%ld,\"acked_lost\":%ld,"
           "\"half_made_replaced\":%ld,\"rounds_without_file\":%ld,\"busy_retries\":%ld,"
           "\"seconds\":%.1f}\n",
           f.restored_exact, f.acked_checked, f.reported_lost, f.dropped, f.wrong,
           f.acked_lost, f.half_made, f.rounds_no_file, f.busy_retries, kvt_now_s() - t0);
    kv_store_destroy(g_ref);
    kv_offload_unlink(g_path);
    kvt_dir_remove(&dir);
    return kv_test_end();
}
