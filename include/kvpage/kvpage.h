/*
 * kvpage.h — the public C API of kvpage, a paged KV-cache store.
 *
 * An inference engine opens a store for one model shape (layers, query heads,
 * kv heads, head_dim), creates sequences in it, appends the post-RoPE keys and
 * values of every layer as tokens arrive, and asks the store for attention over
 * what it holds (decode for a batch of sequences, causal prefill for one).
 * Keys and values live in fixed-size pages taken from a pool whose capacity is
 * fixed when the store is created; a fork shares every page copy-on-write.
 *
 * Conventions (all functions):
 *   - Return 0 (KV_OK) or a negative KV_E* code; kv_strerror() names it.
 *     Negative values that are not KV_E* codes are -errno from the OS.
 *   - Bad input (NULL handle, index out of range, freed sequence, absurd
 *     config) returns an error and leaves the store exactly as it was.
 *     Running out of pages or memory mid-call also leaves the store unchanged:
 *     every mutating call is all-or-nothing.
 *   - Thread safety: calls that change a store (append, fork, free, compact,
 *     create/destroy of sequences) must be serialized by the caller per store.
 *     Attention and read calls only read and may run concurrently with each
 *     other, but not with a mutating call on the same store.
 *   - Shapes are written [outer][...][inner], row-major, elements contiguous.
 *   - A call with several things wrong returns the code of one of them; which
 *     one is not specified.
 *
 * Ownership: the store owns every page and sequence; buffers passed in are
 * borrowed for the duration of the call only.
 */
#ifndef KVPAGE_KVPAGE_H
#define KVPAGE_KVPAGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KVPAGE_BUILD) && defined(__GNUC__)
#define KV_API __attribute__((visibility("default")))
#else
#define KV_API
#endif

/* ---- errors ------------------------------------------------------------ */

/* Error codes. Kept far from -errno so OS errors can pass through unchanged. */
enum {
    KV_OK          = 0,
    KV_EINVAL      = -1001, /* bad argument: NULL pointer, zero size, bad enum    */
    KV_ENOMEM      = -1002, /* no free page in the pool, or metadata alloc failed */
    KV_ERANGE      = -1003, /* layer, head, token index or value out of range     */
    KV_ENOENT      = -1004, /* no such sequence (never created, or freed)         */
    KV_ESTATE      = -1005, /* object in the wrong state (double release, ...)    */
    KV_ENOTSUP     = -1006, /* feature not built in or not supported              */
    KV_EVERSION    = -1007, /* config struct_size/version not understood          */
    KV_ECORRUPT    = -1008, /* stored data failed its integrity check             */
    KV_EIO         = -1009, /* I/O error                                          */
    KV_ELIMIT      = -1010, /* a fixed limit was reached (max_seqs, max tokens)   */
};

/* A short English description of an error code (never NULL). */
KV_API const char *kv_strerror(int err);

/* The library version as "MAJOR.MINOR.PATCH". */
KV_API const char *kv_version(void);

/* ---- types ------------------------------------------------------------- */

/* Element type of K/V given to kv_append. */
typedef enum kv_dtype {
    KV_DTYPE_F32 = 0,
    KV_DTYPE_F16 = 1, /* IEEE binary16, stored as uint16_t */
} kv_dtype_t;

/* Page formats. The numbers never change: they are written into page files. */
typedef enum kv_format {
    KV_FMT_FP16   = 0,
    KV_FMT_INT4   = 1, /* KIVI 4-bit, groups of 16: 6 bits/element   */
    KV_FMT_INT2   = 2, /* KIVI 2-bit, groups of 16: 4 bits/element   */
    KV_FMT_MERGED = 3, /* MiniCache merged layer pair               */
    KV_FMT_COUNT  = 4,
} kv_format_t;

/* Compute backends. The CPU backend is always present. */
typedef enum kv_backend_kind {
    KV_BACKEND_CPU  = 0,
    KV_BACKEND_CUDA = 1, /* not yet available: kv_store_create returns KV_ENOTSUP */
} kv_backend_kind_t;

typedef struct kv_store kv_store_t; /* opaque */
typedef uint32_t kv_seq_id_t;       /* sequence id, unique among live sequences */

/* Store configuration. Always start from kv_config_default(), which sets
 * struct_size and version; then set the model shape and pool size. */
