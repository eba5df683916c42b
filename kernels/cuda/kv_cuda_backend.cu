/* SPDX-License-Identifier: MIT */
/*
 * kv_cuda_backend.cu — the CUDA backend behind kv_backend_t (kv_backend.h):
 * attn_decode, attn_prefill and convert run on the GPU; merge_select and
 * merge are the CPU reference's in staged mode (NULL ops: kv_backend_merge
 * falls back, the pages being host memory) and KV_ENOTSUP in device mode.
 *
 * A call, whatever the op: validate (kv_cuda_check_*: nothing is touched
 * on error), plan on the host (kv_cuda_plan.cu), lay the call out in two
 * buffers that grow as needed and are reused (a device buffer and a pinned
 * host mirror of its first part, both owned by the context):
 *   up    pages (staged mode) | entries | work | list_work | seq_len |
 *         statistics items and offsets | q            (one H2D copy)
 *   down  out | statistics                 (a D2H copy each, not the gap)
 *   dev   partials | log-sum-exp                      (device only)
 * then copy up, launch, copy down and wait for the stream; only then are
 * the caller's out/stats (or destination pages) written, so a failed call
 * changes nothing. Staged mode memcpy's each distinct host page into the
 * pinned buffer (a page shared by several lists once). Device mode reads
 * the pool's pages in place.
 *
 * The context (device, stream, buffers, pool) is guarded by a mutex: calls
 * from several threads run one at a time. Every call makes the context's
 * device current on the calling thread.
 */
#include <pthread.h>
#include <string.h>

#include "kv_cuda_int.cuh"

extern "C" {
#include "alloc/kv_mem.h"
}

