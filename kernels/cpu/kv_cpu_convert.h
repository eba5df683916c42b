/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu_convert.h — the CPU reference conversion kernels (kv_cpu_convert.c):
 * the convert / merge_select / merge ops of kv_backend_ops_t (contract in
 * kernels/kv_backend.h). They run on the calling thread and ignore ctx, so
 * kv_backend_convert.c can call them without a backend (the fallback while
 * a backend's ops table does not list them).
 */
#ifndef KV_CPU_CONVERT_H
#define KV_CPU_CONVERT_H

#include "kernels/kv_backend.h"

int kv_cpu_convert(void *ctx, const kv_convert_params_t *p);
int kv_cpu_merge_select(void *ctx, const kv_merge_params_t *p);
int kv_cpu_merge(void *ctx, const kv_merge_params_t *p);

#endif /* KV_CPU_CONVERT_H */
