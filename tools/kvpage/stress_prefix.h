/* SPDX-License-Identifier: MIT */
/*
 * stress_prefix.h — the shared-prefix workload of `kvpage stress`
 * (--prefix-cache; docs/stress.md, "Shared prefixes"): requests whose
 * prompts start with one of a few long "system prompts", under one of a few
 * salts (tenants), matched against the store's prefix cache
 * (kv_seq_prefix_match) at admission and published
 * (kv_seq_prefix_publish) after each prefill chunk.
 *
 * Content-derived values. A request's prompt is token ids: system prompt j
 * (length L_j) then the request's own tokens; the K/V of a prompt position
 * are a function of what precedes it, as in a model: positions < L_j are
 * generated from the origin (salt, j) (stress_pfx_sys_origin), the rest
 * from the request's content origin (kept when the request is requeued, so
 * a preempted request finds its own blocks again). The K/V also depend on
 * the salt, as if each tenant had its own adapter: a page shared across
 * salts would read back wrong. Decode tokens are the incarnation's own.
 *
 * What is checked besides the shadow's rows (stress_pfx_match):
 *   - matched is a multiple of the block size and < the prompt;
 *   - matched <= the longest prefix of this (salt, system prompt, policy)
 *     ever published (or of this request's own prompt, published by an
 *     earlier incarnation or by another copy of it: a request whose
 *     parallel samples are preempted is requeued once per sample, each copy
 *     with the same prompt): nothing is matched that was not published
 *     under the same salt and policy; a request whose system prompt was
 *     published only under other salts ("salt probe", counted) matches 0;
 *   - every row of a hit reads back as the cold values (stress_verify_seq
 *     right after the match).
 *
 * Compressed contexts (cfg.compressed, stress_pfx_ctx): a request with a
 * system prompt under a policy that compresses (any but none and MiniCache,
 * whose merged pages a context cannot hold) takes the system prompt as its
 * context: kv_seq_prefix_match_compressed at admission; on a miss the
 * context is prefilled, compressed at kv_seq_prefill_end and published
 * (kv_seq_prefix_publish_compressed); then the rest of the prompt is
 * appended and ended with kv_seq_step_end. Checked besides the shadow:
 *   - a hit installs exactly the context's n tokens (*matched == L_j);
 *   - a hit reads back bit for bit as the sequence that published the
 *     node it came from: each publish that made a node (prefix_ctx_published
 *     grew) records a digest of the publisher's lists (kv_read of every
 *     list: lengths, positions, K, V) under (salt, system prompt, policy);
 *     a hit must match that digest, and a hit where none was recorded is a
 *     context served across salts or policies.
 * At the end (stress_pfx_drain) the cache must hold every page still used
 * and give all of them up to a sequence that fills the pool (KV_ENOMEM only
 * once no node holds a pool page); with a page file, full sequences go on
 * to the file until it refuses one (-ENOSPC only once no node is left on
 * it either), so stress_verify_empty then finds an empty pool and file;
 * the metadata may keep only the cache's grown hash table (at most 2
 * pointers per node at the peak; ASan's leak check covers the rest).
 *
 * Ownership: stress_pfx_t owns its arrays; it is part of the driver.
 */
#ifndef STRESS_PREFIX_H
#define STRESS_PREFIX_H

#include <stdint.h>

#include "kv_cli.h"
#include "kvpage/kvpage.h"

#define STRESS_PFX_MAX_PROMPTS 64u
#define STRESS_PFX_MAX_SALTS 16u

typedef struct stress_pfx_cfg {
    int on;              /* --prefix-cache                                */
    uint32_t prompts;    /* system prompts (1..64)                        */
    uint32_t prompt_len; /* the longest one's tokens; L_j spread over     */
                         /* [len/2, len]                                  */
    uint32_t salts;      /* salts (tenants), 1..16                        */
    double share;        /* fraction of requests that start with a system */
                         /* prompt (the others: unique prompts)           */
    int compressed;      /* --prefix-compressed: system prompts as        */
                         /* compressed contexts (top of this file)        */
    const char *remote;  /* kv_config_t.prefix_remote, or NULL            */
    kv_cli_remote_t ropt; /* its credential, TLS and deployment fields   */
    uint32_t timeout_ms; /* kv_config_t.prefix_remote_timeout_ms          */
} stress_pfx_cfg_t;

/* What the prefix calls did. */
typedef struct stress_pfx_count {
    uint64_t matches;        /* kv_seq_prefix_match calls that returned 0  */
    uint64_t hits;           /* ... matching > 0 tokens                    */
    uint64_t tokens_matched; /* summed                                     */
    uint64_t hits_verified;  /* hits read back right away, every row       */
    uint64_t own_hits;       /* hits beyond the system prompt: a requeued  */
                             /* request's own blocks                        */
    uint64_t publishes;      /* kv_seq_prefix_publish calls that returned  */
                             /* >= 0                                       */
    uint64_t salt_probes;    /* matches of a system prompt published only  */
                             /* under other salts (must match 0)           */
    uint64_t drained_nodes;  /* nodes the final drain made the store evict */
    /* compressed contexts (cfg.compressed)                                */
    uint64_t ctx_matches;    /* kv_seq_prefix_match_compressed calls        */
                             /* that returned 0                            */
    uint64_t ctx_hits;       /* ... that installed the context             */
    uint64_t ctx_hits_verified; /* hits equal to their publisher's digest  */
    uint64_t ctx_publishes;  /* kv_seq_prefix_publish_compressed calls     */
                             /* that returned 0                            */
    uint64_t ctx_nodes_made; /* ... that made a node (digest recorded)     */
} stress_pfx_count_t;

typedef struct stress_pfx {
    uint32_t block;          /* tokens per block (FP16 tokens per page)    */
    uint32_t n_pol;          /* policies of the mix                        */
    uint32_t *len;           /* [prompts] L_j                              */
    uint32_t *pub;           /* [salts][prompts][n_pol] longest system-    */
                             /* prompt prefix published (tokens)           */
    uint64_t *ctx_digest;    /* [salts][prompts][n_pol] digest of the last */
                             /* context node made (0: none yet)            */
    int32_t *tok;            /* scratch: one prompt's ids [max prompt]     */
    uint64_t next_content;   /* content origins handed out                 */
    char fp[96];             /* the model fingerprint: unique per run      */
    uint64_t peak_nodes;     /* most nodes the cache held                  */
    uint64_t table_bytes;    /* metadata the drained cache kept: its hash  */
                             /* table's growth (checked against the peak)  */
    stress_pfx_count_t n;
} stress_pfx_t;

/* Origins (stress_shadow.h) of generated values: the driver's incarnations
 * count from 1; these have high bits set so they never meet. */
uint64_t stress_pfx_sys_origin(uint32_t salt, uint32_t sys);
uint64_t stress_pfx_content_origin(uint64_t n);

#endif /* STRESS_PREFIX_H */
