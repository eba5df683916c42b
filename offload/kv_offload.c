/* SPDX-License-Identifier: MIT */
/*
 * kv_offload.c — a page file's life: create (built under "<path>.new":
 * geometry, superblock, empty index, then renamed), open (superblock, index,
 * held slots, a new owner id), close/crash, ownership (the OFD lock held on
 * lock_fd for the file object's life, the owner id checked before every
 * index write), and the slot-level calls (free, info, list, stats, fault
 * settings).
 *
 * Setup order (and teardown in reverse): lock_fd (locked) -> fd -> pool + slot records ->
 * stage (aligned staging memory) -> I/O queue (registers the stage and fd) ->
 * io records. kv_offload_setup() builds the in-memory half for both create
 * and open once the geometry is known.
 *
 * Slots in the pool: right after the pool is made, every id is taken
 * (ascending indices, in a fresh pool's order), which also tells id_base;
 * the slots the index does not name are then released from the highest
 * index down, so the LIFO free stack hands out low, adjacent indices first
 * (adjacent slots coalesce into one I/O).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "offload/kv_offload_int.h"

#define KV_OFFLOAD_DEFAULT_QD 64u
#define KV_OFFLOAD_DEFAULT_IO (256u << 10)
#define KV_OFFLOAD_STAGE_CAP (64ull << 20)

kv_offload_config_t kv_offload_config_default(void)
{
    kv_offload_config_t c;
    memset(&c, 0, sizeof c);
    c.ioq = KV_OFFLOAD_IOQ_AUTO;
    c.queue_depth = KV_OFFLOAD_DEFAULT_QD;
    return c;
}

static int kv_pow2(uint32_t x)
{
    return x && !(x & (x - 1u));
}

/* The runtime half of a config (I/O queue, depth, faults): valid for open too. */
static int kv_offload_check_cfg(const kv_offload_config_t *c)
{
    if (c->ioq > KV_OFFLOAD_IOQ_PREAD ||
        (c->flags & ~(KV_OFFLOAD_BUFFERED | KV_OFFLOAD_NO_FIXED | KV_OFFLOAD_NO_LOCK)))
        return KV_EINVAL;
    if (c->queue_depth > KV_OFFLOAD_MAX_QD || c->ring_entries > KV_OFFLOAD_MAX_QD ||
        (c->align && (!kv_pow2(c->align) || c->align < 512 || c->align > 65536)))
        return KV_ERANGE;
    return kv_offload_shim_check(&c->fault);
}

/* O_DIRECT alignment the kernel reports for fd (0 when it reports none). */
static uint32_t kv_offload_dio_align(int fd)
{
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
        (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align) {
        uint32_t a = sx.stx_dio_offset_align;
        return sx.stx_dio_mem_align > a ? sx.stx_dio_mem_align : a;
    }
#else
    (void)fd;
#endif
    return 0;
}

/* Open path read-write for the engine, with O_DIRECT unless `buffered` or
 * refused (EINVAL: tmpfs and friends); *direct says which. It must be the
 * file lock_fd holds (a rename in between: KV_EBUSY). -errno on failure. */
static int kv_offload_open_fd(const char *path, int lock_fd, int buffered, int *direct)
{
    int fd = -1;
    *direct = 0;
    if (!buffered) {
        fd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
        if (fd >= 0)
            *direct = 1;
        else if (errno != EINVAL)
            return -errno;
    }
    if (fd < 0 && (fd = open(path, O_RDWR | O_CLOEXEC)) < 0)
        return -errno;
    struct stat a, b;
    if (fstat(fd, &a) != 0 || fstat(lock_fd, &b) != 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino) {
        close(fd);
        return KV_EBUSY;
    }
    return fd;
}

static uint64_t kv_offload_new_id(void)
{
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        id = ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 48);
    }
    return id ? id : 1;
}

/* ---- ownership ---------------------------------------------------------------- */

