/* SPDX-License-Identifier: MIT */
/*
 * kv_offload_disk.c — encode/decode/check of the on-disk structures laid out
 * in kv_offload_disk.h. Pure functions over byte buffers; the only state is
 * the crc tables inside kv_crc32c.
 */
#include "offload/kv_offload_disk.h"

#include <string.h>

#include "alloc/kv_alloc.h"
#include "kvpage/kvpage.h"
#include "util/kv_crc32c.h"
#include "util/kv_le.h"
#include "offload/kv_offload.h"

static int kv_all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

/* crc of a block whose 4-byte crc field at crc_off counts as zero. */
static uint32_t kv_crc_skip(const uint8_t *p, size_t n, size_t crc_off)
{
    static const uint8_t zero4[4];
    uint32_t c = kv_crc32c(0, p, crc_off);
    c = kv_crc32c(c, zero4, 4);
    return kv_crc32c(c, p + crc_off + 4, n - crc_off - 4);
}

/* Zero hdr[0..n), then the tag headers start with: u32 magic, u16 version,
 * u16 w6. */
static void kv_tag_put(uint8_t *hdr, size_t n, uint32_t magic, uint32_t w6)
{
    memset(hdr, 0, n);
    kv_le_put32(hdr + 0, magic);
    kv_le_put16(hdr + 4, KV_REC_PF_VERSION);
    kv_le_put16(hdr + 6, w6);
}

/* 1 if a 64-byte header has that tag and zero bytes 44..47, and 48..63
 * unless `owner_at_48` (then 56..63 only). */
static int kv_tag_ok(const uint8_t *hdr, uint32_t magic, uint32_t w6, int owner_at_48)
{
    return kv_le_get32(hdr) == magic &&
           kv_le_get16(hdr + 4) == KV_REC_PF_VERSION &&
           kv_le_get16(hdr + 6) == w6 && kv_all_zero(hdr + 44, 4) &&
           kv_all_zero(hdr + 48, owner_at_48 ? 0 : 8) && kv_all_zero(hdr + 56, 8);
}

static uint64_t kv_round_up(uint64_t x, uint32_t a)
{
    return (x + a - 1u) & ~(uint64_t)(a - 1u);
}

/* ---- superblock ------------------------------------------------------------ */

void kv_offload_sb_encode(const kv_offload_sb_t *sb, uint8_t out[KV_REC_PF_SB_BYTES])
{
    kv_tag_put(out, KV_REC_PF_SB_BYTES, KV_REC_PF_SB_MAGIC, KV_REC_PF_SLOT_BYTES);
    kv_le_put32(out + 8, sb->page_bytes);
    kv_le_put32(out + 12, sb->slot_bytes);
    kv_le_put32(out + 16, sb->capacity);
    kv_le_put32(out + 20, sb->align);
    kv_le_put64(out + 24, sb->data_off);
    kv_le_put64(out + 32, sb->file_id);
    kv_le_put64(out + 48, sb->owner);
    kv_le_put32(out + 40, kv_crc_skip(out, KV_REC_PF_SB_BYTES, 40));
}

int kv_offload_sb_decode(const uint8_t in[KV_REC_PF_SB_BYTES], kv_offload_sb_t *sb)
{
    if (!kv_tag_ok(in, KV_REC_PF_SB_MAGIC, KV_REC_PF_SLOT_BYTES, 1) ||
        kv_le_get32(in + 40) != kv_crc_skip(in, KV_REC_PF_SB_BYTES, 40))
        return KV_ECORRUPT;
    sb->page_bytes = kv_le_get32(in + 8);
    sb->slot_bytes = kv_le_get32(in + 12);
    sb->capacity = kv_le_get32(in + 16);
    sb->align = kv_le_get32(in + 20);
    sb->data_off = kv_le_get64(in + 24);
    sb->file_id = kv_le_get64(in + 32);
    sb->owner = kv_le_get64(in + 48);
    /* exactly the geometry kv_offload_create writes: nothing a later
     * allocation or offset computation could overflow on */
    uint32_t a = sb->align;
    if (a < 512 || a > 65536 || (a & (a - 1)) || sb->page_bytes < 64 ||
        sb->page_bytes % 64 || sb->page_bytes > KV_OFFLOAD_MAX_PAGE_BYTES ||
        sb->capacity == 0 || sb->capacity > KV_ALLOC_MAX_PAGES ||
        sb->slot_bytes != kv_round_up(KV_REC_PF_SLOT_BYTES + (uint64_t)sb->page_bytes, a) ||
        sb->data_off != kv_round_up(4096, a))
        return KV_ECORRUPT;
    return 0;
}

/* ---- slot header ------------------------------------------------------------ */

