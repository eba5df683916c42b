/* SPDX-License-Identifier: MIT */
/*
 * kv_offload_io.c — batches of page reads and writes: from submit, through
 * coalesced I/Os on the I/O queue, to verified per-page results.
 *
 * A batch's pages are sorted by slot index (order[]); runs of adjacent
 * slots (at most max_run, and as many stage units as are free) become one
 * I/O over one run of stage units. Batches are served in submit order. The
 * pump hands transfers to the I/O queue while it holds fewer than qd and io
 * records and stage units are free (there are 2 x qd of those, so reaped
 * I/Os can be checked while their replacements run); completions come back
 * through handle(), which copes with every kind of result the same way for
 * both I/O queues:
 *   - -EAGAIN / -EINTR, or 0 bytes: the transfer is issued again, up to
 *     KV_OFFLOAD_RETRIES times in a row, then the error (KV_EIO for 0);
 *   - fewer bytes than asked: the rest is issued again (short transfer);
 *   - another -errno: the I/O ends with it;
 * and only when an I/O ends are its pages finished (finish_io): a write
 * makes its slots VALID or frees them; a read checks every slot image
 * (kv_offload_slot_check) before copying a payload out. A page covered by
 * a whole slot transferred before an error still succeeds.
 *
 * The fault shim sees each transfer before the I/O queue does; a transfer it
 * fails (or tears to nothing) never reaches the I/O queue and completes
 * through the synth list instead, so the same handle() sees it.
 *
 * Everything here runs under f->lock.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "offload/kv_offload_int.h"

#define KV_OFFLOAD_RETRIES 64u
#define KV_OFFLOAD_MAX_BATCH (1u << 24)

/* ---- io records ------------------------------------------------------------- */

int kv_offload_io_init(kv_offload_file_t *f)
{
    f->ios = kv_mem_calloc(f->n_ios, sizeof *f->ios);
    if (!f->ios)
        return KV_ENOMEM;
    for (uint32_t i = f->n_ios; i-- > 0;) {
        f->ios[i].next = f->io_free;
        f->io_free = &f->ios[i];
    }
    return 0;
}

void kv_offload_io_fini(kv_offload_file_t *f)
{
    if (f->ios)
        kv_mem_free(f->ios, (size_t)f->n_ios * sizeof *f->ios);
    f->ios = NULL;
    f->io_free = NULL;
}

static void kv_io_push(kv_offload_io_t **head, kv_offload_io_t **tail, kv_offload_io_t *io)
{
    io->next = NULL;
    if (*tail)
        (*tail)->next = io;
    else
        *head = io;
    *tail = io;
}

static kv_offload_io_t *kv_io_pop(kv_offload_io_t **head, kv_offload_io_t **tail)
{
    kv_offload_io_t *io = *head;
    if (io) {
        *head = io->next;
        if (!*head)
            *tail = NULL;
        io->next = NULL;
    }
    return io;
}

void kv_offload_slot_release(kv_offload_file_t *f, uint32_t idx)
{
    int r = kv_alloc_release(f->pool, f->id_base | idx);
    assert(r == 1);
    (void)r;
    memset(&f->recs[idx], 0, sizeof f->recs[idx]);
}

/* ---- issue ------------------------------------------------------------------- */

/* Hand the rest of io ([done, len)) to the shim, then the I/O queue. */
static void kv_offload_issue(kv_offload_file_t *f, kv_offload_io_t *io)
{
    uint32_t piece = io->len - io->done;
    kv_offload_shim_act_t act;
    kv_offload_shim_issue(&f->shim, io->op, io->buf + io->done, piece, &act);
    io->piece = piece;
    io->lie = (uint8_t)act.lie;
    io->flip = (uint8_t)act.flip_read;
    if (act.err || act.len == 0) {
        /* never reaches the kernel: an error, or a write torn to nothing */
        io->res = act.err ? act.err : (int)piece;
        io->lie = 0;
        kv_io_push(&f->synth_head, &f->synth_tail, io);
        return;
    }
    f->ops->queue(f->ioq, io->op, io->buf + io->done, act.len, io->off + io->done, io);
    f->ioq_out++;
    if (f->ioq_out > f->st.ios_peak)
        f->st.ios_peak = f->ioq_out;
    f->eng_queued++;
    f->st.ios++;
}

/* Copy the pages of a write io into its stage units: payload, zero padding,
 * header with crc. */
