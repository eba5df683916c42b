/* SPDX-License-Identifier: MIT */
/*
 * kv_model_load.c — builds a kv_model_t from a GGUF file: hyperparameters
 * from the `llama.*` metadata, every weight bound by name with its shape and
 * type checked (a file that does not match gets an error naming the tensor),
 * every matrix repacked for the matmul (kv_q_pack: still quantized, same
 * size), norms copied to FP32, RoPE frequencies precomputed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_model_int.h"

static int get_u32(const kv_gguf_t *g, const char *key, uint32_t *v, char *err, size_t el)
{
    int rc = kv_gguf_get_u32(g, key, v);
    if (rc)
        return kv_model_errf(err, el, KV_ECORRUPT, "model: metadata '%s' %s", key,
                     rc == KV_ENOENT ? "is missing" : "is not a valid unsigned integer");
    return 0;
}

static int read_hparams(const kv_gguf_t *g, kv_model_hparams_t *hp, char *err, size_t el)
{
    kv_gguf_str_t arch;
    if (kv_gguf_get_str(g, "general.architecture", &arch) || !kv_gguf_str_eq(arch, "llama"))
        return kv_model_errf(err, el, KV_ENOTSUP, "model: general.architecture is not 'llama'");
    int rc;
    if ((rc = get_u32(g, "llama.block_count", &hp->n_layers, err, el)) ||
        (rc = get_u32(g, "llama.embedding_length", &hp->d_model, err, el)) ||
        (rc = get_u32(g, "llama.attention.head_count", &hp->n_q_heads, err, el)) ||
        (rc = get_u32(g, "llama.feed_forward_length", &hp->d_ff, err, el)) ||
        (rc = get_u32(g, "llama.context_length", &hp->n_ctx, err, el)))
        return rc;
    if (kv_gguf_get_u32(g, "llama.attention.head_count_kv", &hp->n_kv_heads))
        hp->n_kv_heads = hp->n_q_heads;
    if (kv_gguf_get_f32(g, "llama.rope.freq_base", &hp->rope_theta))
        hp->rope_theta = 10000.0f;
    if (kv_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &hp->rms_eps))
        hp->rms_eps = 1e-5f;
    if (!hp->n_layers || hp->n_layers > 4096 || !hp->n_q_heads || !hp->n_kv_heads ||
        hp->n_q_heads % hp->n_kv_heads || hp->d_model % hp->n_q_heads || !hp->d_ff ||
        hp->d_model > 65536 || hp->d_ff > 262144 || !hp->n_ctx)
        return kv_model_errf(err, el, KV_ECORRUPT, "model: inconsistent hyperparameters");
    hp->head_dim = hp->d_model / hp->n_q_heads;
    uint32_t rot;
    if (!kv_gguf_get_u32(g, "llama.rope.dimension_count", &rot) && rot != hp->head_dim)
        return kv_model_errf(err, el, KV_ENOTSUP, "model: partial RoPE (%u of %u dims) not supported",
                     rot, hp->head_dim);
    if (hp->head_dim % 16 || hp->head_dim > 1024)
        return kv_model_errf(err, el, KV_ENOTSUP, "model: head_dim %u is not a multiple of 16 <= 1024",
                     hp->head_dim);
    if (!(hp->rope_theta > 0) || !(hp->rms_eps > 0))
        return kv_model_errf(err, el, KV_ECORRUPT, "model: bad rope base or rms epsilon");
    return 0;
}

/* Bind tensor `name` as a matrix of rows x cols. */
static int bind_mat(const kv_gguf_t *g, const char *name, uint32_t rows, uint32_t cols,
                    kv_q_mat_t *m, char *err, size_t el)
{
    const kv_gguf_tensor_t *t = kv_gguf_tensor(g, name);
    if (!t)
        return kv_model_errf(err, el, KV_ECORRUPT, "model: tensor '%s' is missing", name);
    if (t->n_dims != 2 || t->ne[0] != cols || t->ne[1] != rows)
        return kv_model_errf(err, el, KV_ECORRUPT, "model: tensor '%s' is %llux%llu, expected %ux%u",
                     name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], cols,
                     rows);
    if (!kv_q_supported(t->type) || kv_q_mat_init(m, t->type, rows, cols, t->data, t->nbytes))
        return kv_model_errf(err, el, KV_ENOTSUP, "model: tensor '%s' has type %s, not supported", name,
                     kv_gguf_ttype_name(t->type));
    return 0;
}

