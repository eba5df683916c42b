/* SPDX-License-Identifier: MIT */
/*
 * kv_store_prefix_int.h — the prefix cache's structures, shared by
 * kv_store_prefix.c (nodes in the pool: match, publish, eviction, check) and
 * kv_store_prefix_remote.c (the Redis/Valkey tier). Not part of any API.
 * Invariants and ownership: kv_store_prefix.c's file comment.
 */
#ifndef KV_STORE_PREFIX_INT_H
#define KV_STORE_PREFIX_INT_H

#include "kv_store_int.h"
#include "prefix/kv_prefix_hash.h"

struct kv_remote;
struct kv_remote_pub;

#define PFX_BUCKETS0 64u
#define PFX_MAX_SALT 65536u

typedef struct kv_pfx_node {
    kv_prefix_hash_t key;        /* hash of the block ending at `end`         */
    struct kv_pfx_node *parent;  /* the node ending at start; NULL at 0       */
    struct kv_pfx_node *hnext;   /* next in its bucket                        */
    struct kv_pfx_node *prev, *next; /* LRU: prev is colder                   */
    uint32_t start, end;         /* tokens [start, end)                       */
    uint32_t children;           /* nodes whose parent this is                */
    uint32_t n_ents;             /* entries, all lists                        */
    size_t bytes;                /* this kv_mem block                         */
    uint32_t *off;               /* [n_lists + 1]: list li's entries are      */
                                 /* ents[off[li] .. off[li+1])                */
    kv_page_ent_t *ents;         /* [n_ents]                                  */
    /* statistics snapshot (kv_store_prefix_acc.c), NULL if none: list li's  */
    /* accumulated attention of tokens [0, end) after rows [0, end), at      */
    /* acc[li * end .. (li + 1) * end); its own kv_mem block of acc_bytes    */
    float *acc;
    size_t acc_bytes;            /* n_lists * end * 4, 0 without            */

    /* page-file tier (kv_store_prefix_file.c)                                */
    uint32_t on_file;            /* 1: pages only on the file (ents' ids are  */
                                 /* its copy's slots, no pool reference)      */
    uint32_t file_kids;          /* of children, those on the file            */
    struct kv_pfx_copy *copy;    /* its pages and record on the page file;    */
                                 /* NULL: none (kept until the node goes)     */

    /* compressed context (kv_store_prefix_ctx.c): a node of [0, end) made    */
    /* after the publisher's prefill end; NULL/0 for a block node            */
    struct kv_pol_seq *pol;      /* the policy state after that prefill end,  */
                                 /* owned (counted in the policy table)       */
    int32_t *pos;                /* [n_pos] the lists' positions, list-major, */
                                 /* in this block (NULL for a block node)     */
    uint32_t n_pos;              /* tokens over all lists                     */
    uint32_t *target;            /* [n_lists] the lists' target formats, in   */
                                 /* this block (NULL for a block node)        */
} kv_pfx_node_t;

typedef struct kv_pfx {
    uint8_t *model;              /* copy of cfg.prefix_model [model_len]      */
    uint32_t model_len;
    kv_pfx_node_t **buckets;     /* [n_buckets], a power of two               */
    uint32_t n_buckets;
    kv_pfx_node_t *cold, *hot;   /* LRU ends                                  */
    uint64_t n_nodes, n_refs;    /* nodes, entries over all nodes             */
    uint64_t bytes;              /* kv_mem bytes held (meta_bytes)            */
    uint64_t hits, misses, reused, published, evicted, evicted_pages;
    uint64_t n_acc, acc_bytes;   /* nodes with a snapshot, their bytes (in   */
                                 /* bytes too)                               */
    /* compressed contexts (kv_store_prefix_ctx.c): nodes among n_nodes     */
    uint64_t ctx_nodes, ctx_published, ctx_hits, ctx_misses;
    /* remote tier (kv_store_prefix_remote.c); NULL/0 without prefix_remote */
    struct kv_remote *remote;     /* fetches, on the caller's thread        */
    struct kv_remote_pub *pub;    /* publishes, on its own thread           */
    char *url;                    /* copy of cfg.prefix_remote [url_bytes]  */
    size_t url_bytes;
    char *rstr[3];                /* copies of cfg.prefix_remote_ns, _mac,  */
    size_t rstr_bytes[3];         /* _mac_prev (NULL: not set), their bytes */
    uint64_t r_hits, r_tokens, r_bad, r_errors, r_bytes_in, r_put, r_dropped, r_unauth;
    char *sec;                    /* copies of cfg.prefix_remote_password_* */
    size_t sec_bytes;             /* and _tls_* (kv_store_prefix_sec.c)     */
    /* page-file tier (kv_store_prefix_file.c); 0 without offload_path */
    uint64_t f_nodes, f_slots;    /* nodes on the file; slots of all copies */
    uint64_t f_mem;               /* kv_mem bytes of the copies (meta_bytes) */
    uint32_t f_next_id;           /* next copy id (file keys)               */
    uint64_t f_hits, f_tokens, f_bytes_in, f_bytes_out, f_demoted, f_dropped,
        f_bad, f_restored;
} kv_pfx_t;

