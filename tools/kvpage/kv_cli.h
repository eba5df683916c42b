/*
 * kv_cli.h — what the subcommands of the `kvpage` tool share.
 *
 * The tool uses only the public API (include/kvpage/kvpage.h), like any
 * client. Each subcommand is `int kv_cmd_<name>(int argc, char **argv)`,
 * argv[0] being the subcommand's name, returning the process exit code
 * (0 ok, 1 failure, 2 usage error).
 */
#ifndef KV_CLI_H
#define KV_CLI_H

#include <stdint.h>

int kv_cmd_demo(int argc, char **argv);
int kv_cmd_run(int argc, char **argv);
int kv_cmd_eval(int argc, char **argv);

/* Monotonic clock in seconds. */
double kv_cli_now(void);

/* Parse a non-negative integer option value in [lo, hi]; on error prints a
 * message naming the option and returns -1. */
int kv_cli_uint(const char *opt, const char *val, uint64_t lo, uint64_t hi,
                uint64_t *out);

#endif /* KV_CLI_H */