static int pack_mat(kv_q_mat_t *mat, char *err, size_t el)
{
    int rc = kv_q_pack(mat);
    return rc ? kv_model_errf(err, el, rc, "model: packing weights failed (%s)", kv_strerror(rc)) : 0;
}

/* Copy a vector tensor of n values to a new FP32 array. */
static int load_vec(const kv_gguf_t *g, const char *name, uint32_t n, float **out, char *err,
                    size_t el)
{
    const kv_gguf_tensor_t *t = kv_gguf_tensor(g, name);
    if (!t)
        return kv_model_errf(err, el, KV_ECORRUPT, "model: tensor '%s' is missing", name);
    if (t->n_elems != n || t->ne[0] != n)
        return kv_model_errf(err, el, KV_ECORRUPT, "model: tensor '%s' has %llu values, expected %u",
                     name, (unsigned long long)t->n_elems, n);
    float *v = malloc((size_t)n * sizeof *v);
    if (!v)
        return kv_model_errf(err, el, KV_ENOMEM, "model: out of memory");
    if (kv_q_dequant_row(t->type, t->data, v, n)) {
        free(v);
        return kv_model_errf(err, el, KV_ENOTSUP, "model: tensor '%s' has type %s, not supported", name,
                     kv_gguf_ttype_name(t->type));
    }
    *out = v;
    return 0;
}

static int load_layer(kv_model_t *m, uint32_t l, char *err, size_t el)
{
    const kv_model_hparams_t *hp = &m->hp;
    kv_model_layer_w_t *w = &m->layers[l];
    const uint32_t D = hp->d_model, QD = hp->n_q_heads * hp->head_dim;
    const uint32_t KD = hp->n_kv_heads * hp->head_dim, F = hp->d_ff;
    const struct {
        const char *name;
        uint32_t rows, cols;
        kv_q_mat_t *mat;
    } mats[] = {
        {"attn_q", QD, D, &w->wq},       {"attn_k", KD, D, &w->wk},
        {"attn_v", KD, D, &w->wv},       {"attn_output", D, QD, &w->wo},
        {"ffn_gate", F, D, &w->gate},    {"ffn_up", F, D, &w->up},
        {"ffn_down", D, F, &w->down},
    };
    char name[96];
    int rc;
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
        snprintf(name, sizeof name, "blk.%u.%s.weight", l, mats[i].name);
        if ((rc = bind_mat(m->g, name, mats[i].rows, mats[i].cols, mats[i].mat, err, el)) ||
            (rc = pack_mat(mats[i].mat, err, el)))
            return rc;
    }
    snprintf(name, sizeof name, "blk.%u.attn_norm.weight", l);
    if ((rc = load_vec(m->g, name, D, &w->attn_norm, err, el)))
        return rc;
    snprintf(name, sizeof name, "blk.%u.ffn_norm.weight", l);
    return load_vec(m->g, name, D, &w->ffn_norm, err, el);
}

void kv_model_free(kv_model_t *m)
{
    if (!m)
        return;
    if (m->layers)
        for (uint32_t l = 0; l < m->hp.n_layers; l++) {
            kv_model_layer_w_t *w = &m->layers[l];
            free(w->attn_norm);
            free(w->ffn_norm);
            kv_q_mat_t *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->gate, &w->up, &w->down};
            for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
                kv_q_mat_release(mats[i]);
        }
    kv_q_mat_release(&m->out);
    free(m->layers);
    free(m->out_norm);
    free(m->inv_freq);
    kv_workers_destroy(m->workers);
    kv_gguf_close(m->g);
    free(m);
}

