/* SPDX-License-Identifier: MIT */
/*
 * test_prefix_crash.c — kill -9 at random moments with the prefix cache's
 * nodes on the page file, then restart: every acknowledged prompt block
 * comes back, and no hit is ever wrong.
 *
 *   test_prefix_crash [KILLS [SEED]]     (defaults: 120 kills, seed 1)
 *
 * Recipes: 12 prompts (3 system prompts of 64, 112 and 160 tokens, each
 * followed by 4 tails of 9..120 tokens; token ids drawn from SEED) times 3
 * kinds (every layer FP16, INT4 or INT2, KIVI with residual 64). The K/V of
 * a token is a function of its id and index (kvt_pfx_val), so any prefix of
 * a recipe is rebuilt in a store without a page file (the reference) and
 * compared with kv_read, bit for bit.
 *
 * Each round forks a child (tests/kv_test_crash.h) that opens the store
 * with the cache on and the page file (creates it when there is none) in a
 * pool of 144 pages, so that nodes are demoted to the file all the time,
 * and runs a random workload through the public API: requests (a fresh
 * sequence, kv_seq_prefix_match -- its hit checked bit for bit -- the rest
 * appended in random chunks with kv_seq_prefix_publish after each), live
 * sequences offloaded, prefetched and freed, kv_store_offload_sync, and
 * kv_store_destroy + reopen (kv_store_check; every node back, none bad --
 * with the small file below, the nodes whose copies it took and whose
 * parents' copies too: the others are counted, clean_restart_orphans).
 * The parent kills it with SIGKILL after 0-150 ms.
 *
 * Acknowledgement: per recipe, the child knows a lower bound of the tokens
 * from 0 that cached nodes cover (the largest publish result or match
 * since the store opened, starting from the last acknowledgement). After a
 * successful kv_store_offload_sync every node's copy is in the synced
 * index, and every pool node has one unless the sync's best-effort copies
 * stopped at a full file or failed: with COPY_MAX slots still free after
 * it and no new I/O error, none did, and the child sends those bounds (the
 * acknowledgement; else M_NOACK, counted). Nodes leave the cache, or their
 * copies the file, only when a copy fails (a full file, an I/O error:
 * prefix_file_dropped), a read-back fails its check (prefix_file_bad) or a
 * sequence's page-out takes the copies' slots (prefix_file_slots falls);
 * the child looks after every call (settle()).
 *   - The big file (4096 slots) holds every node of every recipe and the
 *     live sequences: none of that may happen (checked), so an
 *     acknowledged block stays acknowledged until the next sync.
 *   - The small file (400 slots; every other round that starts without a
 *     file makes one, up to the next such round) fills: copies yield to
 *     sequences and demotions drop nodes, by design. Before each call that
 *     may drop (match, append, offload) the child sends M_RISK, after it
 *     M_SAFE, or M_WITHDRAW when something left: every acknowledgement is
 *     withdrawn (which nodes went is not known), counted. A kill between
 *     M_RISK and its answer withdraws them too (counted: kills at risk).
 *     These rounds put nodes whose slots were taken after the last sync in
 *     front of the restart: the index names slots that hold other pages.
 *
 * After the kill the parent opens the file (KV_OFFLOAD_OPEN, a large pool),
 * kv_store_check, frees the restored sequences, and matches every recipe in
 * a fresh sequence with one extra token (so the match may reach the
 * prompt's last full block):
 *   - silently wrong: a hit whose K/V or positions differ from the recipe's
 *     (kv_read against the reference built from the recipe) -- must be 0;
 *   - acknowledged and lost: fewer tokens matched than the last
 *     acknowledgement covered -- must be 0.
 * Then it syncs (the matched tokens become its acknowledgement), destroys,
 * and the next child starts from there. Every 16th round starts without a
 * file and kills within a few milliseconds (kills inside the first
 * kv_store_create; the next create replaces the "<path>.new" left).
 * Counted: kills by phase, nodes restored, hits and tokens, nodes read back
 * from the file, prefix_file_bad (at restore, at read-back), dropped. One
 * JSON line of figures at the end.
 */