/* Take the exclusive owner lock of a page file: an OFD write lock over the
 * whole file on lock_fd's open file description, held until that
 * description closes (kv_offload_teardown, or the process's exit). OFD
 * locks conflict between descriptions, so a second open of the file in
 * this process is refused like one in another process. A filesystem that
 * has no such locks (ENOLCK, EINVAL, EOPNOTSUPP) gets none: the owner id
 * in the superblock and in every slot is the second line there. */
static int kv_offload_lock(int lock_fd, uint32_t flags)
{
    if (flags & KV_OFFLOAD_NO_LOCK)
        return 0;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(lock_fd, F_OFD_SETLK, &fl) == 0)
        return 0;
    if (errno == EAGAIN || errno == EACCES)
        return KV_EBUSY;
    if (errno == ENOLCK || errno == EINVAL || errno == EOPNOTSUPP)
        return 0;
    return -errno;
}

/* Write f->sb (with f's owner id) at offset 0 and make it durable. */
static int kv_offload_sb_write(kv_offload_file_t *f)
{
    uint8_t sbuf[KV_REC_PF_SB_BYTES];
    kv_offload_sb_encode(&f->sb, sbuf);
    errno = 0;
    if (pwrite(f->lock_fd, sbuf, sizeof sbuf, 0) != (ssize_t)sizeof sbuf ||
        fdatasync(f->lock_fd) != 0)
        return errno ? -errno : KV_EIO;
    return 0;
}

/* Read and check the superblock on disk through lock_fd. */
static int kv_offload_sb_read(int lock_fd, kv_offload_sb_t *sb)
{
    uint8_t sbuf[KV_REC_PF_SB_BYTES];
    ssize_t n = pread(lock_fd, sbuf, sizeof sbuf, 0);
    if (n < 0)
        return -errno;
    if (n != (ssize_t)sizeof sbuf)
        return KV_ECORRUPT;
    return kv_offload_sb_decode(sbuf, sb);
}

int kv_offload_owner_check(kv_offload_file_t *f)
{
    kv_offload_sb_t now;
    int r = kv_offload_sb_read(f->lock_fd, &now);
    if (r)
        return r;
    return now.file_id == f->sb.file_id && now.owner == f->sb.owner ? 0 : KV_EBUSY;
}

/* ---- in-memory setup / teardown ---------------------------------------------- */

static void kv_offload_teardown(kv_offload_file_t *f)
{
    kv_offload_io_fini(f);
    if (f->ioq)
        f->ops->destroy(f->ioq);
    kv_offload_stage_fini(&f->stage);
    if (f->recs)
        kv_mem_free(f->recs, (size_t)f->sb.capacity * sizeof *f->recs);
    kv_alloc_pool_destroy(f->pool);
    if (f->fd >= 0)
        close(f->fd);
    if (f->lock_fd >= 0)
        close(f->lock_fd); /* last: the file stays ours until here */
    kv_mem_free(f->path, f->path_bytes);
    pthread_mutex_destroy(&f->lock);
    kv_mem_free(f, sizeof *f);
}

static kv_offload_file_t *kv_offload_file_new(const char *path)
{
    kv_offload_file_t *f = kv_mem_calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->fd = -1;
    f->lock_fd = -1;
    pthread_mutex_init(&f->lock, NULL);
    f->path = kv_offload_path_with(path, "", &f->path_bytes);
    if (!f->path) {
        kv_offload_teardown(f);
        return NULL;
    }
    return f;
}

/* Take every slot id, then give back those whose record is FREE. */
static int kv_offload_slots_init(kv_offload_file_t *f)
{
    uint32_t cap = f->sb.capacity;
    for (uint32_t i = 0; i < cap; i++) {
        kv_page_id_t id;
        if (kv_alloc_page(f->pool, &id) != 0)
            return KV_ENOMEM; /* the pool is destroyed with the file */
        if (i == 0)
            f->id_base = id - kv_alloc_page_index(id);
    }
    for (uint32_t i = cap; i-- > 0;)
        if (f->recs[i].state == KV_SLOT_FREE && kv_alloc_release(f->pool, f->id_base | i) != 1)
            return KV_ESTATE;
    return 0;
}

