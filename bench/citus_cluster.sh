#!/usr/bin/env bash
# A Citus cluster of a coordinator and N workers on this machine, for bench/citus.py on a machine
# bigger than the test one (../shared/citus/cluster.sh makes two workers, with throwaway
# settings). Run as root; the servers run as the OS user postgres. Builds Citus first from
# ../shared/citus when it is not installed.
#   bench/citus_cluster.sh start N      create (first time) and start; prints the coordinator's URL
#   bench/citus_cluster.sh stop         stop every server (data kept)
#   bench/citus_cluster.sh destroy      stop and delete the data
#   bench/citus_cluster.sh run N [bench/citus.py options]
#                                       start, run bench/citus.py against it, destroy
# CITUS_DIR (default /tmp/routemaster-bench-citus), CITUS_PORT (default 9800: workers on +1..+N).
# Durable by default (fsync, synchronous_commit: a two-phase commit costs what it costs in
# production); BENCH_DURABLE=0 turns both off. BENCH_MAX_CONNECTIONS (default 500) per server,
# BENCH_SHARED_BUFFERS (default 1GB). Several machines: make the cluster by hand (docs/deployment.md)
# and run bench/citus.py --coordinator URL.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=${CITUS_DIR:-/tmp/routemaster-bench-citus}
PORT=${CITUS_PORT:-9800}
PGBIN=/usr/lib/postgresql/15/bin
SHARED="${ROUTEMASTER_CITUS_SHARED:-$HERE/../../shared/citus}"
as_pg() { runuser -u postgres -- "$@"; }
psqlp() { local port=$1; shift; "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -U root -p "$port" "$@"; }

nodes() {  # name:port of every server, coordinator first
    local count=$1
    echo "coord:$PORT"
    for ((i = 1; i <= count; i++)); do echo "w$i:$((PORT + i))"; done
}

start() {
    local count=${1:?how many workers}
    if [[ -f $SHARED/build.sh ]]; then bash "$SHARED/build.sh" >&2; fi
    mkdir -p "$DIR/sockets" && chown postgres "$DIR" "$DIR/sockets"
    echo "$count" >"$DIR/workers"
    local durable=on
    [[ ${BENCH_DURABLE:-1} == 0 ]] && durable=off
    for spec in $(nodes "$count"); do
        local name=${spec%%:*} port=${spec##*:} data=$DIR/${spec%%:*}
        if [[ ! -f $data/PG_VERSION ]]; then
            as_pg "$PGBIN/initdb" -D "$data" -U root --auth=trust -E UTF8 --locale=C.UTF-8 >"$DIR/initdb-$name.log" &
        fi
    done
    wait
    for spec in $(nodes "$count"); do
        local name=${spec%%:*} port=${spec##*:} data=$DIR/${spec%%:*}
        if ! grep -q "^port = $port" "$data/postgresql.conf"; then
            cat >>"$data/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$DIR/sockets'
shared_preload_libraries = 'citus'
max_connections = ${BENCH_MAX_CONNECTIONS:-500}
shared_buffers = ${BENCH_SHARED_BUFFERS:-1GB}
fsync = $durable
synchronous_commit = $durable
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10
max_prepared_transactions = ${BENCH_MAX_CONNECTIONS:-500}
citus.node_conninfo = 'sslmode=disable'
log_min_messages = warning
CONF
        fi
        as_pg "$PGBIN/pg_ctl" -D "$data" status >/dev/null 2>&1 \
            || as_pg "$PGBIN/pg_ctl" -D "$data" -l "$DIR/$name.log" -w start >/dev/null
    done
    for spec in $(nodes "$count"); do
        local port=${spec##*:}
        psqlp "$port" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'routemaster'" | grep -q 1 \
            || psqlp "$port" -d postgres -c "CREATE DATABASE routemaster"
        psqlp "$port" -d routemaster -c "CREATE EXTENSION IF NOT EXISTS citus"
    done
    psqlp "$PORT" -d routemaster -c "SELECT citus_set_coordinator_host('127.0.0.1', $PORT)" >/dev/null
    for ((i = 1; i <= count; i++)); do
        psqlp "$PORT" -d routemaster -c "SELECT citus_add_node('127.0.0.1', $((PORT + i)))
            WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node WHERE nodeport = $((PORT + i)))" >/dev/null
    done
    echo "postgresql://root@127.0.0.1:$PORT/routemaster"
}

stop() {
    local count
    count=$(cat "$DIR/workers" 2>/dev/null || echo 0)
    for spec in $(nodes "$count"); do
        local data=$DIR/${spec%%:*}
        [[ -f $data/postmaster.pid ]] && as_pg "$PGBIN/pg_ctl" -D "$data" -m fast -w stop >/dev/null || true
    done
}

case ${1:-} in
    start) start "${2:-}" ;;
    stop) stop ;;
    destroy) stop; rm -rf "$DIR" ;;
    run)
        count=${2:?how many workers}
        shift 2
        url=$(start "$count" | tail -n 1)
        trap 'stop; rm -rf "$DIR"' EXIT
        source "$HERE/../scripts/_common.sh"
        ensure_installed
        "$PYTHON" "$HERE/citus.py" --coordinator "$url" "$@"
        ;;
    *) echo "usage: $0 start N|stop|destroy|run N [bench/citus.py options]" >&2; exit 2 ;;
esac
