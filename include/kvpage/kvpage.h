/* SPDX-License-Identifier: MIT */
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
 *     other, but not with a mutating call on the same store. (With a page
 *     file and KV_OFFLOAD_WAIT they may read pages back: see "offload".)
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
    KV_ENOTRES     = -1011, /* page not resident (on the page file, see offload) */
    KV_EBUSY       = -1012, /* the page file is owned by another store (offload) */
    KV_EAUTH       = -1013, /* the remote tier refused our credentials or ACL    */
    KV_ETLS        = -1014, /* the remote tier's TLS: files, handshake or        */
                            /* certificate verification failed                   */
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

/* Or'ed into a TARGET format (kv_seq_set_format, the policies' rot=1):
 * KV_FMT_INT4 | KV_FMT_ROT and KV_FMT_INT2 | KV_FMT_ROT store rows rotated
 * per head (a normalized Walsh-Hadamard transform with a fixed sign
 * diagonal, docs/policies.md "Rotated INT pages") before quantization:
 * same bytes per token, lower error on outlier channels; every reader
 * (kv_read, attention) sees rows in the original space. head_dim must be a
 * power of two (else KV_EINVAL). Never part of a page's own format number. */
#define KV_FMT_ROT 0x100u

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
/* Attention over INT4/INT2 pages with 8-bit integer dot products: q * scale
 * and p * scale are rounded to int8 per group before they meet the codes,
 * so logits and outputs differ slightly from those over kv_read's floats
 * (APPROXIMATE; its cost in perplexity and retrieval on SmolLM2:
 * docs/results.md). INT2 decode attention runs about 1.4x faster than
 * without it (docs/results/benchmarks.md). CPUs with AVX-512 VNNI and VBMI
 * only: elsewhere kv_store_create returns KV_ENOTSUP. Results stay
 * deterministic and independent of n_threads; FP16 and MERGED pages are
 * unaffected. kvpage eval: a policy spec ending in "@i8". */
#define KV_CONFIG_INT8_ATTN 0x2u

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
    const char *pressure; /* memory-pressure ladder, NULL or "" = off: steps run */
                          /* on the coldest sequences before KV_ENOMEM, e.g.     */
                          /* "offload,int4,int2,evict:sink=4,recent=256" (see    */
                          /* "memory pressure" below); copied at create          */
    uint32_t pressure_reserve; /* pages: when a mutating call leaves            */
                          /* fewer free, the ladder runs until this many are;    */
                          /* 0 = only when a page is refused; <= host_pages      */
    /* page-file tier ("offload" below); all zero/NULL: no page file          */
    const char *offload_path; /* the page file; NULL = no offload tier. Its  */
                          /* index is "<path>.idx". Copied at create          */
    uint32_t offload_pages; /* slots of a new file (one page each),           */
                          /* 1..2^26; ignored with KV_OFFLOAD_OPEN            */
    uint32_t offload_qd;  /* I/Os in flight, 1..4096; 0 = 64                  */
    uint32_t offload_high; /* watermarks of kv_store_offload_balance, in per  */
    uint32_t offload_low;  /* mille of host_pages in use; 0 = 900 and 750     */
                          /* (low: high/2 if high <= 750); low < high <= 1000 */
    uint32_t offload_flags; /* KV_OFFLOAD_* bits                              */
    /* TESTING only (docs/offload.md, "Fault injection"): faults injected     */
    /* into page-file I/O, per million transfers, 0..1e6 (with faults on,    */
    /* each I/O carries one page); split evenly over 7 kinds (EIO, ENOSPC,    */
    /* short transfer, torn write, bit flip, EAGAIN, EINTR); 0 = none.        */
    /* Both 0 without offload_path (KV_EINVAL); > 1e6: KV_ERANGE.             */
    uint32_t offload_fault_ppm;
    uint64_t offload_fault_seed; /* PRNG seed of the injected faults          */
    /* prefix cache ("prefix cache" below); all zero/NULL: off              */
    uint32_t prefix_cache; /* 1: keep published prompt blocks for reuse    */
    uint32_t prefix_model_len; /* bytes of prefix_model, 1..65536 (cache on) */
    const void *prefix_model; /* model fingerprint, e.g. the SHA-256 of the */
                          /* weights file: KV of other models never matches; */
                          /* copied at create                                */
    const char *prefix_remote; /* remote tier: "redis://host:port" or a   */
                          /* Redis Cluster's seeds "redis://h1:p1,h2:p2";   */
                          /* "rediss://": TLS; "redis://user:pass@h:p" or   */
                          /* "redis://:pass@h:p": AUTH (prefer the two      */
                          /* fields below: a url may be seen in a process   */
                          /* list); NULL = none; copied at create           */
                          /* (docs/prefix.md, "Authentication and TLS")     */
    uint32_t prefix_remote_timeout_ms; /* bound of one remote fetch; 0 = 1000 */
    /* remote tier: credentials and TLS (docs/prefix.md, "Authentication and */
    /* TLS"). All NULL: none. Each needs prefix_remote; paths and names are   */
    /* copied at create, where the password is read (never kept in            */
    /* kv_config_t).                                                          */
    const char *prefix_remote_password_file; /* a file whose first line is the */
                          /* AUTH password (1..512 bytes; a trailing "\r\n"  */
                          /* is not part of it); -errno if it cannot be read */
    const char *prefix_remote_password_env; /* the name of an environment     */
                          /* variable holding the password (set, non-empty); */
                          /* at most one of the two, and not with a password */
                          /* in the url (KV_EINVAL)                          */
    const char *prefix_remote_tls_ca; /* rediss: CA file (PEM) that verifies */
                          /* the servers; NULL = the system's store          */
    const char *prefix_remote_tls_cert; /* rediss: client certificate chain   */
                          /* (PEM), for servers that ask for one             */
    const char *prefix_remote_tls_key; /* its private key (PEM); both or none */
    /* remote tier, per deployment: key prefix and value authentication     */
    /* (docs/prefix.md, "Deployments"); all NULL: keys "kvp:<hash>", values */
    /* unsigned (crc32c only) as before. Each needs prefix_remote.          */
    const char *prefix_remote_ns; /* key prefix: every server key is       */
                          /* "<ns>:<64 hex digits>" (an ACL user limited to   */
                          /* "~<ns>:*" suffices); 1..64 printable ASCII bytes, */
                          /* no space; NULL = "kvp"; copied at create          */
    const char *prefix_remote_mac; /* the deployment's MAC key, as          */
                          /* "file:PATH" (the file holds it) or "env:NAME"    */
                          /* (the environment variable holds it): 64..128 hex */
                          /* digits (32..64 bytes), whitespace around ignored;*/
                          /* read once at create (the store keeps the key,    */
                          /* never this string's target). Every value is then */
                          /* signed (HMAC-SHA-256) and only values signed     */
                          /* with this key or prefix_remote_mac_prev are      */
                          /* accepted. NULL = unsigned values; copied         */
    const char *prefix_remote_mac_prev; /* the key before a rotation, same  */
                          /* syntax: still accepted, never used to sign;     */
                          /* needs prefix_remote_mac; NULL = none; copied     */
} kv_config_t;

/* kv_config_t.offload_flags */
#define KV_OFFLOAD_WAIT  0x1u /* a call that needs a non-resident page reads  */
                              /* it back and waits, instead of KV_ENOTRES     */
#define KV_OFFLOAD_OPEN  0x2u /* open an existing page file and restore its   */
                              /* sequences (else create it: -EEXIST if there) */
