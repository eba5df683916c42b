/* SPDX-License-Identifier: MIT */
/*
 * stress_shadow.c — the shadow record of a live sequence (stress_shadow.h).
 */
#include <string.h>

#include "stress_gen.h"
#include "stress_shadow.h"

void stress_shadow_init(stress_shadow_t *s, kv_seq_id_t id, uint64_t origin,
                        uint32_t n_layers, const stress_check_t *chk)
{
    memset(s, 0, sizeof *s);
    s->id = id;
    s->chk = chk;
    s->n_layers = n_layers;
    s->n_lineage = 1;
    s->lineage[0].origin = origin;
}

int stress_shadow_fork(const stress_shadow_t *parent, kv_seq_id_t id, uint64_t origin,
                       stress_shadow_t *child)
{
    if (parent->n_lineage >= STRESS_MAX_LINEAGE)
        return -1;
    for (uint32_t l = 1; l < parent->n_layers; l++)
        if (parent->next[l] != parent->next[0])
            return -1;
    *child = *parent;
    child->id = id;
    child->lineage[child->n_lineage].origin = origin;
    child->lineage[child->n_lineage].from = parent->next[0];
    child->n_lineage++;
    return 0;
}

int stress_shadow_push(stress_shadow_t *s, uint64_t origin, int32_t from)
{
    if (s->n_lineage >= STRESS_MAX_LINEAGE || from < s->lineage[s->n_lineage - 1].from)
        return -1;
    s->lineage[s->n_lineage].origin = origin;
    s->lineage[s->n_lineage].from = from;
    s->n_lineage++;
    return 0;
}

uint64_t stress_shadow_origin(const stress_shadow_t *s, int32_t pos)
{
    uint32_t i = s->n_lineage - 1;
    while (i > 0 && s->lineage[i].from > pos)
        i--;
    return s->lineage[i].origin;
}

void stress_shadow_values(const stress_shadow_t *s, uint64_t seed, uint32_t layer,
                          uint32_t n, uint32_t n_kv_heads, uint32_t head_dim, float *k,
                          float *v, int32_t *pos)
{
    for (uint32_t t = 0; t < n; t++) {
        pos[t] = s->next[layer] + (int32_t)t;
        const uint64_t origin = stress_shadow_origin(s, pos[t]);
        for (uint32_t h = 0; h < n_kv_heads; h++) {
            size_t at = ((size_t)t * n_kv_heads + h) * head_dim;
            stress_gen_token(seed, origin, layer, h, pos[t], head_dim, k + at, v + at);
        }
    }
}

void stress_shadow_append(stress_shadow_t *s, uint32_t layer, uint32_t n)
{
    s->next[layer] += (int32_t)n;
}