#define KV_CONFIG_VERSION 1u

/* kv_config_t.flags */
#define KV_CONFIG_NO_TCACHE 0x1u /* pool: no per-thread page caches (exact peak, slower) */

typedef struct kv_config {
    uint32_t struct_size; /* sizeof(kv_config_t), set by kv_config_default       */
    uint32_t version;     /* KV_CONFIG_VERSION, set by kv_config_default          */
    uint32_t n_layers;    /* transformer layers, 1..4096                          */
    uint32_t n_q_heads;   /* query heads, a multiple of n_kv_heads                */
    uint32_t n_kv_heads;  /* key/value heads (GQA groups), 1..1024                */
    uint32_t head_dim;    /* elements per head, a multiple of 16, 16..1024        */
    uint32_t page_bytes;  /* bytes per page; 0 = 16 FP16 tokens of K+V            */
                          /* (64 * head_dim); a multiple of 64, >= 1 FP16 token   */
    uint64_t host_pages;  /* pool capacity in pages, 1..2^26                      */
    uint32_t max_seqs;    /* live sequences at once, 1..2^20; 0 = 1024            */
    uint32_t n_threads;   /* attention threads; 0 = online CPUs                   */
    uint32_t backend;     /* kv_backend_kind_t                                    */
    uint32_t flags;       /* KV_CONFIG_* bits                                     */
    uint32_t kv_format;   /* format that full residual groups are converted to:   */
                          /* KV_FMT_FP16 (never convert), KV_FMT_INT4, KV_FMT_INT2 */
    uint32_t residual;    /* R: newest tokens of a list kept FP16, converted R at */
                          /* a time; a multiple of 16; 0 = 128                    */
    /* @pressure-fields (memory-pressure escalation) */
    /* @offload-fields (page file tier) */
} kv_config_t;

/* A config with struct_size/version set, defaults filled in, and the model
 * shape left zero (the caller must set n_layers, heads, head_dim, host_pages). */
KV_API kv_config_t kv_config_default(void);

/* Store-wide statistics (see kv_store_stats). Byte counts are exact. */
typedef struct kv_stats {
    uint32_t page_bytes;        /* bytes per page                                  */
    uint32_t fp16_tokens_per_page;
    uint64_t pages_capacity;    /* pool capacity                                   */
    uint64_t pages_used;        /* pages referenced by the store                   */
    uint64_t pages_free;        /* pages_capacity - pages_used                     */
    uint64_t pages_peak;        /* high-water mark of pages_used; exact with one   */
                                /* thread, sampled per refill with several         */
    uint64_t alloc_failures;    /* page allocations refused (pool exhausted)       */
    uint64_t n_seqs;            /* live sequences                                  */
    uint64_t tokens;            /* tokens held, summed over seq x layer x kv_head  */
    uint64_t pages_by_format[KV_FMT_COUNT]; /* distinct pages of each format       */
    uint64_t bytes_by_format[KV_FMT_COUNT]; /* pages_by_format * page_bytes        */
    uint64_t kv_bytes;          /* all page bytes held (sum of bytes_by_format)    */
    uint64_t meta_bytes;        /* live metadata bytes (page tables, sequences)    */
    uint64_t fp16_bytes;        /* an unpaged FP16 cache of the same tokens:       */
                                /* tokens * 2 (K,V) * head_dim * 2 bytes           */
} kv_stats_t;
/* Compression ratio, honest: fp16_bytes / (kv_bytes + meta_bytes) (partly
 * filled pages, FP16 residual tails and metadata all count; a MERGED page
 * counts once though two layers read it). Print kv_format_note() beside it. */

/* ---- store ------------------------------------------------------------- */

/* Create a store. *out is set only on success. Errors: KV_EINVAL (NULL,
 * inconsistent shape), KV_ERANGE (a field outside its range), KV_EVERSION
 * (struct_size or version other than this header's), KV_ENOTSUP (backend not built),
 * KV_ENOMEM. */
KV_API int kv_store_create(const kv_config_t *cfg, kv_store_t **out);

/* Destroy a store and everything in it. NULL is a no-op. */
KV_API void kv_store_destroy(kv_store_t *store);

/* The config the store runs with (defaults resolved). */
KV_API int kv_store_config(const kv_store_t *store, kv_config_t *out);

