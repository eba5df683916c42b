/* SPDX-License-Identifier: MIT */
/*
 * kv_rec.h — every record kvpage writes to a file or a server: its magic,
 * version and fixed sizes, and its byte layout, in one place. Integers are
 * little-endian (util/kv_le.h); "zero" fields are written zero and checked
 * zero when read. A magic names one layout: two records never share one,
 * and a change of layout takes a new version (or magic) that today's
 * readers refuse. Semantics (when a record is written, what a reader
 * checks) are with the code named under each record.
 *
 * Page file (offload/kv_offload_disk.c; kv_offload_disk.h says what the
 * serial and owner fields guarantee):
 *   Superblock "KVPF" v1, 64 bytes, at offset 0 (the data area at data_off):
 *     0 u32 magic      4 u16 version      6 u16 slot header bytes (64)
 *     8 u32 page_bytes 12 u32 slot_bytes  16 u32 capacity (slots)
 *    20 u32 align      24 u64 data_off    32 u64 file id (random)
 *    40 u32 crc32c of bytes 0..63 with this field zero       44 u32 zero
 *    48 u64 owner (0 in files written before owners existed) 56 u64 zero
 *   Slot header "KVSL" v1, 64 bytes, at data_off + index * slot_bytes, the
 *   payload after it (bytes after the payload up to slot_bytes: zero,
 *   unchecked):
 *     0 u32 magic      4 u16 version      6 u8 format        7 u8 zero
 *     8 u64 key       16 u64 generation  24 u64 serial
 *    32 u32 slot index 36 u32 tokens     40 u32 payload bytes
 *    44 u32 crc32c of the header with this field zero, then the payload
 *    48 u64 file id   56 u64 owner that wrote the slot (0: none)
 *   Index file "KVIX" v1 ("<path>.idx"): a 64-byte header, then `entries`
 *   entries of 48 bytes, slot indices strictly increasing:
 *     0 u32 magic      4 u16 version      6 u16 entry bytes (48)
 *     8 u64 file id   16 u32 page_bytes  20 u32 slot_bytes
 *    24 u32 capacity  28 u32 entries     32 u64 next serial
 *    40 u32 crc32c of the whole file with this field zero    44..63 zero
 *   entry:
 *     0 u32 slot index 4 u32 tokens       8 u32 payload bytes
 *    12 u8 format     13..15 zero        16 u64 key
 *    24 u64 generation 32 u64 serial     40 u64 owner (as in the slot)
 *
 * Records stored as pages of a page file: cut into page_bytes chunks, each
 * a slot of format tag KV_REC_CHUNK_FORMAT, under the keys below (a
 * sequence's pages have bit 63 clear: kv_offload_key). Both start with the
 * same 40 bytes (store/kv_store_offload_record.c, kv_store_off_rec_head_*):
 *     0 u32 magic      4 u32 version      8 u32 id (seq / copy id)
 *    12 u32 n_layers  16 u32 n_kv_heads  20 u32 head_dim
 *    24 u32 page_bytes 28 u32 chunks     32 u64 bytes (the whole record)
 *   Sequence record "KVSQ" v1 (store/kv_store_offload_record.c), chunk c of
 *   sequence seq under key KV_REC_SEQ_KEY_BIT | seq << 24 | c:
 *    40..63 zero
 *    then per list (layer-major, kv head inner), 16 bytes:
 *     0 u32 entries    4 u32 tokens       8 u32 target format (| KV_FMT_ROT:
 *     rotated INT)    12 u32 has_pos
 *    followed by its entries, 16 bytes each:
 *     0 u64 generation 8 u16 tokens      10 u8 format       11 u8 flags (the
 *     structural bits: RETAINED on FP16; bit 0 on INT4/INT2 = ROT, a page
 *     stored rotated, 0 in files written before rotation)   12 u32 zero
 *    and, if has_pos, tokens x i32 positions.
 *   Prefix node record "KVPN" v1 (store/kv_store_prefix_file.c), page e of
 *   copy id under KV_REC_PFX_KEY_NS | id << 24 | e, chunk c of its record
 *   under KV_REC_PFX_KEY_NS | id << 24 | KV_REC_PFX_KEY_REC | c:
 *    40 u64 gen       48 u32 start       52 u32 end
 *    56 u32 has_parent 60 u32 zero
 *    then the node, 64 bytes: its key (32), its parent's key (32; zero at 0)
 *    per list (layer-major), 16 bytes: u32 entries, u32 tokens (end - start),
 *     u32 format of its entries, u32 zero
 *    per entry, 16 bytes: u64 generation, u16 tokens, u8 format, u8 flags
 *     (0), u32 zero.
 *
 * Remote tier (a server's values):
 *   Value frame "KVRM" (remote/kv_remote_frame.c): a header, then the
 *   payload. v1 (unsigned), 64 bytes:
 *     0 u32 magic      4 u16 version      6 u16 header bytes
 *     8 u32 format    12 u32 crc32c(namespace)  16 u64 payload length
 *    24 hash[32]      56 u32 zero        60 u32 crc32c(bytes 0..59, payload)
 *   v2 (signed, remote/kv_remote_mac.c), 96 bytes: bytes 0..55 as v1, then
 *    56 u32 key id    60 u32 zero        64 HMAC-SHA-256[32]
 *   Remote node record "KVPR" v1 (store/kv_store_prefix_remote.c), a
 *   frame's payload:
 *     0 u32 magic      4 u32 version      8 u32 start       12 u32 end
 *    16 u32 n_lists   20 u32 page_bytes  24 parent key[32] (zero at 0)
 *    56 u32 entries [n_lists], then per entry 4 bytes: u8 format, u8 flags
 *     (0), u16 tokens; then each entry's page, page_bytes each, in entry
 *     order. (kvpage before "KVPR" wrote this layout as "KVPN" v1; such
 *     values are refused: a miss, counted in prefix_remote_bad.)
 *
 * Prefix hash inputs (prefix/kv_prefix_hash.c: hashed, never stored, but
 * they fix every content address; u32 fields):
 *   Fingerprint "KVPX" v1: magic, version, then fields (id, length, bytes).
 *   Block "KVPB" v1: magic, version, kind, parent[32], X[32], n_tokens
 *   (80 bytes), then the tokens.
 */
