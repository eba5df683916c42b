/*
 * kv_cpu.h — private interface of the CPU reference backend (kernels/cpu/).
 *
 *   kv_cpu_backend.c   create/destroy, the ops table, the hot-loop dispatch
 *   kv_cpu_plan.c      token ranges of page lists -> (page, offset) spans,
 *                      per-call scratch
 *   kv_pool.c      worker threads: jobs of independent units
 *   kv_cpu_decode.c    batched decode: split-K partitions + (max, sum-exp)
 *   kv_cpu_prefill.c   causal prefill over blocks of query rows
 *   kv_cpu_attend.c    the hot loops (one source, compiled for AVX2+FMA+F16C
 *                      and for the baseline ISA, chosen once at create)
 *
 * The attention loop is the same for every page format: a page's tokens are
 * decoded to an FP32 tile through kv_format_get(format)->load, and all
 * arithmetic after that is FP32 on tiles, except for formats whose traits
 * score and accumulate from the encoded tokens directly (attn_score,
 * attn_accum: INT4, INT2). Results do not depend on the number
 * of threads: work is split into units whose boundaries depend only on the
 * shapes, each unit writes its own output, and reductions run in a fixed order.
 */
#ifndef KV_CPU_H
#define KV_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kv_kern.h"

/* The vector width (floats) and the tiles: any head_dim the backend
 * interface allows (kv_kern.h) is a whole number of vectors and fits one
 * tile. */
#define KV_CPU_VW          8u
#define KV_CPU_TILE_FLOATS 4096u /* floats per K (and per V) tile         */
_Static_assert(KV_KERN_DIM_STEP % KV_CPU_VW == 0 &&
                   KV_KERN_MAX_DIM <= KV_CPU_TILE_FLOATS,
               "every head_dim of the interface suits the CPU loops");

/* A token range [t_begin, t_end) of one page list, and where it starts:
 * token t_begin is token off0 of pages[page0]. */
typedef struct kv_cpu_span {
    const kv_kern_page_t *pages; /* the list's pages (pages[0] = its first) */
    uint32_t page0, off0;
    uint32_t t_begin, t_end;     /* tokens of the list                      */
} kv_cpu_span_t;

/* One piece of work for the hot loops: n_rows query rows over a span.
 * Row r sees list tokens t < lim0 + r / group (causal prefill: group = the
 * q heads of a kv head; decode: group = n_rows, lim0 = the list length). */
typedef struct kv_cpu_task {
    const kv_page_geom_t *geom;
    kv_cpu_span_t span;
    const float *q;        /* [n_rows][head_dim], already times scale     */
    uint32_t n_rows;
    uint32_t group;        /* >= 1                                        */
    uint32_t lim0;         /* token limit of rows 0..group-1 (exclusive)  */
    /* attend: running online-softmax state, updated in place */
    float *m;              /* [n_rows] running max logit (-INF initially) */
    float *l;              /* [n_rows] running sum of exp(logit - m)      */
    float *acc;            /* [n_rows][head_dim] running sum p * v        */
    float *logits;         /* NULL or [n_rows][logits_stride]: logit of   */
    size_t logits_stride;  /*   token t at [r * stride + t] (attend)      */
    /* stats pass */
    const float *lse;      /* [n_rows] log-sum-exp of each row            */
    float *stats;          /* [list tokens]: stats[t] for t in the span   */
} kv_cpu_task_t;

/* Per-thread scratch floats for tasks of at most max_rows rows. */
size_t kv_cpu_thread_floats(uint32_t head_dim, uint32_t max_rows);

/* The hot loops (kv_cpu_attend.c). scratch: kv_cpu_thread_floats()
 * floats, 64-byte aligned, private to the calling thread. */
typedef struct kv_cpu_loops {
    const char *isa; /* "avx2" or "generic" */
    /* Online softmax over the span for every row: updates m, l, acc, and
     * writes logits of the tokens each row sees if task->logits. */
    void (*attend)(const kv_cpu_task_t *t, float *scratch);
    /* stats[t] = sum over rows r that see t of exp(q_r . k_t - lse[r]) for
     * t in the span (overwritten). */
    void (*stats)(const kv_cpu_task_t *t, float *scratch);
    /* stats[t] = sum over rows r < n_rows of exp(logits[r*stride+t] - lse[r])
     * for t in the span (overwritten); needs no pages. */
    void (*stats_from_logits)(const kv_cpu_task_t *t);
} kv_cpu_loops_t;

extern const kv_cpu_loops_t kv_cpu_loops_avx2;
extern const kv_cpu_loops_t kv_cpu_loops_generic;

/* Worker threads (kv_pool.c): kv_pool_* are public (kvpage.h:
 * the model engine runs on them too). A job on every worker of the pool;
 * worker is in [0, kv_pool_size(pool)). */
static inline void kv_cpu_run(kv_pool_t *pool, size_t n_units,
                                   kv_pool_unit_fn fn, void *arg)
{
    (void)kv_pool_run(pool, 0, n_units, fn, arg);
}

/* Backend context (immutable after create). */
typedef struct kv_cpu {
    const kv_cpu_loops_t *loops; /* chosen at create        */
    kv_pool_t *pool;         /* n_threads workers        */
} kv_cpu_t;

/* Split tokens [0, len) of a list into ranges of `part` tokens (the last may
 * be shorter) and write their spans to out[0 .. ceil(len/part)). */
void kv_cpu_split(const kv_kern_page_t *pages, uint32_t len,
                       uint32_t part, kv_cpu_span_t *out);

/* Decode and prefill drivers (the ops). */
int kv_cpu_decode(void *ctx, const kv_attn_decode_params_t *p);
int kv_cpu_prefill(void *ctx, const kv_attn_prefill_params_t *p);

#endif /* KV_CPU_H */
