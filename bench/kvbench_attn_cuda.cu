/* SPDX-License-Identifier: MIT */
/*
 * kvbench_attn_cuda.cu — `kvbench-attn --backend cuda`: paged decode attention
 * on the GPU per page format, against the device-to-device copy bandwidth
 * and the FP16 rows measured in the same run.
 *
 * Pages: per format, a pool of distinct device pages (up to --pool-mib MiB,
 * default 4096) filled with real encoded data: 256 pages written on the host
 * by the C format code (FP16 rows, INT4/INT2 stores of random values,
 * MERGED pages through kv_fmt_merged_put), copied up and replicated on the
 * device. A point (ctx, batch) is batch * n_kv lists of ctx tokens of one
 * format, every page full but each list's last (MERGED: every list of one
 * variant, no retained pages: the merged half alone); the page table is
 * built by kv_cuda_plan_build (device mode) as the backend builds it.
 * Pages are taken from the pool in order, so a call reads distinct pages as
 * long as its pages fit the pool (row field "distinct"); calls rotate over
 * disjoint page ranges (a base pointer offset) so that consecutive calls
 * do not find their pages in L2 when the pool has room for it.
 *
 * Timing: CUDA events around each call (kv_cuda_attn_launch only: the
 * device-resident page table, q and out; no host copies), formats
 * interleaved one call each in turn, median and best over the calls after
 * a warm-up. Baseline: cudaMemcpyAsync device-to-device of copy_bytes (>=
 * 8x L2), copy_gbps = 2 * bytes / time (bytes read + written: what the
 * memory moved), copy_read_gbps = bytes / time. frac_of_memcpy of a row is
 * gbps / copy_gbps, gbps = kv_bytes / time, kv_bytes = pages read * page
 * bytes (as the CPU rows count them; INT4 at head_dim 64 leaves 1 KiB of
 * a 4 KiB page unused, and the kernel does not read it).
 * Not measured here: PyTorch SDPA (no "torch_sdpa_us" field).
 *
 * Options (after --backend cuda): --json, --quick, --ctx N, --batch N,
 * --shape smollm|llama (9/3 or 32/8 heads, head_dim 64 or 128),
 * --min-time S, --pool-mib N, --device N; --threads is accepted and ignored.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kv_cuda_int.cuh"

#define _Static_assert static_assert /* the C11 headers below, in C++ */
extern "C" {
#include "alloc/kv_mem.h"
#include "formats/kv_fmt_merged.h"
#include "formats/kv_format.h"
}
#undef _Static_assert

namespace {

constexpr uint32_t N_BASE = 256;   /* pages encoded on the host per format */
constexpr uint32_t MAX_ROWS = 512; /* result rows                          */

struct opts_t {
    int json, quick, device;
    uint32_t only_ctx, only_batch, n_q, n_kv, d, pool_mib;
    double min_time;
};

struct row_t {
    uint32_t fmt, ctx, batch, partition, n_work, single_pass, distinct;
    double sec, sec_best, gbps, gbps_best, frac, frac_best, tps;
    double speedup, speedup_best, bytes_ratio;
    uint64_t kv_bytes;
    int err;
};

/* One format's device pages. */
struct pool_t {
    uint8_t *base;
    uint32_t pages, tpp;
};

double rand_unit(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)((*s >> 40) * (1.0 / 8388608.0)) - 1.0;
}

/* N_BASE host pages of format fmt, filled with random data. */
int host_pages(uint32_t fmt, const kv_page_geom_t *g, uint8_t *out)
{
    const uint32_t d = g->head_dim, pb = g->page_bytes;
    uint64_t s = 0x1234u + fmt;
    const uint32_t tpp = kv_format_get(fmt)->tokens_per_page(g);
    float *k = (float *)malloc((size_t)2 * tpp * d * sizeof(float));
    if (!k)
        return KV_ENOMEM;
    float *v = k + (size_t)tpp * d;
    memset(out, 0, (size_t)N_BASE * pb);
    for (uint32_t i = 0; i < N_BASE; i++) {
        uint8_t *page = out + (size_t)i * pb;
        for (size_t j = 0; j < (size_t)tpp * d; j++) {
            k[j] = (float)rand_unit(&s);
            v[j] = (float)rand_unit(&s);
        }
        if (fmt != KV_FMT_MERGED) {
            kv_format_get(fmt)->store(page, g, 0, tpp, KV_DTYPE_F32, k, v, d);
            continue;
        }
        kv_fmt_merged_init(page, g, KV_FMT_FP16);
        const uint32_t cap = kv_fmt_merged_capacity(g, KV_FMT_FP16);
        for (uint32_t t = 0; t < cap; t++) {
            float *ek = k + (size_t)t * d, *ev = v + (size_t)t * d;
            double nk = 0, nv = 0;
            for (uint32_t c = 0; c < d; c++) {
                nk += (double)ek[c] * ek[c];
                nv += (double)ev[c] * ev[c];
            }
            for (uint32_t c = 0; c < d; c++) {
                ek[c] = (float)(ek[c] / sqrt(nk));
                ev[c] = (float)(ev[c] / sqrt(nv));
            }
            const float norms[4] = {4.0f, 4.5f, 3.0f, 2.5f};
            kv_fmt_merged_put(page, g, t, ek, ev, norms);
        }
    }
    free(k);
    return 0;
}

