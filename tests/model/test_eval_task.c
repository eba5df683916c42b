/* SPDX-License-Identifier: MIT */
/*
 * test_eval_task.c — the retrieval items of `kvpage eval` (tools/kvpage/
 * eval_task.c, from the kvtool library): seeded determinism, needle
 * placement by depth, the variable chain's order, fitting to a token budget
 * with a stand-in token counter, exact-match scoring, bad input; the
 * haystacks (tools/kvpage/eval_hay.c): the cut into sentence units, the
 * filler haystack giving the same items as no haystack, real-text items
 * starting where their seed says, the license texts loaded with their
 * hashes. Needs no model file.
 */
#include <string.h>

#include "kv_test.h"
#include "tools/kvpage/eval_hay.h"
#include "tools/kvpage/eval_task.h"

/* Stand-in tokenizer: one token per space-separated word of user + the
 * longest question + its prime, plus a fixed template overhead. */
static long count_words(void *user, const eval_item_t *it)
{
    long *calls = user, most = 0;
    (*calls)++;
    for (uint32_t q = 0; q < it->n_q; q++) {
        long n = 20;
        const char *parts[3] = {it->user, it->q[q].text, it->q[q].prime};
        for (int k = 0; k < 3; k++)
            for (const char *p = parts[k]; *p; p++)
                n += (*p != ' ' && *p != '\n') &&
                     (p == parts[k] || p[-1] == ' ' || p[-1] == '\n');
        most = n > most ? n : most;
    }
    return most;
}

/* The user message of question 0 (context + question), in a static buffer
 * (rebuilt by each call, so pointers into it stay comparable). */
static const char *msg0(const eval_item_t *it)
{
    static char msg[1 << 16];
    snprintf(msg, sizeof msg, "%s%s", it->user, it->q[0].text);
    return msg;
}

static const char *find(const eval_item_t *it, const char *s)
{
    return strstr(msg0(it), s);
}

static void test_determinism(void)
{
    for (int kind = 0; kind < EVAL_TASK_COUNT; kind++) {
        eval_item_spec_t s = {.kind = (eval_task_kind_t)kind, .seed = 42, .n_units = 50,
                              .depth_pct = 30};
        eval_item_t a, b, c;
        CHECK_OK(eval_item_make(&s, &a));
        CHECK_OK(eval_item_make(&s, &b));
        s.seed = 43;
        CHECK_OK(eval_item_make(&s, &c));
        CHECK(a.user_len == b.user_len && !memcmp(a.user, b.user, a.user_len));
        CHECK(!strcmp(a.q[0].answer, b.q[0].answer) && !strcmp(a.q[0].prime, b.q[0].prime));
        CHECK(strcmp(a.q[0].answer, c.q[0].answer)); /* another seed, another answer */
        CHECK_EQ(strlen(a.user), a.user_len);
        CHECK(a.q[0].max_new > 0);
        CHECK_EQ(a.n_q, 1);
        CHECK_EQ(a.q[0].depth_pct, 30);
        eval_item_free(&a);
        eval_item_free(&b);
        eval_item_free(&c);
    }
}

static void test_passkey_depth(void)
{
    const char *first = "The grass is green.", *last = "There and back again.";
    eval_item_spec_t s = {.kind = EVAL_TASK_PASSKEY, .seed = 7, .n_units = 100};
    for (uint32_t d = 0; d <= 100; d += 25) {
        s.depth_pct = d;
        eval_item_t it;
        CHECK_OK(eval_item_make(&s, &it));
        CHECK_EQ(strlen(it.q[0].answer), 5);
        char needle[64];
        snprintf(needle, sizeof needle, "The pass key is %s. Remember it.", it.q[0].answer);
        const char *n = find(&it, needle), *f0 = find(&it, first);
        CHECK(n && f0);
        /* filler sentences before the needle: d% of 100 */
        uint32_t before = 0;
        const char *m = msg0(&it);
        for (const char *p = m; n && p < n; p++)
            before += *p == '.' && p > m && p[-1] != ' ';
        /* the intro has 3 sentences ending in '.' */
        CHECK_EQ(before, 3 + d);
        if (d == 100) {
            const char *q = find(&it, "What is the pass key? Answer with the number only.");
            CHECK(q && n > strstr(m, last) && q > n);
            CHECK(q == m + it.user_len + 2); /* the question follows the context */
        }
        CHECK(!strcmp(it.q[0].prime, "The pass key is"));
        CHECK(!strstr(it.user, "vault number")); /* one question: no second fact */
        eval_item_free(&it);
    }
}