#define KV_OFFLOAD_PREAD 0x4u /* pread/pwrite I/O queue even where io_uring runs */

/* Fill the first size bytes of *cfg (size = the caller's sizeof(kv_config_t))
 * with the defaults, struct_size = size and version set, the model shape
 * zero (the caller sets n_layers, heads, head_dim, host_pages). A caller
 * built against an older header, whose kv_config_t ends before fields added
 * since, gets its own fields and kv_store_create gives the rest their
 * defaults. Errors: KV_EINVAL (NULL), KV_EVERSION (size larger than this
 * library's kv_config_t or smaller than the first one served by size). */
KV_API int kv_config_init(kv_config_t *cfg, uint32_t size);

/* A config with the defaults (kv_config_init with this header's size):
 * inline, so a program keeps its own struct's size when the library's
 * grows. On KV_EVERSION (a library older than the header) struct_size is
 * still set, and kv_store_create refuses it with KV_EVERSION. */
static inline kv_config_t kv_config_default(void)
{
    kv_config_t c;
    unsigned char *b = (unsigned char *)&c;
    for (size_t i = 0; i < sizeof c; i++)
        b[i] = 0;
    if (kv_config_init(&c, (uint32_t)sizeof c))
        c.struct_size = (uint32_t)sizeof c;
    return c;
}

/* Store-wide statistics (see kv_store_stats). Byte counts are exact.
 * The caller sets struct_size before the call, e.g.
 *     kv_stats_t st = {.struct_size = sizeof st};
 * Fields are only ever added at the end: a caller built against an older,
 * smaller kv_stats_t gets the fields its struct has, and nothing is written
 * past its struct_size. */
typedef struct kv_stats {
    uint32_t struct_size;       /* set by the caller: sizeof(kv_stats_t) of the    */
                                /* header it was built with; never written         */
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
    /* memory-pressure ladder (kv_config_t.pressure; all 0 when off)              */
    uint64_t pressure_runs;     /* ladder runs (a refused page, or below reserve)  */
    uint64_t pressure_rescued;  /* calls that failed for want of pages and then    */
                                /* succeeded after the ladder                      */
    uint64_t pressure_pages_freed;      /* pool pages the ladder gave back (net)   */
    uint64_t pressure_converted_tokens; /* FP16 tokens its int4/int2 steps         */
                                        /* converted, summed over lists            */
    uint64_t pressure_evicted_tokens;   /* tokens its evict step dropped, summed   */
                                        /* over lists                              */
    /* page-file tier (kv_config_t.offload_path; all 0 without one). Pages on */
    /* the file are not in pages_used, pages_by_format or kv_bytes.           */
    uint64_t offload_slots;     /* slots in the page file                          */
    uint64_t offload_slots_used; /* slots held: pages, writes in flight, records   */
    uint64_t pages_on_file;     /* page references whose data is only on the file  */
                                /* (lost ones included)                            */
    uint64_t pages_in_flight;   /* page references with a read or write in flight  */
    uint64_t pages_lost;        /* on the file, but their last read failed         */
    uint64_t pages_out;         /* page writes completed (cumulative)              */
    uint64_t pages_in;          /* page reads completed and verified (cumulative)  */
    uint64_t bytes_out;         /* payload bytes of pages_out                      */
    uint64_t bytes_in;          /* payload bytes of pages_in                       */
    uint64_t io_errors;         /* page reads/writes that failed, checksum         */
                                /* failures included (cumulative)                  */
    uint64_t seqs_dropped;      /* sequences a reopened file named that could not  */
                                /* be restored (record or pages unreadable)        */
    uint64_t offload_faults;    /* faults injected (kv_config_t.offload_fault_ppm; */
                                /* testing), cumulative                            */
    /* memory-pressure ladder, continued                                       */
    uint64_t pressure_offloaded_pages; /* pages its offload step wrote to the   */
                                /* page file (their pool pages freed)              */
    /* prefix cache (kv_config_t.prefix_cache; all 0 when off). Pages the     */
    /* cache holds are in pages_used, pages_by_format and kv_bytes.           */
    uint64_t prefix_nodes;      /* cached nodes (a block run each), in the pool or */
                                /* on the page file                                */
    uint64_t prefix_pages;      /* pool page references the nodes hold             */
    uint64_t prefix_pages_only; /* of those, pages no sequence holds (refcount 1): */
                                /* what eviction frees                             */
    uint64_t prefix_hits;       /* kv_seq_prefix_match calls that matched tokens   */
    uint64_t prefix_misses;     /* ... that matched none                           */
    uint64_t prefix_tokens_reused; /* tokens matched, summed over calls (blocks    */
                                   /* and compressed contexts)                     */
    uint64_t prefix_published;  /* nodes created by kv_seq_prefix_publish          */
    uint64_t prefix_evicted;    /* nodes evicted from the pool (memory pressure):  */
                                /* dropped, or demoted to the page file            */
    uint64_t prefix_evicted_pages; /* pool pages those evictions freed             */
    /* remote tier (kv_config_t.prefix_remote; all 0 without)                 */
    uint64_t prefix_remote_hits;   /* nodes fetched, validated and installed       */
    uint64_t prefix_remote_tokens; /* tokens matched through those nodes           */
    uint64_t prefix_remote_bad;    /* values that failed a check (never used)      */
    uint64_t prefix_remote_errors; /* keys the remote did not answer: down, slow,  */
                                   /* server error (misses)                        */
    uint64_t prefix_remote_bytes_in; /* payload bytes of installed nodes          */
    uint64_t prefix_remote_put;    /* nodes queued for the remote                  */
    uint64_t prefix_remote_dropped; /* nodes not queued (queue full, no memory, or */
                                   /* more than 1023 pages)                        */
    /* prefix cache, continued: statistics snapshots (H2O, MiniKV, CaM)       */
    uint64_t prefix_snapshots;     /* nodes that carry one                         */
    uint64_t prefix_snapshot_bytes; /* their host bytes (also in meta_bytes)       */
    /* page-file tier of the cache (kv_config_t.offload_path with the cache  */
    /* on; all 0 without; docs/prefix.md). A node on the file holds no pool   */
    /* page: its pages are only in its copy on the file.                       */
    uint64_t prefix_file_nodes;    /* nodes whose pages are only on the file       */
    uint64_t prefix_file_slots;    /* file slots the nodes' copies hold (pages and */
                                   /* records; also in offload_slots_used)         */
    uint64_t prefix_file_hits;     /* nodes read back by a match and installed     */
    uint64_t prefix_file_tokens;   /* tokens matched through those nodes           */
    uint64_t prefix_file_bytes_in; /* page bytes read back for them                */
    uint64_t prefix_file_bytes_out; /* page bytes written (demotions and syncs)    */
    uint64_t prefix_file_demoted;  /* nodes moved from the pool to the file        */
    uint64_t prefix_file_dropped;  /* nodes not kept on the file: full file or     */
                                   /* failed write at demotion, or dropped to make */
                                   /* room for a sequence's page-out               */
    uint64_t prefix_file_bad;      /* nodes whose read-back failed a check (or an  */
                                   /* I/O error), dropped with their descendants;  */
                                   /* records that failed restore's checks         */
    uint64_t prefix_file_restored; /* nodes found on the file at KV_OFFLOAD_OPEN   */
    /* compressed contexts (kv_seq_prefix_publish_compressed)                 */
    uint64_t prefix_ctx_nodes;     /* context nodes cached (in prefix_nodes)       */
    uint64_t prefix_ctx_published; /* context nodes created                        */
    uint64_t prefix_ctx_hits;      /* kv_seq_prefix_match_compressed hits          */
    uint64_t prefix_ctx_misses;    /* ... misses                                   */
    /* remote tier, continued                                                */
    uint64_t prefix_remote_unauth; /* of prefix_remote_bad, values refused as   */
                                   /* unauthenticated: with prefix_remote_mac,  */
                                   /* unsigned or without a valid MAC under the */
                                   /* current or previous key; without it,     */
                                   /* signed values                            */
    /* remote tier, continued: refusals (docs/prefix.md, "Authentication and */
    /* TLS"); fetches and publishes both, none in prefix_remote_errors        */
    uint64_t prefix_remote_denied; /* keys the server refused (KV_EAUTH: AUTH  */
                                   /* refused, -NOAUTH, -WRONGPASS, -NOPERM)   */
    uint64_t prefix_remote_auth_failures; /* connections whose AUTH was refused */
    uint64_t prefix_remote_tls_failures; /* TLS handshakes that failed (the    */
                                   /* certificate not verified, not a TLS      */
                                   /* server, no answer by the connect timeout) */
} kv_stats_t;
/* Compression ratio, honest: fp16_bytes / (kv_bytes + meta_bytes) (partly
 * filled pages, FP16 residual tails and metadata all count; a MERGED page
 * counts once though two layers read it). Print kv_format_note() beside it. */

