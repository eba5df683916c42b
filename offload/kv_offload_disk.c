/*
 * kv_offload_disk.c — encode/decode/check of the on-disk structures laid out
 * in kv_offload_disk.h. Pure functions over byte buffers; the only state is
 * the crc tables inside kv_crc32c.
 */
#include "offload/kv_offload_disk.h"

#include <string.h>

#include "kvpage/kvpage.h"
#include "offload/kv_crc32c.h"

/* ---- little-endian fields ------------------------------------------------- */

static void kv_le16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void kv_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void kv_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t kv_rd16(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}
static uint32_t kv_rd32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint64_t kv_rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
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

/* ---- superblock ------------------------------------------------------------ */

void kv_offload_sb_encode(const kv_offload_sb_t *sb, uint8_t out[KV_OFFLOAD_SB_BYTES])
{
    memset(out, 0, KV_OFFLOAD_SB_BYTES);
    kv_le32(out + 0, KV_OFFLOAD_SB_MAGIC);
    kv_le16(out + 4, KV_OFFLOAD_VERSION);
    kv_le16(out + 6, 64);
    kv_le32(out + 8, sb->page_bytes);
    kv_le32(out + 12, sb->slot_bytes);
    kv_le32(out + 16, sb->capacity);
    kv_le32(out + 20, sb->align);
    kv_le64(out + 24, sb->data_off);
    kv_le64(out + 32, sb->file_id);
    kv_le32(out + 40, kv_crc_skip(out, KV_OFFLOAD_SB_BYTES, 40));
}

int kv_offload_sb_decode(const uint8_t in[KV_OFFLOAD_SB_BYTES], kv_offload_sb_t *sb)
{
    if (kv_rd32(in) != KV_OFFLOAD_SB_MAGIC || kv_rd16(in + 4) != KV_OFFLOAD_VERSION ||
        kv_rd16(in + 6) != 64 || !kv_all_zero(in + 44, 20) ||
        kv_rd32(in + 40) != kv_crc_skip(in, KV_OFFLOAD_SB_BYTES, 40))
        return KV_ECORRUPT;
    sb->page_bytes = kv_rd32(in + 8);
    sb->slot_bytes = kv_rd32(in + 12);
    sb->capacity = kv_rd32(in + 16);
    sb->align = kv_rd32(in + 20);
    sb->data_off = kv_rd64(in + 24);
    sb->file_id = kv_rd64(in + 32);
    uint32_t a = sb->align;
    if (a < 512 || (a & (a - 1)) || sb->page_bytes == 0 || sb->capacity == 0 ||
        sb->slot_bytes % a || sb->slot_bytes < 64ull + sb->page_bytes ||
        sb->data_off % a || sb->data_off < KV_OFFLOAD_SB_BYTES)
        return KV_ECORRUPT;
    return 0;
}

/* ---- slot header ------------------------------------------------------------ */

static void kv_offload_hdr_fill(uint8_t *h, const kv_offload_meta_t *m, uint64_t file_id)
{
    memset(h, 0, 64);
    kv_le32(h + 0, KV_OFFLOAD_SLOT_MAGIC);
    kv_le16(h + 4, KV_OFFLOAD_VERSION);
    h[6] = (uint8_t)m->format;
    kv_le64(h + 8, m->key);
    kv_le64(h + 16, m->generation);
    kv_le64(h + 24, m->serial);
    kv_le32(h + 32, m->slot);
    kv_le32(h + 36, m->tokens);
    kv_le32(h + 40, m->bytes);
    kv_le64(h + 48, file_id);
}

void kv_offload_slot_encode(uint8_t *hdr, const kv_offload_meta_t *m, uint64_t file_id)
{
    kv_offload_hdr_fill(hdr, m, file_id);
    uint32_t c = kv_crc32c(0, hdr, 64);          /* crc field is zero here */
    c = kv_crc32c(c, hdr + 64, m->bytes);
    kv_le32(hdr + 44, c);
}

