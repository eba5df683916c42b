/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu_score.h — the CPU reference of KVzip's scoring (kv_cpu_score.c):
 * the zip_score op of kv_backend_ops_t (contract in kernels/kv_backend.h).
 * ctx is the CPU backend's (its worker threads) or NULL (the calling
 * thread alone: kv_backend_zip_score's fallback).
 */
#ifndef KV_CPU_SCORE_H
#define KV_CPU_SCORE_H

#include "kernels/kv_backend.h"

int kv_cpu_zip_score(void *ctx, const kv_zip_score_params_t *p);

#endif /* KV_CPU_SCORE_H */
