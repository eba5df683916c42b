/* SPDX-License-Identifier: MIT */
/*
 * eval_task.c — retrieval items of `kvpage eval` as text (see eval_task.h):
 * passkey, multi-key needle, variable tracking; fitting to a token budget;
 * exact-match scoring.
 *
 * A haystack is n_units units (eval_hay.h) with inserts (needle sentences)
 * placed before unit i (i == n_units: after the last one), joined by
 * single spaces. Inserts are kept in the order they were added among those
 * at the same unit, so a variable-tracking chain always reads in order.
 */
#include "eval_task.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpage/kvpage.h"

static const char *const filler[] = {
    "The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
    "There and back again.",
};
#define N_FILLER (sizeof filler / sizeof filler[0])

/* The units an item reads: n of them from start, cycled. */
typedef struct units {
    const char *const *u;
    uint32_t n, start;
} units_t;

static units_t item_units(const eval_item_spec_t *s)
{
    if (!s->hay || !s->hay->n_units)
        return (units_t){filler, N_FILLER, 0};
    units_t u = {s->hay->units, s->hay->n_units, 0};
    if (s->hay->kind != EVAL_HAY_FILLER) { /* a stream of its own: keys unchanged */
        uint64_t r = s->seed ^ 0x68617973746b6eull;
        u.start = (uint32_t)(eval_mix64(&r) % u.n);
    }
    return u;
}

/* Needle keys (RULER uses words; these are common, single-meaning nouns). */
static const char *const words[] = {
    "apple",  "river",  "candle", "garden", "pencil", "mirror", "harbor", "violin",
    "lantern", "meadow", "rocket", "saddle", "tunnel", "wallet", "falcon", "island",
    "basket", "castle", "dragon", "engine", "forest", "helmet", "jacket", "kettle",
    "ladder", "magnet", "needle", "orange", "parrot", "quartz", "ribbon", "silver",
};
#define N_WORDS (sizeof words / sizeof words[0])

static const char *const task_names[EVAL_TASK_COUNT] = {"passkey", "needle", "vt"};

const char *eval_task_name(eval_task_kind_t kind)
{
    return (unsigned)kind < EVAL_TASK_COUNT ? task_names[kind] : NULL;
}

int eval_task_parse(const char *name, size_t len, eval_task_kind_t *out)
{
    if (!name || !out)
        return KV_EINVAL;
    for (unsigned k = 0; k < EVAL_TASK_COUNT; k++)
        if (strlen(task_names[k]) == len && !memcmp(name, task_names[k], len)) {
            *out = (eval_task_kind_t)k;
            return 0;
        }
    return KV_EINVAL;
}

uint64_t eval_mix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- a growable text buffer ---------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int err; /* KV_ENOMEM once a growth failed; later appends do nothing */
} sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...)
{
    if (b->err)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->err = KV_EINVAL;
        return;
    }
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->err = KV_ENOMEM;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* ---- haystacks ------------------------------------------------------------ */

#define MAX_INSERTS 12u /* two vt chains of EVAL_VT_VARS; EVAL_NEEDLES */

typedef struct insert {
    uint32_t unit;   /* goes before filler unit `unit` */
    char text[96];
} insert_t;

typedef struct hay {
    insert_t ins[MAX_INSERTS];
    uint32_t n;
} hay_t;

/* Add an insert, keeping the list sorted by unit, stable. */
static void hay_add(hay_t *h, uint32_t unit, const char *text)
{
    if (h->n >= MAX_INSERTS)
        return;
    uint32_t i = h->n;
    while (i > 0 && h->ins[i - 1].unit > unit) {
        h->ins[i] = h->ins[i - 1];
        i--;
    }
    h->ins[i].unit = unit;
    snprintf(h->ins[i].text, sizeof h->ins[i].text, "%s", text);
    h->n++;
}