/* ---- store ------------------------------------------------------------- */

/* Memory a configuration can take, known before a store exists
 * (kv_config_estimate). Metadata is everything the store allocates besides
 * pages. */
typedef struct kv_estimate {
    uint64_t meta_fixed;    /* bytes kv_store_create allocates: the pool's    */
                            /* refcounts and free list, sequence tables, a new */
                            /* page file's slot arrays (a reopened file's:    */
                            /* ~56 bytes per slot more; staging buffers, up to */
                            /* 64 MiB, aside)                                  */
    uint64_t meta_per_seq;  /* bytes each live sequence takes when created:    */
                            /* n_layers * n_kv_heads list headers              */
    uint64_t meta_per_page; /* bytes per page reference held by a list         */
    uint64_t meta_max;      /* meta_fixed + max_seqs * meta_per_seq +          */
                            /* host_pages * meta_per_page: a full store (forks */
                            /* and compacted positions, 4 bytes a token, add)  */
    uint64_t kv_max;        /* host_pages * page_bytes: the pool's pages,      */
                            /* reserved as address space, touched as used      */
    uint64_t meta_cap;      /* the cap on meta_max: physical memory           */
} kv_estimate_t;

/* Validate cfg as kv_store_create does (same errors) and estimate its
 * memory into *out, allocating nothing. E.g. 4096 layers x 1024 kv heads
 * take 224 MiB of list headers per sequence: with the default max_seqs
 * (1024) meta_max is 224 GiB. */
KV_API int kv_config_estimate(const kv_config_t *cfg, kv_estimate_t *out);

/* Create a store. *out is set only on success. Errors: KV_EINVAL (NULL,
 * inconsistent shape; a prefix_remote_ns or prefix_remote_mac* that is
 * malformed or set without prefix_remote, an env: variable that is not set,
 * a key that is not 64..128 hex digits), KV_ERANGE (a field outside its
 * range), -errno (a file: key that cannot be read), KV_EVERSION
 * (struct_size or version other than this header's), KV_ENOTSUP (backend
 * not built; KV_CONFIG_INT8_ATTN on a CPU without it), KV_ENOMEM: memory
 * ran out, or -- before anything is allocated -- the
 * metadata of a full store (kv_config_estimate: meta_max) exceeds the
 * machine's physical memory (meta_cap): lower max_seqs or host_pages.
 * With a remote tier (prefix_remote): KV_EAUTH (the server refused the
 * credentials, or wants some), KV_ETLS (a TLS file cannot be loaded, the
 * handshake or the certificate check failed), -errno (the password file
 * cannot be read), KV_EINVAL (a password env variable unset or empty, an
 * empty password file). */
KV_API int kv_store_create(const kv_config_t *cfg, kv_store_t **out);

/* Destroy a store and everything in it. NULL is a no-op. With a page file:
 * finishes its I/O and persists it first (kv_store_offload_sync); the file
 * stays on disk. */
KV_API void kv_store_destroy(kv_store_t *store);

/* The config the store runs with (defaults resolved): the first size bytes
 * of it into *out (size = the caller's sizeof(kv_config_t); struct_size =
 * size), so a caller built against an older, smaller kv_config_t gets its
 * own fields and nothing past them. Errors: KV_EINVAL (NULL), KV_EVERSION
 * (size as kv_config_init refuses it); nothing is written then. */
KV_API int kv_store_config_into(const kv_store_t *store, kv_config_t *out, uint32_t size);

/* kv_store_config_into with this header's size: inline, so a program keeps
 * its own struct's size when the library's grows. */
static inline int kv_store_config(const kv_store_t *store, kv_config_t *out)
{
    return kv_store_config_into(store, out, (uint32_t)sizeof *out);
}

/* Fill *out with current statistics: the first out->struct_size bytes of
 * kv_stats_t (all of it for a caller built with this header; an older,
 * smaller struct gets its own fields, and a field cut by struct_size gets
 * its leading bytes). struct_size itself is left as it is. Errors: KV_EINVAL
 * (NULL), KV_EVERSION (struct_size under 8 -- not set -- or larger than this
 * library's kv_stats_t: a caller built against a newer header); nothing is
 * written then. */
KV_API int kv_store_stats(const kv_store_t *store, kv_stats_t *out);

/* Check every internal invariant (refcount of each page == number of page
 * table and prefix-cache references to it, used + free == capacity, list
 * lengths consistent, the prefix cache's nodes and chains).
 * Returns 0, KV_ECORRUPT, or KV_ENOMEM (its scratch could not be allocated).
 * O(pages); meant for tests and debugging. */
KV_API int kv_store_check(const kv_store_t *store);

/* ---- sequences --------------------------------------------------------- */

/* Create an empty sequence. Errors: KV_ELIMIT (max_seqs live), KV_ENOMEM. */
KV_API int kv_seq_create(kv_store_t *store, kv_seq_id_t *out);

/* Free a sequence and release its pages (shared pages stay with the other
 * holders). With a page file it first waits for the sequence's I/O in
 * flight and frees its slots. Errors: KV_ENOENT. */
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
 *         from one past the largest position it holds (0 for an empty list;
 *         after a MiniCache merge the last token need not hold the largest).
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
 * Errors: KV_ENOENT, KV_ERANGE (t0 + n beyond the list), KV_ENOTRES (a page
 * of the range is on the page file; see "offload" for KV_OFFLOAD_WAIT). */
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
 * they are. Forks inherit it. fmt may be KV_FMT_INT4 | KV_FMT_ROT or
 * KV_FMT_INT2 | KV_FMT_ROT: pages converted from now on are stored rotated.
 * Errors: KV_ENOENT, KV_ERANGE, KV_EINVAL (fmt not INT4/INT2/FP16, or
 * KV_FMT_ROT on FP16 or with a head_dim that is not a power of two), KV_ENOTSUP (this page size holds no 16-token group
 * of fmt), KV_ENOTRES (see "offload"). Allocates nothing. */
KV_API int kv_seq_set_format(kv_store_t *store, kv_seq_id_t seq, uint32_t layer,
                             kv_format_t fmt);

