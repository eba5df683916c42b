/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu.h — private interface of the CPU reference backend (kernels/cpu/).
 *
 *   kv_cpu_backend.c    create/destroy, the ops table
 *   kv_cpu_isa.c        the CPU feature probe (the only one) and the builds
 *                       of the hot loops this CPU runs
 *   kv_cpu_plan.c       token ranges of page lists -> (page, offset) spans
 *   kv_workers.c        worker threads: jobs of independent units
 *   kv_cpu_decode.c     batched decode: split-K partitions + (max, sum-exp)
 *   kv_cpu_prefill.c    causal prefill over blocks of query rows
 *   kv_cpu_convert.c    the conversion ops (convert, merge_select, merge)
 *   kv_cpu_score.c      KVzip's scoring op (zip_score), on the workers
 *   kv_cpu_simd.h       vector types and the per-build operations
 *   kv_cpu_attend.c     the hot loops                       \  compiled once
 *   kv_cpu_fmt_int.c    INT4/INT2 attention from the codes   > per build
 *   kv_cpu_fmt_load.c   FP16 and MERGED rows to FP32        /  (KV_CPU_SYM)
 *   kv_cpu_fmt_i8.c     INT4/INT2 attention with int8 dot products
 *                       (approximate, opt-in: KV_BACKEND_INT8; compiled
 *                       once, AVX-512 VNNI + VBMI)
 *
 * The attention loop is the same for every page format; how it reads a
 * format's pages is the format's entry in the kernels-side format table
 * (kv_cpu_loops_t.fmt, as ggml's CPU backend keeps its own per-type ops
 * beside the type traits): rows decoded to FP32 tiles (FP16, MERGED), or
 * scores and sums computed straight from the codes (INT4, INT2; a rotated
 * INT page, variant 1, is scored with the rotated query R q and its sum of
 * p * v, which is in the rotated space, is rotated back by R^T before it is
 * added: q . k = Rq . Rk, sum p v = R^T sum p Rv). The format
 * traits (formats/kv_format.h) say what the bytes mean; this table says how
 * the CPU reads them fast. Results do not depend on the number of threads
 * nor on the build: work is split into units whose boundaries depend only
 * on the shapes, each unit writes its own output, reductions run in a
 * fixed order, and every build performs the same operations.
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
    uint32_t scratch_rows; /* max_rows the thread scratch was sized for   */
                           /*   (kv_cpu_thread_floats); >= 1              */
    uint32_t group;        /* >= 1                                        */
    uint32_t lim0;         /* token limit of rows 0..group-1 (exclusive)  */
    /* attend: running online-softmax state, updated in place */
    float *m;              /* [n_rows] running max logit (-INF initially) */
    float *l;              /* [n_rows] running sum of exp(logit - m)      */
    float *acc;            /* [n_rows][head_dim] running sum p * v        */
    float *logits;         /* NULL or [n_rows][logits_stride]: logit of   */
    size_t logits_stride;  /*   token t at [r * stride + t] (attend)      */
    const struct kv_cpu_fmt_ops *fmt; /* [KV_FMT_COUNT] the format table  */
                           /*   attend and stats read pages with          */
                           /*   (kv_cpu_fmt_table); unused by             */
                           /*   stats_from_logits                         */
    /* stats pass */
    const float *lse;      /* [n_rows] log-sum-exp of each row            */
    float *stats;          /* [list tokens]: stats[t] for t in the span   */
} kv_cpu_task_t;

/* Tokens of one tile, and the floats of one row of logits (a whole number
 * of vectors), for head_dim d. */
static inline uint32_t kv_cpu_tile_tokens(uint32_t d)
{
    return KV_CPU_TILE_FLOATS / d;
}
static inline uint32_t kv_cpu_tile_stride(uint32_t d)
{
    return (kv_cpu_tile_tokens(d) + KV_CPU_VW - 1) / KV_CPU_VW * KV_CPU_VW;
}

/* Per-thread scratch floats for tasks of at most max_rows rows: K tile, V
 * tile, a row of logits per query row, a head_dim row per query row
 * (kv_cpu_plan.c). */
size_t kv_cpu_thread_floats(uint32_t head_dim, uint32_t max_rows);

/* ---- the builds of the hot loops ----------------------------------------
 * kv_cpu_attend.c, kv_cpu_fmt_int.c and kv_cpu_fmt_load.c are compiled once
 * per build, each with its -m flags and KV_CPU_BUILD=<name> (CMakeLists.txt);
 * their symbols carry the build's name: KV_CPU_SYM(f) is f_<build>. */