/* What a sequence's rule is (see the file comment and kvpage.h). */
typedef struct pfx_rule {
    int off;          /* 1: eattn w=0 (query moments of every prompt  */
                      /* row, no snapshot): neither match nor publish */
    int acc;          /* 1: H2O/MiniKV/CaM: a match ends at a node    */
                      /* with a statistics snapshot, no remote tier   */
    uint32_t window;  /* rows a match must leave to the engine        */
    uint32_t step;    /* node boundaries are multiples of this        */
} pfx_rule_t;

/* kv_store_prefix.c */
/* The hasher for seq under salt: the fingerprint's state bytes are the
 * format of the store ("kvpage-prefix/1", query heads, R), every layer's
 * target format (targets[n_layers], or NULL: seq's now) and the policy's
 * canonical spec. Also fills *rule. */
int kv_pfx_hasher(kv_store_t *s, kv_seq_id_t seq, const uint8_t *targets, const void *salt,
                  size_t salt_len, kv_prefix_hasher_t **out, pfx_rule_t *rule);
/* Validate a match/publish call and hash the full blocks of tokens[0..n)
 * under seq's fingerprint (targets: as kv_pfx_hasher): *h = [*nb] hashes
 * (kv_mem, *h_bytes), NULL when *nb is 0. end: NULL, or also the key of
 * the compressed context tokens[0..n) (kv_prefix_hash_end after the last
 * full block). Errors: KV_EINVAL, KV_ENOTSUP (cache off), KV_ENOENT,
 * KV_ENOMEM, KV_EIO; nothing allocated then. */
int kv_pfx_call_begin(kv_store_t *s, kv_seq_id_t seq, const int32_t *tokens, uint32_t n,
                      const void *salt, size_t salt_len, const uint8_t *targets,
                      pfx_rule_t *rule, kv_prefix_hash_t **h, uint32_t *nb, size_t *h_bytes,
                      kv_prefix_hash_t *end);
kv_pfx_node_t *kv_pfx_lookup(const kv_pfx_t *p, const kv_prefix_hash_t *k);
/* A zeroed node block for n_lists lists, n_ents entries and n_pos
 * positions (bytes, off, ents; with n_pos, pos and target set), NULL
 * without memory. An unlinked
 * one: kv_mem_free(x, x->bytes). */
kv_pfx_node_t *kv_pfx_node_alloc(uint32_t n_lists, uint32_t n_ents, uint32_t n_pos);
/* Move a node to the hot end of the LRU. */
void kv_pfx_touch(kv_pfx_t *p, kv_pfx_node_t *n);
/* Room in the table for `more` nodes: 0 or KV_ENOMEM (nothing changed). */
int kv_pfx_reserve(kv_pfx_t *p, uint64_t more);
/* Link a filled node (after kv_pfx_reserve): table, parent's children, LRU
 * (hottest), counters; take_refs: take one reference per entry (else the
 * caller's references become the node's). */
void kv_pfx_link(kv_store_t *s, kv_pfx_node_t *x, int take_refs);

/* kv_store_prefix_acc.c: statistics snapshots, for policies whose prefill
 * end reads attention summed over every prompt row (H2O, MiniKV, CaM) */
/* 1 if seq's policy keeps accumulated attention (a match needs a snapshot). */
int kv_pfx_acc_rule(const kv_store_t *s, kv_seq_id_t seq);
/* The boundary where seq's statistics may be taken now, 0 if none: before
 * its prefill end, every list holds b tokens (b a positive multiple of B,
 * b <= limit) and every acc vector b entries, so they sum rows [0, b). */
uint32_t kv_pfx_acc_at(const kv_store_t *s, kv_seq_id_t seq, uint32_t limit);
/* A copy of seq's acc vectors of [0, b) ([n_lists][b] floats, a kv_mem
 * block of *bytes), NULL without memory. */
float *kv_pfx_acc_take(const kv_store_t *s, kv_seq_id_t seq, uint32_t b, size_t *bytes);
/* Give x (without one; ending at the snapshot's b) the snapshot; counted in
 * p when x is linked (kv_pfx_link counts a linked node's own). */
