/* SPDX-License-Identifier: MIT */
/*
 * test_crc32c.c — CRC-32C against published vectors (RFC 3720 B.4
 * and the "123456789" check value), the hardware and table paths against
 * each other on random buffers of every small length and alignment and
 * around the sizes where the three-stream rounds start, the table path
 * against byte-at-a-time updates, and chaining (crc of a||b == crc of b
 * continued from crc of a).
 */
#include <string.h>

#include "kv_test.h"
#include "util/kv_crc32c.h"

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

static void check_vectors(crc_fn fn)
{
    uint8_t b[48];
    memset(b, 0, 32);
    CHECK_EQ(fn(0, b, 32), 0x8A9136AAu);
    memset(b, 0xFF, 32);
    CHECK_EQ(fn(0, b, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)i;
    CHECK_EQ(fn(0, b, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)(31 - i);
    CHECK_EQ(fn(0, b, 32), 0x113FDB5Cu);
    static const uint8_t pdu[48] = {
        0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
        0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    CHECK_EQ(fn(0, pdu, 48), 0xD9963A56u);
    CHECK_EQ(fn(0, "123456789", 9), 0xE3069283u);
    CHECK_EQ(fn(0, b, 0), 0u);
}

int main(void)
{
    check_vectors(kv_crc32c_sw);
    check_vectors(kv_crc32c);
    if (kv_crc32c_have_hw())
        check_vectors(kv_crc32c_hw);
    else
        fprintf(stderr, "note: no SSE4.2 here, hardware path not tested\n");

    /* every length 0..300 at every alignment 0..7, and some big ones */
    static uint8_t buf[70000];
    uint64_t s = 7;
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)kv_test_rand(&s);
    long bad = 0;
    for (size_t a = 0; a < 8; a++)
        for (size_t n = 0; n <= 300; n++) {
            uint32_t sw = kv_crc32c_sw(0, buf + a, n);
            if (kv_crc32c(0, buf + a, n) != sw)
                bad++;
            if (kv_crc32c_have_hw() && kv_crc32c_hw(0, buf + a, n) != sw)
                bad++;
        }
    CHECK_EQ(bad, 0);
    /* around the three-stream round sizes (3 x 128, 3 x 1024 bytes) */
    static const size_t edges[] = {383, 384, 385, 768, 3071, 3072, 3073, 3455, 3456,
                                   3457, 4096, 4160, 6144, 9999, 65537};
    bad = 0;
    for (size_t a = 0; a < 8; a++)
        for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
            for (size_t d = 0; d < 9; d++) {
                size_t n = edges[e] + d;
                uint32_t sw = kv_crc32c_sw(0, buf + a, n);
                /* the table path against a plain bytewise reference */
                uint32_t ref = kv_crc32c_sw(0, buf + a, 0);
                for (size_t i = 0; i < n; i++)
                    ref = kv_crc32c_sw(ref, buf + a + i, 1);
                bad += sw != ref;
                bad += kv_crc32c(0, buf + a, n) != sw;
                if (kv_crc32c_have_hw())
                    bad += kv_crc32c_hw(0, buf + a, n) != sw;
            }
    CHECK_EQ(bad, 0);
    CHECK_EQ(kv_crc32c(0, buf + 3, 65537), kv_crc32c_sw(0, buf + 3, 65537));

    /* chaining, at every split point of a 100-byte buffer */
    uint32_t whole = kv_crc32c(0, buf, 100);
    bad = 0;
    for (size_t k = 0; k <= 100; k++)
        if (kv_crc32c(kv_crc32c(0, buf, k), buf + k, 100 - k) != whole ||
            kv_crc32c_sw(kv_crc32c_sw(0, buf, k), buf + k, 100 - k) != whole)
            bad++;
    CHECK_EQ(bad, 0);

    /* a single flipped bit anywhere changes the crc */
    bad = 0;
    uint32_t clean = kv_crc32c(0, buf, 4096);
    for (size_t bit = 0; bit < 4096 * 8; bit += 7) {
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        uint32_t c = kv_crc32c(0, buf, 4096);
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        if (c == clean)
            bad++;
    }
    CHECK_EQ(bad, 0);
    return kv_test_end();
}
