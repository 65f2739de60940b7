#!/usr/bin/env bash
# Start a throwaway PostgreSQL cluster on 127.0.0.1 for the tests and print the variable that points them at it.
#   pg_env=$(bash tools/pg_test_server.sh start) && eval "$pg_env"   # exports LOOPD_ES_TEST_POSTGRES
#   bash tools/pg_test_server.sh stop
# (Assign first, then eval: `eval "$(...)"` would hide a failed start behind an empty string and exit 0.)
# The port is a free one unless LOOPD_ES_PG_PORT names it; a cluster already running in the directory is reused
# on its own port. Needs Debian's postgresql package (apt-get install postgresql). initdb refuses to run as
# root, so the cluster belongs to the 'postgres' user when we are root; it lives in a temporary directory with
# trust authentication on loopback only, and stops with `stop` (or when the machine does). Exits non-zero,
# with the server's own words on stderr, when the cluster cannot start.
set -euo pipefail
dir=${LOOPD_ES_PG_DIR:-/tmp/loopd-es-pg}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bin" ] || { echo "PostgreSQL is not installed: apt-get install postgresql" >&2; exit 2; }
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
start_on() {  # start_on PORT: a fresh cluster in $dir listening on PORT; non-zero when the server will not start
    rm -rf "$dir"; mkdir -p "$dir"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
    # (set -e is off inside a function called with ||: each step says its own status)
    as_owner "$bin/initdb" -D "$dir" -A trust -U postgres --no-sync >/dev/null || return 1
    as_owner "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w \
        -o "-p $1 -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
}
case "${1:-start}" in
start)
    if as_owner "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
        port=$(sed -n 4p "$dir/postmaster.pid")  # the running cluster's port
    elif [ -n "${LOOPD_ES_PG_PORT:-}" ]; then
        port=$LOOPD_ES_PG_PORT
        start_on "$port" || { tail -n 3 "$dir/server.log" >&2; echo "PostgreSQL did not start on port $port" >&2; exit 1; }
    else
        # a port found free can be taken before the server binds it: try a few
        for attempt in 1 2 3; do
            port=$(free_port)
            if start_on "$port"; then break; fi
            tail -n 3 "$dir/server.log" >&2
            if [ "$attempt" = 3 ]; then echo "PostgreSQL did not start (3 free ports tried)" >&2; exit 1; fi
        done
    fi
    echo "export LOOPD_ES_TEST_POSTGRES=postgresql://postgres@127.0.0.1:$port/postgres"
    ;;
stop)
    as_owner "$bin/pg_ctl" -D "$dir" -m fast stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    ;;
*) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