#include <fcntl.h>
#include <sys/stat.h>

#include "kv_test_crash.h"
#include "kv_test_prefix.h"
#include "test_offload_util.h"

#define L      2u   /* layers            */
#define H      2u   /* kv heads          */
#define D      32u  /* head dim          */
#define R      64u  /* KIVI residual     */
#define NSYS   3u
#define NTAIL  4u
#define NP     (NSYS * NTAIL) /* prompts */
#define NK     3u             /* kinds   */
#define NR     (NP * NK)      /* recipes */
#define MAXT   288u
#define POOL   144u           /* the child's pool: nodes go to the file */
#define SLOTS  4096u          /* holds every node of every recipe      */
#define SMALL  400u           /* holds a fraction: copies yield, drop  */
#define COPY_MAX 9u           /* slots of one node's copy, at most     */
#define LIVE   2u             /* live sequences in the child, at most   */

static const char MODEL[] = "prefix-crash-model";
static const uint32_t g_sys_len[NSYS] = {64, 112, 160};
static const kv_format_t g_fmt[NK] = {KV_FMT_FP16, KV_FMT_INT4, KV_FMT_INT2};
static const char *const g_kind[NK] = {"fp16", "int4", "int2"};

enum { PH_OPEN, PH_CREATE_FILE, PH_MATCH, PH_APPEND, PH_PUBLISH, PH_OFFLOAD, PH_PREFETCH,
       PH_FREE, PH_SYNC, PH_DESTROY, PH_COUNT };
static const char *const g_phase[PH_COUNT] = {"open",    "create_file", "match", "append",
                                              "publish", "offload",     "prefetch",
                                              "free",    "sync",        "destroy"};
enum { M_ACK = 1, M_RISK, M_SAFE, M_WITHDRAW, M_NOACK, M_ORPHANS };

typedef struct msg {          /* child -> parent, one write() each    */
    kvt_crash_hdr_t h;        /* id: M_WITHDRAW nodes dropped, M_ORPHANS */
                              /* nodes not restored                   */
    uint16_t cov[NR];         /* M_ACK: tokens covered, per recipe    */
} msg_t;

typedef struct model {        /* what the parent knows                */
    uint16_t acked[NR];       /* the last acknowledgement             */
    int file;                 /* 1: the page file exists              */
    int small;                /* it was made with SMALL slots         */
    int at_risk;              /* inside a call that may drop nodes    */
    long withdrawn, dropped, noack, orphans; /* since the parent looked */
} model_t;

static char g_path[4096];
static int32_t g_prompt[NP][MAXT + 1]; /* + the extra token of the check */
static uint32_t g_len[NP];
static kv_store_t *g_ref;              /* no page file, no cache         */
static model_t g_m;

static void take(void *model, const void *msg)
{
    model_t *m = model;
    const msg_t *g = msg;
    switch (g->h.type) {
    case M_ACK: memcpy(m->acked, g->cov, sizeof m->acked); break;
    case M_RISK: m->at_risk = 1; break;
    case M_SAFE: m->at_risk = 0; break;
    case M_WITHDRAW:
        memset(m->acked, 0, sizeof m->acked);
        m->at_risk = 0;
        m->withdrawn++;
        m->dropped += g->h.id;
        break;
    case M_NOACK: m->noack++; break;
    case M_ORPHANS: m->orphans += g->h.id; break;
    default: break;
    }
}

static kvt_crash_t g_crash = {.msg_size = sizeof(msg_t), .take = take, .child_model = &g_m};

/* ---- recipes --------------------------------------------------------------- */

