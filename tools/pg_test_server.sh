#!/usr/bin/env bash
# Start a throwaway PostgreSQL cluster on 127.0.0.1 for the tests and print the URL to use.
#   eval "$(bash tools/pg_test_server.sh start)"   # exports LOOPD_ES_TEST_POSTGRES
#   bash tools/pg_test_server.sh stop
# Needs Debian's postgresql package (apt-get install postgresql). initdb refuses to run as root, so the
# cluster belongs to the 'postgres' user when we are root; it lives in a temporary directory with trust
# authentication on loopback only, and stops with `stop` (or when the machine does).
set -euo pipefail
port=${LOOPD_ES_PG_PORT:-54329}
dir=${LOOPD_ES_PG_DIR:-/tmp/loopd-es-pg-$port}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bin" ] || { echo "PostgreSQL is not installed: apt-get install postgresql" >&2; exit 2; }
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
case "${1:-start}" in
start)
    if ! as_owner "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
        rm -rf "$dir"; mkdir -p "$dir"
        [ "$(id -u)" = 0 ] && chown postgres: "$dir"
        as_owner "$bin/initdb" -D "$dir" -A trust -U postgres --no-sync >/dev/null
        as_owner "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w \
            -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
    fi
    echo "export LOOPD_ES_TEST_POSTGRES=postgresql://postgres@127.0.0.1:$port/postgres"
    ;;
stop)
    as_owner "$bin/pg_ctl" -D "$dir" -m fast stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    ;;
*) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
