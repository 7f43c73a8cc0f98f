#!/usr/bin/env bash
# bench/citus.py on one larger machine, each PostgreSQL node pinned to cores of its own (taskset),
# so that each node's CPU per operation, and what a coordinator and W workers do together, are
# measured without the nodes competing for the same cores. Run as root, from the repository.
#   bench/citus_pinned.sh W [bench/citus.py options]
# Cores: CORES_PER_NODE (default 2) for the coordinator and for each of the W workers, from
# core 0 on (coordinator: 0..C-1, worker 1: C..2C-1, ...); what is left (at least 2 cores) runs
# the service (serve, cron) and the clients. W=2 with 2 cores per node needs 8 cores; W=16
# needs 36. The plain server the cluster is compared with is the coordinator's own server,
# on the coordinator's cores. Durable settings, as bench/citus_cluster.sh (BENCH_DURABLE=0: off).
# Example: bench/citus_pinned.sh 4 --clients 16 --processes 8 --labels 5000 --cron 2
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${1:?how many workers}
shift
PER=${CORES_PER_NODE:-2}
CORES=$(nproc)
NODES=$((W + 1))
FIRST_FREE=$((NODES * PER))
if ((CORES - FIRST_FREE < 2)); then
    echo "$CORES cores: $NODES nodes of $PER cores need $FIRST_FREE, plus 2 for the service" >&2
    exit 2
fi
export CITUS_DIR=${CITUS_DIR:-/tmp/routemaster-bench-pinned}
export CITUS_PORT=${CITUS_PORT:-9800}
url=$(bash "$HERE/citus_cluster.sh" start "$W" | tail -n 1)
trap 'bash "$HERE/citus_cluster.sh" destroy' EXIT

pin() {  # pin a server's postmaster and every process it has forked so far
    local data=$1 cores=$2
    local pid
    pid=$(head -n 1 "$data/postmaster.pid")
    taskset -a -c -p "$cores" "$pid" >/dev/null
    for child in $(pgrep -P "$pid"); do taskset -a -c -p "$cores" "$child" >/dev/null || true; done
}
pin "$CITUS_DIR/coord" "0-$((PER - 1))"
for ((i = 1; i <= W; i++)); do
    pin "$CITUS_DIR/w$i" "$((i * PER))-$((i * PER + PER - 1))"
done
echo "coordinator on cores 0-$((PER - 1)); worker i on cores i*$PER..; service and clients on $FIRST_FREE-$((CORES - 1))" >&2

source "$HERE/../scripts/_common.sh"
ensure_installed
# New backends are forked by the pinned postmasters and inherit their cores; the service and
# the clients (this process and its children) run on the rest.
taskset -c "$FIRST_FREE-$((CORES - 1))" "$PYTHON" "$HERE/citus.py" --coordinator "$url" "$@"