static void recipes(uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    int32_t sys[NSYS][160];
    for (uint32_t i = 0; i < NSYS; i++)
        for (uint32_t t = 0; t < g_sys_len[i]; t++)
            sys[i][t] = (int32_t)(kv_test_rand(&s) % 49152u);
    for (uint32_t p = 0; p < NP; p++) {
        const uint32_t si = p / NTAIL, tail = 9 + (uint32_t)(kv_test_rand(&s) % 112);
        memcpy(g_prompt[p], sys[si], g_sys_len[si] * sizeof(int32_t));
        g_len[p] = g_sys_len[si] + tail;
        for (uint32_t t = g_sys_len[si]; t <= g_len[p]; t++) /* the extra one too */
            g_prompt[p][t] = (int32_t)(kv_test_rand(&s) % 49152u);
    }
}

/* A fresh sequence of recipe r's kind in st (its target format set). */
static int seq_new(kv_store_t *st, uint32_t r, kv_seq_id_t *q)
{
    int rc = kv_seq_create(st, q);
    for (uint32_t l = 0; l < L && rc == 0 && g_fmt[r % NK] != KV_FMT_FP16; l++)
        if ((rc = kv_seq_set_format(st, *q, l, g_fmt[r % NK])))
            kv_seq_free(st, *q);
    return rc;
}

/* 1 if seq in st holds exactly tokens [0, n) of recipe r as a cold prefill
 * leaves them (the reference: one append of n tokens in g_ref). */
static int holds(const kv_store_t *st, kv_seq_id_t seq, uint32_t r, uint32_t n)
{
    kv_seq_id_t q;
    if (seq_new(g_ref, r, &q))
        return 0;
    int ok = kvt_pfx_feed(g_ref, q, g_prompt[r / NK], 0, n, L, H, D) == 0 &&
             kvt_seq_same(g_ref, q, st, seq, L, H, D);
    kv_seq_free(g_ref, q);
    return ok;
}

static kv_config_t config(uint32_t flags, uint32_t pool, uint32_t slots)
{
    kv_config_t c = kv_config_default();
    c.n_layers = L;
    c.n_q_heads = 4;
    c.n_kv_heads = H;
    c.head_dim = D;
    c.host_pages = pool;
    c.max_seqs = 16;
    c.n_threads = 1;
    c.flags = KV_CONFIG_NO_TCACHE;
    c.residual = R;
    c.prefix_cache = 1;
    c.prefix_model = MODEL;
    c.prefix_model_len = sizeof MODEL - 1;
    c.offload_path = g_path;
    c.offload_pages = (flags & KV_OFFLOAD_OPEN) ? 0 : slots;
    c.offload_qd = 16;
    c.offload_flags = flags;
    return c;
}

/* ---- the child --------------------------------------------------------------- */

#define CHILD_CHECK(cond, rc_) KVT_CHILD_CHECK(&g_crash, cond, rc_)

static uint16_t g_cov[NR]; /* child: tokens known covered, per recipe */
static kv_stats_t g_obs;   /* child: the stats after the last call    */

static void say(uint32_t type, uint32_t id)
{
    msg_t m = {.h = {.type = type, .id = id}};
    if (type == M_ACK)
        memcpy(m.cov, g_cov, sizeof m.cov);
    kvt_crash_say(&g_crash, &m);
}

/* Before a call that may drop nodes or free their copies' slots (the
 * small file only: the big one never fills). */
static void risk(void)
{
    if (g_m.small)
        say(M_RISK, 0);
}

/* After every call: did a node leave the cache, or a copy its slots? (An
 * eviction that did not demote, a drop, a bad read-back, fewer slots.)
 * With the big file that must not happen; with the small one it
 * withdraws every acknowledgement (which nodes went is not known). */