/* Convert now every token of (seq, layer) but the newest keep_fp16 (rounded up
 * so that only whole 16-token groups convert) to the layer's format; e.g. at
 * prefill end. No-op for FP16 layers. All-or-nothing (KV_ENOMEM, after the
 * memory-pressure ladder if any; KV_ENOTRES: see "offload"). */
KV_API int kv_seq_quantize(kv_store_t *store, kv_seq_id_t seq, uint32_t layer,
                           uint32_t keep_fp16);

/* MiniCache merge options (docs/design.md). Start from
 * kv_merge_opts_default(). */
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
 * KV_ENOTSUP (a page too small for one merged token), KV_ENOMEM (after the
 * memory-pressure ladder if any), KV_ENOTRES (see "offload"). */
KV_API int kv_seq_merge_layers(kv_store_t *store, kv_seq_id_t seq, uint32_t layer,
                               const kv_merge_opts_t *opts);

/* The bits-per-element note of a format, e.g. "INT2 g16 = 4 bits/element"
 * (print it wherever a ratio is shown; kv_format_info gives the numbers);
 * NULL for an unknown format. */
KV_API const char *kv_format_note(kv_format_t fmt);

/* The numbers of a page format for a page geometry (for capacity planners
 * and reports: what kv_format_note says for people). */
typedef struct kv_format_info {
    const char *name;         /* "fp16", "int4", "int2", "merged"             */
    const char *note;         /* kv_format_note(fmt)                          */
    double bits_per_element;  /* what one element of a list's K or V costs:   */
                              /* codes, scales and minimums, norms; partly    */
                              /* filled pages aside. FP16 16, INT4 6, INT2 4; */
                              /* MERGED (one layer's share of the pair)       */
                              /* 8 + 32/head_dim, with INT4 directions        */
                              /* 3 + 32/head_dim                              */
    uint32_t group_size;      /* elements sharing one scale and minimum: 16   */
                              /* for INT4, INT2 and MERGED's INT4 directions; */
                              /* 0: not grouped                               */
    uint32_t tokens_per_page; /* tokens (MERGED: merged tokens) one page      */
                              /* holds; 0: none fits (a store of this         */
                              /* geometry answers KV_ENOTSUP for the format)  */
} kv_format_info_t;

/* The numbers of format fmt for head_dim and page_bytes, given as in
 * kv_config_t (page_bytes 0: 64 * head_dim). dir_format: MERGED's
 * direction format, KV_FMT_FP16 or KV_FMT_INT4 (kv_merge_opts_t.dir_format);
 * KV_FMT_FP16 for every other format. Errors: KV_EINVAL (NULL out, an
 * unknown format, a dir_format the format does not have), KV_ERANGE
 * (head_dim or page_bytes kv_store_create would refuse). *out is written
 * only on success. */
KV_API int kv_format_info(kv_format_t fmt, kv_format_t dir_format, uint32_t head_dim,
                          uint32_t page_bytes, kv_format_info_t *out);

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
 * offending method/key/value into err (if err_len > 0): an unknown method
 * or key, a method or key given twice, a malformed or out-of-range value,
 * an invalid composition. */
KV_API int kv_policy_parse(const char *spec, kv_policy_t **out, char *err,
                           size_t err_len);
KV_API void kv_policy_destroy(kv_policy_t *policy);
/* The canonical spec (every key with its value, numbers in the shortest
 * form that parses back to the same value: "hh=0.2"), NUL-terminated; KV_ERANGE
 * if it does not fit in len. */
KV_API int kv_policy_describe(const kv_policy_t *policy, char *buf, size_t len);

/* The value of one key of one method of a parsed policy, e.g. ("h2o", "hh")
 * or ("simlayerkv", "w"), into *out: as given or defaulted; an amount (a
 * token budget) as given, a fraction of the prompt when < 1 or tokens;
 * a key with named values (simlayerkv's mode) the value's index in
 * docs/policies.md's list (decode 0, prefill 1). Errors: KV_EINVAL (NULL,
 * an unknown method, or a key that method does not have), KV_ENOENT (the
 * policy does not have that method). *out is written only on success. */
KV_API int kv_policy_value(const kv_policy_t *policy, const char *method,
                           const char *key, double *out);

/* The methods of a policy: bits of kv_policy_info_t.methods, in the order
 * kv_policy_describe writes them (but eattn, a later bit, which it writes
 * after minikv, with the other selections). */
#define KV_POLICY_FP16         0x001u
#define KV_POLICY_STREAMINGLLM 0x002u
#define KV_POLICY_H2O          0x004u
#define KV_POLICY_SNAPKV       0x008u
#define KV_POLICY_MINIKV       0x010u
#define KV_POLICY_SIMLAYERKV   0x020u
#define KV_POLICY_MINICACHE    0x040u
#define KV_POLICY_CAM          0x080u
#define KV_POLICY_KIVI2        0x100u
#define KV_POLICY_KIVI4        0x200u
#define KV_POLICY_INT2         0x400u
#define KV_POLICY_INT4         0x800u
#define KV_POLICY_EATTN        0x1000u /* Expected Attention (selection);  */
                                       /* described after h2o..minikv     */
#define KV_POLICY_KVZIP        0x2000u /* KVzip (selection, query-agnostic: */
                                       /* scored by a reconstruction pass, */
                                       /* kv_seq_score_begin); described   */
                                       /* after eattn                      */

/* What a policy does to the lists of a sequence of n_layers layers and a
 * prompt of prompt_len tokens, in numbers, resolved as kv_seq_prefill_end
 * resolves them (for capacity planners and reports). What depends on the
 * attention itself (which tokens are kept, SimLayerKV's lazy layers,
 * MiniCache's retained tokens) is not in it. */
typedef struct kv_policy_info {
    uint32_t methods;        /* KV_POLICY_* bits of the methods it names     */
    kv_format_t format;      /* format its converted tokens take: FP16 (no   */
                             /* conversion), INT4 or INT2; MiniKV without a  */
                             /* format method: INT2; with MiniCache, that of */
                             /* the unmerged layers                          */
    uint32_t residual;       /* R: the format method's r (tokens kept FP16,  */
                             /* converted R at a time; the store's           */
                             /* kv_config_t.residual must equal it); 0       */
                             /* without a format method                      */
    uint32_t evicts;         /* 1: the selection evicts after every decode   */
                             /* step (streamingllm, h2o): a list never holds */
                             /* more than `budget` tokens; 0: it selects     */
                             /* once at prefill end and keeps every decoded  */
                             /* token (snapkv, minikv, eattn), or none       */
    uint32_t budget;         /* tokens a list keeps at prefill end: heavy    */
                             /* hitters + recent window (at least 1),        */
                             /* sink + recent (at least 1), snapkv's and     */
                             /* eattn's c; under a MiniKV pyramid or ada=1/2 */
                             /* the mean over layers / lists                 */
                             /* (heavy hitters before the pyramid spreads    */
                             /* them); may exceed prompt_len (all kept);     */
                             /* prompt_len without a selection               */
    double kept_fraction;    /* min(budget, prompt_len) / prompt_len; 1      */
                             /* without a selection or for an empty prompt   */
    uint32_t lazy_window;    /* SimLayerKV: tokens a lazy layer keeps (sink  */
                             /* + w); 0 without                              */
    uint32_t lazy_at_prefill; /* SimLayerKV: 1 lazy layers are decided at   */
                             /* prefill end (mode=prefill), 0 after the      */
                             /* first decode step                            */
    uint32_t merge_first;    /* MiniCache: the lower layer of the first      */
                             /* merged pair, floor(n_layers * from); pairs   */
                             /* (merge_first, +1), (+2, +3), ...;            */
                             /* n_layers without                             */
    uint32_t merge_pairs;    /* MiniCache: pairs merged (MERGED pages); the  */
                             /* other layers keep `format`; 0 without        */
    uint32_t merge_every;    /* MiniCache: decode tokens merged every this   */
                             /* many; 0 without                              */
    kv_format_t merge_dir_format; /* MiniCache: the MERGED pages' direction */
                             /* format (kv_format_info): INT4 with +int4,    */
                             /* else FP16                                    */
} kv_policy_info_t;