static void kv_offload_fill(kv_offload_file_t *f, kv_offload_io_t *io)
{
    const kv_offload_batch_t *b = io->batch;
    uint32_t sb = f->sb.slot_bytes;
    for (uint32_t j = 0; j < io->count; j++) {
        uint64_t o = b->order[io->first + j];
        uint32_t page = (uint32_t)o, idx = (uint32_t)(o >> 32);
        const kv_offload_wpage_t *w = &b->w[page];
        uint8_t *s = io->buf + (size_t)j * sb;
        memcpy(s + KV_REC_PF_SLOT_BYTES, w->data, w->bytes);
        memset(s + KV_REC_PF_SLOT_BYTES + w->bytes, 0, sb - KV_REC_PF_SLOT_BYTES - w->bytes);
        kv_offload_meta_t m = kv_offload_rec_meta(f, idx);
        kv_offload_slot_encode(s, &m, f->sb.file_id);
    }
}

/* (Re)issue transfers while the kernel holds fewer than qd and io records
 * and stage units allow; submit. */
static void kv_offload_pump(kv_offload_file_t *f)
{
    kv_offload_io_t *io;
    while (f->ioq_out < f->qd && (io = kv_io_pop(&f->redo_head, &f->redo_tail)))
        kv_offload_issue(f, io);
    while (f->ioq_out < f->qd && f->io_free && f->issue) {
        kv_offload_batch_t *b = f->issue;
        uint32_t i = b->issued;
        uint32_t idx0 = (uint32_t)(b->order[i] >> 32), k = 1;
        while (k < f->max_run && i + k < b->n &&
               (uint32_t)(b->order[i + k] >> 32) == idx0 + k)
            k++;
        uint32_t got;
        int64_t u = kv_offload_stage_alloc(&f->stage, k, &got);
        if (u < 0)
            break;
        io = f->io_free;
        f->io_free = io->next;
        f->ios_out++;
        *io = (kv_offload_io_t){
            .batch = b, .buf = kv_offload_stage_ptr(&f->stage, (uint32_t)u),
            .off = f->sb.data_off + (uint64_t)idx0 * f->sb.slot_bytes,
            .len = got * f->sb.slot_bytes, .first = i, .count = got,
            .stage = (uint32_t)u, .op = b->op};
        if (got > 1)
            f->st.ios_coalesced++;
        b->issued += got;
        if (b->issued == b->n)
            f->issue = b->next;
        if (b->op == KV_OFFLOAD_OP_WRITE)
            kv_offload_fill(f, io);
        kv_offload_issue(f, io);
    }
    if (f->eng_queued) {
        if (f->ops->submit(f->ioq) == 0)
            f->eng_queued = 0;
        /* else (-EAGAIN/-EBUSY): retried at the next pump, after a reap */
    }
}

/* ---- completion ---------------------------------------------------------- */

/* The I/O ended (err 0: every byte transferred): finish its pages. */
static void kv_offload_finish_io(kv_offload_file_t *f, kv_offload_io_t *io, int err)
{
    kv_offload_batch_t *b = io->batch;
    uint32_t sb = f->sb.slot_bytes;
    for (uint32_t j = 0; j < io->count; j++) {
        uint64_t o = b->order[io->first + j];
        uint32_t page = (uint32_t)o, idx = (uint32_t)(o >> 32);
        kv_offload_slotrec_t *rec = &f->recs[idx];
        const uint8_t *s = io->buf + (size_t)j * sb;
        int whole = err == 0 || (uint64_t)(j + 1) * sb <= io->done;
        int st = whole ? 0 : err;
        if (b->op == KV_OFFLOAD_OP_WRITE) {
            assert(rec->state == KV_SLOT_WRITING);
            if (st == 0) {
                rec->state = KV_SLOT_VALID;
                f->st.pages_written++;
                if (rec->free_pending)
                    kv_offload_slot_release(f, idx);
            } else {
                f->st.pages_failed++;
                kv_offload_slot_release(f, idx);
                b->slots_out[page] = KV_PAGE_ID_INVALID;
            }
        } else {
            assert(rec->state == KV_SLOT_VALID && rec->readers > 0);
            if (st == 0) {
                kv_offload_meta_t m = kv_offload_rec_meta(f, idx);
                st = kv_offload_slot_check(s, &m, f->sb.file_id, f->sb.page_bytes);
                if (st == 0) {
                    memcpy(b->r[page].data, s + KV_REC_PF_SLOT_BYTES, rec->bytes);
                    f->st.pages_read++;
                } else {
                    f->st.pages_corrupt++;
                }
            } else {
                f->st.pages_failed++;
            }
            if (--rec->readers == 0 && rec->free_pending)
                kv_offload_slot_release(f, idx);
        }
        b->status[page] = st;
    }
    assert(b->remaining >= io->count);
    b->remaining -= io->count;
    kv_offload_stage_free(&f->stage, io->stage, io->count);
    io->batch = NULL;
    io->next = f->io_free;
    f->io_free = io;
    f->ios_out--;
}