static void settle(kv_store_t *st)
{
    kv_stats_t s = kvt_pfx_stats(st);
    const int gone = s.prefix_evicted - s.prefix_file_demoted !=
                         g_obs.prefix_evicted - g_obs.prefix_file_demoted ||
                     s.prefix_file_dropped != g_obs.prefix_file_dropped ||
                     s.prefix_file_bad != g_obs.prefix_file_bad ||
                     s.prefix_file_slots < g_obs.prefix_file_slots;
    CHILD_CHECK(g_m.small || !gone, 0);
    if (gone) {
        memset(g_cov, 0, sizeof g_cov);
        say(M_WITHDRAW, (uint32_t)(s.prefix_file_dropped - g_obs.prefix_file_dropped));
    } else if (g_m.at_risk) {
        say(M_SAFE, 0);
    }
    g_obs = s;
}

static void cover(uint32_t r, uint32_t n)
{
    if (n > g_cov[r])
        g_cov[r] = (uint16_t)n;
}

/* Open the file; clean: after this child's own kv_store_destroy (else
 * after the parent's, which dropped every node it could not restore). */
static kv_store_t *child_open(int clean)
{
    kvt_crash_phase(&g_crash, g_m.file ? PH_OPEN : PH_CREATE_FILE);
    kv_config_t c = config(g_m.file ? KV_OFFLOAD_OPEN : 0, POOL, g_m.small ? SMALL : SLOTS);
    kv_store_t *st = NULL;
    int rc = kv_store_create(&c, &st);
    CHILD_CHECK(rc == 0, rc);
    g_m.file = 1;
    CHILD_CHECK((rc = kv_store_check(st)) == 0, rc);
    g_obs = kvt_pfx_stats(st);
    /* With the small file a clean shutdown may leave a node on the file
     * whose parent stayed in the pool without a copy (the file was full):
     * its record is not linked, counted in prefix_file_bad. */
    CHILD_CHECK(g_obs.prefix_file_bad == 0 || (clean && g_m.small), 0);
    if (g_obs.prefix_file_bad)
        say(M_ORPHANS, (uint32_t)g_obs.prefix_file_bad);
    /* sequences restored from the file: not this test's subject */
    kv_seq_id_t ids[16];
    uint32_t n = 0;
    kv_store_seqs(st, ids, 16, &n);
    for (uint32_t i = 0; i < n && i < 16; i++) {
        kvt_crash_phase(&g_crash, PH_FREE);
        CHILD_CHECK((rc = kv_seq_free(st, ids[i])) == 0, rc);
    }
    memcpy(g_cov, g_m.acked, sizeof g_cov);
    return st;
}

static int sync_ack(kv_store_t *st)
{
    kvt_crash_phase(&g_crash, PH_SYNC);
    const uint64_t io0 = g_obs.io_errors;
    int rc = kv_store_offload_sync(st);
    CHILD_CHECK(rc == 0 || rc == -ENOSPC, rc);
    settle(st);
    /* the copies are best effort: with COPY_MAX slots still free none was
     * refused (a sync only takes slots), and none failed (no I/O error) */
    const int all = g_obs.offload_slots - g_obs.offload_slots_used >= COPY_MAX &&
                    g_obs.io_errors == io0;
    CHILD_CHECK(g_m.small || rc || all, 0);
    if (rc == 0)
        say(all ? M_ACK : M_NOACK, 0);
    return rc;
}

typedef struct live {
    kv_seq_id_t q[LIVE];
    uint32_t n;
} live_t;

static void live_free(kv_store_t *st, live_t *lv, uint32_t i)
{
    kvt_crash_phase(&g_crash, PH_FREE);
    int rc = kv_seq_free(st, lv->q[i]);
    CHILD_CHECK(rc == 0, rc);
    lv->q[i] = lv->q[--lv->n];
    settle(st);
}

/* One request for recipe r: match (checked), append the rest in chunks,
 * publishing after each; kept live or freed. */
