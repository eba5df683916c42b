/* SPDX-License-Identifier: MIT */
/*
 * kv_offload_index.c — the index file "<path>.idx" of a page file: which
 * slots hold which pages (layout in kv_offload_disk.h).
 *
 * Write (atomic replace): fdatasync the page file (so every page the index
 * names is on stable storage first), write "<path>.idx.tmp", fsync it,
 * rename it over "<path>.idx", fsync the directory. A crash at any point
 * leaves either the old or the new index, whole; a leftover .tmp is ignored
 * and removed by the next open. Read: the whole file, checked (size, crc,
 * file id and geometry against the superblock, every entry) before any
 * record is believed. Called with f->lock held (or before f is shared).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "offload/kv_offload_int.h"

char *kv_offload_path_with(const char *path, const char *suffix, size_t *bytes)
{
    size_t a = strlen(path), b = strlen(suffix);
    char *p = kv_mem_alloc(a + b + 1);
    if (!p)
        return NULL;
    memcpy(p, path, a);
    memcpy(p + a, suffix, b + 1);
    *bytes = a + b + 1;
    return p;
}

/* The directory holding path (for its fsync), as a kv_mem string. */
static char *kv_offload_dir_of(const char *path, size_t *bytes)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return kv_offload_path_with(".", "", bytes);
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *p = kv_mem_alloc(n + 1);
    if (!p)
        return NULL;
    memcpy(p, path, n);
    p[n] = 0;
    *bytes = n + 1;
    return p;
}

static int kv_write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (w == 0)
            return KV_EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int kv_read_all(int fd, uint8_t *p, size_t n)
{
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return KV_ECORRUPT; /* shorter than fstat said: changed under us */
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

int kv_offload_fsync_dir(const char *path)
{
    size_t db = 0;
    char *dir = kv_offload_dir_of(path, &db);
    if (!dir)
        return KV_ENOMEM;
    int r = 0, dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0)
        r = -errno;
    if (dfd >= 0)
        close(dfd);
    kv_mem_free(dir, db);
    return r;
}

/* Write buf to tmp, fsync, rename to dst, fsync dst's directory. */
static int kv_offload_replace(const char *tmp, const char *dst, const uint8_t *buf,
                              size_t bytes)
{
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    int r = kv_write_all(fd, buf, bytes);
    if (r == 0 && fsync(fd) != 0)
        r = -errno;
    if (close(fd) != 0 && r == 0)
        r = -errno;
    if (r == 0 && rename(tmp, dst) != 0)
        r = -errno;
    if (r != 0) {
        unlink(tmp);
        return r;
    }
    return kv_offload_fsync_dir(dst);
}

int kv_offload_index_write(kv_offload_file_t *f)
{
    int own = kv_offload_owner_check(f);
    if (own)
        return own; /* the file is not ours any more: never clobber its index */
    if (fdatasync(f->fd) != 0)
        return -errno;
    uint32_t n = 0;
    for (uint32_t i = 0; i < f->sb.capacity; i++)
        n += f->recs[i].state == KV_SLOT_VALID && !f->recs[i].free_pending;
    size_t bytes = KV_REC_PF_IDX_HDR_BYTES + (size_t)n * KV_REC_PF_IDX_ENT_BYTES;
    size_t tb = 0, ib = 0;
    uint8_t *buf = kv_mem_alloc(bytes);
    char *tmp = kv_offload_path_with(f->path, ".idx.tmp", &tb);
    char *idx = kv_offload_path_with(f->path, ".idx", &ib);
    int r = KV_ENOMEM;
    if (buf && tmp && idx) {
        kv_offload_idx_hdr_t h = {.file_id = f->sb.file_id, .page_bytes = f->sb.page_bytes,
                                  .slot_bytes = f->sb.slot_bytes,
                                  .capacity = f->sb.capacity, .entries = n,
                                  .next_serial = f->next_serial};
        kv_offload_idx_encode_hdr(buf, &h);
        uint8_t *e = buf + KV_REC_PF_IDX_HDR_BYTES;
        for (uint32_t i = 0; i < f->sb.capacity; i++) {
            const kv_offload_slotrec_t *rec = &f->recs[i];
            if (rec->state != KV_SLOT_VALID || rec->free_pending)
                continue;
            kv_offload_meta_t m = kv_offload_rec_meta(f, i);
            kv_offload_idx_encode_ent(e, &m);
            e += KV_REC_PF_IDX_ENT_BYTES;
        }
        kv_offload_idx_seal(buf, bytes);
        r = kv_offload_replace(tmp, idx, buf, bytes);
    }
    kv_mem_free(buf, bytes);
    kv_mem_free(tmp, tb);
    kv_mem_free(idx, ib);
    return r;
}

