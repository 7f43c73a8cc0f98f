# Shared by scripts/run and scripts/test (sourced, not run).
#
# The Python used: $PYTHON when set; else the active virtualenv's; else the
# checkout's own virtualenv .venv (made here with python3 -m venv), so a system
# Python that forbids `pip install` (PEP 668) is never installed into.
# ensure_installed: `pip install -e '.[dev,embedded]'` into it, plus (for the
# tests) the published 1.x logging plugins, skipped when nothing changed (or
# when ROUTEMASTER_NO_INSTALL is set).

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.routemaster"

ensure_state_dir() {
    # Local state (install stamp, logs): ignored by git from inside.
    mkdir -p "$STATE"
    [ -f "$STATE/.gitignore" ] || echo '*' > "$STATE/.gitignore"
}

choose_python() {
    if [ -n "${PYTHON:-}" ]; then
        return 0
    fi
    if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
        PYTHON="$VIRTUAL_ENV/bin/python"
        return 0
    fi
    if [ ! -x "$ROOT/.venv/bin/python" ]; then
        echo "Making a virtualenv in $ROOT/.venv (first run only)..." >&2
        if ! python3 -m venv "$ROOT/.venv" >"$STATE/venv.log" 2>&1; then
            echo "Cannot make a virtualenv: $(tail -n 1 "$STATE/venv.log") (on Debian: apt-get install python3-venv; or set PYTHON=/path/to/python)" >&2
            rm -rf "$ROOT/.venv"
            exit 1
        fi
    fi
    PYTHON="$ROOT/.venv/bin/python"
}

# Plugins installed without their dependencies (they would pull routemaster 1.x from PyPI).
PLUGIN_REQUIREMENTS="$ROOT/tests/published-plugins.txt"

ensure_installed() {
    ensure_state_dir
    choose_python
    if [ -n "${ROUTEMASTER_NO_INSTALL:-}" ]; then
        return 0  # use $PYTHON as it is (the tests of these scripts do)
    fi
    local stamp="$STATE/installed" want installed_root
    want="$(cd "$ROOT" && "$PYTHON" -c 'import sys; print(sys.executable)') $(cat "$ROOT/setup.py" "$ROOT/pyproject.toml" "$PLUGIN_REQUIREMENTS" | sha256sum | cut -d' ' -f1)"
    installed_root="$(cd / && "$PYTHON" -c 'import os, routemaster; print(os.path.dirname(os.path.dirname(os.path.abspath(routemaster.__file__))))' 2>/dev/null || true)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ "$installed_root" = "$ROOT" ]; then
        return 0
    fi
    echo "Installing routemaster and its dependencies into $("$PYTHON" -c 'import sys; print(sys.prefix)') (first run only)..." >&2
    local pip=("$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore)
    # A job of its own process group (set -m), waited for with SIGTERM and SIGINT trapped, so
    # that stopping the script stops pip and whatever pip started (a build backend), rather
    # than the script dying alone in its wait and leaving them to run on.
    set -m
    (cd "$ROOT" && "${pip[@]}" -e '.[dev,embedded]' && "${pip[@]}" --no-deps -r "$PLUGIN_REQUIREMENTS") &
    INSTALL_JOB=$!
    set +m
    trap 'kill -TERM -- "-$INSTALL_JOB" 2>/dev/null; exit 143' TERM
    trap 'kill -TERM -- "-$INSTALL_JOB" 2>/dev/null; exit 130' INT
    local status=0
    wait "$INSTALL_JOB" || status=$?
    trap - TERM INT
    [ "$status" = 0 ] || exit "$status"
    echo "$want" > "$stamp"
}

# The PostgreSQL server the tests use (scripts/test, scripts/test-lowest): TEST_DATABASE_URL
# or DATABASE_URL when set, else the server answering on 127.0.0.1:5432 (skip that probe with
# ROUTEMASTER_TEST_NO_LOCAL_PG=1), else the embedded one, stopped again on exit if this
# started it. Exports TEST_DATABASE_URL when it chose the server.
local_server_answers() {
    "$PYTHON" - <<'PY'
import sys
import psycopg2
try:
    psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres",
                     connect_timeout=2).close()
except psycopg2.Error:
    sys.exit(1)
PY
}

started_db=""
stop_test_database() {
    if [ -n "$started_db" ]; then
        routemaster db stop || true
    fi
}

use_test_database() {
    local where
    trap stop_test_database EXIT
    if [ -n "${TEST_DATABASE_URL:-}" ]; then
        where="TEST_DATABASE_URL"
    elif [ -n "${DATABASE_URL:-}" ]; then
        where="DATABASE_URL"
    elif [ -z "${ROUTEMASTER_TEST_NO_LOCAL_PG:-}" ] && local_server_answers; then
        where="the server on 127.0.0.1:5432"
        export TEST_DATABASE_URL="postgresql://postgres@127.0.0.1:5432/postgres"
    else
        where="the embedded server"
        export ROUTEMASTER_DATABASE=embedded
        routemaster db status >/dev/null || started_db=1
        TEST_DATABASE_URL="$(routemaster db start)"
        export TEST_DATABASE_URL
    fi
    echo "Tests use the PostgreSQL server from $where" >&2
}

# The CLI, independent of whether the console script's directory is on PATH.
routemaster() {
    "$PYTHON" -m routemaster "$@"
}

# True when DATABASE_URL or the reference's DB_* variables name a server.
database_named() {
    [ -n "${DATABASE_URL:-}${DB_HOST:-}${DB_NAME:-}${DB_USER:-}" ]
}
