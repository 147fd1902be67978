# Sourced by scripts/test: make sure a PostgreSQL server answers for the store's tests.
#
# The tests find it through TUNNEL_TEST_POSTGRES (default
# postgresql://postgres@127.0.0.1:5432/postgres). When nothing answers there, this
# starts a private server for the run: Debian's postgresql package (installed with
# apt-get if its binaries are missing), a cluster in a temporary directory owned by
# an unprivileged user (PostgreSQL refuses to run as root), trust authentication,
# a free port on 127.0.0.1 and a socket directory of its own. It exports
# TUNNEL_TEST_POSTGRES for pytest, and stops and removes the server when the
# sourcing script exits (an EXIT trap: the script must not `exec` its last command).
set -euo pipefail

: "${TUNNEL_TEST_POSTGRES:=postgresql://postgres@127.0.0.1:5432/postgres}"
export TUNNEL_TEST_POSTGRES

tunnel_pg_python="${venv:-}/bin/python"
[ -x "$tunnel_pg_python" ] || tunnel_pg_python="python3"

# Whether a PostgreSQL server answers, and lets the tests in, at the URL in $1.
tunnel_pg_answers() {
    "$tunnel_pg_python" - "$1" <<'PY' >/dev/null 2>&1
import asyncio, sys
import asyncpg

async def main() -> None:
    connection = await asyncpg.connect(sys.argv[1], timeout=5)
    await connection.close()

asyncio.run(main())
PY
}

tunnel_pg_redacted() {
    printf '%s' "$1" | sed -E 's#(://[^:/@]*):[^@/]*@#\1:***@#'
}

tunnel_pg_stop() {
    if [ -n "${tunnel_pg_dir:-}" ] && [ -d "$tunnel_pg_dir" ]; then
        echo "==> stopping the private PostgreSQL server"
        $tunnel_pg_as "$tunnel_pg_bin/pg_ctl" -D "$tunnel_pg_dir/data" -m immediate -w stop \
            >/dev/null 2>&1 || true
        rm -rf "$tunnel_pg_dir"
    fi
}

tunnel_pg_start() {
    tunnel_pg_bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [ -z "$tunnel_pg_bin" ] || [ ! -x "$tunnel_pg_bin/initdb" ]; then
        echo "==> installing PostgreSQL (Debian's postgresql package) for the store's tests"
        if [ "$(id -u)" -ne 0 ]; then
            echo "no PostgreSQL binaries in /usr/lib/postgresql/*/bin and not root to install" \
                "them: apt-get install postgresql, or set TUNNEL_TEST_POSTGRES" >&2
            return 1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            postgresql >/dev/null
        tunnel_pg_bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
    fi

    tunnel_pg_dir="$(mktemp -d "${TMPDIR:-/tmp}/tunnel-postgres.XXXXXX")"
    trap tunnel_pg_stop EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    mkdir -p "$tunnel_pg_dir/data" "$tunnel_pg_dir/socket"
    tunnel_pg_as=""
    if [ "$(id -u)" -eq 0 ]; then
        # PostgreSQL refuses to run as root: the cluster belongs to nobody.
        chown -R nobody: "$tunnel_pg_dir"
        chmod 755 "$tunnel_pg_dir"
        tunnel_pg_as="runuser -u nobody --"
    fi
    chmod 700 "$tunnel_pg_dir/data"

    local port
    port="$("$tunnel_pg_python" -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"

    echo "==> starting a private PostgreSQL server on 127.0.0.1:$port ($tunnel_pg_bin)"
    $tunnel_pg_as "$tunnel_pg_bin/initdb" -D "$tunnel_pg_dir/data" -U postgres \
        --auth=trust --encoding=UTF8 --locale=C --no-sync >"$tunnel_pg_dir/initdb.log" 2>&1 \
        || { cat "$tunnel_pg_dir/initdb.log" >&2; return 1; }
    # A scratch server: durability off, which the tests never need.
    $tunnel_pg_as "$tunnel_pg_bin/pg_ctl" -D "$tunnel_pg_dir/data" -l "$tunnel_pg_dir/server.log" \
        -o "-p $port -c listen_addresses=127.0.0.1 -k $tunnel_pg_dir/socket -c fsync=off" \
        -o "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
        -w -t 60 start >/dev/null \
        || { cat "$tunnel_pg_dir/server.log" >&2; return 1; }
    TUNNEL_TEST_POSTGRES="postgresql://postgres@127.0.0.1:$port/postgres"
    export TUNNEL_TEST_POSTGRES
}

if tunnel_pg_answers "$TUNNEL_TEST_POSTGRES"; then
    echo "==> PostgreSQL for the store's tests: $(tunnel_pg_redacted "$TUNNEL_TEST_POSTGRES")"
else
    echo "==> nothing answers at $(tunnel_pg_redacted "$TUNNEL_TEST_POSTGRES")"
    tunnel_pg_start
fi
