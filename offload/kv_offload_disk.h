/* SPDX-License-Identifier: MIT */
/*
 * kv_offload_disk.h — the bytes of a page file and of its index (format
 * version 1). Encoding, decoding and checking only: no I/O here.
 *
 * The byte layouts (superblock "KVPF", slot header "KVSL", index "KVIX"),
 * their magics, version and sizes are in util/kv_rec.h; integers go through
 * util/kv_le.h. What this file adds:
 *
 * Superblock geometry: it must be exactly what kv_offload_create writes:
 *   page_bytes a multiple of 64 up to KV_OFFLOAD_MAX_PAGE_BYTES, capacity up
 *   to KV_ALLOC_MAX_PAGES, align a power of two 512..65536, slot_bytes =
 *   round_up(64 + page_bytes, align), data_off = round_up(4096, align).
 *
 * Index file: replaced atomically (kv_offload_index.c).
 *
 * serial: a per-file counter stamped on every page write; a reopened file
 * continues 2^40 past the index's value, so no later write can ever carry
 * the serial of a write lost in a crash. Any next serial reads back; the
 * jump saturates at 2^64 - 1, which is never stamped: a file whose serials
 * ran out still opens and reads, and refuses writes (-ENOSPC).
 *
 * owner: two stores that opened one file despite its lock (a filesystem
 * without OFD locks) draw different owner ids, so a slot one of them wrote
 * never passes the other's check (same key, generation and serial or not),
 * and the superblock tells a store at its next sync that another one took
 * the file over (kv_offload.c).
 */
#ifndef KV_OFFLOAD_DISK_H
#define KV_OFFLOAD_DISK_H

#include <stddef.h>
#include <stdint.h>

#include "util/kv_rec.h"

#define KV_OFFLOAD_SERIAL_JUMP (1ull << 40)

typedef struct kv_offload_sb {   /* superblock, decoded                      */
    uint32_t page_bytes;
    uint32_t slot_bytes;
    uint32_t capacity;
    uint32_t align;
    uint64_t data_off;           /* bytes before slot 0                     */
    uint64_t file_id;
    uint64_t owner;              /* id of the create/open that holds it     */
} kv_offload_sb_t;

typedef struct kv_offload_meta { /* one page's identity, as on disk         */
    uint64_t key;
    uint64_t generation;
    uint64_t serial;
    uint32_t slot;               /* slot index                              */
    uint32_t tokens;
    uint32_t bytes;              /* payload bytes                           */
    uint32_t format;             /* 0..255                                  */
    uint64_t owner;              /* owner id of the writer (0: none)        */
} kv_offload_meta_t;

typedef struct kv_offload_idx_hdr {
    uint64_t file_id;
    uint32_t page_bytes, slot_bytes, capacity, entries;
    uint64_t next_serial;
} kv_offload_idx_hdr_t;

void kv_offload_sb_encode(const kv_offload_sb_t *sb, uint8_t out[KV_REC_PF_SB_BYTES]);
/* 0, or KV_ECORRUPT (magic, version, crc, zero fields, inconsistent geometry). */
int kv_offload_sb_decode(const uint8_t in[KV_REC_PF_SB_BYTES], kv_offload_sb_t *sb);

/* Write the header for m (payload already at hdr + 64) and its crc. */
void kv_offload_slot_encode(uint8_t *hdr, const kv_offload_meta_t *m, uint64_t file_id);
/* Check a slot image (header + at least page_bytes after it) against the
 * expected identity: 0 or KV_ECORRUPT. */
int kv_offload_slot_check(const uint8_t *slot, const kv_offload_meta_t *want,
                          uint64_t file_id, uint32_t page_bytes);

/* Index: header and entries are encoded into one buffer of
 * 64 + entries * 48 bytes; kv_offload_idx_seal writes the crc. */
void kv_offload_idx_encode_hdr(uint8_t *buf, const kv_offload_idx_hdr_t *h);
void kv_offload_idx_encode_ent(uint8_t *ent, const kv_offload_meta_t *m);
void kv_offload_idx_seal(uint8_t *buf, size_t bytes);
/* Checks size, magic, version, crc: 0 or KV_ECORRUPT. */
int kv_offload_idx_decode_hdr(const uint8_t *buf, size_t bytes, kv_offload_idx_hdr_t *h);
/* One entry: 0 or KV_ECORRUPT (zero fields). */
int kv_offload_idx_decode_ent(const uint8_t *ent, kv_offload_meta_t *m);

#endif /* KV_OFFLOAD_DISK_H */