static void test_needle(void)
{
    eval_item_spec_t s = {.kind = EVAL_TASK_NEEDLE, .seed = 11, .n_units = 80, .depth_pct = 60};
    eval_item_t it;
    CHECK_OK(eval_item_make(&s, &it));
    uint32_t n = 0;
    for (const char *p = it.user; (p = strstr(p, "One of the special magic numbers for ")); p++)
        n++;
    CHECK_EQ(n, EVAL_NEEDLES);
    /* the asked key is in the question and in the prime; its value is the answer */
    const char *q = strstr(it.q[0].text, "What is the special magic number for ");
    CHECK(q != NULL);
    char word[32] = "";
    if (q)
        sscanf(q + strlen("What is the special magic number for "), "%31s", word);
    char needle[96];
    snprintf(needle, sizeof needle, "numbers for %s is: %s.", word, it.q[0].answer);
    CHECK(find(&it, needle) != NULL);
    CHECK(strstr(it.q[0].prime, word) != NULL);
    eval_item_free(&it);
}

static void test_vt(void)
{
    eval_item_spec_t s = {.kind = EVAL_TASK_VT, .seed = 5, .n_units = 60, .depth_pct = 100};
    for (int round = 0; round < 2; round++, s.depth_pct = 10) {
        eval_item_t it;
        CHECK_OK(eval_item_make(&s, &it));
        char names[EVAL_VT_VARS][8];
        CHECK_EQ(sscanf(it.q[0].answer, "%7s %7s %7s %7s %7s", names[0], names[1], names[2],
                        names[3], names[4]),
                 EVAL_VT_VARS);
        const char *prev = msg0(&it);
        for (unsigned i = 1; i < EVAL_VT_VARS; i++) { /* X_i = X_{i-1}, in order */
            char stmt[64];
            snprintf(stmt, sizeof stmt, "VAR %s = VAR %s.", names[i], names[i - 1]);
            const char *at = find(&it, stmt);
            CHECK(at && at > prev);
            prev = at ? at : prev;
            CHECK(strcmp(names[i], names[i - 1]));
        }
        eval_item_free(&it);
    }
}

static void test_fit(void)
{
    long calls = 0;
    for (int kind = 0; kind < EVAL_TASK_COUNT; kind++)
        for (uint32_t target = 200; target <= 5000; target = target * 3 + 1) {
            eval_item_spec_t s = {.kind = (eval_task_kind_t)kind, .seed = 3, .depth_pct = 50};
            eval_item_t it;
            uint32_t n = 0;
            CHECK_OK(eval_item_fit(&s, target, count_words, &calls, &it, &n));
            CHECK(n <= target);
            CHECK_EQ(n, count_words(&calls, &it));
            eval_item_free(&it);
            /* one more unit would not fit */
            s.n_units++;
            CHECK_OK(eval_item_make(&s, &it));
            CHECK(count_words(&calls, &it) > (long)target);
            eval_item_free(&it);
        }
    CHECK(calls < 1000); /* the search is logarithmic, not a scan */
    eval_item_spec_t s = {.kind = EVAL_TASK_PASSKEY, .seed = 3};
    eval_item_t it;
    CHECK_EQ(eval_item_fit(&s, 10, count_words, &calls, &it, NULL), KV_ERANGE);
}

