/* SPDX-License-Identifier: MIT */
/*
 * kv_tok_bpe.c — byte-pair merging of one pre-token.
 *
 * The word starts as one symbol per byte (its single-byte token). Candidate
 * merges of adjacent symbols wait in a min-heap ordered by (merge rank, left
 * position); the best one is applied if both symbols are still what they
 * were when it was queued, and the merged symbol's new neighbour pairs are
 * queued. This is HF tokenizers' BPE (lowest rank first, leftmost on ties),
 * O(n log n) in the word length, so a 100 KB word without spaces is fine.
 *
 * Symbols live at their first byte's index; a symbol's extent is implied by
 * its id, so (position, id) identifies it. A byte without a token is a
 * symbol with id -1 that never merges and comes out as tok->repl.
 * Scratch: the caller's kv_tok_scratch_t, grown on demand (stack arrays for
 * words up to KV_TOK_SMALL_WORD bytes).
 */
#include <stdint.h>

#include "kv_tok_int.h"

void kv_tok_scratch_init(kv_tok_scratch_t *sc)
{
    sc->sym = sc->small_sym;
    sc->heap = sc->small_heap;
    sc->cap = KV_TOK_SMALL_WORD;
    sc->owned = 0;
}

void kv_tok_scratch_fini(const kv_tok_t *t, kv_tok_scratch_t *sc)
{
    if (sc->owned) {
        kv_tok_mem_free(t, sc->sym, sc->cap * sizeof *sc->sym);
        kv_tok_mem_free(t, sc->heap, 3 * sc->cap * sizeof *sc->heap);
    }
    kv_tok_scratch_init(sc);
}

static int reserve(const kv_tok_t *t, kv_tok_scratch_t *sc, size_t n)
{
    if (n <= sc->cap)
        return 0;
    size_t cap = sc->cap * 2 > n ? sc->cap * 2 : n;
    if (cap > SIZE_MAX / (3 * sizeof(kv_tok_cand_t)))
        return KV_ENOMEM;
    kv_tok_sym_t *sym = kv_tok_mem(t, cap * sizeof *sym);
    kv_tok_cand_t *heap = kv_tok_mem(t, 3 * cap * sizeof *heap);
    if (!sym || !heap) {
        kv_tok_mem_free(t, sym, cap * sizeof *sym);
        kv_tok_mem_free(t, heap, 3 * cap * sizeof *heap);
        return KV_ENOMEM;
    }
    kv_tok_scratch_fini(t, sc);
    sc->sym = sym;
    sc->heap = heap;
    sc->cap = cap;
    sc->owned = 1;
    return 0;
}

/* ---- the candidate heap ---------------------------------------------------- */

static int cand_less(const kv_tok_cand_t *a, const kv_tok_cand_t *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(kv_tok_cand_t *h, size_t *n, kv_tok_cand_t c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_less(&c, &h[parent]))
            break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = c;
}

static kv_tok_cand_t heap_pop(kv_tok_cand_t *h, size_t *n)
{
    kv_tok_cand_t top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c]))
            c++;
        if (!cand_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

/* Queue the merge of symbol l with its right neighbour, if there is one. */
static void queue_pair(const kv_tok_t *t, kv_tok_scratch_t *sc, size_t *hn, int32_t l)
{
    if (l < 0)
        return;
    int32_t r = sc->sym[l].next;
    if (r < 0 || sc->sym[l].id < 0 || sc->sym[r].id < 0)
        return;
    kv_tok_cand_t c = {.pos = (uint32_t)l, .left = sc->sym[l].id, .right = sc->sym[r].id};
    if (kv_tok_merge_get(t, c.left, c.right, &c.rank, &c.result))
        heap_push(sc->heap, hn, c);
}

static int emit_symbol(const kv_tok_t *t, int32_t id, kv_tok_sink_t *out)
{
    if (id >= 0) {
        kv_tok_emit(out, id);
        return 0;
    }
    if (t->n_repl == 0)
        return KV_EINVAL;
    for (uint32_t i = 0; i < t->n_repl; i++)
        kv_tok_emit(out, t->repl[i]);
    return 0;
}

int kv_tok_bpe_word(const kv_tok_t *t, const uint8_t *w, size_t n,
                    kv_tok_scratch_t *sc, kv_tok_sink_t *out)
{
    int rc;

    if (n == 1)
        return emit_symbol(t, t->byte_id[w[0]], out);
    if (n > INT32_MAX)
        return KV_ERANGE;
    if ((rc = reserve(t, sc, n)) != 0)
        return rc;

    kv_tok_sym_t *sym = sc->sym;
    for (size_t i = 0; i < n; i++) {
        sym[i].id = t->byte_id[w[i]];
        sym[i].prev = (int32_t)i - 1;
        sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
        sym[i].live = 1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++)
        queue_pair(t, sc, &hn, (int32_t)i);

    while (hn > 0) {
        kv_tok_cand_t c = heap_pop(sc->heap, &hn);
        int32_t l = (int32_t)c.pos, r = sym[l].next;
        if (!sym[l].live || sym[l].id != c.left || r < 0 || sym[r].id != c.right)
            continue; /* stale: one side has changed since it was queued */
        sym[l].id = c.result;
        sym[r].live = 0;
        sym[l].next = sym[r].next;
        if (sym[r].next >= 0)
            sym[sym[r].next].prev = l;
        queue_pair(t, sc, &hn, sym[l].prev);
        queue_pair(t, sc, &hn, l);
    }

    for (int32_t i = 0; i >= 0; i = sym[i].next)
        if ((rc = emit_symbol(t, sym[i].id, out)) != 0)
            return rc;
    return 0;
}