/* Fill *out for policy, n_layers (1..4096) and prompt_len (>= 0).
 * Errors: KV_EINVAL (NULL), KV_ERANGE (n_layers out of range). */
KV_API int kv_policy_info(const kv_policy_t *policy, uint32_t n_layers,
                          uint32_t prompt_len, kv_policy_info_t *out);

/* Attach a policy (copied) to a sequence, before its first append; forks
 * inherit it with its state. NULL detaches (keeps what is stored).
 * Errors: KV_ENOENT, KV_ESTATE (sequence not empty), KV_ENOTSUP. */
KV_API int kv_seq_set_policy(kv_store_t *store, kv_seq_id_t seq,
                             const kv_policy_t *policy);

/* The prompt is in (every layer appended and prefilled): apply prefill-end
 * decisions (selection, quantization, merging, lazy-layer marking).
 * Errors: KV_ENOENT, KV_ENOMEM (after the memory-pressure ladder if any;
 * call again to finish, docs/policies.md), KV_ENOTRES (see "offload"). */
KV_API int kv_seq_prefill_end(kv_store_t *store, kv_seq_id_t seq);

/* One decode step is done on every layer: apply per-step decisions
 * (H2O/StreamingLLM eviction + CaM merging, SimLayerKV trimming after the
 * first decode token, MiniCache merging of new tokens, residual
 * quantization). Errors as kv_seq_prefill_end. */
KV_API int kv_seq_step_end(kv_store_t *store, kv_seq_id_t seq);

/* KVzip scoring (policy "kvzip", docs/policies.md): the store scores a
 * prompt's tokens by how much a reconstruction of the prompt attends to
 * them; the engine runs that reconstruction. After the prompt's T tokens
 * are in `owner` (a kvzip policy attached, before kv_seq_prefill_end), fork
 * it (kv_seq_fork), mark the fork as a scoring pass of owner for context
 * tokens [t0, t1) with this call, and run through the fork a prompt that
 * asks the model to repeat those tokens ("Repeat the previous context
 * exactly." + the turn change of the chat template + tokens t0..t1-1),
 * with the usual kv_append and kv_attn_prefill calls. Each prefill call on
 * the pass records, for every token of [t0, t1), the largest attention
 * probability a row of the pass and a q head of the token's group gives
 * it, the softmax taken over the first min(sink, t0) tokens, [t0, t1) and
 * the pass's tokens up to the row; scores keep their maximum over calls
 * and passes. Free the pass (kv_seq_free) when done; score long prompts in
 * chunks, one pass each. kv_seq_prefill_end then keeps the first `sink`
 * tokens and the top-c by score (KV_ESTATE there if no pass scored a prompt
 * longer than c). The owner must not change while a pass runs (its calls
 * then fail with KV_ESTATE). kv_model_kvzip_score in the reference engine
 * does all of this.
 * Errors: KV_EINVAL (NULL), KV_ENOENT (a sequence not live), KV_ENOTSUP
 * (owner's policy has no kvzip), KV_ESTATE (pass == owner, the pass has no
 * kvzip policy or is a pass already, either is past prefill end, or a list
 * of either is not T long), KV_ERANGE (t0 >= t1 or t1 > T), KV_ENOMEM. */
KV_API int kv_seq_score_begin(kv_store_t *store, kv_seq_id_t pass, kv_seq_id_t owner,
                              uint32_t t0, uint32_t t1);

/* ---- prefix cache (docs/prefix.md) -------------------------------------- */

/* With kv_config_t.prefix_cache = 1 (and a model fingerprint), a sequence's
 * prompt blocks can be published and found again by later sequences with
 * the same prompt prefix, which then skip computing them. A block is B =
 * fp16_tokens_per_page tokens; block i is named by a SHA-256 chained over
 * blocks 0..i, the model fingerprint, the store's shape, the sequence's
 * per-layer formats, residual and policy spec, and a caller salt. A cached
 * node holds one pool reference to each page of every list covering its
 * blocks; a match shares those pages copy-on-write (as kv_seq_fork does).
 *
 * Salt: a tenant or isolation key (0..65536 bytes, NULL when 0). Sequences
 * matched or published with different salts never share a page.
 *
 * Exactness: a match at token b leaves the lists exactly as appending the
 * publisher's KV of tokens [0, b) to an empty sequence would, so the rest
 * of the prompt and the decode see the same bits as in the publisher (same
 * chunk boundary at b). Nodes exist only where the lists are in that state:
 * every entry full, unflagged and resident, positions 0..b-1; for a layer
 * converting to INT4/INT2 (KIVI) only at multiples of the residual R (all
 * of [0, b) converted, full INT pages). Policies: the fingerprint holds the
 * policy's canonical spec (different policies never share); publish the
 * prompt before kv_seq_prefill_end (which may select, merge or quantize:
 * the nodes keep the pages as appended). A match under SnapKV, or
 * SimLayerKV in prefill mode, stops before the last w rows (their
 * statistics are computed again). Under H2O, MiniKV or CaM (attention
 * summed over all prompt rows) a node may carry a statistics snapshot: the
 * sums for tokens [0, b) after rows [0, b), taken by a publish made when
 * the prefill has processed exactly b rows (b a node boundary: publish
 * after each prefill chunk); a match then stops at the last node with a
 * snapshot and installs it in seq's policy state, and never uses the
 * remote tier. The selection is then bit-identical to the publisher's when
 * the rest of the prompt is prefilled in the same chunks.
 *
 * Memory: when a page allocation of a call under the memory-pressure
 * protocol (see "memory pressure") is refused, least recently used nodes
 * are evicted first (the ends of chains first; nodes whose pages no
 * sequence holds before the others), with or without a ladder, and the
 * call retried. The cache never makes KV_ENOMEM more likely for those
 * calls. kv_store_check counts the nodes' references.
 *
 * Page-file tier (kv_config_t.offload_path): an evicted node is demoted
 * instead of dropped (its pages written to the page file, its pool pages
 * freed); a match that reaches it reads it back (only into free pool
 * pages: never a refused page; a page that fails its check shortens the
 * match, counted, never data); kv_store_offload_sync and kv_store_destroy
 * write the pool's nodes too, and a store opened with KV_OFFLOAD_OPEN finds
 * them again (kv_stats_t.prefix_file_*). The nodes' copies yield their
 * slots to sequences' page-outs.
 *
 * Remote tier (kv_config_t.prefix_remote, Redis/Valkey): published nodes
 * are also queued to the server (never blocking; a full queue drops), and a
 * match that stops in the pool asks the server for the following nodes,
 * each value checked in full (checksum, key, layout, formats, finite values)
 * before it becomes a pool node. A server that is down, slow (beyond
 * prefix_remote_timeout_ms) or returns a bad value shortens the match and
 * counts (kv_stats_t.prefix_remote_*); it is never an error of the call.
 * Without prefix_remote_mac, anyone who can write to the server can store
 * well-formed wrong KV: keep it private to the engines that share it. With
 * it, every value carries an HMAC-SHA-256 under the deployment's key,
 * checked (constant time) before anything of the value is used; a value
 * without a valid MAC is a miss, counted in prefix_remote_bad and
 * prefix_remote_unauth (docs/prefix.md, Security).
 * Credentials (the url's, prefix_remote_password_file or _env) are sent
 * with AUTH on every connection; "rediss://" verifies the server's
 * certificate and name (prefix_remote_tls_*). kv_store_create contacts the
 * server once (within prefix_remote_timeout_ms) and fails with KV_EAUTH
 * when it refuses the credentials (or wants some), KV_ETLS when the TLS
 * handshake or certificate check fails; a server that is down does not
 * fail it. Later refusals count in prefix_remote_denied (never a silent
 * miss). */