/* Fill *out with current statistics. */
KV_API int kv_store_stats(const kv_store_t *store, kv_stats_t *out);

/* Check every internal invariant (refcount of each page == number of page
 * table references to it, used + free == capacity, list lengths consistent).
 * Returns 0, KV_ECORRUPT, or KV_ENOMEM (its scratch could not be allocated).
 * O(pages); meant for tests and debugging. */
KV_API int kv_store_check(const kv_store_t *store);

/* ---- sequences --------------------------------------------------------- */

/* Create an empty sequence. Errors: KV_ELIMIT (max_seqs live), KV_ENOMEM. */
KV_API int kv_seq_create(kv_store_t *store, kv_seq_id_t *out);

/* Free a sequence and release its pages (shared pages stay with the other
 * holders). Errors: KV_ENOENT. */
KV_API int kv_seq_free(kv_store_t *store, kv_seq_id_t seq);

/* Fork: a new sequence sharing every page of parent (copy-on-write: the first
 * append to a shared, partly filled tail page copies that page). The child has
 * the parent's tokens and positions. Errors: KV_ENOENT, KV_ELIMIT, KV_ENOMEM. */
KV_API int kv_seq_fork(kv_store_t *store, kv_seq_id_t parent, kv_seq_id_t *child);

/* Tokens held for (seq, layer, kv_head). Lists of one layer differ in length
 * only after kv_compact. Errors: KV_ENOENT, KV_ERANGE. */
KV_API int kv_seq_len(const kv_store_t *store, kv_seq_id_t seq, uint32_t layer,
                      uint32_t kv_head, uint32_t *len);

/* Append n_tokens tokens of one layer, all kv heads at once.
 *   k, v: [n_tokens][n_kv_heads][head_dim] of dtype (post-RoPE keys).
 *   pos:  [n_tokens] original token positions, or NULL to continue each list
 *         from its last position + 1 (0 for an empty list).
 * Values must be finite and within FP16 range (|x| <= 65504): otherwise
 * KV_ERANGE and nothing is stored. All-or-nothing: on KV_ENOMEM no head of the
 * layer changed. n_tokens == 0 is a no-op. If the layer's format is INT4/INT2
 * and its FP16 residual reaches R tokens, the oldest floor(residual/R)*R are
 * converted (all heads or none); when the pages or memory for that are not
 * free the conversion is deferred to a later append and the append still
 * succeeds (the result is the same either way). */
KV_API int kv_append(kv_store_t *store, kv_seq_id_t seq, uint32_t layer,
                     uint32_t n_tokens, kv_dtype_t dtype, const void *k,
                     const void *v, const int32_t *pos);

/* Read back tokens [t0, t0+n) of (seq, layer, kv_head), decoded to FP32.
 *   k, v: [n][head_dim] or NULL; pos: [n] or NULL.
 * Errors: KV_ENOENT, KV_ERANGE (t0 + n beyond the list). */
KV_API int kv_read(const kv_store_t *store, kv_seq_id_t seq, uint32_t layer,
                   uint32_t kv_head, uint32_t t0, uint32_t n, float *k,
                   float *v, int32_t *pos);

/* Keep only the tokens keep[0..n_keep) (strictly increasing indices into the
 * current list) of (seq, layer, kv_head), in order, with their positions;
 * pages that empty are released. n_keep == 0 empties the list. Pages shared with a fork are never written:
 * kept tokens that land in them go to fresh pages. Kept tokens of INT4/INT2
 * or MERGED pages are decoded and stored FP16 (the list becomes all
 * residual; it converts again from the next append). Errors: KV_ENOENT,
 * KV_ERANGE, KV_EINVAL (not strictly increasing), KV_ENOMEM. */
KV_API int kv_compact(kv_store_t *store, kv_seq_id_t seq, uint32_t layer,
                      uint32_t kv_head, const uint32_t *keep, uint32_t n_keep);

/* ---- compressed formats ------------------------------------------------ */

/* Set the format that (seq, layer)'s FP16 residual is converted to from now
 * on (all kv heads): KV_FMT_FP16 stops converting; KV_FMT_INT4/INT2 convert
 * each time R tokens have accumulated (KIVI). Pages already converted stay as
 * they are. Forks inherit it. Errors: KV_ENOENT, KV_ERANGE, KV_EINVAL (fmt
 * not INT4/INT2/FP16), KV_ENOTSUP (this page size holds no 16-token group
 * of fmt). Allocates nothing. */
