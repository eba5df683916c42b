/* SPDX-License-Identifier: MIT */
/*
 * eval_dump.c — one retrieval item as a JSON line (eval_dump.h): the
 * format `kvpage eval --dump-items` writes and docs/eval.md describes.
 */
#include "eval_dump.h"

#include <inttypes.h>

#include "kv_cli.h"

static void ids_array(FILE *f, const int32_t *ids, uint32_t n)
{
    fputc('[', f);
    for (uint32_t i = 0; i < n; i++)
        fprintf(f, i ? ",%" PRId32 : "%" PRId32, ids[i]);
    fputc(']', f);
}

int eval_dump_item(FILE *f, const eval_item_spec_t *spec, const char *hay_name, uint32_t ctx,
                   uint32_t k, const eval_item_t *it, const eval_dump_ids_t *ids)
{
    fprintf(f, "{\"task\":\"%s\",\"haystack\":\"%s\",\"ctx\":%" PRIu32 ",\"item\":%" PRIu32
            ",\"seed\":%" PRIu64 ",\"depth\":%" PRIu32 ",\"units\":%" PRIu32 ",\"context\":",
            eval_task_name(spec->kind), hay_name, ctx, k, spec->seed, spec->depth_pct,
            spec->n_units);
    kv_cli_json_strn(f, it->user, it->user_len);
    fputs(",\"context_ids\":", f);
    ids_array(f, ids->ids[0], ids->n_head);
    fputs(",\"questions\":[", f);
    for (uint32_t qi = 0; qi < it->n_q; qi++) {
        const eval_question_t *q = &it->q[qi];
        fprintf(f, "%s{\"question\":%" PRIu32 ",\"text\":", qi ? "," : "", qi);
        kv_cli_json_str(f, q->text);
        fputs(",\"prime\":", f);
        kv_cli_json_str(f, q->prime);
        fputs(",\"answer\":", f);
        kv_cli_json_str(f, q->answer);
        fprintf(f, ",\"max_new\":%" PRIu32 ",\"depth\":%" PRIu32 ",\"ids\":", q->max_new,
                q->depth_pct);
        ids_array(f, ids->ids[qi] + ids->n_head, ids->n[qi] - ids->n_head);
        fputc('}', f);
    }
    fputs("]}\n", f);
    return ferror(f) ? -1 : 0;
}