static void request(kv_store_t *st, live_t *lv, uint32_t r, uint64_t *s)
{
    const int32_t *p = g_prompt[r / NK];
    const uint32_t n = g_len[r / NK];
    if (lv->n == LIVE)
        live_free(st, lv, 0);
    kvt_crash_phase(&g_crash, PH_MATCH);
    kv_seq_id_t q;
    uint32_t m = 0;
    int rc = seq_new(st, r, &q);
    CHILD_CHECK(rc == 0, rc);
    risk();
    CHILD_CHECK((rc = kv_seq_prefix_match(st, q, p, n, NULL, 0, &m)) == 0, rc);
    settle(st);
    CHILD_CHECK(m < n && holds(st, q, r, m), 0);
    cover(r, m);
    for (uint32_t t = m; t < n;) {
        uint32_t c = (kv_test_rand(s) & 1) ? 16u * (1 + (uint32_t)(kv_test_rand(s) % 4))
                                           : 1 + (uint32_t)(kv_test_rand(s) % 80);
        if (c > n - t)
            c = n - t;
        kvt_crash_phase(&g_crash, PH_APPEND);
        risk();
        rc = kvt_pfx_feed(st, q, p, t, c, L, H, D);
        settle(st);
        if (rc == KV_ENOMEM) { /* the pool is full of live sequences */
            kvt_crash_phase(&g_crash, PH_FREE);
            CHILD_CHECK((rc = kv_seq_free(st, q)) == 0, rc);
            return;
        }
        CHILD_CHECK(rc == 0, rc);
        t += c;
        kvt_crash_phase(&g_crash, PH_PUBLISH);
        rc = kv_seq_prefix_publish(st, q, p, t, NULL, 0);
        CHILD_CHECK(rc >= 0, rc);
        settle(st);
        cover(r, (uint32_t)rc);
    }
    lv->q[lv->n++] = q;
    if (kv_test_rand(s) & 1)
        live_free(st, lv, lv->n - 1);
}

static void child_main(void *arg)
{
    uint64_t s = *(const uint64_t *)arg;
    live_t lv = {.n = 0};
    kv_store_t *st = child_open(0);
    for (;;) {
        const uint32_t dice = (uint32_t)(kv_test_rand(&s) % 100);
        const uint32_t pick = lv.n ? (uint32_t)(kv_test_rand(&s) % lv.n) : 0;
        int rc;
        if (dice < 60 || (!lv.n && dice < 82)) {
            request(st, &lv, (uint32_t)(kv_test_rand(&s) % NR), &s);
        } else if (dice < 68 && lv.n) {
            kvt_crash_phase(&g_crash, PH_OFFLOAD);
            risk();
            rc = kv_seq_offload(st, lv.q[pick]);
            CHILD_CHECK(rc == 0 || rc == -ENOSPC, rc);
            if (kv_test_rand(&s) & 1)
                CHILD_CHECK((rc = kv_seq_wait(st, lv.q[pick])) == 0, rc);
            settle(st);
        } else if (dice < 73 && lv.n) {
            kvt_crash_phase(&g_crash, PH_PREFETCH);
            rc = kv_seq_prefetch(st, lv.q[pick]);
            CHILD_CHECK(rc == 0 || rc == KV_ENOMEM, rc);
            CHILD_CHECK((rc = kv_seq_wait(st, lv.q[pick])) == 0, rc);
            settle(st);
        } else if (dice < 82 && lv.n) {
            live_free(st, &lv, pick);
        } else if (dice < 96) {
            sync_ack(st);
        } else {
            /* a clean restart: every node comes back (with the small
             * file, those whose copy it took) */
            sync_ack(st);
            const uint64_t nodes = kvt_pfx_stats(st).prefix_nodes;
            kvt_crash_phase(&g_crash, PH_DESTROY);
            kv_store_destroy(st);
            lv.n = 0;
            st = child_open(1);
            kv_stats_t a = kvt_pfx_stats(st);
            CHILD_CHECK(a.prefix_file_restored == a.prefix_nodes, 0);
            CHILD_CHECK(g_m.small ? a.prefix_nodes <= nodes : a.prefix_nodes == nodes, 0);
        }
    }
}