/* Both calls below are mutating calls (serialized with the others).
 * Attach the longest cached prefix of tokens[0..n) to seq, which must be
 * empty (its policy, if any, already set): at most n - 1 tokens (the engine
 * computes at least the last one), rounded down to a node. *matched = the
 * tokens attached (0: a miss, not an error); the engine then appends and
 * prefills tokens [*matched, n). Token ids are hashed as their 32-bit
 * patterns. Errors (nothing attached): KV_EINVAL (NULL, salt_len >
 * 65536), KV_ENOTSUP (cache off), KV_ENOENT, KV_ESTATE (seq not empty),
 * KV_ENOMEM, KV_EIO (libcrypto failed). */
KV_API int kv_seq_prefix_match(kv_store_t *store, kv_seq_id_t seq, const int32_t *tokens,
                               uint32_t n, const void *salt, size_t salt_len,
                               uint32_t *matched);

/* Publish the full blocks of seq's first n tokens (tokens[0..n) must be
 * the ids of the tokens appended, n <= every list's length) that are in
 * the state described above and not cached yet. Idempotent; call after
 * each prefill chunk or once before kv_seq_prefill_end. Returns the tokens
 * now covered by cached nodes from token 0 on (>= 0), or an error with
 * nothing published: KV_EINVAL, KV_ENOTSUP, KV_ENOENT, KV_ERANGE (n beyond
 * a list), KV_ENOMEM, KV_EIO. */
KV_API int kv_seq_prefix_publish(kv_store_t *store, kv_seq_id_t seq, const int32_t *tokens,
                                 uint32_t n, const void *salt, size_t salt_len);

/* Compressed contexts. A context is the first n tokens of a request that
 * later requests share (a document, a system prompt, a conversation so
 * far), compressed by seq's policy at kv_seq_prefill_end before anything
 * that follows it exists; the rest of a request (a question, the next
 * turn) is appended after the prefill end and decoded with kv_seq_step_end.
 * Publishing the compressed cache lets a later request with the same
 * context, salt and policy spec skip its prefill, its scoring pass and its
 * compression: the match installs the publisher's state after its prefill
 * end (the same pages, shared copy-on-write, positions and policy state, as
 * kv_seq_fork gives a fork), so everything after it computes exactly what
 * it computes on the publisher; a hit equals a cold run of the request bit
 * for bit. The context's key is its n token ids (any n >= 1), the same
 * fingerprint and salt as blocks, and a distinct kind; a context node
 * lives in the pool only (evicted like a node, never written to the page
 * file or the remote tier) and counts in kv_stats_t.prefix_nodes,
 * prefix_pages and prefix_ctx_*.
 *
 * Publish seq's compressed context tokens[0..n): after kv_seq_prefill_end
 * of exactly n prompt tokens and before any kv_seq_step_end or append.
 * Idempotent (an existing node is kept). Errors (nothing published):
 * KV_EINVAL (NULL, n 0, salt_len > 65536), KV_ENOTSUP (cache off; a list
 * holds merged pages, e.g. MiniCache), KV_ENOENT, KV_ESTATE (no policy, no
 * prefill end yet, a step end or an append since, n not the prompt length,
 * a KVzip scoring pass), KV_ENOMEM, KV_EIO, and kv_seq_fork's residency
 * errors. */
KV_API int kv_seq_prefix_publish_compressed(kv_store_t *store, kv_seq_id_t seq,
                                            const int32_t *tokens, uint32_t n,
                                            const void *salt, size_t salt_len);

/* Install the compressed context tokens[0..n) into seq: empty, its policy
 * set and not prefill-ended. *matched = n on a hit (seq is then as the
 * publisher was after kv_seq_prefill_end: do not call it again; append the
 * rest and call kv_seq_step_end), 0 on a miss (nothing changed: prefill
 * the context, kv_seq_prefill_end, publish). Errors (nothing changed):
 * KV_EINVAL, KV_ENOTSUP, KV_ENOENT, KV_ESTATE (seq not empty, no policy,
 * prefill ended, a scoring pass), KV_ENOMEM, KV_EIO. */
KV_API int kv_seq_prefix_match_compressed(kv_store_t *store, kv_seq_id_t seq,
                                          const int32_t *tokens, uint32_t n,
                                          const void *salt, size_t salt_len,
                                          uint32_t *matched);

/* The remote tier's url (kv_config_t.prefix_remote) with every password
 * replaced by "***" ("redis://app:***@h:6379"), fit for a log or a report,
 * into buf: NUL-terminated, truncated to cap - 1 bytes (a truncation never
 * shows a password either). Also for urls kv_store_create would refuse.
 * Returns the redacted url's full length, or KV_EINVAL (url NULL, or buf
 * NULL with cap > 0). */
KV_API int kv_prefix_remote_redact(const char *url, char *buf, size_t cap);

/* ---- memory pressure --------------------------------------------------- */

