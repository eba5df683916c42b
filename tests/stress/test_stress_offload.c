/* SPDX-License-Identifier: MIT */
/*
 * test_stress_offload.c — `kvpage stress` with a page file (tools/kvpage/
 * stress_offload.c and the offload parts of the verifier, from the kvtool
 * library):
 *   - the verifier on a real store with a page file: a sequence on the file
 *     reads as KV_ENOTRES (accepted only where the shadow says so, and at
 *     least one list must); planted: a shadow that claims resident pages
 *     that are on the file, a shadow that claims pages on the file that are
 *     all back; kv_seq_wait checks: a lost page with a 0 result (a silent
 *     loss), residency that does not add up, a non-I/O error; a real lost
 *     page (every transfer faulted) is reported, never read as data, and
 *     claiming it fine is caught; an offloaded sequence left behind is a
 *     leak (its slots included);
 *   - the driver: short fixed-seed runs with a page file, without and with
 *     injected faults (both engines where io_uring runs), are clean, offload,
 *     prefetch, wait, balance, probe KV_ENOTRES, lose pages under faults and
 *     free those sequences, leave no slot or page behind, and are
 *     deterministic; planted: a shadow altered while its sequence was on
 *     the file is caught when it comes back, and a sequence the driver
 *     thinks resident but is on the file is caught by verification.
 * The page files live in a mkdtemp() directory under $KV_OFFLOAD_TEST_DIR or
 * the current directory (removed at the end).
 */
#include <string.h>

#include "integration/test_offload_util.h"
#include "kv_test.h"
#include "tools/kvpage/stress_driver.h"
#include "tools/kvpage/stress_gen.h"
#include "tools/kvpage/stress_mix.h"
#include "tools/kvpage/stress_shadow.h"
#include "tools/kvpage/stress_verify.h"
#include "test_stress_util.h"

#define NL 2
#define NKV 2
#define HD 32

static kvt_dir_t g_dir;

/* A store of the verifier tests' shape with a page file at name, and a
 * verifier on it. */
static kv_store_t *vt_open(const char *name, uint32_t fault_ppm, stress_verifier_t *vf)
{
    char p[4096];
    kv_config_t cfg = kv_config_default();
    cfg.n_layers = NL;
    cfg.n_q_heads = 2 * NKV;
    cfg.n_kv_heads = NKV;
    cfg.head_dim = HD;
    cfg.host_pages = 256;
    cfg.max_seqs = 16;
    cfg.n_threads = 1;
    cfg.offload_path = kvt_path(&g_dir, name, p);
    cfg.offload_pages = 512;
    cfg.offload_flags = KV_OFFLOAD_PREAD; /* faults reproducible */
    cfg.offload_fault_ppm = fault_ppm;
    cfg.offload_fault_seed = 9;
    kv_store_t *st = NULL;
    CHECK_OK(kv_store_create(&cfg, &st));
    CHECK_OK(stress_verifier_init(vf, st, 42, NULL));
    return st;
}

static void vt_remove(const char *name)
{
    char p[4096];
    CHECK_OK(kv_offload_unlink(kvt_path(&g_dir, name, p)));
}

/* A sequence with n tokens in every layer, as its shadow says. */
static stress_shadow_t vt_seq(kv_store_t *st, uint64_t seed, uint32_t n,
                              const stress_check_t *chk)
{
    static float k[256 * NKV * HD], v[256 * NKV * HD];
    static int32_t pos[256];
    stress_shadow_t s;
    kv_seq_id_t id = 0;
    CHECK_OK(kv_seq_create(st, &id));
    stress_shadow_init(&s, id, 1 + id, NL, chk);
    for (uint32_t l = 0; l < NL; l++) {
        stress_shadow_values(&s, seed, l, n, NKV, HD, k, v, pos);
        CHECK_OK(kv_append(st, id, l, n, KV_DTYPE_F32, k, v, pos));
        stress_shadow_append(&s, l, n);
    }
    return s;
}