static void kv_offload_hdr_fill(uint8_t *h, const kv_offload_meta_t *m, uint64_t file_id)
{
    kv_tag_put(h, KV_REC_PF_SLOT_BYTES, KV_REC_PF_SLOT_MAGIC, 0); /* byte 7 stays zero */
    h[6] = (uint8_t)m->format;
    kv_le_put64(h + 8, m->key);
    kv_le_put64(h + 16, m->generation);
    kv_le_put64(h + 24, m->serial);
    kv_le_put32(h + 32, m->slot);
    kv_le_put32(h + 36, m->tokens);
    kv_le_put32(h + 40, m->bytes);
    kv_le_put64(h + 48, file_id);
    kv_le_put64(h + 56, m->owner);
}

void kv_offload_slot_encode(uint8_t *hdr, const kv_offload_meta_t *m, uint64_t file_id)
{
    kv_offload_hdr_fill(hdr, m, file_id);
    uint32_t c = kv_crc32c(0, hdr, KV_REC_PF_SLOT_BYTES); /* crc field is zero here */
    c = kv_crc32c(c, hdr + KV_REC_PF_SLOT_BYTES, m->bytes);
    kv_le_put32(hdr + 44, c);
}

int kv_offload_slot_check(const uint8_t *slot, const kv_offload_meta_t *want,
                          uint64_t file_id, uint32_t page_bytes)
{
    /* The expected header, byte for byte, apart from the crc. Comparing the
     * whole image also checks magic, version and the zero fields. */
    uint8_t exp[KV_REC_PF_SLOT_BYTES];
    kv_offload_hdr_fill(exp, want, file_id);
    if (want->bytes == 0 || want->bytes > page_bytes || memcmp(exp, slot, 44) != 0 ||
        memcmp(exp + 48, slot + 48, 16) != 0)
        return KV_ECORRUPT;
    uint32_t c = kv_crc32c(0, exp, KV_REC_PF_SLOT_BYTES);
    c = kv_crc32c(c, slot + KV_REC_PF_SLOT_BYTES, want->bytes);
    return c == kv_le_get32(slot + 44) ? 0 : KV_ECORRUPT;
}

/* ---- index -------------------------------------------------------------------- */

void kv_offload_idx_encode_hdr(uint8_t *buf, const kv_offload_idx_hdr_t *h)
{
    kv_tag_put(buf, KV_REC_PF_IDX_HDR_BYTES, KV_REC_PF_IDX_MAGIC,
               KV_REC_PF_IDX_ENT_BYTES);
    kv_le_put64(buf + 8, h->file_id);
    kv_le_put32(buf + 16, h->page_bytes);
    kv_le_put32(buf + 20, h->slot_bytes);
    kv_le_put32(buf + 24, h->capacity);
    kv_le_put32(buf + 28, h->entries);
    kv_le_put64(buf + 32, h->next_serial);
}

void kv_offload_idx_encode_ent(uint8_t *ent, const kv_offload_meta_t *m)
{
    memset(ent, 0, KV_REC_PF_IDX_ENT_BYTES);
    kv_le_put32(ent + 0, m->slot);
    kv_le_put32(ent + 4, m->tokens);
    kv_le_put32(ent + 8, m->bytes);
    ent[12] = (uint8_t)m->format;
    kv_le_put64(ent + 16, m->key);
    kv_le_put64(ent + 24, m->generation);
    kv_le_put64(ent + 32, m->serial);
    kv_le_put64(ent + 40, m->owner);
}

void kv_offload_idx_seal(uint8_t *buf, size_t bytes)
{
    kv_le_put32(buf + 40, 0);
    kv_le_put32(buf + 40, kv_crc32c(0, buf, bytes));
}

int kv_offload_idx_decode_hdr(const uint8_t *buf, size_t bytes, kv_offload_idx_hdr_t *h)
{
    if (bytes < KV_REC_PF_IDX_HDR_BYTES ||
        !kv_tag_ok(buf, KV_REC_PF_IDX_MAGIC, KV_REC_PF_IDX_ENT_BYTES, 0))
        return KV_ECORRUPT;
    h->file_id = kv_le_get64(buf + 8);
    h->page_bytes = kv_le_get32(buf + 16);
    h->slot_bytes = kv_le_get32(buf + 20);
    h->capacity = kv_le_get32(buf + 24);
    h->entries = kv_le_get32(buf + 28);
    h->next_serial = kv_le_get64(buf + 32);
    if (bytes != KV_REC_PF_IDX_HDR_BYTES + (size_t)h->entries * KV_REC_PF_IDX_ENT_BYTES ||
        kv_le_get32(buf + 40) != kv_crc_skip(buf, bytes, 40))
        return KV_ECORRUPT;
    return 0;
}

int kv_offload_idx_decode_ent(const uint8_t *ent, kv_offload_meta_t *m)
{
    if (!kv_all_zero(ent + 13, 3))
        return KV_ECORRUPT;
    m->slot = kv_le_get32(ent + 0);
    m->tokens = kv_le_get32(ent + 4);
    m->bytes = kv_le_get32(ent + 8);
    m->format = ent[12];
    m->key = kv_le_get64(ent + 16);
    m->generation = kv_le_get64(ent + 24);
    m->serial = kv_le_get64(ent + 32);
    m->owner = kv_le_get64(ent + 40);
    return 0;
}
