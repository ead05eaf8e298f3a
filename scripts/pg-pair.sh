#!/usr/bin/env bash
# A PostgreSQL primary and a streaming standby on this machine, for the
# failover tests (tests/failover.rs): their own data directories under
# $LEASEHOLD_PG_PAIR_DIR (default /tmp/leasehold-pg-pair), loopback ports
# 5433 (primary) and 5434 (standby), trust authentication. Nothing of the
# machine's own clusters is touched.
#
#   pg-pair.sh up sync|async   (re)create the pair: a fresh primary, the
#                              standby made by pg_basebackup, streaming;
#                              sync: synchronous_standby_names = '*'
#   pg-pair.sh cut-standby     stop the standby's replication (what the
#                              primary writes from now on never reaches it)
#   pg-pair.sh kill-primary    stop the primary at once (no checkpoint,
#                              sessions cut: as a crash)
#   pg-pair.sh promote         promote the standby (a new timeline)
#   pg-pair.sh down            stop both and remove their directories
set -euo pipefail

BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$BIN" ] || { echo "pg-pair: no PostgreSQL server binaries under /usr/lib/postgresql" >&2; exit 1; }
ROOT=${LEASEHOLD_PG_PAIR_DIR:-/tmp/leasehold-pg-pair}
A=$ROOT/primary
B=$ROOT/standby
PA=5433
PB=5434

# The server refuses to run as root: as the postgres user when root.
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
sql() { # PORT SQL
  as_pg "$BIN/psql" -h 127.0.0.1 -p "$1" -U postgres -d postgres -Atq -v ON_ERROR_STOP=1 -c "$2"
}
stop() { # DIR
  [ -f "$1/postmaster.pid" ] && as_pg "$BIN/pg_ctl" -D "$1" -m immediate -w stop >/dev/null 2>&1 || true
}

case "${1:-}" in
  up)
    mode=${2:?"pg-pair.sh up sync|async"}
    stop "$A"; stop "$B"; rm -rf "$ROOT"
    mkdir -p "$ROOT"
    [ "$(id -u)" = 0 ] && chown postgres: "$ROOT"
    as_pg "$BIN/initdb" -D "$A" -U postgres --auth=trust --no-sync >/dev/null
    {
      echo "port = $PA"
      echo "listen_addresses = '127.0.0.1'"
      echo "unix_socket_directories = '$ROOT'"
      echo "wal_level = replica"
      echo "max_wal_senders = 5"
      echo "wal_keep_size = '256MB'"
      echo "fsync = off"
    } | as_pg tee -a "$A/postgresql.conf" >/dev/null
    as_pg "$BIN/pg_ctl" -D "$A" -l "$ROOT/primary.log" -w start >/dev/null
    as_pg "$BIN/pg_basebackup" -h 127.0.0.1 -p "$PA" -U postgres -D "$B" -R -X stream --no-sync
    {
      echo "port = $PB"
      echo "primary_conninfo = 'host=127.0.0.1 port=$PA user=postgres application_name=standby'"
    } | as_pg tee -a "$B/postgresql.auto.conf" >/dev/null
    as_pg "$BIN/pg_ctl" -D "$B" -l "$ROOT/standby.log" -w start >/dev/null
    if [ "$mode" = sync ]; then
      # Set on the primary after the base backup: the promoted standby
      # does not wait for a standby of its own.
      sql $PA "ALTER SYSTEM SET synchronous_standby_names = '*'"
      sql $PA "SELECT pg_reload_conf()" >/dev/null
    fi
    want=async
    [ "$mode" = sync ] && want=sync
    for _ in $(seq 1 100); do
      [ "$(sql $PA "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = '$want'")" = 1 ] && exit 0
      sleep 0.1
    done
    echo "pg-pair: the standby never streamed as $want (see $ROOT/*.log)" >&2
    exit 1
    ;;
  cut-standby)
    sql $PB "ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port=1 connect_timeout=1'"
    sql $PB "SELECT pg_reload_conf()" >/dev/null
    for _ in $(seq 1 100); do
      [ "$(sql $PA "SELECT count(*) FROM pg_stat_replication")" = 0 ] && exit 0
      sleep 0.1
    done
    echo "pg-pair: the standby still streams" >&2
    exit 1
    ;;
  kill-primary) stop "$A" ;;
  promote) as_pg "$BIN/pg_ctl" -D "$B" -w promote >/dev/null ;;
  down) stop "$A"; stop "$B"; rm -rf "$ROOT" ;;
  *) echo "usage: pg-pair.sh up sync|async | cut-standby | kill-primary | promote | down" >&2; exit 2 ;;
esac