/* Check and apply a whole index image to f->recs. */
static int kv_offload_index_apply(kv_offload_file_t *f, const uint8_t *buf, size_t bytes)
{
    kv_offload_idx_hdr_t h;
    int r = kv_offload_idx_decode_hdr(buf, bytes, &h);
    if (r)
        return r;
    if (h.file_id != f->sb.file_id || h.page_bytes != f->sb.page_bytes ||
        h.slot_bytes != f->sb.slot_bytes || h.capacity != f->sb.capacity ||
        h.entries > h.capacity)
        return KV_ECORRUPT;
    const uint8_t *e = buf + KV_REC_PF_IDX_HDR_BYTES;
    int64_t last = -1;
    for (uint32_t i = 0; i < h.entries; i++, e += KV_REC_PF_IDX_ENT_BYTES) {
        kv_offload_meta_t m;
        if (kv_offload_idx_decode_ent(e, &m) || (int64_t)m.slot <= last ||
            m.slot >= f->sb.capacity || m.bytes == 0 || m.bytes > f->sb.page_bytes ||
            m.serial >= h.next_serial)
            return KV_ECORRUPT;
        last = m.slot;
        f->recs[m.slot] = (kv_offload_slotrec_t){
            .key = m.key, .generation = m.generation, .serial = m.serial,
            .owner = m.owner, .bytes = m.bytes, .tokens = m.tokens, .format = (uint8_t)m.format,
            .state = KV_SLOT_VALID};
    }
    /* saturating: any next serial this library writes reads back; a file
     * left with none takes no more writes (kv_offload_write_submit) */
    f->next_serial = h.next_serial > UINT64_MAX - KV_OFFLOAD_SERIAL_JUMP
                         ? UINT64_MAX
                         : h.next_serial + KV_OFFLOAD_SERIAL_JUMP;
    return 0;
}

int kv_offload_index_read(kv_offload_file_t *f)
{
    size_t ib = 0, tb = 0;
    char *idx = kv_offload_path_with(f->path, ".idx", &ib);
    char *tmp = kv_offload_path_with(f->path, ".idx.tmp", &tb);
    int r = KV_ENOMEM;
    if (idx && tmp) {
        unlink(tmp); /* a write that never got renamed: not the index */
        int fd = open(idx, O_RDONLY | O_CLOEXEC);
        struct stat st;
        size_t max = KV_REC_PF_IDX_HDR_BYTES +
                     (size_t)f->sb.capacity * KV_REC_PF_IDX_ENT_BYTES;
        if (fd < 0) {
            r = errno == ENOENT ? KV_ECORRUPT : -errno;
        } else if (fstat(fd, &st) != 0) {
            r = -errno;
        } else if (st.st_size < KV_REC_PF_IDX_HDR_BYTES || (size_t)st.st_size > max) {
            r = KV_ECORRUPT;
        } else {
            size_t bytes = (size_t)st.st_size;
            uint8_t *buf = kv_mem_alloc(bytes);
            r = buf ? kv_read_all(fd, buf, bytes) : KV_ENOMEM;
            if (r == 0)
                r = kv_offload_index_apply(f, buf, bytes);
            kv_mem_free(buf, bytes);
        }
        if (fd >= 0)
            close(fd);
    }
    kv_mem_free(idx, ib);
    kv_mem_free(tmp, tb);
    return r;
}
