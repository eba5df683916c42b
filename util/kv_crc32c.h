/* SPDX-License-Identifier: MIT */
/*
 * kv_crc32c.h — CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the
 * checksum of every page and index in a page file and of every remote
 * value. util/ holds what every module may use (tests/check_deps.sh).
 *
 * kv_crc32c() picks, once per process, the SSE4.2 `crc32` instruction when
 * the CPU has it and a slicing-by-8 table otherwise; both produce the same
 * value (tests compare them, and against RFC 3720 B.4 vectors, e.g. 32 zero
 * bytes -> 0x8A9136AA). The value is the standard one: initial ~0, final ~.
 *
 * Chaining: kv_crc32c(kv_crc32c(0, a, na), b, nb) == kv_crc32c(0, a||b, ...),
 * i.e. pass the previous result as `crc` to continue (0 to start).
 *
 * Thread-safe; no state besides read-only tables built once.
 */
#ifndef KV_CRC32C_H
#define KV_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of n bytes at p, continuing from crc (0 to start). */
uint32_t kv_crc32c(uint32_t crc, const void *p, size_t n);

/* The two implementations, for tests and benchmarks. kv_crc32c_hw must only
 * be called when kv_crc32c_have_hw() returns 1. */
uint32_t kv_crc32c_sw(uint32_t crc, const void *p, size_t n);
uint32_t kv_crc32c_hw(uint32_t crc, const void *p, size_t n);
int kv_crc32c_have_hw(void);

#endif /* KV_CRC32C_H */