/* Pool, stage, I/O queue, ios, from f->sb and the runtime config. f->recs is
 * allocated and says which slots are held (all FREE for a new file, the
 * index's entries VALID for an opened one). */
static int kv_offload_setup(kv_offload_file_t *f, const kv_offload_config_t *c)
{
    f->qd = c->queue_depth ? c->queue_depth : KV_OFFLOAD_DEFAULT_QD;
    f->n_ios = 2 * f->qd;
    uint32_t sb = f->sb.slot_bytes;
    uint32_t io_bytes = c->max_io_bytes ? c->max_io_bytes : KV_OFFLOAD_DEFAULT_IO;
    f->max_run = io_bytes / sb ? io_bytes / sb : 1;
    uint64_t units = c->staging_bytes ? c->staging_bytes / sb : (uint64_t)f->n_ios * f->max_run;
    if (!c->staging_bytes && units * sb > KV_OFFLOAD_STAGE_CAP)
        units = KV_OFFLOAD_STAGE_CAP / sb;
    if (units < 1)
        units = 1;
    if (units > (1u << 24))
        return KV_ERANGE;
    if (f->max_run > units)
        f->max_run = (uint32_t)units;

    kv_alloc_config_t ac = {.page_bytes = (f->sb.page_bytes + 63u) & ~63u,
                            .capacity = f->sb.capacity, .tier = KV_TIER_FILE,
                            .flags = KV_ALLOC_NO_TCACHE};
    int r = kv_alloc_pool_create(&ac, &f->pool);
    if (r)
        return r;
    r = kv_offload_slots_init(f);
    if (r)
        return r;
    r = kv_offload_stage_init(&f->stage, sb, (uint32_t)units,
                              f->sb.align > 4096 ? f->sb.align : 4096);
    if (r)
        return r;

    kv_offload_ioq_cfg_t ec = {.fd = f->fd, .buf = f->stage.base,
                                  .buf_bytes = (size_t)units * sb, .depth = f->qd,
                                  .ring_entries = c->ring_entries,
                                  .fixed = !(c->flags & KV_OFFLOAD_NO_FIXED)};
    r = KV_ENOTSUP;
    if (c->ioq != KV_OFFLOAD_IOQ_PREAD) {
        f->ops = &kv_offload_ioq_uring;
        r = f->ops->create(&ec, &f->ioq);
        if (r && c->ioq == KV_OFFLOAD_IOQ_URING)
            return r == -ENOSYS || r == -EPERM ? KV_ENOTSUP : r;
    }
    if (r) {
        f->ops = &kv_offload_ioq_pread;
        r = f->ops->create(&ec, &f->ioq);
        if (r)
            return r;
    }
    kv_offload_shim_init(&f->shim, &c->fault, f->sb.align);
    return kv_offload_io_init(f);
}

static int kv_offload_recs_alloc(kv_offload_file_t *f)
{
    f->recs = kv_mem_calloc(f->sb.capacity, sizeof *f->recs);
    return f->recs ? 0 : KV_ENOMEM;
}

/* ---- create / open / close ------------------------------------------------------- */

/* Remove "<path>.idx" and "<path>.idx.tmp" (no allocation). */
static void kv_offload_unlink_index(const char *path)
{
    static const char *const sfx[] = {".idx", ".idx.tmp"};
    char p[PATH_MAX + 16];
    for (int i = 0; i < 2; i++) {
        int n = snprintf(p, sizeof p, "%s%s", path, sfx[i]);
        if (n > 0 && (size_t)n < sizeof p)
            unlink(p);
    }
}