/* MERGED pages hold FP16 directions here: their capacity. */
uint32_t fmt_tpp(uint32_t fmt, const kv_page_geom_t *g)
{
    return fmt == KV_FMT_MERGED ? kv_fmt_merged_capacity(g, KV_FMT_FP16)
                                : kv_format_get(fmt)->tokens_per_page(g);
}

int make_pool(uint32_t fmt, const kv_page_geom_t *g, uint32_t pages, pool_t *p)
{
    const size_t pb = g->page_bytes;
    p->pages = pages;
    p->tpp = fmt_tpp(fmt, g);
    uint8_t *h = (uint8_t *)malloc(N_BASE * pb);
    if (!h)
        return KV_ENOMEM;
    int rc = host_pages(fmt, g, h);
    if (!rc)
        rc = kv_cuda_status(cudaMalloc((void **)&p->base, (size_t)pages * pb));
    if (!rc)
        rc = kv_cuda_status(
            cudaMemcpy(p->base, h, N_BASE * pb, cudaMemcpyHostToDevice));
    for (size_t have = N_BASE; !rc && have < pages; have *= 2) {
        const size_t n = have < pages - have ? have : pages - have;
        rc = kv_cuda_status(cudaMemcpy(p->base + have * pb, p->base, n * pb,
                                       cudaMemcpyDeviceToDevice));
    }
    free(h);
    return rc;
}

/* Device copy bandwidth over `bytes`: median and best, GB/s of bytes read
 * + written. */