/* One transfer of io came back with res (bytes or -errno). */
static void kv_offload_handle(kv_offload_file_t *f, kv_offload_io_t *io, int res)
{
    if (res >= 0 && io->lie)
        res = (int)io->piece; /* torn write: the shim reports it all done */
    io->lie = 0;
    if (res > (int)io->piece)
        res = KV_EIO; /* the kernel claims more than asked: do not trust it */
    if (res <= 0) {
        int transient = res == 0 || res == -EAGAIN || res == -EINTR;
        if (transient && io->retries < KV_OFFLOAD_RETRIES) {
            io->retries++;
            f->st.retries++;
            kv_io_push(&f->redo_head, &f->redo_tail, io);
            return;
        }
        kv_offload_finish_io(f, io, res == 0 ? KV_EIO : res);
        return;
    }
    if (io->op == KV_OFFLOAD_OP_READ) {
        f->st.bytes_read += (uint64_t)res;
        if (io->flip)
            kv_offload_shim_flip(&f->shim, io->buf + io->done, (uint32_t)res);
    } else {
        f->st.bytes_written += (uint64_t)res;
    }
    io->flip = 0;
    io->done += (uint32_t)res;
    if (io->done < io->len) {
        f->st.short_resubmits++;
        io->retries = 0;
        kv_io_push(&f->redo_head, &f->redo_tail, io);
        return;
    }
    kv_offload_finish_io(f, io, 0);
}

/* Move completions from the I/O queue to the done list (blocking for one if
 * `block`) and refill the kernel at once. Returns the count or -errno. */
static int kv_offload_reap(kv_offload_file_t *f, int block)
{
    kv_offload_cqe_t c[64];
    int n = f->ops->reap(f->ioq, block, c, 64);
    for (int i = 0; i < n; i++) {
        assert(f->ioq_out > 0);
        f->ioq_out--;
        kv_offload_io_t *io = c[i].tag;
        io->res = c[i].res;
        kv_io_push(&f->done_head, &f->done_tail, io);
    }
    if (n > 0)
        kv_offload_pump(f);
    return n;
}

/* Issue; take completions: the shim's, and the I/O queue's (blocking for one
 * when `block` and nothing else is pending). The pages of reaped I/Os are
 * checked and copied one I/O at a time, topping the kernel up between them,
 * so the device stays busy while the CPU works. At most n_ios I/Os are
 * finished per call (what is left stays on the done list for the next), so
 * a submit or poll returns in bounded time even when completions keep
 * coming (always, with the synchronous pread I/O queue). Returns 0 or -errno
 * from the I/O queue's reap. */
static int kv_offload_progress(kv_offload_file_t *f, int block)
{
    kv_offload_pump(f);
    int moved = 0;
    kv_offload_io_t *io;
    while ((io = kv_io_pop(&f->synth_head, &f->synth_tail))) {
        kv_offload_handle(f, io, io->res);
        moved = 1;
    }
    int n = 0;
    if (!f->done_head)
        n = kv_offload_reap(f, block && !moved && !f->redo_head);
    if (n < 0)
        return n;
    for (uint32_t budget = f->n_ios; budget && (io = kv_io_pop(&f->done_head, &f->done_tail));
         budget--) {
        kv_offload_handle(f, io, io->res);
        if (budget > 1 && (f->done_head == NULL || f->ioq_out < f->qd / 2))
            if ((n = kv_offload_reap(f, 0)) < 0)
                return n;
    }
    kv_offload_pump(f);
    return 0;
}

/* ---- batches ---------------------------------------------------------------- */

