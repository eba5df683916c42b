/* SPDX-License-Identifier: MIT */
/*
 * kv_tok_int.h — internals shared by the tokenizer's files (kv_tok*.c); not
 * for other modules, which use kv_tok.h.
 *
 *   kv_tok.c       create/destroy, vocabulary and merge hash maps, queries
 *   kv_tok_utf8.c  UTF-8 decoding, character classes, the GPT-2 byte map
 *   kv_tok_ucd.c   generated Unicode L/N range table
 *   kv_tok_pre.c   the pre-tokenizer (GPT-2 regex, \p{N} split) as an iterator
 *   kv_tok_bpe.c   BPE merging of one pre-token
 *   kv_tok_encode.c  special-token split + pre-tokenizer + BPE; decode
 *   kv_tok_chat.c  the ChatML prompt
 *   kv_tok_gguf.c  building a tokenizer from GGUF metadata
 *
 * Invariants of kv_tok_t (immutable after kv_tok_create):
 *   - off[0] = 0, off[i] <= off[i+1]; bytes[off[i]..off[i+1]) is the piece of
 *     token i: raw bytes (byte-level types unmapped, raw types verbatim).
 *   - vmap holds every byte-level token (NORMAL, UNUSED, BYTE) with a
 *     non-empty piece, keyed by the piece; on duplicate pieces the lowest id.
 *   - mmap holds (left id, right id) -> (rank, merged id) for every usable
 *     merge, lowest rank on duplicates; merged id's piece = left + right.
 *   - byte_id[b] is the token whose piece is the single byte b, or -1.
 *   - repl[0..n_repl) encodes one unrepresentable byte (U+FFFD or unk).
 */
#ifndef KV_TOK_INT_H
#define KV_TOK_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kv_tok.h"

/* ---- characters (kv_tok_utf8.c, kv_tok_ucd.c) ------------------------------ */

enum {
    KV_TOK_CAT_OTHER = 0, /* anything else, including undecodable bytes */
    KV_TOK_CAT_L     = 1, /* \p{L}: Lu Ll Lt Lm Lo                      */
    KV_TOK_CAT_N     = 2, /* \p{N}: Nd Nl No                            */
    KV_TOK_CAT_WS    = 3, /* \s: the Unicode White_Space property       */
};

typedef struct kv_tok_urange {
    uint32_t first, last; /* code points, inclusive        */
    uint32_t cat;         /* KV_TOK_CAT_L or KV_TOK_CAT_N  */
} kv_tok_urange_t;

extern const kv_tok_urange_t kv_tok_ucd_ranges[];
extern const uint32_t kv_tok_ucd_n;

#define KV_TOK_CP_INVALID 0xFFFFFFFFu /* an undecodable byte */

/* Decode the character at s[pos] (pos < len): returns its length in bytes
 * (1..4) and sets *cp, or returns 1 with *cp = KV_TOK_CP_INVALID for a byte
 * that does not start a well-formed UTF-8 sequence (overlong, surrogate,
 * truncated, > U+10FFFF). */
size_t kv_tok_utf8_next(const uint8_t *s, size_t len, size_t pos, uint32_t *cp);

/* KV_TOK_CAT_* of a code point (KV_TOK_CP_INVALID: OTHER). */
int kv_tok_ucat(uint32_t cp);

/* The GPT-2 byte <-> unicode map: every byte has a printable code point
 * (< 324); kv_tok_cp_byte is its inverse, -1 for any other code point. */
uint32_t kv_tok_byte_cp(uint8_t b);
int kv_tok_cp_byte(uint32_t cp);

/* Unmap n bytes of mapped text into raw bytes (out has room for n; the raw
 * text is never longer). KV_EINVAL if a character is not in the map. */
int kv_tok_unmap(const char *s, size_t n, uint8_t *out, size_t *out_n);

/* ---- pre-tokenizer (kv_tok_pre.c) ------------------------------------------ */

typedef struct kv_tok_pre_it {
    const uint8_t *s;   /* the segment being split (borrowed)          */
    size_t len;         /* bytes of s                                  */
    size_t pos;         /* next unread byte                            */
    size_t seg_end;     /* end of the current \p{N}-free sub-segment   */
    kv_tok_pre_t pre;
} kv_tok_pre_it_t;

void kv_tok_pre_init(kv_tok_pre_it_t *it, kv_tok_pre_t pre, const uint8_t *s,
                     size_t len);
/* Next piece: 1 and s[*start .. *start + *n) (n > 0), or 0 at the end.
 * The pieces tile s in order. */
int kv_tok_pre_next(kv_tok_pre_it_t *it, size_t *start, size_t *n);

/* ---- the tokenizer ------------------------------------------------------- */

typedef struct kv_tok_mslot {
    uint32_t key_a;  /* left id + 1; 0 = empty slot */
    uint32_t key_b;  /* right id                    */
    uint32_t rank;   /* merge index                 */
    int32_t result;  /* merged token id             */
} kv_tok_mslot_t;