int copy_gbps(size_t bytes, double *med, double *best)
{
    uint8_t *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    int rc = kv_cuda_status(cudaMalloc((void **)&a, bytes));
    if (!rc)
        rc = kv_cuda_status(cudaMalloc((void **)&b, bytes));
    if (!rc)
        rc = kv_cuda_status(cudaMemset(a, 1, bytes));
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    double t[15];
    for (int i = 0; !rc && i < 15; i++) {
        cudaEventRecord(e0);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        rc = kv_cuda_status(cudaEventSynchronize(e1));
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        t[i] = ms * 1e-3;
    }
    if (!rc) {
        qsort(t + 3, 12, sizeof(double), [](const void *x, const void *y) {
            double p = *(const double *)x, q = *(const double *)y;
            return p < q ? -1 : p > q;
        });
        *med = 2.0 * bytes / (0.5 * (t[8] + t[9])) / 1e9;
        *best = 2.0 * bytes / t[3] / 1e9;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return rc;
}

/* One format of one point: its page table on the device, ready to launch. */
struct run_t {
    kv_cuda_attn_args_t a;
    kv_cuda_plan_t pl;
    uint8_t *dmem;         /* entries, work, list_work, seq_len, part  */
    uint32_t n_pages, rot; /* pages per call; rotations             */
    double *t;
    size_t n, cap;
};

void run_free(run_t *r)
{
    kv_cuda_plan_free(&r->pl);
    cudaFree(r->dmem);
    free(r->t);
    memset(r, 0, sizeof *r);
}

int run_setup(run_t *r, const opts_t *o, const kv_page_geom_t *g,
              const pool_t *pool, uint32_t fmt, uint32_t ctx, uint32_t batch,
              size_t l2, const float *q, float *out, uint32_t n_sm)
{
    memset(r, 0, sizeof *r);
    const uint32_t n_lists = batch * o->n_kv, pb = g->page_bytes;
    const uint32_t per_list = (ctx + pool->tpp - 1) / pool->tpp;
    const uint64_t n_pages = (uint64_t)per_list * n_lists;
    if (n_pages > 0x7fffffffu)
        return KV_ENOMEM;
    r->n_pages = (uint32_t)n_pages;
    kv_kern_page_t *pages = (kv_kern_page_t *)malloc(n_pages * sizeof *pages);
    uint32_t *indptr = (uint32_t *)malloc((n_lists + 1) * sizeof(uint32_t));
    uint32_t *len = (uint32_t *)malloc(n_lists * sizeof(uint32_t));
    int rc = pages && indptr && len ? 0 : KV_ENOMEM;
    for (uint32_t i = 0, e = 0; !rc && i < n_lists; i++) {
        indptr[i] = e;
        len[i] = ctx;
        for (uint32_t j = 0; j < per_list; j++, e++) {
            const uint32_t n =
                j + 1 < per_list ? pool->tpp : ctx - j * pool->tpp;
            pages[e].data = pool->base + (size_t)(e % pool->pages) * pb;
            pages[e].n_tokens = n;
            pages[e].format = fmt;
            pages[e].variant = fmt == KV_FMT_MERGED ? i % 2 : 0;
        }
        indptr[n_lists] = (uint32_t)n_pages;
    }
    kv_cuda_plan_in_t in;
    memset(&in, 0, sizeof in);
    in.mode = KV_CUDA_DECODE;
    in.geom = *g;
    in.n_q_heads = o->n_q;
    in.n_kv_heads = o->n_kv;
    in.n_lists = n_lists;
    in.n_new = 1;
    in.indptr = indptr;
    in.pages = pages;
    in.seq_len = len;
    in.n_sm = n_sm;
    in.dev_base = pool->base;
    in.dev_pages = pool->pages;
    if (!rc)
        rc = kv_cuda_plan_build(&in, &r->pl);
    const kv_cuda_plan_t *pl = &r->pl;
    size_t o_ents = 0,
           o_work = o_ents + (size_t)pl->n_ents * sizeof(kv_cuda_ent_t);
    size_t o_lw = o_work + (size_t)pl->n_work * sizeof(kv_cuda_work_t);
    size_t o_len = o_lw + (n_lists + 1) * sizeof(uint32_t);
    size_t o_part = (o_len + n_lists * sizeof(uint32_t) + 255) / 256 * 256;
    size_t part = pl->single_pass
                      ? 0
                      : kv_cuda_part_floats(pl->n_work, pl->n_rg, pl->rows_blk,
                                            g->head_dim) *
                            sizeof(float);
    if (!rc)
        rc = kv_cuda_status(cudaMalloc((void **)&r->dmem, o_part + part));
    if (!rc)
        rc = kv_cuda_status(
            cudaMemcpy(r->dmem + o_ents, pl->ents,
                       (size_t)pl->n_ents * sizeof(kv_cuda_ent_t),
                       cudaMemcpyHostToDevice));
    if (!rc)
        rc = kv_cuda_status(
            cudaMemcpy(r->dmem + o_work, pl->work,
                       (size_t)pl->n_work * sizeof(kv_cuda_work_t),
                       cudaMemcpyHostToDevice));
    if (!rc)
        rc = kv_cuda_status(cudaMemcpy(r->dmem + o_lw, pl->list_work,
                                       (n_lists + 1) * sizeof(uint32_t),
                                       cudaMemcpyHostToDevice));
    if (!rc)
        rc = kv_cuda_status(cudaMemcpy(r->dmem + o_len, len,
                                       n_lists * sizeof(uint32_t),
                                       cudaMemcpyHostToDevice));
    free(pages);
    free(indptr);
    free(len);
    if (rc)
        return rc;
    kv_cuda_attn_args_t &a = r->a;
    memset(&a, 0, sizeof a);
    a.mode = KV_CUDA_DECODE;
    a.head_dim = g->head_dim;
    a.page_bytes = pb;
    a.n_q_heads = o->n_q;
    a.n_kv_heads = o->n_kv;
    a.n_lists = n_lists;
    a.n_rows = pl->n_rows;
    a.rows_blk = pl->rows_blk;
    a.n_rg = pl->n_rg;
    a.scale = 1.0f / sqrtf((float)g->head_dim);
    a.pages = pool->base;
    a.ents = (const kv_cuda_ent_t *)(r->dmem + o_ents);
    a.work = (const kv_cuda_work_t *)(r->dmem + o_work);
    a.n_work = pl->n_work;
    a.list_work = (const uint32_t *)(r->dmem + o_lw);
    a.seq_len = (const uint32_t *)(r->dmem + o_len);
    a.q = q;
    a.out = out;
    a.part = part ? (float *)(r->dmem + o_part) : NULL;
    a.rotated = pl->rotated;
    /* rotations: disjoint page ranges while the pool has room, enough to
     * cover 4x L2 */
    const uint64_t call_bytes = n_pages * pb;
    uint64_t want = call_bytes ? (4 * l2 + call_bytes - 1) / call_bytes : 1;
    uint64_t room = n_pages <= pool->pages ? pool->pages / n_pages : 1;
    r->rot = (uint32_t)(want < room ? want : room);
    if (r->rot < 1)
        r->rot = 1;
    r->cap = 1 << 16;
    r->t = (double *)malloc(r->cap * sizeof(double));
    return r->t ? 0 : KV_ENOMEM;
}

/* One call (rotation i), timed when `record`. */
int run_call(run_t *r, const pool_t *pool, uint32_t pb, size_t i, int record,
             cudaEvent_t e0, cudaEvent_t e1)
{
    r->a.pages = pool->base + (size_t)(i % r->rot) * r->n_pages * pb;
    cudaEventRecord(e0);
    int rc = kv_cuda_attn_launch(&r->a, NULL);
    cudaEventRecord(e1);
    if (!rc)
        rc = kv_cuda_status(cudaEventSynchronize(e1));
    float ms = 0;
    if (!rc && record && r->n < r->cap) {
        cudaEventElapsedTime(&ms, e0, e1);
        r->t[r->n++] = ms * 1e-3;
    }
    return rc;
}

int cmp_d(const void *x, const void *y)
{
    double p = *(const double *)x, q = *(const double *)y;
    return p < q ? -1 : p > q;
}

const char *fmt_name(uint32_t f)
{
    static const char *const names[] = {"fp16", "int4", "int2", "merged"};
    return f < 4 ? names[f] : "?";
}

} // namespace

