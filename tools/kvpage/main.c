/* SPDX-License-Identifier: MIT */
/*
 * main.c — the `kvpage` command: dispatch to subcommands.
 *
 *   kvpage demo [options]   synthetic engine-like workload, prints a table
 *   kvpage version          library version, commit, features built in
 *                           (also --version; kv_build_info.h is generated at
 *                           build time by cmake/kv_build_info.cmake)
 *   kvpage help             this list
 *
 * Each subcommand takes --help. Exit codes: 0 ok, 1 failure, 2 usage.
 * Help that was asked for (help, --help, <command> --help) goes to stdout
 * with exit 0; a usage error (no command, an unknown one, a bad option)
 * prints its message, and `kvpage` alone the command list, on stderr.
 * Whatever a command printed must have reached stdout: lost output (a full
 * disk, >/dev/full) turns a success into exit 1 with a message.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kv_build_info.h"
#include "kv_cli.h"
#include "kvpage/kvpage.h"

static int cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("kvpage %s (commit %s)\nfeatures: %s\n", kv_version(), KV_BUILD_COMMIT,
           KV_BUILD_FEATURES);
    return 0;
}

static int cmd_help(int argc, char **argv);

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"demo", kv_cmd_demo, "synthetic workload: sequences prefill and decode through the store"},
    {"run", kv_cmd_run, "generate text with SmolLM2-135M, its KV cache in the store"},
    {"eval", kv_cmd_eval, "compare KV cache policies: perplexity, retrieval, fidelity"},
    {"stress", kv_cmd_stress, "memory-pressure stress: an engine-like workload, verified continuously"},
    {"plan", kv_cmd_plan, "capacity planning: bytes per token, sequences and context per policy"},
    {"version", cmd_version, "print the version, commit and features built in"},
    {"help", cmd_help, "list the commands"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvpage <command> [options]   (kvpage <command> --help)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

static int cmd_help(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    usage(stdout);
    return 0;
}

double kv_cli_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 2) { /* a usage error: the list goes to stderr */
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
        argv[1] = "help";
    if (!strcmp(argv[1], "--version"))
        argv[1] = "version";
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            int rc = commands[i].fn(argc - 1, argv + 1);
            if (kv_cli_stdout_close(commands[i].name) && rc == 0)
                rc = 1; /* the output was lost: not a success */
            return rc;
        }
    fprintf(stderr, "kvpage: unknown command '%s' (kvpage help lists them)\n", argv[1]);
    return 2;
}