KV_API int kv_seq_set_format(kv_store_t *store, kv_seq_id_t seq, uint32_t layer,
                             kv_format_t fmt);

/* Convert now every token of (seq, layer) but the newest keep_fp16 (rounded up
 * so that only whole 16-token groups convert) to the layer's format; e.g. at
 * prefill end. No-op for FP16 layers. All-or-nothing (KV_ENOMEM). */
KV_API int kv_seq_quantize(kv_store_t *store, kv_seq_id_t seq, uint32_t layer,
                           uint32_t keep_fp16);

/* MiniCache merge options (DESIGN §4). Start from kv_merge_opts_default(). */
typedef struct kv_merge_opts {
    uint32_t struct_size;  /* sizeof(kv_merge_opts_t)                          */
    float t;               /* SLERP parameter toward the deeper layer, 0..1; 0.6 */
    float gamma;           /* retention: keep token i unmerged when d_i >       */
                           /* d_max - gamma (d_max - d_min), d = theta/pi; 0.05 */
    uint32_t dir_format;   /* directions stored as KV_FMT_FP16 or KV_FMT_INT4    */
    uint32_t keep_fp16;    /* newest tokens of each layer left unmerged (FP16)   */
} kv_merge_opts_t;

KV_API kv_merge_opts_t kv_merge_opts_default(void);

/* Merge layers (layer-1, layer) of seq (MiniCache): for each kv head, the
 * tokens both layers hold (same positions, FP16 pages, all but the newest
 * keep_fp16) become MERGED pages referenced by both layers' lists (refcount
 * 2), and the retained tokens stay as FP16 originals in each layer's list.
 * Attention restores merged tokens on the fly (k = e * |k|: every restored
 * vector keeps its norm). The tokens merged are each list's newest run of
 * unmerged, unconverted FP16 tokens (its residual); both layers' must match
 * in length and positions. Token order: in both lists the merged tokens come
 * first, then the retained ones, then those left unmerged (kv_read and
 * statistics follow that order; positions travel with their tokens).
 * Retention: d = theta/pi per token for K and for V; a token is retained
 * when d > d_max - gamma (d_max - d_min) for K or for V (gamma 0: none).
 * opts NULL = the defaults. Errors: KV_ENOENT, KV_ERANGE (layer 0 or out of
 * range), KV_ESTATE (the two layers' tokens differ), KV_EVERSION
 * (struct_size), KV_EINVAL (t or gamma outside [0, 1], dir_format),
 * KV_ENOTSUP (a page too small for one merged token), KV_ENOMEM. */
KV_API int kv_seq_merge_layers(kv_store_t *store, kv_seq_id_t seq, uint32_t layer,
                               const kv_merge_opts_t *opts);

/* The bits-per-element note of a format, e.g. "INT2 g16 = 4 bits/element"
 * (print it wherever a ratio is shown); NULL for an unknown format. */
KV_API const char *kv_format_note(kv_format_t fmt);

/* ---- policies ---------------------------------------------------------- */

/* A policy decides what a sequence keeps and in which format: token
 * selection (StreamingLLM, H2O, SnapKV, MiniKV), quantization (KIVI INT4/
 * INT2), layer merging (MiniCache), lazy-layer trimming (SimLayerKV) and
 * eviction merging (CaM), composed with '+'. It is data, parsed from a
 * string, e.g. "fp16", "kivi2", "h2o:hh=0.1,rw=0.1+cam:m=16",
 * "minikv:hh=0.25,rw=0.25,pyramid=7", "simlayerkv:delta=0.9,w=1024+int4",
 * "minicache:from=0.5,t=0.6,gamma=0.05+int4" (the full grammar, every key
 * and the valid compositions: docs/policies.md).
 *
 * With a policy set on a sequence the store itself collects the exact
 * attention statistics the policy needs during kv_attn_prefill/decode on
 * that sequence (nothing otherwise), and acts at kv_seq_prefill_end and
 * kv_seq_step_end. Attention calls on a sequence with a policy write its
 * statistics: they must not run concurrently for the same sequence. */