static void test_score(void)
{
    eval_question_t it = {.answer = "51095"};
    const char *ok[] = {" 51095.", "51095", "The pass key is 51095 indeed"};
    const char *bad[] = {" 510951", " 5109", "1. 51095", "", " fifty"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        CHECK_EQ(eval_item_score(&it, ok[i], strlen(ok[i])), 1);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_EQ(eval_item_score(&it, bad[i], strlen(bad[i])), 0);
    eval_question_t vt = {.answer = "ABCDE FGHIJ KLMNO"};
    const char *g1 = " ABCDE, FGHIJ and KLMNO.", *g2 = " ABCDE, FGHIJ.",
               *g3 = " ABCDEX, FGHIJ, KLMNO";
    CHECK_EQ(eval_item_score(&vt, g1, strlen(g1)), 1);
    CHECK_EQ(eval_item_score(&vt, g2, strlen(g2)), 0);
    CHECK_EQ(eval_item_score(&vt, g3, strlen(g3)), 0);
}

static void test_bad_input(void)
{
    eval_item_t it = {.user = NULL};
    eval_item_spec_t s = {.kind = EVAL_TASK_PASSKEY, .depth_pct = 101};
    CHECK_EQ(eval_item_make(&s, &it), KV_EINVAL);
    s = (eval_item_spec_t){.kind = EVAL_TASK_COUNT};
    CHECK_EQ(eval_item_make(&s, &it), KV_EINVAL);
    CHECK(it.user == NULL);
    eval_task_kind_t k;
    CHECK_EQ(eval_task_parse("passkeyx", 8, &k), KV_EINVAL);
    CHECK_OK(eval_task_parse("vt", 2, &k));
    CHECK_EQ(k, EVAL_TASK_VT);
    CHECK(eval_task_name(EVAL_TASK_COUNT) == NULL);
    eval_item_free(NULL);
}

static void test_hay_cut(void)
{
    const char *t[] = {"One.  Two!\n%\nThree? \"Four.\" Five\nsix (seven.) eight",
                       "\tNine.\x01 Ten."};
    eval_hay_t h;
    CHECK_OK(eval_hay_from_texts(EVAL_HAY_LICENSES, t, 2, &h));
    const char *want[] = {"One.", "Two!", "Three?", "\"Four.\"", "Five six (seven.)", "eight",
                          "Nine.", "Ten."};
    CHECK_EQ(h.n_units, 8);
    for (uint32_t i = 0; i < h.n_units && i < 8; i++)
        CHECK(!strcmp(h.units[i], want[i]));
    eval_hay_free(&h);
    /* a sentence longer than the limit is cut at a space after it */
    char longs[1200];
    size_t n = 0;
    while (n + 6 < sizeof longs - 2)
        n += (size_t)snprintf(longs + n, sizeof longs - n, "word ");
    snprintf(longs + n, sizeof longs - n, "end.");
    const char *l = longs;
    CHECK_OK(eval_hay_from_texts(EVAL_HAY_FORTUNES, &l, 1, &h));
    CHECK(h.n_units >= 3);
    for (uint32_t i = 0; i < h.n_units; i++)
        CHECK(strlen(h.units[i]) <= EVAL_HAY_UNIT_MAX + 8);
    eval_hay_free(&h);
    const char *empty = " \n%\n ";
    CHECK_EQ(eval_hay_from_texts(EVAL_HAY_FORTUNES, &empty, 1, &h), KV_ERANGE);
    CHECK_EQ(eval_hay_from_texts(EVAL_HAY_COUNT, t, 1, &h), KV_EINVAL);
    eval_hay_kind_t k;
    CHECK(!eval_hay_parse("fortunes", 8, &k) && k == EVAL_HAY_FORTUNES);
    CHECK_EQ(eval_hay_parse("fortune", 7, &k), KV_EINVAL);
    CHECK(!strcmp(eval_hay_name(EVAL_HAY_LICENSES), "licenses") && !eval_hay_name(EVAL_HAY_COUNT));
}

static void test_hay_items(void)
{
    char err[700];
    eval_hay_t fill, lic;
    CHECK_OK(eval_hay_load(EVAL_HAY_FILLER, &fill, err, sizeof err));
    CHECK_EQ(fill.n_units, 5);
    for (int kind = 0; kind < EVAL_TASK_COUNT; kind++) { /* same items as before haystacks */
        eval_item_spec_t s = {.kind = (eval_task_kind_t)kind, .seed = 9, .n_units = 40,
                              .depth_pct = 50};
        eval_item_t a, b;
        CHECK_OK(eval_item_make(&s, &a));
        s.hay = &fill;
        CHECK_OK(eval_item_make(&s, &b));
        CHECK(!strcmp(a.user, b.user) && !strcmp(a.q[0].answer, b.q[0].answer));
        eval_item_free(&a);
        eval_item_free(&b);
    }
    eval_hay_free(&fill);
    /* base-files is essential on Debian: the license texts are there */
    CHECK_OK(eval_hay_load(EVAL_HAY_LICENSES, &lic, err, sizeof err));
    CHECK(lic.n_files >= 8 && lic.n_units > 1000);
    for (uint32_t i = 0; i < lic.n_files; i++)
        CHECK(strlen(lic.files[i].sha256) == 64 && lic.files[i].bytes > 1000);
    /* two seeds read different passages; the same seed the same one */
    eval_item_spec_t s = {.kind = EVAL_TASK_PASSKEY, .seed = 1, .n_units = 30, .depth_pct = 0,
                          .hay = &lic};
    eval_item_t a, b, c;
    CHECK_OK(eval_item_make(&s, &a));
    CHECK_OK(eval_item_make(&s, &c));
    s.seed = 2;
    CHECK_OK(eval_item_make(&s, &b));
    CHECK(!strcmp(a.user, c.user) && strcmp(a.user, b.user));
    /* after the needle (depth 0): consecutive units of the haystack */
    const char *p = strstr(a.user, "is the pass key. ");
    CHECK(p != NULL);
    p += strlen("is the pass key. ");
    int found = 0;
    for (uint32_t j = 0; j < lic.n_units && !found && p; j++) {
        const char *q = p;
        found = 1;
        for (uint32_t d = 0; d < 4 && found; d++) {
            const char *un = lic.units[(j + d) % lic.n_units];
            found = !strncmp(q, un, strlen(un)) && q[strlen(un)] == ' ';
            q += strlen(un) + 1;
        }
    }
    CHECK(found);
    eval_item_free(&a);
    eval_item_free(&b);
    eval_item_free(&c);
    eval_hay_free(&lic);
}

/* Two questions: each about its own fact in the one context, the first
 * question's item otherwise as with one (same key, same question). */
static void test_two_questions(void)
{
    for (int kind = 0; kind < EVAL_TASK_COUNT; kind++)
        for (uint32_t d = 0; d <= 100; d += 25) {
            eval_item_spec_t s = {.kind = (eval_task_kind_t)kind, .seed = 9, .n_units = 80,
                                  .depth_pct = d};
            eval_item_t one, two;
            CHECK_OK(eval_item_make(&s, &one));
            s.questions = 2;
            CHECK_OK(eval_item_make(&s, &two));
            CHECK_EQ(two.n_q, 2);
            CHECK(!strcmp(one.q[0].answer, two.q[0].answer));
            CHECK(!strcmp(one.q[0].text, two.q[0].text));
            CHECK(!strcmp(one.q[0].prime, two.q[0].prime));
            CHECK(strcmp(two.q[0].text, two.q[1].text));
            CHECK(strcmp(two.q[0].prime, two.q[1].prime));
            if (kind == EVAL_TASK_NEEDLE) /* the question asks another of its needles */
                CHECK(!strcmp(one.user, two.user));
            else
                CHECK(two.user_len > one.user_len); /* the second fact */
            CHECK(two.q[1].max_new > 0 && two.q[1].depth_pct <= 100);
            if (kind != EVAL_TASK_NEEDLE) /* half the haystack away */
                CHECK_EQ(two.q[1].depth_pct, d < 50 ? d + 50 : d - 50);
            /* every answer is in the context: the facts were planted */
            const char *a = two.q[1].answer;
            char first[8] = "";
            snprintf(first, sizeof first, "%.5s", a);
            CHECK(strstr(two.user, first) != NULL);
            if (kind == EVAL_TASK_PASSKEY) {
                char fact[128];
                snprintf(fact, sizeof fact, "The vault number is %s. Remember it.", a);
                CHECK(strstr(two.user, fact) != NULL);
                CHECK(strstr(two.q[1].text, "What is the vault number?") != NULL);
            }
            eval_item_free(&one);
            eval_item_free(&two);
        }
    eval_item_spec_t s = {.kind = EVAL_TASK_VT, .questions = EVAL_QUESTIONS + 1};
    eval_item_t it = {.user = NULL};
    CHECK_EQ(eval_item_make(&s, &it), KV_EINVAL);
    CHECK(it.user == NULL);
}

int main(void)
{
    test_hay_cut();
    test_hay_items();
    test_determinism();
    test_passkey_depth();
    test_needle();
    test_vt();
    test_two_questions();
    test_fit();
    test_score();
    test_bad_input();
    return kv_test_end();
}