static void hay_write(sbuf_t *b, const hay_t *h, const units_t *un, uint32_t n_units)
{
    uint32_t k = 0;
    const char *sep = "";
    for (uint32_t u = 0; u <= n_units; u++) {
        for (; k < h->n && h->ins[k].unit == u; k++) {
            sb_printf(b, "%s%s", sep, h->ins[k].text);
            sep = " ";
        }
        if (u < n_units) {
            sb_printf(b, "%s%s", sep, un->u[(un->start + (uint64_t)u) % un->n]);
            sep = " ";
        }
    }
}

static uint32_t depth_unit(uint32_t n_units, uint32_t depth_pct)
{
    return (uint32_t)(((uint64_t)n_units * depth_pct + 50) / 100);
}

/* ---- the three tasks ------------------------------------------------------ */

/* The depth of a second fact: half the haystack away from the first. */
static uint32_t other_depth(uint32_t depth_pct)
{
    return depth_pct < 50 ? depth_pct + 50 : depth_pct - 50;
}

static uint32_t unit_depth(uint32_t unit, uint32_t n_units)
{
    return n_units ? (uint32_t)(((uint64_t)unit * 100 + n_units / 2) / n_units) : 0;
}

/* A 5-digit number key sentence ("The pass key is N. Remember it. N is the
 * pass key.") for what, with its question. */
static void key_fact(uint64_t *rng, const char *what, uint32_t depth, char *sentence,
                     size_t len, eval_question_t *q)
{
    unsigned key = 10000u + (unsigned)(eval_mix64(rng) % 90000u);
    snprintf(sentence, len, "The %s is %u. Remember it. %u is the %s.", what, key, key, what);
    snprintf(q->text, sizeof q->text, "\n\nWhat is the %s? Answer with the number only.", what);
    snprintf(q->prime, sizeof q->prime, "The %s is", what);
    snprintf(q->answer, sizeof q->answer, "%u", key);
    q->max_new = 8;
    q->depth_pct = depth;
}

static void make_passkey(const eval_item_spec_t *s, const units_t *un, uint64_t *rng, sbuf_t *b,
                         eval_item_t *it)
{
    static const char *const what[EVAL_QUESTIONS] = {"pass key", "vault number"};
    hay_t h = {.n = 0};
    for (uint32_t i = 0; i < it->n_q; i++) {
        char needle[96];
        uint32_t d = i ? other_depth(s->depth_pct) : s->depth_pct;
        key_fact(rng, what[i], d, needle, sizeof needle, &it->q[i]);
        hay_add(&h, depth_unit(s->n_units, d), needle);
    }
    sb_printf(b, "There is an important info hidden inside a lot of irrelevant text. Find it "
                 "and memorize it. I will quiz you about the important information there.\n\n");
    hay_write(b, &h, un, s->n_units);
}

static void make_needle(const eval_item_spec_t *s, const units_t *un, uint64_t *rng, sbuf_t *b,
                        eval_item_t *it)
{
    unsigned pick[EVAL_NEEDLES], val[EVAL_NEEDLES];
    for (unsigned i = 0; i < EVAL_NEEDLES; i++) {
        unsigned w;
        int dup;
        do { /* distinct keys */
            w = (unsigned)(eval_mix64(rng) % N_WORDS);
            dup = 0;
            for (unsigned j = 0; j < i; j++)
                dup |= pick[j] == w;
        } while (dup);
        pick[i] = w;
        val[i] = 10000u + (unsigned)(eval_mix64(rng) % 90000u);
    }
    hay_t h = {.n = 0};
    for (unsigned i = 0; i < EVAL_NEEDLES; i++) {
        char needle[96];
        snprintf(needle, sizeof needle, "One of the special magic numbers for %s is: %u.",
                 words[pick[i]], val[i]);
        uint32_t unit = i == 0 ? depth_unit(s->n_units, s->depth_pct)
                               : (uint32_t)(eval_mix64(rng) % ((uint64_t)s->n_units + 1));
        hay_add(&h, unit, needle);
        if (i >= it->n_q)
            continue;
        eval_question_t *q = &it->q[i]; /* question i asks needle i */
        snprintf(q->text, sizeof q->text, "\n\nWhat is the special magic number for %s "
                 "mentioned in the provided text?", words[pick[i]]);
        snprintf(q->prime, sizeof q->prime,
                 "The special magic number for %s mentioned in the provided text is",
                 words[pick[i]]);
        snprintf(q->answer, sizeof q->answer, "%u", val[i]);
        q->max_new = 10;
        q->depth_pct = i == 0 ? s->depth_pct : unit_depth(unit, s->n_units);
    }
    sb_printf(b, "Some special magic numbers are hidden within the following text. Make sure "
                 "to memorize it. I will quiz you about the numbers afterwards.\n\n");
    hay_write(b, &h, un, s->n_units);
}