/* ---- the parent ---------------------------------------------------------------- */

typedef struct figures {
    long kills, by_phase[PH_COUNT], checked, hits, tokens, hits_kind[NK], restored,
        file_hits, bad_restore, bad_read, dropped, acked_checked, acked_tokens, wrong,
        acked_lost, half_made, rounds_no_file, busy_retries, seqs_restored, small_rounds,
        withdrawn, child_dropped, noack, risk_kills, orphans;
} figures_t;

/* Open after a kill, check every recipe, then sync: our acknowledgement. */
static void verify(model_t *m, figures_t *f)
{
    kv_config_t c = config(KV_OFFLOAD_OPEN, 4096, 0);
    kv_store_t *st = NULL;
    f->withdrawn += m->withdrawn;
    f->child_dropped += m->dropped;
    f->noack += m->noack;
    f->orphans += m->orphans;
    m->withdrawn = m->dropped = m->noack = m->orphans = 0;
    if (m->at_risk) { /* killed inside a call that may have dropped nodes */
        f->risk_kills++;
        memset(m->acked, 0, sizeof m->acked);
        m->at_risk = 0;
    }
    int rc = kvt_crash_open(&c, &st, &f->busy_retries);
    if (rc == -ENOENT) { /* killed before the first create finished */
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s%s", g_path, KV_OFFLOAD_NEW_SUFFIX);
        f->half_made += access(tmp, F_OK) == 0;
        for (uint32_t r = 0; r < NR; r++)
            CHECK_EQ(m->acked[r], 0);
        const int small = m->small;
        memset(m, 0, sizeof *m);
        m->small = small;
        return;
    }
    CHECK_OK(rc);
    if (rc)
        return;
    CHECK_OK(kv_store_check(st));
    kv_stats_t s0 = kvt_pfx_stats(st);
    f->restored += (long)s0.prefix_file_restored;
    f->bad_restore += (long)s0.prefix_file_bad;
    kv_seq_id_t ids[16];
    uint32_t n = 0;
    CHECK_OK(kv_store_seqs(st, ids, 16, &n));
    f->seqs_restored += n;
    for (uint32_t i = 0; i < n && i < 16; i++)
        CHECK_OK(kv_seq_free(st, ids[i]));
    uint16_t got[NR];
    for (uint32_t r = 0; r < NR; r++) {
        const uint32_t len = g_len[r / NK];
        kv_seq_id_t q;
        uint32_t mt = 0;
        CHECK_OK(seq_new(st, r, &q));
        CHECK_OK(kv_seq_prefix_match(st, q, g_prompt[r / NK], len + 1, NULL, 0, &mt));
        CHECK(mt <= len / 16 * 16 && (r % NK == 0 || mt % R == 0));
        f->checked++;
        f->hits += mt > 0;
        f->hits_kind[r % NK] += mt > 0;
        f->tokens += mt;
        if (!holds(st, q, r, mt)) {
            fprintf(stderr, "recipe %u (%s, %u tokens): a hit of %u tokens differs\n", r,
                    g_kind[r % NK], len, mt);
            f->wrong++;
        }
        if (m->acked[r]) {
            f->acked_checked++;
            f->acked_tokens += m->acked[r];
        }
        if (mt < m->acked[r]) {
            fprintf(stderr, "recipe %u (%s): %u tokens acknowledged, %u matched\n", r,
                    g_kind[r % NK], m->acked[r], mt);
            f->acked_lost++;
        }
        got[r] = (uint16_t)mt;
        CHECK_OK(kv_seq_free(st, q));
    }
    kv_stats_t s1 = kvt_pfx_stats(st);
    f->file_hits += (long)s1.prefix_file_hits;
    f->bad_read += (long)(s1.prefix_file_bad - s0.prefix_file_bad);
    f->dropped += (long)s1.prefix_file_dropped;
    CHECK_OK(kv_store_check(st));
    rc = kv_store_offload_sync(st);
    CHECK_OK(rc);
    kv_store_destroy(st);
    memcpy(m->acked, got, sizeof got);
    if (rc) /* not acknowledged */
        memset(m->acked, 0, sizeof m->acked);
    m->file = 1;
}