static kv_residency_t vt_res(kv_store_t *st, kv_seq_id_t id)
{
    kv_residency_t r;
    memset(&r, 0, sizeof r);
    CHECK_OK(kv_seq_residency(st, id, &r));
    return r;
}

static void test_verify_offload(void)
{
    stress_check_t exact = {0};
    stress_verifier_t vf;
    kv_store_t *st = vt_open("v.kvp", 0, &vf);
    stress_shadow_t a = vt_seq(st, 42, 100, &exact);
    CHECK_EQ(stress_verify_seq(&vf, &a), 0);

    CHECK_OK(kv_seq_offload(st, a.id));
    int rc = kv_seq_wait(st, a.id);
    CHECK_EQ(rc, 0);
    kv_residency_t r = vt_res(st, a.id);
    CHECK(r.pages > 0 && r.on_file == r.pages && r.resident == 0);
    CHECK_EQ(stress_verify_wait(&vf, &a, rc, &r), 0);
    a.res = STRESS_RES_RESIDENT; /* planted: the shadow claims resident pages */
    CHECK_EQ(stress_verify_seq(&vf, &a), NL * NKV);
    a.res = STRESS_RES_ON_FILE;
    uint64_t e0 = vf.enotres;
    CHECK_EQ(stress_verify_seq(&vf, &a), 0);
    CHECK_EQ(vf.enotres, e0 + NL * NKV);
    a.res = STRESS_RES_WRITING; /* data or KV_ENOTRES, none required */
    CHECK_EQ(stress_verify_seq(&vf, &a), 0);
    const stress_shadow_t *live[] = {&a};
    a.res = STRESS_RES_ON_FILE;
    CHECK_EQ(stress_verify_store(&vf, live, 1), 0);

    /* an offloaded sequence left behind leaks its sequence, metadata, slots */
    kv_stats_t s0 = {.struct_size = sizeof s0};
    CHECK_OK(kv_store_stats(st, &s0));
    CHECK(s0.offload_slots_used > 0 && s0.pages_used == 0);
    uint64_t l0 = vf.leaks;
    CHECK_EQ(stress_verify_empty(&vf, s0.meta_bytes), 2); /* sequence, page file */

    CHECK_OK(kv_seq_prefetch(st, a.id));
    a.res = STRESS_RES_READING; /* lengths only: the page-in is in flight */
    uint64_t sk0 = vf.skipped;
    CHECK_EQ(stress_verify_seq(&vf, &a), 0);
    CHECK_EQ(vf.skipped, sk0 + NL * NKV);
    rc = kv_seq_wait(st, a.id);
    r = vt_res(st, a.id);
    CHECK(rc == 0 && r.on_file == 0 && r.resident == r.pages);
    CHECK_EQ(stress_verify_wait(&vf, &a, rc, &r), 0);
    a.res = STRESS_RES_RESIDENT;
    CHECK_EQ(stress_verify_seq(&vf, &a), 0); /* read back bit-exact */
    a.res = STRESS_RES_ON_FILE; /* planted: the shadow thinks pages are still out */
    CHECK_EQ(stress_verify_seq(&vf, &a), 1);
    stress_shadow_t bad = a; /* another origin: the read-back check would see it */
    bad.res = STRESS_RES_RESIDENT;
    bad.lineage[0].origin++;
    CHECK_EQ(stress_verify_seq(&vf, &bad), NL * NKV);

    /* kv_seq_wait's result against the residency (planted values) */
    kv_residency_t p = {.pages = 10, .resident = 8, .on_file = 2, .lost = 1};
    CHECK_EQ(stress_verify_wait(&vf, &a, 0, &p), 1);           /* a silent loss */
    CHECK_EQ(stress_verify_wait(&vf, &a, KV_ECORRUPT, &p), 0); /* reported */
    CHECK_EQ(stress_verify_wait(&vf, &a, -5 /* -EIO */, &p), 0);
    CHECK_EQ(stress_verify_wait(&vf, &a, KV_ENOENT, &p), 1);   /* not an I/O error */
    p.in_flight = 1; /* after a wait nothing is in flight */
    CHECK_EQ(stress_verify_wait(&vf, &a, KV_EIO, &p), 1);
    p = (kv_residency_t){.pages = 10, .resident = 7, .on_file = 2};
    CHECK_EQ(stress_verify_wait(&vf, &a, 0, &p), 1); /* does not add up */
    p = (kv_residency_t){.pages = 10, .resident = 9, .on_file = 1, .lost = 2};
    CHECK_EQ(stress_verify_wait(&vf, &a, KV_EIO, &p), 1); /* more lost than on file */

    CHECK_OK(kv_seq_free(st, a.id));
    CHECK_OK(kv_store_stats(st, &s0));
    CHECK_EQ(stress_verify_empty(&vf, s0.meta_bytes), 0);
    CHECK_EQ(vf.leaks, l0 + 2);
    stress_verifier_destroy(&vf);
    kv_store_destroy(st);
    vt_remove("v.kvp");
}