/* One chain of EVAL_VT_VARS variables (names distinct from taken[0..n_taken))
 * starting at depth and spread to the end, with its question. */
static void vt_chain(const eval_item_spec_t *s, uint64_t *rng, uint32_t depth,
                     char (*names)[6], uint32_t n_taken, hay_t *h, eval_question_t *q)
{
    for (unsigned i = n_taken; i < n_taken + EVAL_VT_VARS; i++) {
        int dup;
        do {
            for (unsigned c = 0; c < 5; c++)
                names[i][c] = (char)('A' + eval_mix64(rng) % 26);
            names[i][5] = 0;
            dup = 0;
            for (unsigned j = 0; j < i; j++)
                dup |= !strcmp(names[j], names[i]);
        } while (dup);
    }
    char(*chain)[6] = names + n_taken;
    unsigned value = 10000u + (unsigned)(eval_mix64(rng) % 90000u);
    uint32_t start = depth_unit(s->n_units, depth);
    size_t alen = 0;
    for (unsigned i = 0; i < EVAL_VT_VARS; i++) {
        char stmt[96];
        if (i == 0)
            snprintf(stmt, sizeof stmt, "VAR %s = %u.", chain[0], value);
        else
            snprintf(stmt, sizeof stmt, "VAR %s = VAR %s.", chain[i], chain[i - 1]);
        uint32_t unit = start + (uint32_t)((uint64_t)(s->n_units - start) * i /
                                           (EVAL_VT_VARS - 1));
        hay_add(h, unit, stmt);
        alen += (size_t)snprintf(q->answer + alen, sizeof q->answer - alen, "%s%s",
                                 i ? " " : "", chain[i]);
    }
    snprintf(q->text, sizeof q->text, "\n\nQuestion: Find all variables that are assigned the "
             "value %u in the text above.", value);
    snprintf(q->prime, sizeof q->prime,
             "Answer: According to the chain(s) of variable assignment in the text above, %u "
             "variables are assigned the value %u, they are:", EVAL_VT_VARS, value);
    q->max_new = 32;
    q->depth_pct = depth;
}

static void make_vt(const eval_item_spec_t *s, const units_t *un, uint64_t *rng, sbuf_t *b,
                    eval_item_t *it)
{
    char names[EVAL_QUESTIONS * EVAL_VT_VARS][6];
    hay_t h = {.n = 0};
    for (uint32_t i = 0; i < it->n_q; i++)
        vt_chain(s, rng, i ? other_depth(s->depth_pct) : s->depth_pct, names,
                 i * EVAL_VT_VARS, &h, &it->q[i]);
    sb_printf(b, "Memorize and track the chain(s) of variable assignment hidden in the "
                 "following text.\n\n");
    hay_write(b, &h, un, s->n_units);
}

int eval_item_make(const eval_item_spec_t *spec, eval_item_t *out)
{
    if (!spec || !out || (unsigned)spec->kind >= EVAL_TASK_COUNT || spec->depth_pct > 100 ||
        spec->questions > EVAL_QUESTIONS)
        return KV_EINVAL;
    eval_item_t it = {.user = NULL, .n_q = spec->questions ? spec->questions : 1};
    sbuf_t b = {.p = NULL};
    uint64_t rng = spec->seed ^ (0x5bd1e995ull * (spec->kind + 1));
    units_t un = item_units(spec);
    if (spec->kind == EVAL_TASK_PASSKEY)
        make_passkey(spec, &un, &rng, &b, &it);
    else if (spec->kind == EVAL_TASK_NEEDLE)
        make_needle(spec, &un, &rng, &b, &it);
    else
        make_vt(spec, &un, &rng, &b, &it);
    if (b.err) {
        free(b.p);
        return b.err;
    }
    it.user = b.p;
    it.user_len = b.len;
    *out = it;
    return 0;
}