extern "C" int kvbench_attn_cuda(int argc, char **argv)
{
    opts_t o = {0, 0, 0, 0, 0, 9, 3, 64, 4096, 0.0};
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(s, "--json"))
            o.json = 1;
        else if (!strcmp(s, "--quick"))
            o.quick = 1;
        else if (!strcmp(s, "--backend") && v && !strcmp(v, "cuda"))
            i++;
        else if (!strcmp(s, "--threads") && v)
            i++;
        else if (!strcmp(s, "--ctx") && v)
            o.only_ctx = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(s, "--batch") && v)
            o.only_batch = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(s, "--min-time") && v)
            o.min_time = strtod(argv[++i], NULL);
        else if (!strcmp(s, "--pool-mib") && v)
            o.pool_mib = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(s, "--device") && v)
            o.device = (int)strtol(argv[++i], NULL, 10);
        else if (!strcmp(s, "--shape") && v && !strcmp(v, "llama")) {
            o.n_q = 32, o.n_kv = 8, o.d = 128;
            i++;
        } else if (!strcmp(s, "--shape") && v && !strcmp(v, "smollm")) {
            i++;
        } else {
            fprintf(stderr,
                    "usage: %s --backend cuda [--json] [--quick] [--ctx N] "
                    "[--batch N] [--shape smollm|llama] [--min-time S] "
                    "[--pool-mib N] [--device N]\n",
                    argv[0]);
            return 2;
        }
    }
    if (o.device >= kv_cuda_device_count() || o.device < 0) {
        fprintf(stderr, "%s: no CUDA device %d\n", argv[0], o.device);
        return 1;
    }
    cudaSetDevice(o.device);
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, o.device) != cudaSuccess)
        return 1;
    const kv_page_geom_t g = {o.d, 64u * o.d};
    const double min_time = o.min_time > 0 ? o.min_time : o.quick ? 0.05 : 0.25;
    const size_t l2 = (size_t)prop.l2CacheSize;
    size_t copy_bytes = (size_t)1 << 30;
    double copy = 0, copy_best = 0;
    int rc = copy_gbps(copy_bytes, &copy, &copy_best);
    pool_t pools[4];
    memset(pools, 0, sizeof pools);
    const uint64_t pool_pages64 =
        (uint64_t)o.pool_mib * 1048576u / g.page_bytes;
    const uint32_t pool_pages =
        (uint32_t)(pool_pages64 < N_BASE        ? N_BASE
                   : pool_pages64 > 0x7fffffffu ? 0x7fffffffu
                                                : pool_pages64);
    for (uint32_t f = 0; !rc && f < 4; f++)
        rc = make_pool(f, &g, pool_pages, &pools[f]);
    static const uint32_t ctxs[] = {1024, 4096, 16384, 32768, 131072};
    static const uint32_t batches[] = {1, 8, 32, 64, 256};
    static const uint32_t qctx[] = {1024, 32768}, qbat[] = {1, 32};
    const uint32_t *cl = o.quick ? qctx : ctxs, *bl = o.quick ? qbat : batches;
    size_t ncl = o.quick ? 2 : 5, nbl = o.quick ? 2 : 5;
    if (o.only_ctx)
        cl = &o.only_ctx, ncl = 1;
    if (o.only_batch)
        bl = &o.only_batch, nbl = 1;
    const size_t nq = (size_t)256 * o.n_q * o.d;
    float *q = NULL, *out = NULL;
    if (!rc)
        rc = kv_cuda_status(cudaMalloc((void **)&q, nq * sizeof(float)));
    if (!rc)
        rc = kv_cuda_status(cudaMalloc((void **)&out, nq * sizeof(float)));
    if (!rc) { /* q: small values, like scaled activations */
        float *h = (float *)malloc(nq * sizeof(float));
        uint64_t s = 99;
        for (size_t i = 0; h && i < nq; i++)
            h[i] = (float)rand_unit(&s);
        rc = h ? kv_cuda_status(cudaMemcpy(q, h, nq * sizeof(float),
                                           cudaMemcpyHostToDevice))
               : KV_ENOMEM;
        free(h);
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    row_t *rows = (row_t *)calloc(MAX_ROWS, sizeof(row_t));
    size_t nr = 0;
    for (size_t ci = 0; !rc && rows && ci < ncl; ci++)
        for (size_t bi = 0; bi < nbl && nr + 4 <= MAX_ROWS; bi++) {
            run_t runs[4];
            row_t *r = rows + nr;
            int err = 0;
            for (uint32_t f = 0; f < 4; f++) {
                r[f] = row_t{};
                r[f].fmt = f;
                r[f].ctx = cl[ci];
                r[f].batch = bl[bi];
                err = err ? err
                          : run_setup(&runs[f], &o, &g, &pools[f], f, cl[ci],
                                      bl[bi], l2, q, out,
                                      prop.multiProcessorCount);
                if (err)
                    memset(&runs[f], 0, sizeof runs[f]);
            }
            for (size_t i = 0; !err && i < 3; i++) /* warm-up */
                for (uint32_t f = 0; !err && f < 4; f++)
                    err = run_call(&runs[f], &pools[f], g.page_bytes, i, 0, e0,
                                   e1);
            double spent = 0;
            for (size_t i = 0; !err && (i < 7 || spent < 4 * min_time); i++)
                for (uint32_t f = 0; !err && f < 4; f++) {
                    err = run_call(&runs[f], &pools[f], g.page_bytes, i, 1, e0,
                                   e1);
                    if (!err)
                        spent += runs[f].t[runs[f].n - 1];
                }
            for (uint32_t f = 0; f < 4; f++) {
                run_t *u = &runs[f];
                r[f].err = err;
                if (!err && u->n) {
                    qsort(u->t, u->n, sizeof(double), cmp_d);
                    r[f].sec =
                        u->n % 2 ? u->t[u->n / 2]
                                 : 0.5 * (u->t[u->n / 2 - 1] + u->t[u->n / 2]);
                    r[f].sec_best = u->t[0];
                    r[f].kv_bytes = (uint64_t)u->n_pages * g.page_bytes;
                    r[f].gbps = r[f].kv_bytes / r[f].sec / 1e9;
                    r[f].gbps_best = r[f].kv_bytes / r[f].sec_best / 1e9;
                    r[f].frac = r[f].gbps / copy;
                    r[f].frac_best = r[f].gbps_best / copy_best;
                    r[f].tps = (double)cl[ci] * bl[bi] / r[f].sec;
                    r[f].partition = u->pl.partition;
                    r[f].n_work = u->pl.n_work;
                    r[f].single_pass = u->pl.single_pass;
                    r[f].distinct = u->n_pages <= pools[f].pages;
                }
                run_free(u);
            }
            for (uint32_t f = 0; !err && f < 4; f++) {
                r[f].speedup = r[0].sec / r[f].sec;
                r[f].speedup_best = r[0].sec_best / r[f].sec_best;
                r[f].bytes_ratio =
                    (double)r[f].kv_bytes / (double)r[0].kv_bytes;
            }
            nr += 4;
        }
    int status = rc ? 1 : 0;
    if (rc)
        fprintf(stderr, "cuda bench setup: %s\n", kv_strerror(rc));
    for (size_t i = 0; i < nr; i++)
        if (rows[i].err) {
            fprintf(stderr, "%s ctx %u batch %u: %s\n", fmt_name(rows[i].fmt),
                    rows[i].ctx, rows[i].batch, kv_strerror(rows[i].err));
            status = 1;
        }
    if (o.json) {
        printf("{\"bench\":\"attn\",\"backend\":\"cuda\",\"device\":\"%s\","
               "\"sm_count\":%d,\"l2_bytes\":%zu,"
               "\"shape\":{\"n_q_heads\":%u,\"n_kv_heads\":%u,\"head_dim\":%u},"
               "\"page_bytes\":%u,\"copy_gbps\":%.3f,\"copy_gbps_best\":%.3f,"
               "\"copy_counts\":\"read+write\",\"copy_read_gbps\":%.3f,"
               "\"copy_bytes\":%zu,\"pool_pages\":%u,\"results\":[",
               prop.name, prop.multiProcessorCount, l2, o.n_q, o.n_kv, o.d,
               g.page_bytes, copy, copy_best, copy / 2, copy_bytes, pool_pages);
        for (size_t i = 0; i < nr; i++) {
            const row_t *r = &rows[i];
            printf(
                "%s{\"format\":\"%s\",\"note\":\"%s\",\"ctx\":%u,"
                "\"batch\":%u,\"layers\":1,\"source\":\"%s\","
                "\"us_per_call\":%.2f,\"kv_bytes\":%llu,\"set_bytes\":%llu,"
                "\"gbps\":%.3f,\"tokens_per_s\":%.0f,\"frac_of_memcpy\":%.3f,"
                "\"us_best\":%.2f,\"gbps_best\":%.3f,\"frac_best\":%.3f,"
                "\"speedup_vs_fp16\":%.3f,\"speedup_best_vs_fp16\":%.3f,"
                "\"bytes_vs_fp16\":%.4f,\"partition\":%u,\"work_items\":%u,"
                "\"single_pass\":%u,\"distinct\":%u}",
                i ? "," : "", fmt_name(r->fmt),
                kv_format_note((kv_format_t)r->fmt), r->ctx, r->batch,
                r->distinct ? "memory" : "memory-reused", r->sec * 1e6,
                (unsigned long long)r->kv_bytes,
                (unsigned long long)r->kv_bytes, r->gbps, r->tps, r->frac,
                r->sec_best * 1e6, r->gbps_best, r->frac_best, r->speedup,
                r->speedup_best, r->bytes_ratio, r->partition, r->n_work,
                r->single_pass, r->distinct);
        }
        printf("]}\n");
    } else {
        printf("decode attention, cuda backend, %s (%d SMs), %u/%u heads, "
               "head_dim %u, %u-byte pages\n",
               prop.name, prop.multiProcessorCount, o.n_q, o.n_kv, o.d,
               g.page_bytes);
        printf("device copy %.1f GB/s read+write median, %.1f best (%zu MiB)\n",
               copy, copy_best, copy_bytes >> 20);
        printf("%-6s %6s %5s %10s %9s %8s %7s %7s %7s %5s\n", "format", "ctx",
               "batch", "us/call", "KV MiB", "GB/s", "frac", "x fp16", "bytes",
               "parts");
        for (size_t i = 0; i < nr; i++) {
            const row_t *r = &rows[i];
            printf("%-6s %6u %5u %10.2f %9.2f %8.1f %7.3f %7.2f %7.3f %5u\n",
                   fmt_name(r->fmt), r->ctx, r->batch, r->sec * 1e6,
                   (double)r->kv_bytes / 1048576.0, r->gbps, r->frac,
                   r->speedup, r->bytes_ratio, r->n_work);
        }
    }
    free(rows);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(q);
    cudaFree(out);
    for (uint32_t f = 0; f < 4; f++)
        cudaFree(pools[f].base);
    return status;
}
