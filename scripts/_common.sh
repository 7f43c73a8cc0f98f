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
    (cd "$ROOT" && "${pip[@]}" -e '.[dev,embedded]' && "${pip[@]}" --no-deps -r "$PLUGIN_REQUIREMENTS")
    echo "$want" > "$stamp"
}

# The CLI, independent of whether the console script's directory is on PATH.
routemaster() {
    "$PYTHON" -m routemaster "$@"
}

# True when DATABASE_URL or the reference's DB_* variables name a server.
database_named() {
    [ -n "${DATABASE_URL:-}${DB_HOST:-}${DB_NAME:-}${DB_USER:-}" ]
}