static int kv_offload_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* One kv_mem block: the batch, then order, the page copies, slot, status. */
static kv_offload_batch_t *kv_offload_batch_new(uint32_t n, int op)
{
    size_t copy = op == KV_OFFLOAD_OP_WRITE ? sizeof(kv_offload_wpage_t)
                                            : sizeof(kv_offload_rpage_t);
    size_t bytes = sizeof(kv_offload_batch_t) + (size_t)n * (sizeof(uint64_t) + copy +
                                                          sizeof(kv_offload_slot_t) +
                                                          sizeof(int));
    kv_offload_batch_t *b = kv_mem_alloc(bytes);
    if (!b)
        return NULL;
    memset(b, 0, sizeof *b);
    uint8_t *p = (uint8_t *)(b + 1);
    b->order = (uint64_t *)p;
    p += (size_t)n * sizeof(uint64_t);
    if (op == KV_OFFLOAD_OP_WRITE)
        b->w = (kv_offload_wpage_t *)p;
    else
        b->r = (kv_offload_rpage_t *)p;
    p += (size_t)n * copy;
    b->slot = (kv_offload_slot_t *)p;
    p += (size_t)n * sizeof(kv_offload_slot_t);
    b->status = (int *)p;
    b->n = b->remaining = n;
    b->op = (uint8_t)op;
    b->mem_bytes = bytes;
    return b;
}

static void kv_offload_batch_free(kv_offload_batch_t *b)
{
    kv_mem_free(b, b->mem_bytes);
}

/* Sort the pages by slot, append the batch, start its I/O. */
static void kv_offload_batch_start(kv_offload_file_t *f, kv_offload_batch_t *b,
                                   kv_offload_ticket_t *ticket)
{
    for (uint32_t i = 0; i < b->n; i++)
        b->order[i] = ((uint64_t)kv_offload_slot_index(b->slot[i]) << 32) | i;
    qsort(b->order, b->n, sizeof b->order[0], kv_offload_cmp_u64);
    b->ticket = ++f->next_ticket;
    if (f->batches_tail)
        f->batches_tail->next = b;
    else
        f->batches = b;
    f->batches_tail = b;
    if (!f->issue)
        f->issue = b;
    f->n_batches++;
    *ticket = b->ticket;
    kv_offload_progress(f, 0);
}

int kv_offload_write_submit(kv_offload_file_t *f, const kv_offload_wpage_t *pages,
                            uint32_t n, kv_offload_slot_t *slots, int *status,
                            kv_offload_ticket_t *ticket)
{
    if (!f || !pages || !slots || !ticket)
        return KV_EINVAL;
    if (n == 0 || n > KV_OFFLOAD_MAX_BATCH)
        return KV_ERANGE;
    for (uint32_t i = 0; i < n; i++)
        if (!pages[i].data || pages[i].bytes == 0 || pages[i].bytes > f->sb.page_bytes ||
            pages[i].format > 255u)
            return KV_EINVAL;
    kv_offload_batch_t *b = kv_offload_batch_new(n, KV_OFFLOAD_OP_WRITE);
    if (!b)
        return KV_ENOMEM;
    pthread_mutex_lock(&f->lock);
    /* a serial is never reused: a file without n left (UINT64_MAX is never
     * stamped) is full */
    int r = n > UINT64_MAX - f->next_serial ? -ENOSPC : kv_alloc_pages(f->pool, n, b->slot);
    if (r != 0) {
        pthread_mutex_unlock(&f->lock);
        kv_offload_batch_free(b);
        return r == KV_ENOMEM ? -ENOSPC : r;
    }
    memcpy(b->w, pages, (size_t)n * sizeof *pages);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t idx = kv_offload_slot_index(b->slot[i]);
        kv_offload_slotrec_t *rec = &f->recs[idx];
        assert(rec->state == KV_SLOT_FREE);
        *rec = (kv_offload_slotrec_t){.key = pages[i].key, .generation = pages[i].generation,
                                      .serial = f->next_serial++, .owner = f->sb.owner,
                                      .bytes = pages[i].bytes,
                                      .tokens = pages[i].tokens,
                                      .format = (uint8_t)pages[i].format,
                                      .state = KV_SLOT_WRITING};
        slots[i] = b->slot[i];
    }
    b->slots_out = slots;
    b->status_out = status;
    kv_offload_batch_start(f, b, ticket);
    pthread_mutex_unlock(&f->lock);
    return 0;
}