/* Every transfer faulted: pages get lost, reported, never read as data. */
static void test_verify_lost(void)
{
    stress_check_t exact = {0};
    stress_verifier_t vf;
    kv_store_t *st = vt_open("lost.kvp", 1000000, &vf);
    stress_shadow_t a = vt_seq(st, 42, 160, &exact);
    CHECK_OK(kv_seq_offload(st, a.id));
    int rc = kv_seq_wait(st, a.id);
    kv_residency_t r = vt_res(st, a.id);
    CHECK(stress_io_error(rc)); /* some writes failed: reported once */
    CHECK_EQ(stress_verify_wait(&vf, &a, rc, &r), 0);
    CHECK(r.on_file > 0);
    CHECK_OK(kv_seq_prefetch(st, a.id));
    rc = kv_seq_wait(st, a.id);
    r = vt_res(st, a.id);
    CHECK(r.lost > 0 && stress_io_error(rc));
    CHECK_EQ(stress_verify_wait(&vf, &a, rc, &r), 0);
    a.res = STRESS_RES_ON_FILE; /* lost pages answer KV_ENOTRES, the rest reads right */
    CHECK_EQ(stress_verify_seq(&vf, &a), 0);
    CHECK_EQ(stress_verify_wait(&vf, &a, 0, &r), 1); /* planted: the loss called fine */
    a.res = STRESS_RES_RESIDENT;                       /* planted: "it all came back" */
    CHECK(stress_verify_seq(&vf, &a) > 0);
    kv_stats_t s = {.struct_size = sizeof s};
    CHECK_OK(kv_store_stats(st, &s));
    CHECK(s.offload_faults > 0 && s.pages_lost == r.lost);
    CHECK_OK(kv_seq_free(st, a.id));
    CHECK_OK(kv_store_stats(st, &s));
    CHECK(s.offload_slots_used == 0 && s.pages_lost == 0 && s.pages_used == 0);
    stress_verifier_destroy(&vf);
    kv_store_destroy(st);
    vt_remove("lost.kvp");
}

/* ---- the driver ------------------------------------------------------------ */

/* A driver run with a page file in the scratch directory (removed). */
static run_result_t off_run(const char *policy, uint64_t seed, uint64_t ops, uint32_t ppm,
                            int pread)
{
    char p[4096];
    run_result_t r = tsu_run(policy, seed, ops, kvt_path(&g_dir, "run.kvp", p), ppm, pread);
    CHECK_OK(kv_offload_unlink(p));
    return r;
}

