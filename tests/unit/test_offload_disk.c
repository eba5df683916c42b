/* SPDX-License-Identifier: MIT */
/*
 * test_offload_disk.c — the on-disk structures of a page file
 * (offload/kv_offload_disk.h): superblock, slot header, index.
 * Checks round trips, and that EVERY single-bit flip in a superblock, in a
 * slot's header or payload, or in an index image is rejected (KV_ECORRUPT),
 * as is a slot read back for the wrong identity (key, generation, serial,
 * slot index, file id): a stale or misplaced page can never pass.
 */
#include <string.h>

#include "kv_test.h"
#include "offload/kv_offload_disk.h"

static void test_superblock(void)
{
    kv_offload_sb_t sb = {.page_bytes = 4096, .slot_bytes = 4608, .capacity = 1000,
                          .align = 512, .data_off = 4096, .file_id = 0x1234567890ABCDEFull,
                          .owner = 0xFEDCBA0987654321ull};
    uint8_t b[KV_REC_PF_SB_BYTES];
    kv_offload_sb_encode(&sb, b);
    kv_offload_sb_t d;
    CHECK_OK(kv_offload_sb_decode(b, &d));
    CHECK(memcmp(&d, &sb, sizeof sb) == 0);
    long missed = 0;
    for (int bit = 0; bit < (int)KV_REC_PF_SB_BYTES * 8; bit++) {
        b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        if (kv_offload_sb_decode(b, &d) != KV_ECORRUPT)
            missed++;
        b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    CHECK_EQ(missed, 0);
    /* consistent crc but impossible geometry: anything create would not
     * write (sizes a later allocation or offset would overflow on) */
    const kv_offload_sb_t good = sb;
    kv_offload_sb_t bad[8];
    for (int i = 0; i < 8; i++)
        bad[i] = good;
    bad[0].slot_bytes = 4096;            /* < 64 + page_bytes */
    bad[1].slot_bytes = 5120;            /* > round_up(64 + page_bytes, align) */
    bad[2].capacity = (1u << 26) + 1;    /* > KV_ALLOC_MAX_PAGES */
    bad[3].page_bytes = 4000;            /* not a multiple of 64 */
    bad[4].page_bytes = (16u << 20) + 64; bad[4].slot_bytes = (16u << 20) + 512;
    bad[5].align = 1u << 17; bad[5].data_off = 1u << 17; bad[5].slot_bytes = 1u << 17;
    bad[6].data_off = 8192;              /* != round_up(4096, align) */
    bad[7].capacity = 0;
    for (int i = 0; i < 8; i++) {
        kv_offload_sb_encode(&bad[i], b);
        if (kv_offload_sb_decode(b, &d) != KV_ECORRUPT)
            fprintf(stderr, "bad geometry %d accepted\n", i);
        CHECK_EQ(kv_offload_sb_decode(b, &d), KV_ECORRUPT);
    }
    /* the owner is kept, and 0 (files of earlier versions) is valid */
    sb = good;
    sb.owner = 0;
    kv_offload_sb_encode(&sb, b);
    CHECK_OK(kv_offload_sb_decode(b, &d));
    CHECK(d.owner == 0);
}

static void test_slot(void)
{
    enum { PB = 256, SB = 512 };
    uint8_t slot[SB];
    uint64_t s = 3;
    memset(slot, 0, sizeof slot);
    for (int i = 0; i < 200; i++)
        slot[64 + i] = (uint8_t)kv_test_rand(&s);
    kv_offload_meta_t m = {.key = 77, .generation = 5, .serial = 991, .slot = 12,
                           .tokens = 16, .bytes = 200, .format = 2, .owner = 0x5555};
    const uint64_t fid = 42;
    kv_offload_slot_encode(slot, &m, fid);
    CHECK_OK(kv_offload_slot_check(slot, &m, fid, PB));

    /* every bit of header + payload */
    long missed = 0;
    for (int bit = 0; bit < (64 + 200) * 8; bit++) {
        slot[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        if (kv_offload_slot_check(slot, &m, fid, PB) != KV_ECORRUPT)
            missed++;
        slot[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    CHECK_EQ(missed, 0);
    /* bytes after the payload are padding: not covered */
    slot[64 + 200] ^= 1;
    CHECK_OK(kv_offload_slot_check(slot, &m, fid, PB));
    slot[64 + 200] ^= 1;

    /* the right bytes for the wrong identity */
    kv_offload_meta_t w = m;
    w.key++;
    CHECK_EQ(kv_offload_slot_check(slot, &w, fid, PB), KV_ECORRUPT);
    w = m;
    w.generation++;
    CHECK_EQ(kv_offload_slot_check(slot, &w, fid, PB), KV_ECORRUPT);
    w = m;
    w.serial++;
    CHECK_EQ(kv_offload_slot_check(slot, &w, fid, PB), KV_ECORRUPT);
    w = m;
    w.slot++;
    CHECK_EQ(kv_offload_slot_check(slot, &w, fid, PB), KV_ECORRUPT);
    w = m;
    w.format = 1;
    CHECK_EQ(kv_offload_slot_check(slot, &w, fid, PB), KV_ECORRUPT);
    w = m;
    w.bytes = 199;
    CHECK_EQ(kv_offload_slot_check(slot, &w, fid, PB), KV_ECORRUPT);
    w = m;
    w.owner = 1; /* written by another owner */
    CHECK_EQ(kv_offload_slot_check(slot, &w, fid, PB), KV_ECORRUPT);
    CHECK_EQ(kv_offload_slot_check(slot, &m, fid + 1, PB), KV_ECORRUPT);
    CHECK_EQ(kv_offload_slot_check(slot, &m, fid, 128), KV_ECORRUPT); /* bytes > page */
    /* an all-zero slot (never written) */
    uint8_t z[SB];
    memset(z, 0, sizeof z);
    CHECK_EQ(kv_offload_slot_check(z, &m, fid, PB), KV_ECORRUPT);
}

static void test_index(void)
{
    uint8_t buf[64 + 2 * 48];
    kv_offload_idx_hdr_t h = {.file_id = 9, .page_bytes = 4096, .slot_bytes = 4608,
                              .capacity = 100, .entries = 2, .next_serial = 1000};
    kv_offload_idx_encode_hdr(buf, &h);
    kv_offload_meta_t e0 = {.key = 1, .generation = 2, .serial = 3, .slot = 4,
                            .tokens = 5, .bytes = 6, .format = 3};
    kv_offload_meta_t e1 = {.key = ~0ull, .generation = 8, .serial = 999, .slot = 99,
                            .tokens = 16, .bytes = 4096, .format = 0, .owner = 0x77};
    kv_offload_idx_encode_ent(buf + 64, &e0);
    kv_offload_idx_encode_ent(buf + 112, &e1);
    kv_offload_idx_seal(buf, sizeof buf);
    kv_offload_idx_hdr_t d;
    CHECK_OK(kv_offload_idx_decode_hdr(buf, sizeof buf, &d));
    CHECK(memcmp(&d, &h, sizeof h) == 0);
    kv_offload_meta_t m;
    CHECK_OK(kv_offload_idx_decode_ent(buf + 112, &m));
    CHECK(memcmp(&m, &e1, sizeof m) == 0);
    CHECK_OK(kv_offload_idx_decode_ent(buf + 64, &m));
    CHECK(memcmp(&m, &e0, sizeof m) == 0);
    long missed = 0;
    for (size_t bit = 0; bit < sizeof buf * 8; bit++) {
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        if (kv_offload_idx_decode_hdr(buf, sizeof buf, &d) != KV_ECORRUPT)
            missed++;
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    CHECK_EQ(missed, 0);
    CHECK_EQ(kv_offload_idx_decode_hdr(buf, sizeof buf - 48, &d), KV_ECORRUPT);
    CHECK_EQ(kv_offload_idx_decode_hdr(buf, 10, &d), KV_ECORRUPT);
}

int main(void)
{
    test_superblock();
    test_slot();
    test_index();
    return kv_test_end();
}
