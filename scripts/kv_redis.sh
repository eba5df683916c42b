#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# kv_redis.sh — throwaway Redis servers on loopback for the remote tier's
# tests and benchmark (docs/prefix.md). Never a fixed port: each server gets
# a random free port in 10000..21999 (cluster bus: +10000, both below the
# kernel's ephemeral range), retried when taken, and a server is taken as
# ours only when the one answering reports our process id. Several runs at
# once on one machine do not collide.
#
#   kv_redis.sh start DIR single|cluster [OWNER_PID]
#       Creates DIR (or uses it if empty), starts 1 server, or 3 masters joined
#       with `redis-cli --cluster create ... --cluster-replicas 0`, waits
#       until they serve (cluster_state:ok everywhere), prints the URL
#       (redis://127.0.0.1:P or redis://127.0.0.1:P1,127.0.0.1:P2,...) and
#       writes it to DIR/url. Node i lives in DIR/n<i>/ (port, pid, log).
#       A watchdog stops everything and removes DIR when OWNER_PID (default:
#       the caller, $PPID) exits, so a crashed test leaves no server behind.
#       Settings from the environment at start (kept in DIR for restart):
#         KV_REDIS_ARGS   more redis-server arguments, split at spaces, never
#                         globbed (e.g. "--requirepass pw" or ACL "--user ...")
#         KV_REDIS_CLI    the arguments redis-cli needs for the script's own
#                         probes (e.g. "--user admin --pass pw", "--tls ...")
#         KV_REDIS_TLS=1  TLS only: --tls-port P --port 0 (the certificate
#                         files go in KV_REDIS_ARGS; single mode only)
#   kv_redis.sh restart DIR I   start node I again on its port (after a kill)
#   kv_redis.sh stop DIR        stop every server (SIGCONT first, then
#                               SIGKILL), the watchdog, and remove DIR
# Exit status 0, or 1 with a message on stderr. The C side of this is
# tests/kv_test_redis.h (tests and kvbench-remote start servers with it).
set -euo pipefail

die() { echo "kv_redis.sh: $*" >&2; exit 1; }