int kv_model_load(const char *path, kv_model_t **out, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = 0;
    if (!path || !out)
        return kv_model_errf(err, err_len, KV_EINVAL, "model: invalid argument");
    kv_model_t *m = calloc(1, sizeof *m);
    if (!m)
        return kv_model_errf(err, err_len, KV_ENOMEM, "model: out of memory");
    int rc = kv_gguf_open(path, &m->g, err, err_len);
    if (rc) {
        free(m);
        return rc;
    }
    kv_model_hparams_t *hp = &m->hp;
    if ((rc = read_hparams(m->g, hp, err, err_len)))
        goto fail;
    const kv_gguf_tensor_t *e = kv_gguf_tensor(m->g, "token_embd.weight");
    hp->vocab = e && e->n_dims == 2 && e->ne[1] <= INT32_MAX ? (uint32_t)e->ne[1] : 0;
    if ((rc = bind_mat(m->g, "token_embd.weight", hp->vocab ? hp->vocab : 1, hp->d_model,
                       &m->embd, err, err_len)))
        goto fail;
    m->out = m->embd; /* tied unless the file has its own output matrix */
    if (kv_gguf_tensor(m->g, "output.weight") &&
        (rc = bind_mat(m->g, "output.weight", hp->vocab, hp->d_model, &m->out, err, err_len)))
        goto fail;
    if ((rc = pack_mat(&m->out, err, err_len)))
        goto fail;
    if ((rc = load_vec(m->g, "output_norm.weight", hp->d_model, &m->out_norm, err, err_len)))
        goto fail;
    m->layers = calloc(hp->n_layers, sizeof *m->layers);
    m->inv_freq = malloc(hp->head_dim / 2 * sizeof *m->inv_freq);
    if (!m->layers || !m->inv_freq) {
        rc = kv_model_errf(err, err_len, KV_ENOMEM, "model: out of memory");
        goto fail;
    }
    for (uint32_t l = 0; l < hp->n_layers; l++)
        if ((rc = load_layer(m, l, err, err_len)))
            goto fail;
    for (uint32_t i = 0; i < hp->head_dim / 2; i++)
        m->inv_freq[i] = pow((double)hp->rope_theta, -2.0 * i / hp->head_dim);
    if ((rc = kv_workers_create(0, &m->workers))) {
        kv_model_errf(err, err_len, rc, "model: cannot start worker threads (%s)", kv_strerror(rc));
        goto fail;
    }
    *out = m;
    return 0;
fail:
    kv_model_free(m);
    return rc;
}

const kv_model_hparams_t *kv_model_hparams(const kv_model_t *m) { return m ? &m->hp : NULL; }

const struct kv_gguf *kv_model_gguf(const kv_model_t *m) { return m ? m->g : NULL; }

uint64_t kv_model_decode_weight_bytes(const kv_model_t *m)
{
    if (!m)
        return 0;
    const uint64_t D = m->hp.d_model;
    uint64_t b = kv_q_mat_bytes(&m->out) + m->embd.row_bytes + D * 4; /* + out_norm */
    for (uint32_t l = 0; l < m->hp.n_layers; l++) {
        const kv_model_layer_w_t *w = &m->layers[l];
        b += 2 * D * 4; /* attn_norm, ffn_norm */
        b += kv_q_mat_bytes(&w->wq) + kv_q_mat_bytes(&w->wk) + kv_q_mat_bytes(&w->wv) +
             kv_q_mat_bytes(&w->wo) + kv_q_mat_bytes(&w->gate) + kv_q_mat_bytes(&w->up) +
             kv_q_mat_bytes(&w->down);
    }
    return b;
}

int kv_model_store_config(const kv_model_t *m, uint32_t max_tokens, uint32_t max_seqs,
                          uint32_t n_threads, kv_config_t *cfg)
{
    if (!m || !cfg || !max_tokens || !max_seqs)
        return KV_EINVAL;
    kv_config_t c = kv_config_default();
    c.n_layers = m->hp.n_layers;
    c.n_q_heads = m->hp.n_q_heads;
    c.n_kv_heads = m->hp.n_kv_heads;
    c.head_dim = m->hp.head_dim;
    c.max_seqs = max_seqs;
    c.n_threads = n_threads;
    const uint64_t tpp = 16; /* default page: 16 FP16 tokens */
    uint64_t per_list = (max_tokens + tpp - 1) / tpp + 1;
    c.host_pages = (uint64_t)max_seqs * c.n_layers * c.n_kv_heads * per_list;
    *cfg = c;
    return 0;
}