int kv_offload_read_submit(kv_offload_file_t *f, const kv_offload_rpage_t *reqs,
                           uint32_t n, int *status, kv_offload_ticket_t *ticket)
{
    if (!f || !reqs || !ticket)
        return KV_EINVAL;
    if (n == 0 || n > KV_OFFLOAD_MAX_BATCH)
        return KV_ERANGE;
    kv_offload_batch_t *b = kv_offload_batch_new(n, KV_OFFLOAD_OP_READ);
    if (!b)
        return KV_ENOMEM;
    pthread_mutex_lock(&f->lock);
    int r = 0;
    for (uint32_t i = 0; i < n && r == 0; i++) {
        const kv_offload_rpage_t *q = &reqs[i];
        if (!q->data || !kv_alloc_id_valid(f->pool, q->slot)) {
            r = KV_EINVAL;
            break;
        }
        const kv_offload_slotrec_t *rec = &f->recs[kv_offload_slot_index(q->slot)];
        if (rec->state != KV_SLOT_VALID || rec->free_pending || rec->key != q->key ||
            rec->generation != q->generation)
            r = KV_ESTATE;
    }
    if (r != 0) {
        pthread_mutex_unlock(&f->lock);
        kv_offload_batch_free(b);
        return r;
    }
    memcpy(b->r, reqs, (size_t)n * sizeof *reqs);
    for (uint32_t i = 0; i < n; i++) {
        b->slot[i] = reqs[i].slot;
        f->recs[kv_offload_slot_index(reqs[i].slot)].readers++;
    }
    b->status_out = status;
    kv_offload_batch_start(f, b, ticket);
    pthread_mutex_unlock(&f->lock);
    return 0;
}

static kv_offload_batch_t *kv_offload_batch_find(kv_offload_file_t *f,
                                                 kv_offload_ticket_t t,
                                                 kv_offload_batch_t **prev)
{
    *prev = NULL;
    for (kv_offload_batch_t *b = f->batches; b; *prev = b, b = b->next)
        if (b->ticket == t)
            return b;
    return NULL;
}

/* Report a complete batch: statuses out, unlink, free; the first error. */
static int kv_offload_batch_report(kv_offload_file_t *f, kv_offload_batch_t *b,
                                   kv_offload_batch_t *prev)
{
    assert(b->remaining == 0 && f->issue != b);
    int first = 0;
    for (uint32_t i = 0; i < b->n; i++)
        if (!first && b->status[i])
            first = b->status[i];
    if (b->status_out)
        memcpy(b->status_out, b->status, (size_t)b->n * sizeof(int));
    if (prev)
        prev->next = b->next;
    else
        f->batches = b->next;
    if (f->batches_tail == b)
        f->batches_tail = prev;
    f->n_batches--;
    kv_offload_batch_free(b);
    return first;
}

/* kv_offload_poll (block 0: one non-blocking progress step; 1 while the
 * batch is incomplete) and kv_offload_wait (block 1: blocking steps until
 * it is complete or a step fails). A complete batch is reported. */
static int kv_offload_batch_await(kv_offload_file_t *f,
                                  kv_offload_ticket_t ticket, int block)
{
    if (!f)
        return KV_EINVAL;
    pthread_mutex_lock(&f->lock);
    kv_offload_batch_t *prev, *b = kv_offload_batch_find(f, ticket, &prev);
    int r = KV_ENOENT;
    if (b) {
        r = block ? 0 : kv_offload_progress(f, 0);
        while (block && b->remaining && r == 0)
            r = kv_offload_progress(f, 1);
        if (r == 0)
            r = b->remaining ? 1 : kv_offload_batch_report(f, b, prev);
    }
    pthread_mutex_unlock(&f->lock);
    return r;
}

int kv_offload_poll(kv_offload_file_t *f, kv_offload_ticket_t ticket)
{
    return kv_offload_batch_await(f, ticket, 0);
}

int kv_offload_wait(kv_offload_file_t *f, kv_offload_ticket_t ticket)
{
    return kv_offload_batch_await(f, ticket, 1);
}

int kv_offload_write(kv_offload_file_t *f, const kv_offload_wpage_t *pages, uint32_t n,
                     kv_offload_slot_t *slots, int *status)
{
    kv_offload_ticket_t t;
    int r = kv_offload_write_submit(f, pages, n, slots, status, &t);
    return r ? r : kv_offload_wait(f, t);
}

int kv_offload_read(kv_offload_file_t *f, const kv_offload_rpage_t *reqs, uint32_t n,
                    int *status)
{
    kv_offload_ticket_t t;
    int r = kv_offload_read_submit(f, reqs, n, status, &t);
    return r ? r : kv_offload_wait(f, t);
}

void kv_offload_io_drain(kv_offload_file_t *f)
{
    int guard = 0;
    while (f->ios_out || f->issue) {
        if (kv_offload_progress(f, 1) < 0 && ++guard > 1000)
            break; /* the I/O queue keeps failing its reap: give up waiting */
    }
    while (f->batches) {
        kv_offload_batch_t *b = f->batches;
        f->batches = b->next;
        kv_offload_batch_free(b);
    }
    f->batches_tail = NULL;
    f->n_batches = 0;
}