void eval_item_free(eval_item_t *it)
{
    if (!it)
        return;
    free(it->user);
    it->user = NULL;
    it->user_len = 0;
}

/* Tokens of spec with n filler units (the item is freed). */
static long count_units(eval_item_spec_t *spec, uint32_t n, eval_count_fn count, void *user)
{
    eval_item_t it;
    spec->n_units = n;
    int rc = eval_item_make(spec, &it);
    if (rc)
        return rc;
    long t = count(user, &it);
    eval_item_free(&it);
    return t;
}

int eval_item_fit(eval_item_spec_t *spec, uint32_t target, eval_count_fn count, void *user,
                  eval_item_t *out, uint32_t *n_tokens)
{
    if (!spec || !count || !out)
        return KV_EINVAL;
    long base = count_units(spec, 0, count, user);
    if (base < 0)
        return (int)base;
    if (base > (long)target)
        return KV_ERANGE;
    long t64 = count_units(spec, 64, count, user);
    if (t64 < 0)
        return (int)t64;
    /* bracket [lo, hi) around the linear guess: lo fits, hi does not */
    double per = t64 > base ? (double)(t64 - base) / 64.0 : 1.0;
    uint32_t lo = (uint32_t)((double)(target - (uint32_t)base) / per), hi, step = 8;
    long t = count_units(spec, lo, count, user);
    if (t < 0)
        return (int)t;
    if (t <= (long)target) {
        for (hi = lo + step;; hi = lo + step) {
            if ((t = count_units(spec, hi, count, user)) < 0)
                return (int)t;
            if (t > (long)target)
                break;
            lo = hi;
            step *= 2;
        }
    } else {
        for (hi = lo;; hi = lo) {
            lo = hi > step ? hi - step : 0;
            if (!lo)
                break;
            if ((t = count_units(spec, lo, count, user)) < 0)
                return (int)t;
            if (t <= (long)target)
                break;
            step *= 2;
        }
    }
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        t = count_units(spec, mid, count, user);
        if (t < 0)
            return (int)t;
        if (t <= (long)target)
            lo = mid;
        else
            hi = mid;
    }
    spec->n_units = lo;
    int rc = eval_item_make(spec, out);
    if (rc)
        return rc;
    t = count(user, out);
    if (t < 0) {
        eval_item_free(out);
        return (int)t;
    }
    if (n_tokens)
        *n_tokens = (uint32_t)t;
    return 0;
}

/* ---- scoring ----------------------------------------------------------- */

static int is_alnum(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}

/* 1 if word[0..wl) occurs in gen[0..len) with no letter/digit on either side. */
static int has_word(const char *gen, size_t len, const char *word, size_t wl)
{
    for (size_t i = 0; wl && i + wl <= len; i++)
        if (!memcmp(gen + i, word, wl) && (i == 0 || !is_alnum(gen[i - 1])) &&
            (i + wl == len || !is_alnum(gen[i + wl])))
            return 1;
    return 0;
}

int eval_item_score(const eval_question_t *it, const char *gen, size_t len)
{
    if (!it || (!gen && len))
        return 0;
    size_t al = strlen(it->answer);
    if (!strchr(it->answer, ' ') && al && it->answer[0] >= '0' && it->answer[0] <= '9') {
        size_t i = 0;
        while (i < len && !(gen[i] >= '0' && gen[i] <= '9'))
            i++;
        size_t j = i;
        while (j < len && gen[j] >= '0' && gen[j] <= '9')
            j++;
        return j - i == al && !memcmp(gen + i, it->answer, al);
    }
    for (const char *w = it->answer; *w;) { /* vt: every name */
        size_t wl = strcspn(w, " ");
        if (!has_word(gen, len, w, wl))
            return 0;
        w += wl;
        w += *w == ' ';
    }
    return al > 0;
}