static void test_driver_offload(void)
{
    const char *mix = "none|kivi2|h2o:hh=0.1,rw=0.1+cam|minicache+int4|snapkv+int4";
    run_result_t a = off_run(mix, 1, 12000, 0, 0), b = off_run(mix, 1, 12000, 0, 1);
    CHECK_EQ(a.violations, 0);
    CHECK_EQ(a.leaks, 0);
    CHECK(a.off.offloads > 0 && a.off.prefetches > 0 && a.off.read_back > 0);
    CHECK(a.off.waits > 0 && a.off.balances > 0 && a.off.balance_pages > 0);
    CHECK(a.off.enotres_checked > 0 && a.enotres > 0);
    CHECK(a.pages_out > 0 && a.pages_in > 0 && a.slots_used == 0);
    CHECK(a.faults == 0 && a.io_errors == 0 && a.off.lost_seqs == 0);
    CHECK(!memcmp(&a, &b, sizeof a)); /* io_uring or pread: the same run */

    run_result_t f = off_run(mix, 3, 12000, 20000, 1), g = off_run(mix, 3, 12000, 20000, 1);
    CHECK_EQ(f.violations, 0);
    CHECK_EQ(f.leaks, 0);
    CHECK(f.faults > 0 && f.io_errors > 0 && f.off.wait_errors > 0);
    CHECK(f.off.lost_reports > 0 && f.off.pages_lost > 0 && f.off.lost_seqs > 0);
    CHECK_EQ(f.ev_count[STRESS_EV_LOST], f.off.lost_seqs);
    CHECK(f.off.read_back > 0 && f.slots_used == 0);
    CHECK(!memcmp(&f, &g, sizeof f)); /* same seed, same faults, same run */
    run_result_t u = off_run("none", 4, 8000, 20000, 0); /* the default engine */
    CHECK_EQ(u.violations, 0);
    CHECK_EQ(u.leaks, 0);
    CHECK(u.faults > 0 && u.slots_used == 0);
}

/* Step d until some slot is on the file (settled); its index. */
static int off_until_on_file(stress_driver_t *d)
{
    for (int it = 0; it < 2000; it++) {
        stress_driver_step(d);
        for (uint32_t i = 0; i <= d->cfg.max_seqs; i++)
            if (d->slots[i].used && d->slots[i].sh.res == STRESS_RES_ON_FILE)
                return (int)i;
    }
    return -1;
}

static void test_driver_planted(void)
{
    stress_cfg_t cfg;
    stress_mix_t mix;
    stress_driver_t d;
    char err[512], p[4096];
    kvt_path(&g_dir, "planted.kvp", p);
    tsu_cfg(&cfg, &mix, "none", 5, p, 0, 1);
    CHECK_OK(stress_driver_create(&cfg, &d, NULL, err, sizeof err));
    int i = off_until_on_file(&d);
    CHECK(i >= 0);
    if (i >= 0) {
        CHECK_EQ(stress_driver_verify(&d), 0);
        d.slots[i].sh.res = STRESS_RES_RESIDENT; /* the driver forgot it went out */
        CHECK(stress_driver_verify(&d) > 0);
        d.slots[i].sh.res = STRESS_RES_ON_FILE;
        uint64_t v0 = d.vf.violations;
        d.slots[i].sh.lineage[0].origin += 1000; /* shadow altered while on the file */
        stress_off_prefetch_slot(&d, i);
        CHECK_EQ(d.slots[i].sh.res, STRESS_RES_READING);
        stress_off_settle(&d, i); /* back: the read-back check sees the difference */
        CHECK(d.vf.violations > v0);
        CHECK(d.off.read_back > 0);
    }
    stress_driver_finish(&d);
    stress_driver_destroy(&d);
    stress_mix_destroy(&mix);
    CHECK_OK(kv_offload_unlink(p));
}

int main(void)
{
    kvt_dir_make(&g_dir);
    test_verify_offload();
    test_verify_lost();
    test_driver_offload();
    test_driver_planted();
    kvt_dir_remove(&g_dir);
    return kv_test_end();
}