/* kv_config_t.pressure, a ladder of steps in escalation order, comma
 * separated, each at most once and in this order (any subset):
 *   offload                   write whole sequences to the page file
 *                             (lossless; needs offload_path)
 *   int4                      FP16 -> INT4
 *   int2                      FP16 -> INT2
 *   evict[:sink=S,recent=W]   keep the first S (0..65535, default 4) and the
 *                             last W (1..2^24, default 256) tokens of a list
 * e.g. "offload,int4,int2,evict:sink=4,recent=256", "int4,int2,evict",
 * "evict:recent=1024", "int2" (no spaces; values decimal digits). Errors at
 * kv_store_create (kv_pressure_check below says why): KV_EINVAL
 * (unknown step or key, malformed, repeated or out-of-order step or key,
 * pressure_reserve without a ladder, offload without offload_path),
 * KV_ERANGE (a value out of range, pressure_reserve > host_pages),
 * KV_ENOTSUP (a step's format holds no 16-token group in this page size).
 *
 * When a mutating call that takes pages -- kv_append, kv_compact,
 * kv_seq_quantize, kv_seq_merge_layers, kv_seq_prefill_end,
 * kv_seq_step_end, and the page-in of a KV_OFFLOAD_WAIT call (see
 * "offload") -- fails with KV_ENOMEM because the pool refused a page (a
 * failed metadata allocation does not count), the ladder runs over the
 * other live sequences, least recently used first (create, fork, append,
 * attention and kv_seq_prefetch mark a sequence used), step by step (every
 * sequence gets a step before any gets the next), one layer at a time
 * (shortest first), until as many pages are free as the call can need (an
 * upper bound: for the conversions, merges and policy calls, one layer or
 * layer pair rewritten), then the call is retried once and its result
 * returned (still KV_ENOMEM if the ladder could not free enough; what the
 * ladder did stays done). The retry is safe: those calls are all-or-nothing,
 * and kv_seq_prefill_end/kv_seq_step_end finish the job when called again.
 * (Their own conversions and merges run no ladder of their own.)
 *   offload: the coldest sequences' resident, unshared, non-MERGED pages
 *     are written to the page file, whole sequences at a time (as
 *     kv_seq_offload), until the pool would have the pages; the step waits
 *     for those writes (and first for any I/O already in flight), so their
 *     pool pages are free before the retry. Lossless: they come back
 *     bit-exact with kv_seq_prefetch + kv_seq_wait, or KV_OFFLOAD_WAIT. A
 *     sequence the file has no room for (-ENOSPC) or whose write fails
 *     stays resident; the next steps then work on what is still resident.
 *     Only first in the ladder (lossless before lossy).
 *   int4/int2: the layer's FP16 residual (its unconverted FP16 tail) is
 *     converted (kv_seq_set_format + kv_seq_quantize with keep_fp16 0, a few
 *     pages at a time while few are free) and the layer keeps that format
 *     for later appends (KIVI). int4 skips layers already converting to
 *     INT2; INT4 pages are never re-quantized to INT2.
 *   evict: every list longer than S + W keeps its first S and last W tokens
 *     (kv_compact, with the sequence's policy scores following), where that
 *     frees pages: kept tokens of INT4/INT2/MERGED pages become FP16.
 * Never touched: the sequence the call is for. Nor, by the lossy steps
 * (int4, int2, evict): pages shared with another list (forks, merged
 * pairs: acting on them costs pages instead of freeing them); sequences
 * under a MiniCache policy (its layer pairs must keep the same tokens);
 * sequences with pages on the page file or in flight (so a sequence the
 * offload step wrote is not also converted). Sequences under CaM are only
 * evicted (CaM rewrites FP16 values).
 * A conversion needs fresh pages before it frees old ones (at least one per
 * kv head for a layer), so with fewer free pages than kv heads only
 * eviction makes progress (typical at decode time, when an append fails
 * for want of one page per kv head). kv_config_t.pressure_reserve keeps
 * pages free for the ladder ahead of time (after a successful call above,
 * the page-in aside, leaves fewer free, the ladder runs until that many
 * are; best effort): 2 * n_kv_heads or more lets conversion start. With
 * offload first this is an automatic watermark: cold sequences are paged
 * out ahead of time (inside the call, waiting for the writes). Contents change as
 * the lossy steps say (within the format's bound; evicted tokens are gone);
 * kv_store_stats counts runs, pages freed, pages offloaded and tokens
 * converted/evicted. The ladder runs inside the (mutating) call, so the
 * caller's serialization of mutating calls covers it. */

/* Check a ladder (kv_config_t.pressure) on its own, e.g. to tell a user
 * what is wrong with one: 0 for a valid one (NULL and "": no ladder), else
 * the code kv_store_create returns for it, KV_EINVAL (malformed, an unknown
 * step or key, a step or key given twice, steps out of order) or KV_ERANGE
 * (a value out of range), with a message naming the step, key and value in
 * err (if err_len > 0; "" on success). What needs the rest of the config
 * (offload without offload_path, pressure_reserve, KV_ENOTSUP for the page
 * size) is checked by kv_store_create only. */
KV_API int kv_pressure_check(const char *ladder, char *err, size_t err_len);

/* ---- offload: the page-file tier (docs/offload.md) --------------------- */

/* With kv_config_t.offload_path set, the store keeps a page file (O_DIRECT
 * where the filesystem allows, io_uring or pread/pwrite): pages of a
 * sequence can be written to it in their stored (compressed) form and their
 * pool pages freed (kv_seq_offload, kv_store_offload_balance, or the
 * memory-pressure ladder's offload step when the pool runs out), and read
 * back (kv_seq_prefetch). Every page on the file carries a crc32c'd header;
 * a page that fails its check is never returned as data: it is reported
 * lost (below). kv_store_create errors for the tier: KV_EINVAL (offload
 * fields set without offload_path, unknown flag, a reopened file recorded
 * for another model shape, a path that is not a regular file), KV_ERANGE
 * (a field out of range, or a reopened file's page size differs), KV_ELIMIT
 * (a recorded sequence id >= max_seqs), KV_ECORRUPT (a reopened file or its
 * index fails its checks), KV_EBUSY (another store owns the file, below),
 * -errno from the OS (e.g. -EEXIST: creating over an existing file,
 * -ENOENT: opening a missing one, -EISDIR: the path is a directory). A
 * failed create leaves the file as it was.
 *
 * One owner per file: a store holds an exclusive lock on its page file
 * (an OFD lock: it conflicts between stores of one process as between
 * processes) from kv_store_create to kv_store_destroy, or to the process's
 * end, however it ends. A second store on the same file -- KV_OFFLOAD_OPEN
 * or a create racing with another create -- gets KV_EBUSY and changes
 * nothing. Each store also writes a random owner id into the file's
 * superblock and onto every page it writes, so where a filesystem does not
 * enforce the lock a page written by another store is reported lost, never
 * returned, and kv_store_offload_sync fails with KV_EBUSY rather than
 * overwrite the other store's index. A child of fork() shares its parent's
 * lock until it exits or execs. A new file is built under "<path>.new" and
 * renamed to <path> when complete: a crash inside kv_store_create leaves no
 * half-made <path>, and the next create replaces the "<path>.new" left.
 *
 * What goes to the file: pages held by one list only (refcount 1). Pages
 * shared with a fork and MERGED pages always stay resident.
 *
 * A page handed to an I/O belongs to it until the store sees the
 * completion: it is neither written nor freed meanwhile. The store has no
 * thread of its own: I/O makes progress inside these calls (and, for
 * page-ins, in calls that need the pages).
 *
 * Non-resident pages: attention over a list, or kv_read over a token range,
 * with a page that is not resident returns KV_ENOTRES (after taking any
 * completed page-in of those sequences into account), or with
 * KV_OFFLOAD_WAIT reads the whole sequence back first and waits (then
 * KV_ENOMEM if the pool has no room for
 * it, or the read error of a lost page). Attention calls may still run
 * concurrently with each other: page-ins from attention are serialized
 * inside the store, and the pages other calls are reading never move.
 * Mutating calls on a sequence (kv_append, kv_compact, kv_seq_fork as
 * parent, kv_seq_quantize, kv_seq_merge_layers, and kv_seq_prefill_end and
 * kv_seq_step_end on a sequence with a policy) first wait for its I/O in
 * flight; then, with a page not resident, they return KV_ENOTRES, or with
 * KV_OFFLOAD_WAIT read the sequence back first (a page-in the pool has no
 * room for runs the memory-pressure ladder, if any, which may page out
 * colder sequences to make room). kv_seq_set_format does the same when the
 * layer it sets has a page not resident or with I/O in flight. Residency
 * is not content: a call that read pages back keeps them resident even if
 * it then fails. Pages also go to the file without a call of this section:
 * the memory-pressure ladder's offload step (see "memory pressure").
 * kv_seq_free waits for the sequence's I/O in flight, then frees its pages
 * and slots. kv_store_destroy finishes all I/O, then kv_store_offload_sync.
 *
 * Lost pages: a page whose read fails (I/O error, or its check fails:
 * KV_ECORRUPT) stays on the file marked lost; kv_seq_wait returns that
 * error for as long as the sequence has a lost page, kv_seq_residency and
 * kv_stats count it, and a later kv_seq_prefetch (or a WAIT read) tries it
 * again (a transient error may clear). A page whose write fails stays
 * resident (kv_seq_wait reports the error once).
 *
 * Restart: kv_store_offload_sync (and kv_store_destroy) writes, for every
 * sequence whose pages are all on the file (at least one), a record of its
 * lists (entries, positions, formats), then makes the file durable and
 * replaces its index atomically. A store created with KV_OFFLOAD_OPEN over
 * that file restores each recorded sequence under its old id, every page on
 * the file (kv_store_seqs lists them; kv_seq_prefetch brings them back);
 * pages no record names are freed. Policies attached to sequences are not
 * recorded. A sequence whose record or page set cannot be read is not
 * restored (kv_stats.seqs_dropped).
 *
 * Thread safety: every call below is a mutating call, serialized by the
 * caller with the other mutating calls. kv_seq_offload, kv_seq_prefetch,
 * kv_seq_wait and kv_seq_residency change only the sequence they name, so
 * they may also run while attention and read calls use other sequences
 * (e.g. prefetch the next batch while this one decodes);
 * kv_store_offload_balance and kv_store_offload_sync may not. */