int main(int argc, char **argv)
{
    long kills = argc > 1 ? atol(argv[1]) : 120;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : 1;
    kvt_dir_t dir;
    kvt_dir_make(&dir);
    kvt_path(&dir, "pcrash.kvp", g_path);
    recipes(seed);
    kv_config_t rc_cfg = config(0, 512, 0);
    rc_cfg.prefix_cache = 0;
    rc_cfg.prefix_model = NULL;
    rc_cfg.prefix_model_len = 0;
    rc_cfg.offload_path = NULL;
    rc_cfg.offload_pages = rc_cfg.offload_qd = 0;
    rc_cfg.max_seqs = 4;
    CHECK_OK(kv_store_create(&rc_cfg, &g_ref));
    figures_t f = {0};
    const double t0 = kvt_now_s();
    uint64_t s = seed;
    for (long round = 0; round < kills; round++) {
        const int early = round % 16 == 5; /* no file, kill within a few ms */
        if (early) { /* every other new file is the small one */
            kv_offload_unlink(g_path);
            memset(&g_m, 0, sizeof g_m);
            g_m.small = (int)(f.rounds_no_file++ % 2 == 0);
        }
        f.small_rounds += g_m.small;
        const double delay = early ? (double)(kv_test_rand(&s) % 4000) * 1e-6
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
            fprintf(stderr, "%ld kills, %ld nodes restored, %ld hits, %ld wrong, %ld lost\n",
                    f.kills, f.restored, f.hits, f.wrong, f.acked_lost);
    }
    CHECK_EQ(f.wrong, 0);
    CHECK_EQ(f.acked_lost, 0);
    CHECK(f.kills == kills);
    printf("{\"kills\":%ld,\"kills_by_phase\":{", f.kills);
    for (int i = 0; i < PH_COUNT; i++)
        printf("%s\"%s\":%ld", i ? "," : "", g_phase[i], f.by_phase[i]);
    printf("},\"recipes_checked\":%ld,\"hits\":%ld,\"hits_by_kind\":{", f.checked, f.hits);
    for (uint32_t k = 0; k < NK; k++)
        printf("%s\"%s\":%ld", k ? "," : "", g_kind[k], f.hits_kind[k]);
    printf("},\"tokens_matched\":%ld,\"nodes_restored\":%ld,\"nodes_read_back\":%ld,"
           "\"prefix_file_bad_restore\":%ld,\"prefix_file_bad_read\":%ld,"
           "\"prefix_file_dropped\":%ld,\"acked_checked\":%ld,\"acked_tokens\":%ld,"
           "\"silently_wrong\":%ld,\"acked_lost\":%ld,\"small_file_rounds\":%ld,"
           "\"child_dropped\":%ld,\"acks_withdrawn\":%ld,\"syncs_not_acked\":%ld,"
           "\"kills_at_risk\":%ld,\"clean_restart_orphans\":%ld,\"seqs_restored\":%ld,"
           "\"half_made_replaced\":%ld,"
           "\"rounds_without_file\":%ld,\"busy_retries\":%ld,\"seconds\":%.1f}\n",
           f.tokens, f.restored, f.file_hits, f.bad_restore, f.bad_read, f.dropped,
           f.acked_checked, f.acked_tokens, f.wrong, f.acked_lost, f.small_rounds,
           f.child_dropped, f.withdrawn, f.noack, f.risk_kills, f.orphans, f.seqs_restored,
           f.half_made,
           f.rounds_no_file, f.busy_retries, kvt_now_s() - t0);
    kv_store_destroy(g_ref);
    kv_offload_unlink(g_path);
    kvt_dir_remove(&dir);
    return kv_test_end();
}