/* Geometry of a new file from cfg and the alignment the fd asks for. */
static int kv_offload_geometry(kv_offload_file_t *f, const kv_offload_config_t *cfg)
{
    uint32_t dio = f->direct ? kv_offload_dio_align(f->fd) : 0;
    uint32_t a = dio ? dio : 4096u;
    if (a < 512)
        a = 512;
    if (cfg->align > a)
        a = cfg->align;
    if (!kv_pow2(a) || a > 65536)
        return KV_ENOTSUP;
    f->sb.align = a;
    f->sb.page_bytes = cfg->page_bytes;
    f->sb.slot_bytes = (KV_REC_PF_SLOT_BYTES + cfg->page_bytes + a - 1u) & ~(a - 1u);
    f->sb.capacity = cfg->capacity;
    f->sb.data_off = (4096u + a - 1u) & ~(uint64_t)(a - 1u);
    f->sb.file_id = kv_offload_new_id();
    f->sb.owner = kv_offload_new_id();
    return 0;
}

/* Reserve the whole file and write its superblock (durable). */
static int kv_offload_format(kv_offload_file_t *f)
{
    off_t size = (off_t)(f->sb.data_off + (uint64_t)f->sb.capacity * f->sb.slot_bytes);
    int r = posix_fallocate(f->lock_fd, 0, size);
    if (r == EOPNOTSUPP || r == EINVAL)
        r = ftruncate(f->lock_fd, size) == 0 ? 0 : errno;
    return r ? -r : kv_offload_sb_write(f);
}

/* Publish the finished file `tmp` under `path`, never over an existing one
 * (RENAME_NOREPLACE; link + unlink where the filesystem lacks it), and make
 * the name durable. */
static int kv_offload_publish(const char *tmp, const char *path)
{
    int r = renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) == 0 ? 0 : -errno;
    if (r == -EINVAL || r == -ENOSYS) {
        r = link(tmp, path) == 0 ? 0 : -errno;
        if (r == 0)
            unlink(tmp);
    }
    if (r == 0 && (r = kv_offload_fsync_dir(path)) != 0)
        unlink(path); /* ours (locked): a failed create leaves nothing */
    return r;
}

/* -EISDIR if path is a directory, -EEXIST if it is anything else, 0 if
 * there is nothing there. */
static int kv_offload_absent(const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0)
        return S_ISDIR(st.st_mode) ? -EISDIR : -EEXIST;
    if (lstat(path, &st) == 0) /* a dangling symlink is something there */
        return -EEXIST;
    return errno == ENOENT ? 0 : -errno;
}

