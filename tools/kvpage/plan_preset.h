/* SPDX-License-Identifier: MIT */
/*
 * plan_preset.h — the model and GPU presets of `kvpage plan`.
 *
 * A model preset is the KV-cache shape of a published checkpoint (layers,
 * query heads, kv heads, head_dim, from its config.json) and its parameter
 * count (FP16 weights = 2 bytes per parameter), computed from the same
 * config (embeddings, attention and MLP matrices, norms, biases; matches the
 * checkpoint's safetensors total). A GPU preset is the nominal memory of the
 * card in GiB. A model's trained context (max_position_embeddings) caps
 * the longest context the plan reports. Sources are in each entry and in docs/plan.md.
 *
 * The tables are constant data; lookups are case-insensitive and return a
 * pointer into them (never NULL-terminated lists: use the counts).
 */
#ifndef PLAN_PRESET_H
#define PLAN_PRESET_H

#include <stddef.h>
#include <stdint.h>

typedef struct plan_model {
    const char *name;      /* "Llama-2-7B" (matched case-insensitively)      */
    uint32_t layers;       /* num_hidden_layers                              */
    uint32_t q_heads;      /* num_attention_heads                            */
    uint32_t kv_heads;     /* num_key_value_heads                            */
    uint32_t head_dim;     /* hidden_size / num_attention_heads (or head_dim) */
    uint64_t params;       /* parameters; FP16 weights are 2 * params bytes  */
    uint32_t ctx_len;      /* max_position_embeddings: the trained context,  */
                           /* tokens (0: unknown, no cap)                    */
    const char *source;    /* the config.json the shape comes from           */
} plan_model_t;

typedef struct plan_gpu {
    const char *name;      /* "H100-80G"                                     */
    double gib;            /* nominal memory, GiB (2^30 bytes)               */
    const char *source;    /* the vendor's datasheet                         */
} plan_gpu_t;

extern const plan_model_t plan_models[];
extern const size_t plan_n_models;
extern const plan_gpu_t plan_gpus[];
extern const size_t plan_n_gpus;

/* The preset named name (case-insensitive), or NULL. */
const plan_model_t *plan_model_find(const char *name);
const plan_gpu_t *plan_gpu_find(const char *name);

#endif /* PLAN_PRESET_H */
