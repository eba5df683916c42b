/* SPDX-License-Identifier: MIT */
/*
 * kv_store_abi.c — exported symbols that kvpage.h no longer declares, kept
 * for programs built against an older header.
 *
 * kv_store_config: headers before kv_store_config_into declared it as an
 * exported function that wrote a whole kv_config_t. kvpage.h now defines it
 * inline over kv_store_config_into with the caller's own size; a program
 * built earlier still calls this symbol, and every header that can have
 * made a store (kv_store_create refuses a smaller struct) has a kv_config_t
 * of at least KV_CONFIG_SIZE_MIN bytes, so that much is written: never past
 * the caller's struct. The macro below keeps the header's inline out of the
 * way of this definition.
 */
#define kv_store_config kv_store_config_inline_
#include "kvpage/kvpage.h"
#undef kv_store_config

#include "store/kv_store_int.h"

KV_API int kv_store_config(const kv_store_t *store, kv_config_t *out);

int kv_store_config(const kv_store_t *store, kv_config_t *out)
{
    return kv_store_config_into(store, out, (uint32_t)KV_CONFIG_SIZE_MIN);
}