int kv_offload_create(const char *path, const kv_offload_config_t *cfg,
                      kv_offload_file_t **out)
{
    if (!path || !*path || !cfg || !out)
        return KV_EINVAL;
    int r = kv_offload_check_cfg(cfg);
    if (r)
        return r;
    if (cfg->page_bytes < 64 || cfg->page_bytes % 64 ||
        cfg->page_bytes > KV_OFFLOAD_MAX_PAGE_BYTES || cfg->capacity == 0 ||
        cfg->capacity > KV_ALLOC_MAX_PAGES)
        return KV_ERANGE;
    if ((r = kv_offload_absent(path)))
        return r;
    kv_offload_file_t *f = kv_offload_file_new(path);
    if (!f)
        return KV_ENOMEM;
    size_t tb = 0;
    char *tmp = kv_offload_path_with(path, KV_OFFLOAD_NEW_SUFFIX, &tb);
    if (!tmp) {
        kv_offload_teardown(f);
        return KV_ENOMEM;
    }
    /* Built under "<path>.new", locked from the start: a crash leaves only
     * that name (and maybe "<path>.idx"), which the next create takes over
     * once its lock is free; a creator at work holds the lock (KV_EBUSY). */
    int mine = 0, indexed = 0; /* the lock on tmp is ours; "<path>.idx" too */
    f->lock_fd = open(tmp, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    r = f->lock_fd < 0 ? -errno : kv_offload_lock(f->lock_fd, cfg->flags);
    if (r == 0) {
        mine = 1;
        struct stat st;
        if (fstat(f->lock_fd, &st) != 0)
            r = -errno;
        else if (!S_ISREG(st.st_mode))
            r = KV_EINVAL;
        else if ((r = kv_offload_absent(path)) == 0 && ftruncate(f->lock_fd, 0) != 0)
            r = -errno; /* a half-made file of an earlier crash: replaced */
    }
    if (r == 0) {
        f->fd = kv_offload_open_fd(tmp, f->lock_fd, cfg->flags & KV_OFFLOAD_BUFFERED,
                                   &f->direct);
        r = f->fd < 0 ? f->fd : 0;
    }
    if (r == 0)
        r = kv_offload_geometry(f, cfg);
    if (r == 0)
        r = kv_offload_format(f);
    if (r == 0)
        r = kv_offload_recs_alloc(f);
    if (r == 0) {
        f->next_serial = 1;
        r = kv_offload_setup(f, cfg);
    }
    if (r == 0) {
        indexed = 1;
        r = kv_offload_index_write(f); /* "<path>.idx": before the file has its name */
    }
    if (r == 0)
        r = kv_offload_publish(tmp, path);
    if (r != 0 && mine)
        unlink(tmp);
    if (r != 0 && indexed)
        kv_offload_unlink_index(path);
    kv_mem_free(tmp, tb);
    if (r != 0) {
        kv_offload_teardown(f);
        return r;
    }
    *out = f;
    return 0;
}

int kv_offload_open(const char *path, const kv_offload_config_t *cfg,
                    kv_offload_file_t **out)
{
    if (!path || !*path || !cfg || !out)
        return KV_EINVAL;
    int r = kv_offload_check_cfg(cfg);
    if (r)
        return r;
    kv_offload_file_t *f = kv_offload_file_new(path);
    if (!f)
        return KV_ENOMEM;
    /* the lock first, then everything is read through the locked file
     * (O_NONBLOCK: a FIFO must not block the open) */
    struct stat st;
    f->lock_fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (f->lock_fd < 0)
        r = -errno;
    else if (fstat(f->lock_fd, &st) != 0)
        r = -errno;
    else if (!S_ISREG(st.st_mode))
        r = KV_EINVAL;
    else
        r = kv_offload_lock(f->lock_fd, cfg->flags);
    if (r == 0)
        r = kv_offload_sb_read(f->lock_fd, &f->sb);
    if (r == 0 && (uint64_t)st.st_size <
                      f->sb.data_off + (uint64_t)f->sb.capacity * f->sb.slot_bytes)
        r = KV_ECORRUPT;
    if (r == 0 && cfg->page_bytes && cfg->page_bytes != f->sb.page_bytes)
        r = KV_ERANGE;
    if (r == 0) {
        f->fd = kv_offload_open_fd(path, f->lock_fd, cfg->flags & KV_OFFLOAD_BUFFERED,
                                   &f->direct);
        r = f->fd < 0 ? f->fd : 0;
    }
    if (r == 0 && f->direct) {
        /* moved to a device needing coarser alignment: go buffered */
        uint32_t dio = kv_offload_dio_align(f->fd);
        if (dio > f->sb.align) {
            close(f->fd);
            f->fd = kv_offload_open_fd(path, f->lock_fd, 1, &f->direct);
            r = f->fd < 0 ? f->fd : 0;
        }
    }
    if (r == 0)
        r = kv_offload_recs_alloc(f);
    if (r == 0)
        r = kv_offload_index_read(f);
    if (r == 0)
        r = kv_offload_setup(f, cfg);
    if (r == 0) {
        /* last: a failed open leaves the file as it was */
        f->sb.owner = kv_offload_new_id();
        r = kv_offload_sb_write(f);
    }
    if (r != 0) {
        kv_offload_teardown(f);
        return r;
    }
    *out = f;
    return 0;
}

int kv_offload_close(kv_offload_file_t *f)
{
    if (!f)
        return 0;
    pthread_mutex_lock(&f->lock);
    kv_offload_io_drain(f);
    int r = kv_offload_index_write(f);
    pthread_mutex_unlock(&f->lock);
    kv_offload_teardown(f);
    return r;
}

void kv_offload_crash(kv_offload_file_t *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->lock);
    kv_offload_io_drain(f);
    pthread_mutex_unlock(&f->lock);
    kv_offload_teardown(f);
}