#ifndef KV_CPU_BUILD
#define KV_CPU_BUILD portable
#endif
#define KV_CPU_SYM_(f, b) f##_##b
#define KV_CPU_SYM2_(f, b) KV_CPU_SYM_(f, b)
#define KV_CPU_SYM(f) KV_CPU_SYM2_(f, KV_CPU_BUILD)

/* How the hot loops read the pages of one format (kv_cpu_fmt_ops_t.read). */
enum {
    KV_CPU_READ_ROWS = 0,  /* decode chunks to FP32 K and V tiles (load)  */
    KV_CPU_READ_CODES = 1, /* score and accum from the encoded tokens     */
};

/* Tokens [t0, t0+n) of a page as the list reading it with `variant` sees
 * them, to FP32 rows k, v ([n][head_dim]; either may be NULL): exactly the
 * floats kv_format_load gives. */
typedef void (*kv_cpu_load_fn)(const void *page, const kv_page_geom_t *g,
                               uint32_t variant, uint32_t t0, uint32_t n,
                               float *k, float *v);
/* Over tokens [t0, t0+n) of a page, for query rows r < n_rows (k^, v^: the
 * floats the format's load decodes):
 *   score: s[r*s_stride + i] = sum_c q[r*q_stride + c] * k^_{t0+i}[c]
 *   accum: acc[r*acc_stride + c] += sum_{i<n} p[r*p_stride + i] * v^_{t0+i}[c]
 * for i < n, c < head_dim; FP32 sums in the step's own order (they agree
 * with the same sums over load's rows to FP32 rounding, not bit for bit). */
typedef void (*kv_cpu_score_fn)(const void *page, const kv_page_geom_t *g,
                                uint32_t t0, uint32_t n, const float *q,
                                size_t q_stride, uint32_t n_rows, float *s,
                                size_t s_stride);
typedef void (*kv_cpu_accum_fn)(const void *page, const kv_page_geom_t *g,
                                uint32_t t0, uint32_t n, const float *p,
                                size_t p_stride, uint32_t n_rows, float *acc,
                                size_t acc_stride);

typedef struct kv_cpu_fmt_ops {
    uint32_t read;         /* KV_CPU_READ_*                              */
    uint32_t rotated;      /* CODES: bit v set if variant v's codes are  */
                           /* of rotated rows (formats/kv_fmt_rot.h):    */
                           /* score then gets R q, accum's sums get R^T  */
    kv_cpu_load_fn load;   /* ROWS: the decoder                          */
    kv_cpu_score_fn score; /* CODES                                      */
    kv_cpu_accum_fn accum; /* CODES                                      */
} kv_cpu_fmt_ops_t;

/* One build of the hot loops. scratch: kv_cpu_thread_floats() floats,
 * 64-byte aligned, private to the calling thread. */
typedef struct kv_cpu_loops {
    const char *isa; /* "portable", "avx2", "avx512" */
    /* Online softmax over the span for every row: updates m, l, acc, and
     * writes logits of the tokens each row sees if task->logits. */
    void (*attend)(const kv_cpu_task_t *t, float *scratch);
    /* stats[t] = sum over rows r that see t of exp(q_r . k_t - lse[r]) for
     * t in the span (overwritten). */
    void (*stats)(const kv_cpu_task_t *t, float *scratch);
    /* stats[t] = sum over rows r < n_rows of exp(logits[r*stride+t] - lse[r])
     * for t in the span (overwritten); needs no pages. */
    void (*stats_from_logits)(const kv_cpu_task_t *t);
    /* The kernels-side format table: [kv_format_t]. */
    kv_cpu_fmt_ops_t fmt[KV_FMT_COUNT];
} kv_cpu_loops_t;

/* The builds (kv_cpu_attend.c compiled per build; avx2 and avx512 only on
 * x86, where KV_CPU_X86 is defined). */
extern const kv_cpu_loops_t kv_cpu_loops_portable;
extern const kv_cpu_loops_t kv_cpu_loops_avx2;
extern const kv_cpu_loops_t kv_cpu_loops_avx512;

/* The builds this CPU runs (probed once): portable first, best last; *n
 * gets their number (>= 1). kv_cpu_isa.c. */
const kv_cpu_loops_t *const *kv_cpu_builds(uint32_t *n);