void kv_pfx_acc_give(kv_pfx_t *p, kv_pfx_node_t *x, float *acc, size_t bytes, int linked);
/* A hit on chain end `last` (got = last->end) under an ACC policy: stage
 * the snapshot into seq's policy state (kv_pol_acc_stage). */
int kv_pfx_acc_stage(kv_store_t *s, kv_seq_id_t seq, const kv_pfx_node_t *last,
                     float ***staged);
void kv_pfx_acc_commit(kv_store_t *s, kv_seq_id_t seq, float **staged, uint32_t got);
void kv_pfx_acc_unstage(kv_store_t *s, kv_seq_id_t seq, float **staged, uint32_t got);
/* A node's snapshot is sane (size, finite): 0 or KV_ECORRUPT. */
int kv_pfx_acc_check(const kv_store_t *s, const kv_pfx_node_t *x);

/* Unlink a node and its whole subtree (both tiers) from the table and
 * free them (their references, their copies' slots). */
void kv_pfx_drop(kv_store_t *s, kv_pfx_node_t *x);

/* kv_store_prefix_file.c: the page-file tier (file comment there). All
 * no-ops / 0 without a page file. */
/* Demote a host node with no host children (LRU eviction): its pages to
 * the file (unless it has a copy), its pool references dropped, on_file.
 * 1: demoted; 0: not (no file, file full, I/O or memory failure: counted
 * dropped; the caller drops it). */
int kv_pfx_file_demote(kv_store_t *s, kv_pfx_node_t *x);
/* After a host walk that accepted nodes up to *last (*got tokens): read
 * back the chain's nodes on the file (one pipelined batch, as many as the
 * pool has free pages for) and make them host nodes; a node that fails
 * its check is dropped with its subtree (counted) and the chain cut
 * before it. Never fails: a shorter match. */
void kv_pfx_file_load(kv_store_t *s, uint32_t *got, kv_pfx_node_t **last);
/* Free a node's copy (slots, memory) when the node goes. */
void kv_pfx_file_release(kv_store_t *s, kv_pfx_node_t *x);
void kv_pfx_file_stats(const kv_store_t *s, kv_stats_t *out);
/* The copies' slots on the file and the tier's invariants: 0, KV_ECORRUPT. */
int kv_pfx_file_check(const kv_store_t *s);

/* kv_store_prefix_ctx.c: compressed contexts */
/* Free a context node's policy state (its block and references: the
 * caller, as for any node). */
void kv_pfx_ctx_release(kv_store_t *s, kv_pfx_node_t *x);

/* kv_store_prefix_remote.c */
/* Validate the remote fields of a config: 0, KV_EINVAL, KV_ERANGE. */
int kv_pfx_remote_resolve(const kv_config_t *c);
/* kv_store_prefix_sec.c: the credential and TLS fields. resolve: KV_EINVAL
 * (one without prefix_remote, empty, both password sources, a certificate
 * without its key, TLS files with "redis://"). copy: into p->sec (s->cfg
 * then points there), KV_ENOMEM; free undoes it. password: the password
 * read from its file or variable into buf[cap] ("" without one); -errno,
 * KV_EINVAL (unset or empty), KV_ERANGE (longer than 512 bytes); the
 * caller wipes buf. stats: the refusal counters of both clients. */
int kv_pfx_sec_resolve(const kv_config_t *c);
int kv_pfx_sec_copy(kv_store_t *s);
void kv_pfx_sec_free(kv_store_t *s);
int kv_pfx_sec_password(const kv_config_t *c, char *buf, size_t cap);
void kv_pfx_sec_stats(const kv_store_t *s, kv_stats_t *out);
int kv_pfx_remote_init(kv_store_t *s);  /* after s->pfx is set; KV_ENOMEM... */
void kv_pfx_remote_fini(kv_store_t *s); /* NULL-safe; first in fini         */
/* Queue a linked node for the remote (never blocks; a full queue drops,
 * counted). */
void kv_pfx_remote_put(kv_store_t *s, const kv_pfx_node_t *x);
/* After a host walk that matched *got tokens ending at node *last: fetch
 * the chain's next nodes (keys h[j], boundaries (j+1)B that are multiples
 * of step, up to cap tokens) from the remote in pipelined batches, validate
 * each value fully and install it as a host node. targets[li]: list li's
 * target format. Advances *got and *last. Never fails: a remote that is
 * down, slow or wrong is a miss from there on, counted. */
void kv_pfx_remote_fetch(kv_store_t *s, const kv_prefix_hash_t *h, uint32_t nb,
                         uint32_t cap, uint32_t step, const uint8_t *targets,
                         uint32_t *got, kv_pfx_node_t **last);

#endif /* KV_STORE_PREFIX_INT_H */
