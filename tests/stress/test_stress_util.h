/* SPDX-License-Identifier: MIT */
/*
 * test_stress_util.h — the driver runs shared by the `kvpage stress` test
 * programs (test_stress_cli.c, test_stress_offload.c): a small fixed shape
 * (4 layers, GQA 4/2, head_dim 32, pool 192 pages, 12 sequences, lengths
 * uniform 4-80 in / 4-120 out) and one run to an op count, summed up in a
 * run_result_t that two runs can be compared by (memcmp).
 *
 * The including program compiles tools/kvpage/stress_*.c into itself
 * first (this header only uses their declarations).
 */
#ifndef TEST_STRESS_UTIL_H
#define TEST_STRESS_UTIL_H

#include <string.h>

#include "kv_test.h"
#include "tools/kvpage/stress_driver.h"

#define TSU_HD 32 /* head_dim of the driver runs */

/* A driver config; with path, a page file there (pages: 2 x pool), faults
 * at ppm, the pread engine when pread. mix is parsed from policy. */
static inline void tsu_cfg(stress_cfg_t *cfg, stress_mix_t *mix, const char *policy,
                           uint64_t seed, const char *path, uint32_t ppm, int pread)
{
    char err[512];
    *cfg = (stress_cfg_t){.layers = 4, .kv_heads = 2, .q_heads = 4, .head_dim = TSU_HD,
                          .pool = 192, .max_seqs = 12, .seed = seed, .rate = 0.7,
                          .verify_every = 2000, .mix = mix, .offload_path = path,
                          .offload_pages = path ? 384 : 0, .fault_ppm = ppm,
                          .offload_pread = pread};
    CHECK_OK(stress_dist_parse("uniform:4-80,4-120", &cfg->dist, err, sizeof err));
    CHECK_OK(stress_mix_parse(policy, cfg->layers, mix, err, sizeof err));
}

/* What a run did (all counters; zero-filled, so memcmp compares runs). */
typedef struct run_result {
    uint64_t ops, op_count[STRESS_OP_COUNT], ev_count[STRESS_EV_COUNT];
    uint64_t alloc_failures, violations, leaks;
    stress_off_count_t off;
    uint64_t enotres, faults, io_errors, pages_out, pages_in, slots_used;
} run_result_t;

/* Run a driver (tsu_cfg) to at least `ops` ops, finish it, sum it up. */
static inline run_result_t tsu_run(const char *policy, uint64_t seed, uint64_t ops,
                                   const char *path, uint32_t ppm, int pread)
{
    stress_cfg_t cfg;
    stress_mix_t mix;
    stress_driver_t d;
    run_result_t r;
    char err[512];
    memset(&r, 0, sizeof r);
    tsu_cfg(&cfg, &mix, policy, seed, path, ppm, pread);
    CHECK_OK(stress_driver_create(&cfg, &d, stderr, err, sizeof err));
    while (d.ops < ops)
        stress_driver_step(&d);
    stress_driver_finish(&d);
    r.ops = d.ops;
    memcpy(r.op_count, d.op_count, sizeof r.op_count);
    memcpy(r.ev_count, d.ev_count, sizeof r.ev_count);
    r.alloc_failures = d.alloc_failures;
    r.violations = d.vf.violations;
    r.leaks = d.vf.leaks;
    r.off = d.off;
    r.enotres = d.vf.enotres;
    r.faults = d.final.offload_faults;
    r.io_errors = d.final.io_errors;
    r.pages_out = d.final.pages_out;
    r.pages_in = d.final.pages_in;
    r.slots_used = d.final.offload_slots_used;
    stress_driver_destroy(&d);
    stress_mix_destroy(&mix);
    return r;
}

#endif /* TEST_STRESS_UTIL_H */