/* Start writing every resident, unshared, non-MERGED page of seq to the
 * page file; returns without waiting (kv_seq_wait / kv_seq_residency). The
 * pages stay readable until their writes complete; then their pool pages
 * are freed. A page-in of seq still in flight is waited for first. Nothing
 * to write: 0. Errors (nothing started): KV_ENOTSUP (no page file),
 * KV_ENOENT, -ENOSPC (fewer free slots than pages to write), KV_ENOMEM. */
KV_API int kv_seq_offload(kv_store_t *store, kv_seq_id_t seq);

/* Start reading every page of seq that is on the file (lost ones too) back
 * into the pool; returns without waiting. A page-out of seq still in flight
 * is waited for first. Marks seq used (LRU). Nothing to read: 0. Errors
 * (nothing started): KV_ENOTSUP, KV_ENOENT, KV_ENOMEM (not enough free pool
 * pages for all of them, or metadata). */
KV_API int kv_seq_prefetch(kv_store_t *store, kv_seq_id_t seq);

/* Block until no I/O of seq is in flight. Returns 0, or the first error of
 * its I/O since the previous kv_seq_wait that no other call returned (a
 * failed write: the page stayed resident; a failed prefetch read), or,
 * while it has lost pages, the error of the last failed read (KV_ECORRUPT,
 * KV_EIO, -EIO...). Errors: KV_ENOENT; KV_ENOTSUP (no file). */
KV_API int kv_seq_wait(kv_store_t *store, kv_seq_id_t seq);

/* Where a sequence's pages are (page references: a page shared by two of
 * its lists counts twice). */
typedef struct kv_residency {
    uint64_t pages;     /* page references of the sequence                */
    uint64_t resident;  /* readable now (pages being written included)     */
    uint64_t on_file;   /* only on the page file (lost ones included)      */
    uint64_t in_flight; /* with an I/O in flight: being written (resident) */
                        /* or being read (not yet readable)                */
    uint64_t lost;      /* on the file, last read failed                   */
} kv_residency_t;

/* Residency of seq, after taking completed I/O into account (no blocking).
 * Without a page file every page is resident. Errors: KV_EINVAL, KV_ENOENT. */
KV_API int kv_seq_residency(kv_store_t *store, kv_seq_id_t seq, kv_residency_t *out);

/* Apply the watermarks: when more than offload_high per mille of the pool
 * is in use, write whole sequences, least recently used first (create,
 * fork, append, attention and prefetch mark a sequence used), until at most
 * offload_low per mille would be in use; waits for those writes, so their
 * pool pages are free on return (and first for I/O already in flight).
 * Returns the number of pages this call wrote (>= 0) or an error. Not all-or-nothing: it stops at the first sequence that
 * fails (-ENOSPC: the file is full; KV_ENOMEM), what was written before
 * stays written, and returns that error only if nothing was written
 * (KV_EIO if every write it started failed: kv_seq_wait tells which).
 * KV_ENOTSUP without a page file. */
KV_API int kv_store_offload_balance(kv_store_t *store);

/* Persist: finish all I/O, write a record for every sequence wholly on the
 * file that has no current one, fdatasync the file and replace its index
 * atomically (temporary file, rename, fsync of the directory). What a
 * KV_OFFLOAD_OPEN store restores is what the last sync saw. All or nothing:
 * on error no record of this call remains and the old index stays. Errors:
 * KV_ENOTSUP, -ENOSPC (no slot for a record), KV_ENOMEM, KV_EBUSY (the
 * file names another owner: it was taken over where locks do not work),
 * -errno, or an I/O error of a record write. */
KV_API int kv_store_offload_sync(kv_store_t *store);

/* The live sequence ids in increasing order: up to cap into ids (ids may be
 * NULL when cap is 0); *count = how many are live. A read call (after a
 * restart: the restored sequences). Errors: KV_EINVAL. */
KV_API int kv_store_seqs(const kv_store_t *store, kv_seq_id_t *ids, uint32_t cap,
                         uint32_t *count);

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
 * KV_ESTATE (a list is empty), KV_ENOMEM (scratch), KV_ENOTRES (a page is
 * on the page file; see "offload" for KV_OFFLOAD_WAIT). Nothing is changed. */
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

/* ---- worker threads ---------------------------------------------------- */

/* The worker threads the CPU attention backend runs on, for a client's own
 * parallel loops (the reference model runs its matmuls on them). A job is
 * n_units calls fn(arg, unit, worker), each unit once, in any order; worker
 * is below the job's worker count and no two units run on one worker at
 * once (index per-worker scratch with it). The caller is worker 0 and always
 * works; a helper joins only if it gets a CPU while units are left, and the
 * caller waits only for helpers already inside, so on a busy machine a job
 * runs at about single-thread speed instead of stalling at a barrier. Idle
 * helpers sleep. One job at a time per kv_workers_t: a run while another
 * caller's job is open runs entirely on its caller. */
typedef struct kv_workers kv_workers_t;
typedef void (*kv_workers_fn)(void *arg, size_t unit, uint32_t worker);

/* n_threads workers: the caller and n_threads - 1 helper threads
 * (n_threads 0: one per online CPU, at most 1024). Errors: KV_EINVAL (out
 * NULL), KV_ERANGE (n_threads > 1024), KV_ENOMEM (memory or threads). */
KV_API int kv_workers_create(uint32_t n_threads, kv_workers_t **out);
/* Stops and joins the helpers (no job may be running). NULL is a no-op. */
KV_API void kv_workers_destroy(kv_workers_t *workers);
/* Workers, the caller included (1 for NULL). */
KV_API uint32_t kv_workers_size(const kv_workers_t *workers);
/* fn(arg, u, worker) for every u < n_units on the caller and at most
 * max_workers - 1 helpers (0: all; worker < max_workers); returns when every
 * unit is done. workers NULL: all on the caller. Errors: KV_EINVAL (fn NULL
 * and n_units > 0), nothing run. */
KV_API int kv_workers_run(kv_workers_t *workers, uint32_t max_workers,
                          size_t n_units, kv_workers_fn fn, void *arg);

#ifdef __cplusplus
}
#endif
#endif /* KVPAGE_KVPAGE_H */