int kv_offload_slot_check(const uint8_t *slot, const kv_offload_meta_t *want,
                          uint64_t file_id, uint32_t page_bytes)
{
    /* The expected header, byte for byte, apart from the crc. Comparing the
     * whole image also checks magic, version and the zero fields. */
    uint8_t exp[64];
    kv_offload_hdr_fill(exp, want, file_id);
    if (want->bytes == 0 || want->bytes > page_bytes || memcmp(exp, slot, 44) != 0 ||
        memcmp(exp + 48, slot + 48, 16) != 0)
        return KV_ECORRUPT;
    uint32_t c = kv_crc32c(0, exp, 64);
    c = kv_crc32c(c, slot + 64, want->bytes);
    return c == kv_rd32(slot + 44) ? 0 : KV_ECORRUPT;
}

/* ---- index -------------------------------------------------------------------- */

void kv_offload_idx_encode_hdr(uint8_t *buf, const kv_offload_idx_hdr_t *h)
{
    memset(buf, 0, KV_OFFLOAD_IDX_HDR_BYTES);
    kv_le32(buf + 0, KV_OFFLOAD_IDX_MAGIC);
    kv_le16(buf + 4, KV_OFFLOAD_VERSION);
    kv_le16(buf + 6, KV_OFFLOAD_IDX_ENT_BYTES);
    kv_le64(buf + 8, h->file_id);
    kv_le32(buf + 16, h->page_bytes);
    kv_le32(buf + 20, h->slot_bytes);
    kv_le32(buf + 24, h->capacity);
    kv_le32(buf + 28, h->entries);
    kv_le64(buf + 32, h->next_serial);
}

void kv_offload_idx_encode_ent(uint8_t *ent, const kv_offload_meta_t *m)
{
    memset(ent, 0, KV_OFFLOAD_IDX_ENT_BYTES);
    kv_le32(ent + 0, m->slot);
    kv_le32(ent + 4, m->tokens);
    kv_le32(ent + 8, m->bytes);
    ent[12] = (uint8_t)m->format;
    kv_le64(ent + 16, m->key);
    kv_le64(ent + 24, m->generation);
    kv_le64(ent + 32, m->serial);
}

void kv_offload_idx_seal(uint8_t *buf, size_t bytes)
{
    kv_le32(buf + 40, 0);
    kv_le32(buf + 40, kv_crc32c(0, buf, bytes));
}

int kv_offload_idx_decode_hdr(const uint8_t *buf, size_t bytes, kv_offload_idx_hdr_t *h)
{
    if (bytes < KV_OFFLOAD_IDX_HDR_BYTES || kv_rd32(buf) != KV_OFFLOAD_IDX_MAGIC ||
        kv_rd16(buf + 4) != KV_OFFLOAD_VERSION ||
        kv_rd16(buf + 6) != KV_OFFLOAD_IDX_ENT_BYTES || !kv_all_zero(buf + 44, 20))
        return KV_ECORRUPT;
    h->file_id = kv_rd64(buf + 8);
    h->page_bytes = kv_rd32(buf + 16);
    h->slot_bytes = kv_rd32(buf + 20);
    h->capacity = kv_rd32(buf + 24);
    h->entries = kv_rd32(buf + 28);
    h->next_serial = kv_rd64(buf + 32);
    if (bytes != KV_OFFLOAD_IDX_HDR_BYTES + (size_t)h->entries * KV_OFFLOAD_IDX_ENT_BYTES ||
        kv_rd32(buf + 40) != kv_crc_skip(buf, bytes, 40))
        return KV_ECORRUPT;
    return 0;
}

int kv_offload_idx_decode_ent(const uint8_t *ent, kv_offload_meta_t *m)
{
    if (!kv_all_zero(ent + 13, 3) || !kv_all_zero(ent + 40, 8))
        return KV_ECORRUPT;
    m->slot = kv_rd32(ent + 0);
    m->tokens = kv_rd32(ent + 4);
    m->bytes = kv_rd32(ent + 8);
    m->format = ent[12];
    m->key = kv_rd64(ent + 16);
    m->generation = kv_rd64(ent + 24);
    m->serial = kv_rd64(ent + 32);
    return 0;
}
