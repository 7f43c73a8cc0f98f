# Shared by scripts/run and scripts/test (sourced, not run).
#
# ensure_installed: `pip install -e '.[dev,embedded]'` into the current Python
# (no virtualenv is made; an active one is used), skipped when this checkout is
# already installed and setup.py/pyproject.toml have not changed since.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

ensure_state_dir() {
    # Local state (embedded database, install stamp): ignored by git from inside.
    mkdir -p "$ROOT/.routemaster"
    [ -f "$ROOT/.routemaster/.gitignore" ] || echo '*' > "$ROOT/.routemaster/.gitignore"
}

ensure_installed() {
    ensure_state_dir
    local stamp="$ROOT/.routemaster/installed" want installed_root
    want="$(cd "$ROOT" && "$PYTHON" -c 'import sys; print(sys.executable)') $(cat "$ROOT/setup.py" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
    installed_root="$(cd / && "$PYTHON" -c 'import os, routemaster; print(os.path.dirname(os.path.dirname(os.path.abspath(routemaster.__file__))))' 2>/dev/null || true)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ "$installed_root" = "$ROOT" ]; then
        return 0
    fi
    echo "Installing routemaster and its dependencies (first run only)..." >&2
    (cd "$ROOT" && "$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore -e '.[dev,embedded]')
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
