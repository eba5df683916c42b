/* SPDX-License-Identifier: MIT */
/*
 * kv_offload_disk.h — the bytes of a page file and of its index (format
 * version 1). Encoding, decoding and checking only: no I/O here.
 *
 * All integers little-endian. "zero" fields must be zero when read.
 *
 * Superblock (offset 0 of the page file; the data area starts at data_off):
 *    0 u32 magic "KVPF"      4 u16 version (1)     6 u16 slot header bytes (64)
 *    8 u32 page_bytes       12 u32 slot_bytes     16 u32 capacity (slots)
 *   20 u32 align            24 u64 data_off       32 u64 file id (random)
 *   40 u32 crc32c of bytes 0..63 with this field zero      44 u32 zero
 *   48 u64 owner: a random id drawn by each create/open of the file (the
 *      store holding it; 0 in files of earlier versions)   56 u64 zero
 *   The geometry must be exactly what kv_offload_create writes: page_bytes
 *   a multiple of 64 up to KV_OFFLOAD_MAX_PAGE_BYTES, capacity up to
 *   KV_ALLOC_MAX_PAGES, align a power of two 512..65536, slot_bytes =
 *   round_up(64 + page_bytes, align), data_off = round_up(4096, align).
 *
 * Slot header (at data_off + index * slot_bytes; the payload follows it):
 *    0 u32 magic "KVSL"      4 u16 version (1)     6 u8 format   7 u8 zero
 *    8 u64 key              16 u64 generation     24 u64 serial
 *   32 u32 slot index       36 u32 tokens         40 u32 payload bytes
 *   44 u32 crc32c of the header with this field zero, then the payload
 *   48 u64 file id          56 u64 owner that wrote the slot (0: none)
 *   Bytes after the payload up to slot_bytes are written as zero, unchecked.
 *
 * Index file (replaced atomically, see kv_offload_index.c):
 *   header, 64 bytes:
 *    0 u32 magic "KVIX"      4 u16 version (1)     6 u16 entry bytes (48)
 *    8 u64 file id          16 u32 page_bytes     20 u32 slot_bytes
 *   24 u32 capacity         28 u32 entries        32 u64 next serial
 *   40 u32 crc32c of the whole file with this field zero       44..63 zero
 *   then `entries` entries of 48 bytes, slot indices strictly increasing:
 *    0 u32 slot index        4 u32 tokens          8 u32 payload bytes
 *   12 u8 format            13..15 zero           16 u64 key
 *   24 u64 generation       32 u64 serial         40 u64 owner (as in
 *                                                         the slot header)
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

#define KV_OFFLOAD_SB_MAGIC   0x4650564Bu /* "KVPF" */
#define KV_OFFLOAD_SLOT_MAGIC 0x4C53564Bu /* "KVSL" */
#define KV_OFFLOAD_IDX_MAGIC  0x5849564Bu /* "KVIX" */
#define KV_OFFLOAD_VERSION    1u
#define KV_OFFLOAD_SB_BYTES   64u
#define KV_OFFLOAD_IDX_HDR_BYTES 64u
#define KV_OFFLOAD_IDX_ENT_BYTES 48u
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

void kv_offload_sb_encode(const kv_offload_sb_t *sb, uint8_t out[KV_OFFLOAD_SB_BYTES]);
/* 0, or KV_ECORRUPT (magic, version, crc, zero fields, inconsistent geometry). */
int kv_offload_sb_decode(const uint8_t in[KV_OFFLOAD_SB_BYTES], kv_offload_sb_t *sb);

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

/* Little-endian fields, for these structures and the store's sequence
 * records (store/kv_store_offload_record.c). */
static inline void kv_offload_put16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void kv_offload_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void kv_offload_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t kv_offload_get16(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}
static inline uint32_t kv_offload_get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static inline uint64_t kv_offload_get64(const uint8_t *p)
{
    return (uint64_t)kv_offload_get32(p) | (uint64_t)kv_offload_get32(p + 4) << 32;
}

#endif /* KV_OFFLOAD_DISK_H */