namespace {

struct ctx_t {
    int device;
    uint32_t n_sm;
    cudaStream_t stream;
    kv_cuda_pool_t *pool; /* device mode */
    uint8_t *dbuf;        /* device buffer */
    size_t dbuf_bytes;
    uint8_t *hbuf; /* pinned host buffer */
    size_t hbuf_bytes;
    pthread_mutex_t lock;
};

/* Offsets of a call's arrays in the buffers. */
struct lay_t {
    size_t at;
    size_t take(size_t n)
    {
        const size_t o = at;
        at += (n + 255u) / 256u * 256u;
        return o;
    }
};

/* Grow the buffers to at least dev / host bytes (contents not kept). */
int grow(ctx_t *cx, size_t dev, size_t host)
{
    if (dev > cx->dbuf_bytes) {
        cudaFree(cx->dbuf);
        cx->dbuf = NULL;
        cx->dbuf_bytes = 0;
        int rc = kv_cuda_status(cudaMalloc((void **)&cx->dbuf, dev));
        if (rc)
            return rc;
        cx->dbuf_bytes = dev;
    }
    if (host > cx->hbuf_bytes) {
        cudaFreeHost(cx->hbuf);
        cx->hbuf = NULL;
        cx->hbuf_bytes = 0;
        int rc = kv_cuda_status(
            cudaHostAlloc((void **)&cx->hbuf, host, cudaHostAllocDefault));
        if (rc)
            return rc;
        cx->hbuf_bytes = host;
    }
    return 0;
}

/* What an attention op hands to run_attn besides the plan input. */
struct attn_io_t {
    float scale;
    const float *q;
    size_t q_floats, out_floats;
    float *out;
    uint32_t stats_row0;
    float *const *stats_dst; /* [n_lists]: host destination or NULL */
};

/* A byte range of the buffers. */
struct range_t {
    size_t off, len;
};

/* Copy `up` bytes H2D, run fn, copy the ranges down[0..n_down) D2H, wait.
 * The ranges are copied one by one, never the alignment gaps between them,
 * which nothing writes (compute-sanitizer initcheck would flag them). */
template <typename F>
int transfer_run(ctx_t *cx, size_t up, const range_t *down, size_t n_down,
                 F fn)
{
    int rc = kv_cuda_status(cudaMemcpyAsync(
        cx->dbuf, cx->hbuf, up, cudaMemcpyHostToDevice, cx->stream));
    if (!rc)
        rc = fn();
    for (size_t i = 0; !rc && i < n_down; i++)
        if (down[i].len)
            rc = kv_cuda_status(cudaMemcpyAsync(
                cx->hbuf + down[i].off, cx->dbuf + down[i].off, down[i].len,
                cudaMemcpyDeviceToHost, cx->stream));
    int rs = kv_cuda_status(cudaStreamSynchronize(cx->stream));
    return rc ? rc : rs;
}

/* The arena a call's pages must be pages of: the pool's base and pages in
 * device mode (KV_EINVAL when its pages are not of pb bytes), NULL and 0
 * in staged mode. */
int pool_arena(const ctx_t *cx, uint32_t pb, const void **base,
               uint32_t *pages)
{
    *base = NULL;
    *pages = 0;
    if (!cx->pool)
        return 0;
    if (kv_cuda_pool_page_bytes(cx->pool) != pb)
        return KV_EINVAL;
    *base = kv_cuda_pool_base(cx->pool);
    *pages = kv_cuda_pool_capacity(cx->pool);
    return 0;
}

/* Copy what every call uploads first into the pinned buffer h: the plan's
 * distinct host pages (staged mode, pb bytes each) at o_pages, its
 * entries at o_ents. */
void stage_plan(uint8_t *h, const kv_cuda_plan_t *pl, uint32_t pb,
                size_t o_pages, size_t o_ents)
{
    for (uint32_t i = 0; i < pl->n_upload; i++)
        memcpy(h + o_pages + (size_t)i * pb, pl->upload[i], pb);
    memcpy(h + o_ents, pl->ents, pl->n_ents * sizeof(kv_cuda_ent_t));
}

int run_attn(ctx_t *cx, kv_cuda_plan_in_t *in, const attn_io_t *io)
{
    const uint32_t pb = in->geom.page_bytes, D = in->geom.head_dim;
    int rc = pool_arena(cx, pb, &in->dev_base, &in->dev_pages);
    if (rc)
        return rc;
    in->n_sm = cx->n_sm;
    kv_cuda_plan_t pl;
    if ((rc = kv_cuda_plan_build(in, &pl)))
        return rc;
    const size_t n_lists = in->n_lists;
    lay_t L = {0};
    const size_t o_pages = L.take((size_t)pl.n_upload * pb);
    const size_t o_ents = L.take(pl.n_ents * sizeof(kv_cuda_ent_t));
    const size_t o_work = L.take(pl.n_work * sizeof(kv_cuda_work_t));
    const size_t o_lw = L.take((n_lists + 1) * sizeof(uint32_t));
    const size_t o_len = L.take(n_lists * sizeof(uint32_t));
    const size_t o_stile = L.take(pl.n_stile * sizeof(kv_cuda_work_t));
    const size_t o_soff = L.take(n_lists * sizeof(uint64_t));
    const size_t o_q = L.take(io->q_floats * sizeof(float));
    const size_t up = L.at;
    const size_t o_out = L.take(io->out_floats * sizeof(float));
    const size_t o_stats = L.take(pl.n_stats * sizeof(float));
    const size_t down_end = L.at;
    const range_t down[2] = {{o_out, io->out_floats * sizeof(float)},
                             {o_stats, pl.n_stats * sizeof(float)}};
    const size_t o_part =
        L.take(pl.single_pass
                   ? 0
                   : kv_cuda_part_floats(pl.n_work, pl.n_rg, pl.rows_blk, D) *
                         sizeof(float));
    const size_t o_lse =
        L.take(pl.n_stats ? n_lists * pl.n_rows * sizeof(float) : 0);
    if ((rc = grow(cx, L.at, down_end))) {
        kv_cuda_plan_free(&pl);
        return rc;
    }
    uint8_t *h = cx->hbuf, *d = cx->dbuf;
    stage_plan(h, &pl, pb, o_pages, o_ents);
    memcpy(h + o_work, pl.work, pl.n_work * sizeof(kv_cuda_work_t));
    memcpy(h + o_lw, pl.list_work, (n_lists + 1) * sizeof(uint32_t));
    memcpy(h + o_len, in->seq_len, n_lists * sizeof(uint32_t));
    memcpy(h + o_stile, pl.stile, pl.n_stile * sizeof(kv_cuda_work_t));
    memcpy(h + o_soff, pl.stats_off, n_lists * sizeof(uint64_t));
    memcpy(h + o_q, io->q, io->q_floats * sizeof(float));

    kv_cuda_attn_args_t a;
    memset(&a, 0, sizeof a);
    a.mode = in->mode;
    a.head_dim = D;
    a.page_bytes = pb;
    a.n_q_heads = in->n_q_heads;
    a.n_kv_heads = in->n_kv_heads;
    a.n_lists = in->n_lists;
    a.n_new = in->mode == KV_CUDA_PREFILL ? in->n_new : 0;
    a.n_rows = pl.n_rows;
    a.rows_blk = pl.rows_blk;
    a.n_rg = pl.n_rg;
    a.scale = io->scale;
    a.pages = cx->pool ? in->dev_base : d + o_pages;
    a.ents = (const kv_cuda_ent_t *)(d + o_ents);
    a.work = (const kv_cuda_work_t *)(d + o_work);
    a.n_work = pl.n_work;
    a.list_work = (const uint32_t *)(d + o_lw);
    a.seq_len = (const uint32_t *)(d + o_len);
    a.q = (const float *)(d + o_q);
    a.out = (float *)(d + o_out);
    a.part = pl.single_pass ? NULL : (float *)(d + o_part);
    a.rotated = pl.rotated;
    if (pl.n_stats) {
        a.lse = (float *)(d + o_lse);
        a.stile = (const kv_cuda_work_t *)(d + o_stile);
        a.n_stile = pl.n_stile;
        a.stats_off = (const uint64_t *)(d + o_soff);
        a.stats_row0 = io->stats_row0;
        a.stats = (float *)(d + o_stats);
    }
    rc = transfer_run(cx, up, down, 2,
                      [&] { return kv_cuda_attn_launch(&a, cx->stream); });
    if (!rc) {
        memcpy(io->out, h + o_out, io->out_floats * sizeof(float));
        for (size_t i = 0; pl.n_stats && i < n_lists; i++)
            if (pl.stats_off[i] != UINT64_MAX)
                memcpy(io->stats_dst[i],
                       h + o_stats + pl.stats_off[i] * sizeof(float),
                       (size_t)in->seq_len[i] * sizeof(float));
    }
    kv_cuda_plan_free(&pl);
    return rc;
}

/* Lock the context and make its device current; rc: cudaSetDevice's
 * result (KV_*), which the call returns before touching the device. */
struct guard_t {
    ctx_t *cx;
    int rc;
    explicit guard_t(ctx_t *c) : cx(c), rc(0)
    {
        pthread_mutex_lock(&cx->lock);
        rc = kv_cuda_status(cudaSetDevice(cx->device));
    }
    ~guard_t()
    {
        pthread_mutex_unlock(&cx->lock);
    }
    guard_t(const guard_t &) = delete;
    guard_t &operator=(const guard_t &) = delete;
};

/* The plan input both attention ops share (P: their params type) for
 * n_lists lists of n_new query rows each. */
template <typename P>
kv_cuda_plan_in_t plan_in(const P *p, uint32_t mode, uint32_t n_lists,
                          uint32_t n_new)
{
    kv_cuda_plan_in_t in;
    memset(&in, 0, sizeof in);
    in.mode = mode;
    in.geom = p->geom;
    in.n_q_heads = p->n_q_heads;
    in.n_kv_heads = p->n_kv_heads;
    in.n_lists = n_lists;
    in.n_new = n_new;
    in.indptr = p->indptr;
    in.pages = p->pages;
    in.seq_len = p->seq_len;
    return in;
}

/* Run an attention op: with stats, list i's statistics go to dst(i) (NULL:
 * the list wants none), else io->stats_dst and in->stats stay NULL. One
 * kv_mem block per call holds the destinations (pointers first: aligned)
 * and the plan's want flags. */
template <typename D>
int attend(void *ctx, kv_cuda_plan_in_t *in, attn_io_t *io, bool stats,
           D dst)
{
    const size_t lb = (size_t)in->n_lists * (sizeof(float *) + 1);
    uint8_t *blk = NULL;
    if (stats) {
        if (!(blk = (uint8_t *)kv_mem_alloc(lb)))
            return KV_ENOMEM;
        float **dsts = (float **)(void *)blk;
        uint8_t *want = blk + (size_t)in->n_lists * sizeof(float *);
        for (uint32_t i = 0; i < in->n_lists; i++) {
            dsts[i] = dst(i);
            want[i] = dsts[i] != NULL;
        }
        io->stats_dst = dsts;
        in->stats = want;
    }
    ctx_t *cx = (ctx_t *)ctx;
    int rc;
    {
        guard_t g(cx);
        rc = g.rc ? g.rc : run_attn(cx, in, io);
    }
    kv_mem_free(blk, blk ? lb : 0);
    return rc;
}

int cuda_decode(void *ctx, const kv_attn_decode_params_t *p)
{
    int rc = kv_cuda_check_decode(p);
    if (rc)
        return rc;
    const uint32_t H = p->n_kv_heads;
    kv_cuda_plan_in_t in = plan_in(p, KV_CUDA_DECODE, p->batch * H, 1);
    in.partition = p->partition_tokens;
    const size_t nq = (size_t)p->batch * p->n_q_heads * p->geom.head_dim;
    attn_io_t io = {p->scale, p->q, nq, nq, p->out, 0, NULL};
    return attend(ctx, &in, &io, p->stats != NULL, [p, H](uint32_t i) {
        float *s = p->stats[i / H];
        return s ? s + (size_t)(i % H) * p->stats_stride : NULL;
    });
}

int cuda_prefill(void *ctx, const kv_attn_prefill_params_t *p)
{
    int rc = kv_cuda_check_prefill(p);
    if (rc)
        return rc;
    const uint32_t H = p->n_kv_heads, G = p->n_q_heads / H;
    kv_cuda_plan_in_t in = plan_in(p, KV_CUDA_PREFILL, H, p->n_new);
    const size_t nq = (size_t)p->n_new * p->n_q_heads * p->geom.head_dim;
    attn_io_t io = {p->scale, p->q, nq, nq, p->out, p->stats_row0 * G, NULL};
    return attend(ctx, &in, &io, p->stats != NULL, [p](uint32_t h) {
        return p->stats + (size_t)h * p->stats_stride;
    });
}

int cuda_convert(void *ctx, const kv_convert_params_t *p)
{
    int rc = kv_cuda_check_convert(p);
    if (rc || p->n_tokens == 0)
        return rc;
    ctx_t *cx = (ctx_t *)ctx;
    guard_t g(cx);
    if (g.rc)
        return g.rc;
    const uint32_t pb = p->geom.page_bytes;
    const void *base;
    uint32_t cap;
    kv_cuda_plan_t pl;
    if ((rc = pool_arena(cx, pb, &base, &cap)) ||
        (rc = kv_cuda_plan_convert(p, base, cap, &pl)))
        return rc;
    const uint32_t n_dst = cx->pool ? 0 : p->n_dst; /* staged: round trip */
    lay_t L = {0};
    const size_t o_pages = L.take((size_t)pl.n_upload * pb);
    const size_t o_ents = L.take(pl.n_ents * sizeof(kv_cuda_ent_t));
    const size_t o_src = L.take((size_t)p->n_tokens * 2 * sizeof(uint32_t));
    const size_t o_dl = L.take((size_t)p->n_tokens * 2 * sizeof(uint32_t));
    const size_t o_dst = L.take((size_t)n_dst * pb);
    const size_t up = L.at;
    if ((rc = grow(cx, up, up))) {
        kv_cuda_plan_free(&pl);
        return rc;
    }
    uint8_t *h = cx->hbuf, *d = cx->dbuf;
    stage_plan(h, &pl, pb, o_pages, o_ents);
    memcpy(h + o_src, pl.src_loc, (size_t)p->n_tokens * 2 * sizeof(uint32_t));
    memcpy(h + o_dl, pl.dst_loc, (size_t)p->n_tokens * 2 * sizeof(uint32_t));
    for (uint32_t j = 0; j < n_dst; j++)
        memcpy(h + o_dst + (size_t)j * pb, p->dst[j], pb);
    kv_cuda_convert_args_t a = {
        p->geom.head_dim,
        pb,
        p->dst_format,
        p->n_tokens,
        p->dst_variant,
        cx->pool ? base : d + o_pages,
        (const kv_cuda_ent_t *)(d + o_ents),
        (const uint32_t *)(d + o_src),
        cx->pool ? (void *)base : d + o_dst,
        (const uint32_t *)(d + o_dl),
    };
    const range_t down = {o_dst, (size_t)n_dst * pb};
    rc = transfer_run(cx, up, &down, 1,
                      [&] { return kv_cuda_convert_launch(&a, cx->stream); });
    for (uint32_t j = 0; !rc && j < n_dst; j++)
        memcpy(p->dst[j], h + o_dst + (size_t)j * pb, pb);
    kv_cuda_plan_free(&pl);
    return rc;
}

int cuda_merge_unsupported(void *ctx, const kv_merge_params_t *p)
{
    (void)ctx;
    (void)p;
    return KV_ENOTSUP;
}

void cuda_destroy(void *ctx)
{
    ctx_t *cx = (ctx_t *)ctx;
    if (!cx)
        return;
    /* best effort: frees whatever it can, whatever the device's state */
    (void)cudaSetDevice(cx->device);
    kv_cuda_pool_destroy(cx->pool);
    if (cx->stream)
        cudaStreamDestroy(cx->stream);
    cudaFree(cx->dbuf);
    cudaFreeHost(cx->hbuf);
    pthread_mutex_destroy(&cx->lock);
    kv_mem_free(cx, sizeof *cx);
    (void)cudaGetLastError(); /* a failed free is not a later call's error */
}

/* zip_score NULL: KVzip's scoring runs on the CPU reference (its keys are
 * read from host pages). */
const kv_backend_ops_t staged_ops = {
    "cuda", cuda_decode, cuda_prefill, cuda_destroy, cuda_convert, NULL, NULL, NULL,
};

const kv_backend_ops_t device_ops = {
    "cuda-device",          cuda_decode,  cuda_prefill,
    cuda_destroy,           cuda_convert, cuda_merge_unsupported,
    cuda_merge_unsupported, NULL,
};

} // namespace