int kv_offload_sync(kv_offload_file_t *f)
{
    if (!f)
        return KV_EINVAL;
    pthread_mutex_lock(&f->lock);
    int r = kv_offload_index_write(f);
    pthread_mutex_unlock(&f->lock);
    return r;
}

int kv_offload_unlink(const char *path)
{
    if (!path)
        return KV_EINVAL;
    kv_offload_unlink_index(path);
    char p[PATH_MAX + 16];
    int n = snprintf(p, sizeof p, "%s%s", path, KV_OFFLOAD_NEW_SUFFIX);
    if (n > 0 && (size_t)n < sizeof p)
        unlink(p);
    return unlink(path) == 0 ? 0 : -errno;
}

/* ---- slots ---------------------------------------------------------------------- */

int kv_offload_free(kv_offload_file_t *f, const kv_offload_slot_t *slots, uint32_t n)
{
    if (!f || (!slots && n))
        return KV_EINVAL;
    pthread_mutex_lock(&f->lock);
    int r = 0;
    uint32_t i;
    for (i = 0; i < n; i++) {
        if (!kv_alloc_id_valid(f->pool, slots[i])) {
            r = KV_EINVAL;
            break;
        }
        kv_offload_slotrec_t *rec = &f->recs[kv_offload_slot_index(slots[i])];
        if (rec->state == KV_SLOT_FREE || rec->free_pending || rec->mark) {
            r = KV_ESTATE;
            break;
        }
        rec->mark = 1;
    }
    for (uint32_t j = 0; j < i; j++)
        f->recs[kv_offload_slot_index(slots[j])].mark = 0;
    for (i = 0; r == 0 && i < n; i++) {
        uint32_t idx = kv_offload_slot_index(slots[i]);
        kv_offload_slotrec_t *rec = &f->recs[idx];
        if (rec->state == KV_SLOT_WRITING || rec->readers)
            rec->free_pending = 1;
        else
            kv_offload_slot_release(f, idx);
    }
    pthread_mutex_unlock(&f->lock);
    return r;
}

static void kv_offload_entry_of(const kv_offload_file_t *f, uint32_t idx,
                                kv_offload_entry_t *e)
{
    const kv_offload_slotrec_t *rec = &f->recs[idx];
    *e = (kv_offload_entry_t){.slot = f->id_base | idx, .bytes = rec->bytes,
                              .key = rec->key, .generation = rec->generation,
                              .tokens = rec->tokens, .format = rec->format};
}

int kv_offload_info(kv_offload_file_t *f, kv_offload_slot_t slot, kv_offload_entry_t *out)
{
    if (!f || !out)
        return KV_EINVAL;
    pthread_mutex_lock(&f->lock);
    int r = KV_EINVAL;
    if (kv_alloc_id_valid(f->pool, slot)) {
        uint32_t idx = kv_offload_slot_index(slot);
        const kv_offload_slotrec_t *rec = &f->recs[idx];
        r = rec->state == KV_SLOT_VALID && !rec->free_pending ? 0 : KV_ESTATE;
        if (r == 0)
            kv_offload_entry_of(f, idx, out);
    }
    pthread_mutex_unlock(&f->lock);
    return r;
}

static int kv_offload_cmp_entry(const void *a, const void *b)
{
    const kv_offload_entry_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    if (x->generation != y->generation)
        return x->generation < y->generation ? -1 : 1;
    return x->slot < y->slot ? -1 : x->slot > y->slot;
}