struct kv_tok {
    uint32_t n_vocab;
    uint8_t *types;        /* [n_vocab] kv_tok_type_t                          */
    uint32_t *off;         /* [n_vocab + 1] piece offsets into bytes           */
    uint8_t *bytes;        /* [bytes_size] all pieces, back to back            */
    size_t bytes_size;     /* max(off[n_vocab], 1)                             */
    uint32_t *vmap;        /* [vmap_mask + 1] id + 1, 0 = empty                */
    uint32_t vmap_mask;
    kv_tok_mslot_t *mmap;  /* [mmap_mask + 1]                                  */
    uint32_t mmap_mask;
    int32_t *special;      /* [n_special] ids of raw-text tokens (UNKNOWN,     */
    uint32_t n_special;    /* CONTROL, USER_DEFINED) with a non-empty piece    */
    uint8_t special_first[256]; /* bit 0: a CONTROL piece starts with byte b,  */
                                /* bit 1: a USER_DEFINED piece does            */
    int32_t byte_id[256];  /* single-byte token of each byte, -1 none          */
    int32_t repl[4];       /* ids standing for one unrepresentable byte        */
    uint32_t n_repl;       /* 0: such a byte is an error (KV_EINVAL)           */
    int32_t bos, eos, unk; /* -1: none                                         */
    kv_tok_pre_t pre;
    void *(*alloc)(void *ctx, size_t n);
    void (*free)(void *ctx, void *p, size_t n);
    void *alloc_ctx;
};

static inline const uint8_t *kv_tok_piece_ptr(const kv_tok_t *t, uint32_t id)
{
    return t->bytes + t->off[id];
}
static inline size_t kv_tok_piece_len(const kv_tok_t *t, uint32_t id)
{
    return (size_t)(t->off[id + 1] - t->off[id]);
}
static inline int kv_tok_is_raw_type(int type)
{
    return type == KV_TOK_UNKNOWN || type == KV_TOK_CONTROL ||
           type == KV_TOK_USER_DEFINED;
}

/* Allocation through the tokenizer's allocator. */
void *kv_tok_mem(const kv_tok_t *t, size_t n);
void kv_tok_mem_free(const kv_tok_t *t, void *p, size_t n);

/* Byte-level token with this exact piece, or -1. */
int32_t kv_tok_vocab_get(const kv_tok_t *t, const uint8_t *s, size_t n);
/* The merge of (a, b): 1 and its rank and result, or 0. */
int kv_tok_merge_get(const kv_tok_t *t, int32_t a, int32_t b, uint32_t *rank,
                     int32_t *result);

/* ---- encoding (kv_tok_bpe.c, kv_tok_encode.c) ------------------------------ */

/* Where ids go: written while n < cap, counted always. */
typedef struct kv_tok_sink {
    int32_t *ids;
    size_t cap;
    size_t n;
} kv_tok_sink_t;

static inline void kv_tok_emit(kv_tok_sink_t *o, int32_t id)
{
    if (o->n < o->cap)
        o->ids[o->n] = id;
    o->n++;
}

typedef struct kv_tok_sym {
    int32_t id;     /* token id, -1 = unrepresentable byte (never merges)  */
    int32_t prev;   /* index of the previous live symbol, -1 none          */
    int32_t next;   /* index of the next live symbol, -1 none              */
    uint32_t live;  /* 0 once merged into its left neighbour               */
} kv_tok_sym_t;

typedef struct kv_tok_cand {
    uint32_t rank;  /* merge rank: lower merges first        */
    uint32_t pos;   /* left symbol index: lower first on ties */
    int32_t left, right, result; /* ids when queued           */
} kv_tok_cand_t;

#define KV_TOK_SMALL_WORD 64u /* words up to this many bytes use the stack */

/* Per-call BPE scratch: symbols [cap] and a candidate heap [3 * cap]. */
typedef struct kv_tok_scratch {
    kv_tok_sym_t *sym;
    kv_tok_cand_t *heap;
    size_t cap;          /* bytes of the longest word the arrays can take */
    int owned;           /* sym/heap came from the tokenizer's allocator  */
    kv_tok_sym_t small_sym[KV_TOK_SMALL_WORD];
    kv_tok_cand_t small_heap[3 * KV_TOK_SMALL_WORD];
} kv_tok_scratch_t;

void kv_tok_scratch_init(kv_tok_scratch_t *sc);
void kv_tok_scratch_fini(const kv_tok_t *t, kv_tok_scratch_t *sc);

/* BPE-merge the n > 0 bytes of one pre-token and emit its ids. Errors:
 * KV_ENOMEM (scratch), KV_EINVAL (unrepresentable byte and no repl). */
int kv_tok_bpe_word(const kv_tok_t *t, const uint8_t *w, size_t n,
                    kv_tok_scratch_t *sc, kv_tok_sink_t *out);

/* Encode s[0..len) into the sink (special split, pre-tokenizer, BPE). */
int kv_tok_encode_sink(const kv_tok_t *t, const uint8_t *s, size_t len,
                       int parse_special, kv_tok_scratch_t *sc, kv_tok_sink_t *out);

#endif /* KV_TOK_INT_H */