typedef struct kv_policy kv_policy_t; /* opaque, immutable once parsed */

/* Parse spec. On error returns KV_EINVAL and writes a message naming the
 * offending method/key/value into err (if err_len > 0). */
KV_API int kv_policy_parse(const char *spec, kv_policy_t **out, char *err,
                           size_t err_len);
KV_API void kv_policy_destroy(kv_policy_t *policy);
/* The canonical spec (every key with its value), NUL-terminated; KV_ERANGE
 * if it does not fit in len. */
KV_API int kv_policy_describe(const kv_policy_t *policy, char *buf, size_t len);

/* Attach a policy (copied) to a sequence, before its first append; forks
 * inherit it with its state. NULL detaches (keeps what is stored).
 * Errors: KV_ENOENT, KV_ESTATE (sequence not empty), KV_ENOTSUP. */
KV_API int kv_seq_set_policy(kv_store_t *store, kv_seq_id_t seq,
                             const kv_policy_t *policy);

/* The prompt is in (every layer appended and prefilled): apply prefill-end
 * decisions (selection, quantization, merging, lazy-layer marking). */
KV_API int kv_seq_prefill_end(kv_store_t *store, kv_seq_id_t seq);

/* One decode step is done on every layer: apply per-step decisions
 * (H2O/StreamingLLM eviction + CaM merging, SimLayerKV trimming after the
 * first decode token, MiniCache merging of new tokens, residual
 * quantization). */
KV_API int kv_seq_step_end(kv_store_t *store, kv_seq_id_t seq);

/* ---- attention --------------------------------------------------------- */

/* Attention statistics: for each kv head and each token t of its list, the
 * attention probability token t received, summed over the requested query
 * rows and over the query heads of the kv head's group. Probabilities are
 * exact: each row is normalized by its true log-sum-exp. Stats are written,
 * not accumulated (a policy sums them across calls). Layout of a stats
 * buffer: [n_kv_heads][stats_stride] floats, stats_stride >= the longest list
 * of the layer; entries past a head's length are left untouched. */

/* Decode attention for a batch of sequences at one layer (one query row per
 * sequence), over every token each sequence holds at that layer.
 *   q:   [batch][n_q_heads][head_dim]
 *   out: [batch][n_q_heads][head_dim]
 *   stats: NULL, or [batch] pointers (each NULL or a stats buffer, above). */
typedef struct kv_decode {
    uint32_t layer;
    uint32_t batch;             /* sequences, >= 1                         */
    const kv_seq_id_t *seqs;    /* [batch] (duplicates allowed)            */
    const float *q;             /* [batch][n_q_heads][head_dim]            */
    float *out;                 /* [batch][n_q_heads][head_dim]            */
    float *const *stats;        /* NULL or [batch] of [n_kv_heads][stride] */
    uint32_t stats_stride;      /* floats per kv head row in stats         */
    float scale;                /* 0 = 1/sqrt(head_dim)                    */
} kv_decode_t;

/* Errors: KV_EINVAL, KV_ENOENT, KV_ERANGE (layer; stats_stride too short),
 * KV_ESTATE (a list is empty), KV_ENOMEM (scratch). Nothing is changed. */
KV_API int kv_attn_decode(kv_store_t *store, const kv_decode_t *args);

/* Causal prefill attention for one sequence at one layer: the last n_new
 * tokens of each list are the new ones (append them first); new row i
 * attends to every earlier token and to new tokens 0..i.
 *   q:   [n_new][n_q_heads][head_dim];  out: [n_new][n_q_heads][head_dim]
 *   stats: NULL or a stats buffer, summed over rows stats_row0..n_new-1. */
typedef struct kv_prefill {
    uint32_t layer;
    kv_seq_id_t seq;
    uint32_t n_new;             /* query rows, 1..list length             */
    const float *q;
    float *out;
    float *stats;               /* NULL or [n_kv_heads][stats_stride]     */
    uint32_t stats_stride;
    uint32_t stats_row0;        /* first query row counted in stats       */
    float scale;                /* 0 = 1/sqrt(head_dim)                   */
} kv_prefill_t;

KV_API int kv_attn_prefill(kv_store_t *store, const kv_prefill_t *args);

#ifdef __cplusplus
}
#endif
#endif /* KVPAGE_KVPAGE_H */