/* This build's per-format steps (kv_cpu_fmt_int.c, kv_cpu_fmt_load.c). */
void KV_CPU_SYM(kv_cpu_int4_score)(const void *page, const kv_page_geom_t *g,
                                   uint32_t t0, uint32_t n, const float *q,
                                   size_t qs, uint32_t nr, float *s,
                                   size_t ss);
void KV_CPU_SYM(kv_cpu_int2_score)(const void *page, const kv_page_geom_t *g,
                                   uint32_t t0, uint32_t n, const float *q,
                                   size_t qs, uint32_t nr, float *s,
                                   size_t ss);
void KV_CPU_SYM(kv_cpu_int4_accum)(const void *page, const kv_page_geom_t *g,
                                   uint32_t t0, uint32_t n, const float *p,
                                   size_t ps, uint32_t nr, float *acc,
                                   size_t as);
void KV_CPU_SYM(kv_cpu_int2_accum)(const void *page, const kv_page_geom_t *g,
                                   uint32_t t0, uint32_t n, const float *p,
                                   size_t ps, uint32_t nr, float *acc,
                                   size_t as);
void KV_CPU_SYM(kv_cpu_fp16_load)(const void *page, const kv_page_geom_t *g,
                                  uint32_t variant, uint32_t t0, uint32_t n,
                                  float *k, float *v);
void KV_CPU_SYM(kv_cpu_merged_load)(const void *page, const kv_page_geom_t *g,
                                    uint32_t variant, uint32_t t0, uint32_t n,
                                    float *k, float *v);

/* The approximate INT steps with int8 dot products (kv_cpu_fmt_i8.c;
 * x86 builds only, for CPUs where kv_cpu_has_i8() is 1). */
void kv_cpu_i8_int4_score(const void *page, const kv_page_geom_t *g,
                          uint32_t t0, uint32_t n, const float *q, size_t qs,
                          uint32_t nr, float *s, size_t ss);
void kv_cpu_i8_int2_score(const void *page, const kv_page_geom_t *g,
                          uint32_t t0, uint32_t n, const float *q, size_t qs,
                          uint32_t nr, float *s, size_t ss);
void kv_cpu_i8_int4_accum(const void *page, const kv_page_geom_t *g,
                          uint32_t t0, uint32_t n, const float *p, size_t ps,
                          uint32_t nr, float *acc, size_t as);
void kv_cpu_i8_int2_accum(const void *page, const kv_page_geom_t *g,
                          uint32_t t0, uint32_t n, const float *p, size_t ps,
                          uint32_t nr, float *acc, size_t as);
/* 1 if this CPU runs kv_cpu_fmt_i8.c (AVX-512 F, BW, VNNI and VBMI in an
 * x86 build), else 0. kv_cpu_isa.c. */
int kv_cpu_has_i8(void);

/* Worker threads (kv_workers.c): kv_workers_* are public (kvpage.h:
 * the reference model runs on them too). A job on every worker; worker is in
 * [0, kv_workers_size(workers)). */
static inline void kv_cpu_run(kv_workers_t *workers, size_t n_units,
                              kv_workers_fn fn, void *arg)
{
    (void)kv_workers_run(workers, 0, n_units, fn, arg);
}

/* Backend context (immutable after create). */
typedef struct kv_cpu {
    const kv_cpu_loops_t *loops; /* the best build (kv_cpu_builds) */
    kv_workers_t *workers;       /* n_threads workers              */
    int int8;                    /* KV_BACKEND_INT8                */
    /* int8: loops->fmt with the int8 INT steps (kv_cpu_fmt_i8.c) in   */
    /* place of the exact ones                                          */
    kv_cpu_fmt_ops_t i8_fmt[KV_FMT_COUNT];
} kv_cpu_t;

/* The format table this backend's tasks run (kv_cpu_task_t.fmt): the
 * loops' own, or with KV_BACKEND_INT8 the int8 one. */
static inline const kv_cpu_fmt_ops_t *kv_cpu_fmt_table(const kv_cpu_t *cx)
{
    return cx->int8 ? cx->i8_fmt : cx->loops->fmt;
}

/* Split tokens [0, len) of a list into ranges of `part` tokens (the last may
 * be shorter) and write their spans to out[0 .. ceil(len/part)). */
void kv_cpu_split(const kv_kern_page_t *pages, uint32_t len, uint32_t part,
                  kv_cpu_span_t *out);

/* Decode and prefill drivers (the ops). */
int kv_cpu_decode(void *ctx, const kv_attn_decode_params_t *p);
int kv_cpu_prefill(void *ctx, const kv_attn_prefill_params_t *p);

#endif /* KV_CPU_H */