#ifndef KV_REC_H
#define KV_REC_H

#include <stdint.h>

/* The u32 a four-character magic reads as (kv_le_get32 of its bytes). */
#define KV_REC_MAGIC(a, b, c, d) \
    ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)

/* page file */
#define KV_REC_PF_SB_MAGIC      KV_REC_MAGIC('K', 'V', 'P', 'F')
#define KV_REC_PF_SLOT_MAGIC    KV_REC_MAGIC('K', 'V', 'S', 'L')
#define KV_REC_PF_IDX_MAGIC     KV_REC_MAGIC('K', 'V', 'I', 'X')
#define KV_REC_PF_VERSION       1u  /* superblock, slot header and index */
#define KV_REC_PF_SB_BYTES      64u
#define KV_REC_PF_SLOT_BYTES    64u /* slot header                       */
#define KV_REC_PF_IDX_HDR_BYTES 64u
#define KV_REC_PF_IDX_ENT_BYTES 48u

/* records stored as pages of a page file */
#define KV_REC_CHUNK_FORMAT     255u /* format tag of a record's chunks   */
#define KV_REC_HEAD_BYTES       40u  /* the head both records share       */
#define KV_REC_SEQ_MAGIC        KV_REC_MAGIC('K', 'V', 'S', 'Q')
#define KV_REC_SEQ_VERSION      1u
#define KV_REC_SEQ_HDR_BYTES    64u
#define KV_REC_SEQ_LIST_BYTES   16u
#define KV_REC_SEQ_ENT_BYTES    16u
#define KV_REC_SEQ_KEY_BIT      (1ull << 63)
#define KV_REC_PFX_MAGIC        KV_REC_MAGIC('K', 'V', 'P', 'N')
#define KV_REC_PFX_VERSION      1u
#define KV_REC_PFX_HDR_BYTES    64u
#define KV_REC_PFX_NODE_BYTES   64u
#define KV_REC_PFX_LIST_BYTES   16u
#define KV_REC_PFX_ENT_BYTES    16u
#define KV_REC_PFX_KEY_NS       (3ull << 62) /* the prefix tier's keys    */
#define KV_REC_PFX_KEY_REC      (1ull << 23) /* in such a key: a chunk    */

/* remote tier */
#define KV_REC_FRAME_MAGIC         KV_REC_MAGIC('K', 'V', 'R', 'M')
#define KV_REC_FRAME_VERSION       1u  /* unsigned                        */
#define KV_REC_FRAME_SIGNED        2u  /* signed (HMAC-SHA-256)           */
#define KV_REC_FRAME_BYTES         64u
#define KV_REC_FRAME_SIGNED_BYTES  96u
#define KV_REC_REMOTE_MAGIC        KV_REC_MAGIC('K', 'V', 'P', 'R')
#define KV_REC_REMOTE_VERSION      1u
#define KV_REC_REMOTE_HEAD_BYTES   56u /* up to the per-list entry counts */
#define KV_REC_REMOTE_ENT_BYTES    4u

/* prefix hash inputs */
#define KV_REC_HASH_FP_MAGIC       KV_REC_MAGIC('K', 'V', 'P', 'X')
#define KV_REC_HASH_BLOCK_MAGIC    KV_REC_MAGIC('K', 'V', 'P', 'B')
#define KV_REC_HASH_VERSION        1u  /* of both                         */
#define KV_REC_HASH_BLOCK_HDR_BYTES 80u

#endif /* KV_REC_H */