extern "C" int kv_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* later calls must not report this error */
        return 0;
    }
    return n;
}

extern "C" int kv_backend_cuda_create(const kv_cuda_config_t *cfg,
                                      kv_backend_t *out)
{
    if (!cfg || !out || cfg->device < 0)
        return KV_EINVAL;
    if (cfg->device_pages &&
        (cfg->page_bytes == 0 || cfg->page_bytes % 64u != 0 ||
         cfg->page_bytes > KV_CUDA_MAX_PAGE_BYTES))
        return KV_EINVAL;
    if (cfg->device >= kv_cuda_device_count())
        return KV_ENOTSUP;
    ctx_t *cx = (ctx_t *)kv_mem_calloc(1, sizeof *cx);
    if (!cx)
        return KV_ENOMEM;
    cx->device = cfg->device;
    if (pthread_mutex_init(&cx->lock, NULL) != 0) {
        kv_mem_free(cx, sizeof *cx);
        return KV_ENOMEM;
    }
    int sm = 0, rc = kv_cuda_status(cudaSetDevice(cfg->device));
    if (!rc)
        rc = kv_cuda_status(cudaDeviceGetAttribute(
            &sm, cudaDevAttrMultiProcessorCount, cfg->device));
    if (!rc)
        rc = kv_cuda_status(
            cudaStreamCreateWithFlags(&cx->stream, cudaStreamNonBlocking));
    if (!rc && cfg->device_pages)
        rc = kv_cuda_pool_create(cfg->page_bytes, cfg->device_pages,
                                 cfg->staging_pages ? cfg->staging_pages : 64u,
                                 cx->stream, &cx->pool);
    if (rc) {
        cuda_destroy(cx);
        return rc;
    }
    cx->n_sm = (uint32_t)sm;
    out->ops = cfg->device_pages ? &device_ops : &staged_ops;
    out->ctx = cx;
    return 0;
}

extern "C" kv_cuda_pool_t *kv_backend_cuda_pool(const kv_backend_t *b)
{
    if (!b || (b->ops != &staged_ops && b->ops != &device_ops))
        return NULL;
    return ((ctx_t *)b->ctx)->pool;
}