# Process $1 exists and is not a zombie (an exited server nobody reaped).
alive() {
    local s
    s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    s=${s##*) }
    [ "${s%% *}" != Z ]
}

# redis-cli to port $1 (the rest: its command), with KV_REDIS_CLI's arguments.
rcli() {
    local port=$1 extra=()
    shift
    [ -f "$DIR/cli_args" ] && read -ra extra <"$DIR/cli_args"
    redis-cli -h 127.0.0.1 -p "$port" "${extra[@]}" --no-auth-warning "$@"
}

# The process id a server on port $1 reports ("" if none answers).
server_pid() {
    rcli "$1" info server 2>/dev/null |
        sed -n 's/^process_id:\([0-9]*\).*/\1/p'
}

# Start node dir $1 on port $2 (mode $3); 0 once it serves as our pid.
launch() {
    local d=$1 port=$2 mode=$3 pid
    local args=(--bind 127.0.0.1 --dir "$d" --save "" --appendonly no
                --daemonize no --logfile "$d/log" --loglevel warning) extra=()
    if [ -f "$DIR/tls" ]; then args+=(--port 0 --tls-port "$port"); else args+=(--port "$port"); fi
    [ -f "$DIR/server_args" ] && read -ra extra <"$DIR/server_args"
    args+=("${extra[@]}")
    [ "$mode" = cluster ] && args+=(--cluster-enabled yes --cluster-config-file nodes.conf
                                    --cluster-node-timeout 5000
                                    --cluster-require-full-coverage no)
    setsid redis-server "${args[@]}" </dev/null >/dev/null 2>&1 &
    pid=$!
    echo "$pid" >"$d/pid"
    for _ in $(seq 100); do
        alive "$pid" || return 1                         # e.g. port taken
        [ "$(server_pid "$port")" = "$pid" ] && return 0
        sleep 0.05
    done
    kill -9 "$pid" 2>/dev/null || true
    return 1
}

# New node i in $DIR on a free port.
start_node() {
    local i=$1 mode=$2 d="$DIR/n$1" port
    mkdir -p "$d"
    for _ in $(seq 50); do
        port=$((10000 + RANDOM % 12000))
        rm -f "$d/nodes.conf"
        if launch "$d" "$port" "$mode"; then
            echo "$port" >"$d/port"
            echo "$mode" >"$d/mode"
            return 0
        fi
    done
    die "no free port for node $i (log: $d/log)"
}

cluster_ok() { # port
    rcli "$1" cluster info 2>/dev/null | grep -q '^cluster_state:ok'
}

stop_all() {
    local f
    if [ -f "$DIR/watchdog" ] && [ "$(cat "$DIR/watchdog")" != $$ ]; then # (the watchdog
        kill -9 "$(cat "$DIR/watchdog")" 2>/dev/null || true           # execs stop)
    fi
    for f in "$DIR"/n*/pid; do
        [ -f "$f" ] || continue
        kill -CONT "$(cat "$f")" 2>/dev/null || true
        kill -9 "$(cat "$f")" 2>/dev/null || true
    done
    rm -rf "$DIR"
}

cmd=${1:-}
DIR=${2:-}
[ -n "$cmd" ] && [ -n "$DIR" ] || die "usage: kv_redis.sh start DIR single|cluster [OWNER_PID] | restart DIR I | stop DIR"
command -v redis-server >/dev/null || die "redis-server not found: run scripts/setup.sh"

case $cmd in
start)
    mode=${3:-}
    owner=${4:-$PPID}
    [ "$mode" = single ] || [ "$mode" = cluster ] || die "mode must be single or cluster"
    [ -e "$DIR" ] && [ -n "$(ls -A "$DIR")" ] && die "$DIR is not empty"
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
    [ -n "${KV_REDIS_ARGS:-}" ] && printf '%s\n' "$KV_REDIS_ARGS" >"$DIR/server_args"
    [ -n "${KV_REDIS_CLI:-}" ] && printf '%s\n' "$KV_REDIS_CLI" >"$DIR/cli_args"
    if [ "${KV_REDIS_TLS:-0}" = 1 ]; then
        [ "$mode" = single ] || die "KV_REDIS_TLS: single mode only"
        touch "$DIR/tls"
    fi
    # The watchdog: stop everything once the owner is gone.
    self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
    setsid bash -c 'source <(sed -n "/^alive()/,/^}/p" "$3")
                    while alive "$2" && [ -d "$1" ]; do sleep 0.5; done
                    exec "$3" stop "$1"' _ "$DIR" "$owner" "$self" \
        </dev/null >/dev/null 2>&1 &
    echo $! >"$DIR/watchdog"
    trap 'stop_all' EXIT # until the servers are up
    n=1
    [ "$mode" = cluster ] && n=3
    hosts=()
    for i in $(seq 0 $((n - 1))); do
        start_node "$i" "$mode"
        hosts+=("127.0.0.1:$(cat "$DIR/n$i/port")")
    done
    if [ "$mode" = cluster ]; then
        cli_extra=()
        [ -f "$DIR/cli_args" ] && read -ra cli_extra <"$DIR/cli_args"
        redis-cli "${cli_extra[@]}" --no-auth-warning --cluster create "${hosts[@]}" \
            --cluster-replicas 0 --cluster-yes \
            >"$DIR/create.log" 2>&1 || die "cluster create failed"
        for _ in $(seq 200); do
            ok=1
            for h in "${hosts[@]}"; do cluster_ok "${h#*:}" || ok=0; done
            [ $ok = 1 ] && break
            sleep 0.05
        done
        [ $ok = 1 ] || die "cluster did not reach state ok"
    fi
    trap - EXIT
    url="redis://$(IFS=,; echo "${hosts[*]}")"
    echo "$url" >"$DIR/url"
    echo "$url"
    ;;
restart)
    i=${3:-}
    d="$DIR/n$i"
    [ -n "$i" ] && [ -f "$d/port" ] || die "no node $i in $DIR"
    pid=$(cat "$d/pid")
    alive "$pid" && die "node $i (pid $pid) is still running"
    port=$(cat "$d/port")
    mode=$(cat "$d/mode")
    ok=0
    for _ in $(seq 40); do # the port may linger for a moment after a kill
        launch "$d" "$port" "$mode" && { ok=1; break; }
        sleep 0.05
    done
    [ $ok = 1 ] || die "node $i did not restart on port $port (log: $d/log)"
    if [ "$mode" = cluster ]; then
        for _ in $(seq 200); do cluster_ok "$port" && break; sleep 0.05; done
        cluster_ok "$port" || die "node $i rejoined but cluster_state is not ok"
    fi
    ;;
stop)
    [ -d "$DIR" ] || exit 0
    stop_all
    ;;
*)
    die "unknown command $cmd"
    ;;
esac