int kv_offload_list(kv_offload_file_t *f, kv_offload_entry_t *out, uint64_t cap,
                    uint64_t *n)
{
    if (!f || !n || (!out && cap))
        return KV_EINVAL;
    pthread_mutex_lock(&f->lock);
    uint64_t total = 0;
    for (uint32_t i = 0; i < f->sb.capacity; i++)
        total += f->recs[i].state == KV_SLOT_VALID && !f->recs[i].free_pending;
    int r = 0;
    if (cap) {
        /* sort all of them (the first cap of the sorted list are wanted) */
        kv_offload_entry_t *all = total ? kv_mem_alloc(total * sizeof *all) : NULL;
        if (total && !all) {
            r = KV_ENOMEM;
        } else {
            uint64_t k = 0;
            for (uint32_t i = 0; i < f->sb.capacity; i++)
                if (f->recs[i].state == KV_SLOT_VALID && !f->recs[i].free_pending)
                    kv_offload_entry_of(f, i, &all[k++]);
            if (total)
                qsort(all, total, sizeof *all, kv_offload_cmp_entry);
            memcpy(out, all, (cap < total ? cap : total) * sizeof *all);
            if (all)
                kv_mem_free(all, total * sizeof *all);
        }
    }
    *n = total;
    pthread_mutex_unlock(&f->lock);
    return r;
}

int kv_offload_set_fault(kv_offload_file_t *f, const kv_offload_fault_t *fault)
{
    if (!f || !fault || kv_offload_shim_check(fault))
        return KV_EINVAL;
    pthread_mutex_lock(&f->lock);
    kv_offload_shim_init(&f->shim, fault, f->sb.align);
    pthread_mutex_unlock(&f->lock);
    return 0;
}

int kv_offload_set_max_io(kv_offload_file_t *f, uint32_t max_io_bytes)
{
    if (!f)
        return KV_EINVAL;
    pthread_mutex_lock(&f->lock);
    uint32_t run = max_io_bytes / f->sb.slot_bytes;
    f->max_run = run < 1 ? 1 : run > f->stage.units ? f->stage.units : run;
    pthread_mutex_unlock(&f->lock);
    return 0;
}

void kv_offload_stats(kv_offload_file_t *f, kv_offload_stats_t *out)
{
    if (!f || !out)
        return;
    pthread_mutex_lock(&f->lock);
    *out = f->st;
    kv_alloc_stats_t as;
    kv_alloc_stats(f->pool, &as);
    out->ioq = f->ops->name;
    out->direct = (uint32_t)f->direct;
    out->fixed = (uint32_t)f->ops->fixed(f->ioq);
    out->page_bytes = f->sb.page_bytes;
    out->slot_bytes = f->sb.slot_bytes;
    out->align = f->sb.align;
    out->queue_depth = f->qd;
    out->max_run = f->max_run;
    out->staging_units = f->stage.units;
    out->data_off = f->sb.data_off;
    out->owner = f->sb.owner;
    out->capacity = f->sb.capacity;
    out->slots_used = as.used;
    out->slots_free = as.free;
    out->staging_used = f->stage.n_used;
    out->ios_inflight = f->ios_out;
    out->batches_open = f->n_batches;
    out->cq_overflows = f->ops->cq_overflows(f->ioq);
    memcpy(out->faults, f->shim.count, sizeof out->faults);
    pthread_mutex_unlock(&f->lock);
}

uint64_t kv_offload_meta_bytes(uint32_t capacity)
{
    return sizeof(kv_offload_file_t) + sizeof(kv_alloc_pool_t) +
           (uint64_t)capacity * (sizeof(kv_offload_slotrec_t) + sizeof(_Atomic uint32_t) +
                                 sizeof(kv_page_id_t));
}

const kv_alloc_pool_t *kv_offload_pool(const kv_offload_file_t *f)
{
    return f ? f->pool : NULL;
}
