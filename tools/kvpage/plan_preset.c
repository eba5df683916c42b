/* SPDX-License-Identifier: MIT */
/*
 * plan_preset.c — the preset tables of `kvpage plan` (see plan_preset.h).
 *
 * Parameter counts, from each config.json (V vocab, h hidden, I intermediate,
 * L layers, q/kv heads of d): embeddings V*h (twice unless
 * tie_word_embeddings), per layer q and o h*q*d each, k and v h*kv*d each
 * (+ q*d + 2*kv*d biases for Qwen2), MLP 3*h*I, two norms 2h; a final norm
 * h. E.g. Llama-2-7B: 2*32000*4096 + 32*(4*4096^2 + 3*4096*11008 + 8192) +
 * 4096 = 6,738,415,616 (13.48 GB in FP16).
 */
#include "plan_preset.h"

#include <strings.h>

#define HF "https://huggingface.co/"

const plan_model_t plan_models[] = {
    {"SmolLM2-135M", 30, 9, 3, 64, 134515008ull, 8192,
     HF "HuggingFaceTB/SmolLM2-135M/blob/main/config.json"},
    {"Llama-2-7B", 32, 32, 32, 128, 6738415616ull, 4096,
     HF "meta-llama/Llama-2-7b-hf/blob/main/config.json"},
    {"Llama-2-13B", 40, 40, 40, 128, 13015864320ull, 4096,
     HF "meta-llama/Llama-2-13b-hf/blob/main/config.json"},
    {"Llama-3-8B", 32, 32, 8, 128, 8030261248ull, 8192,
     HF "meta-llama/Meta-Llama-3-8B/blob/main/config.json"},
    {"Llama-3-70B", 80, 64, 8, 128, 70553706496ull, 8192,
     HF "meta-llama/Meta-Llama-3-70B/blob/main/config.json"},
    {"Mistral-7B", 32, 32, 8, 128, 7241732096ull, 32768,
     HF "mistralai/Mistral-7B-v0.1/blob/main/config.json"},
    {"Qwen2.5-7B", 28, 28, 4, 128, 7615616512ull, 131072,
     HF "Qwen/Qwen2.5-7B/blob/main/config.json"},
};
const size_t plan_n_models = sizeof plan_models / sizeof plan_models[0];

const plan_gpu_t plan_gpus[] = {
    {"H100-80G", 80, "https://www.nvidia.com/en-us/data-center/h100/"},
    {"H200-141G", 141, "https://www.nvidia.com/en-us/data-center/h200/"},
    {"A100-40G", 40, "https://www.nvidia.com/en-us/data-center/a100/"},
    {"A100-80G", 80, "https://www.nvidia.com/en-us/data-center/a100/"},
    {"L4-24G", 24, "https://www.nvidia.com/en-us/data-center/l4/"},
};
const size_t plan_n_gpus = sizeof plan_gpus / sizeof plan_gpus[0];

const plan_model_t *plan_model_find(const char *name)
{
    for (size_t i = 0; name && i < plan_n_models; i++)
        if (!strcasecmp(name, plan_models[i].name))
            return &plan_models[i];
    return NULL;
}

const plan_gpu_t *plan_gpu_find(const char *name)
{
    for (size_t i = 0; name && i < plan_n_gpus; i++)
        if (!strcasecmp(name, plan_gpus[i].name))
            return &plan_gpus[i];
    return NULL;
}
