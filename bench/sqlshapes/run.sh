#!/usr/bin/env bash
# Runs the statement shapes of a transactional first run and of a replay
# with pgbench against a local PostgreSQL, and prints, for each, the
# transactions per second and the database's CPU per transaction (the
# postmaster's and its children's user and system time, read from /proc
# before and after each run, so the server must run on this machine).
#
#   ./run.sh [-c clients] [-T seconds] [-r rounds] [-M prepared|extended] shape...
#
# e.g. ./run.sh -r 4 typical claimrow recordonce bare
#      ./run.sh -r 4 replay-typical replay-claim replay-read
#
# It starts a cluster of its own (initdb, PostgreSQL 15's binaries, as
# the postgres user when run as root) on a free loopback port, with fsync
# on, so that nothing else the machine runs reaches the database it
# measures, and stops it at the end. Each run begins on empty first-run
# tables after a CHECKPOINT, the shapes in a rotating order from round to
# round; a row gives the median of its rounds.
set -euo pipefail
cd "$(dirname "$0")"
bin=${PGBIN:-/usr/lib/postgresql/15/bin}
dir=$(mktemp -d /tmp/sqlshapes.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as=()
if [ "$(id -u)" = 0 ]; then
	chown postgres "$dir"
	as=(runuser -u postgres --)
fi
"${as[@]}" "$bin/initdb" -D "$dir/data" -U postgres -A trust >/dev/null
"${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=on -c shared_buffers=256MB -c max_connections=100" start >/dev/null
trap '"${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1; rm -rf "$dir"' EXIT
export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=postgres
pidfile=$dir/data/postmaster.pid
clients=16 secs=10 rounds=3 mode=prepared
while getopts c:T:r:M: o; do
	case $o in
	c) clients=$OPTARG ;; T) secs=$OPTARG ;; r) rounds=$OPTARG ;; M) mode=$OPTARG ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "usage: $0 [-c clients] [-T seconds] [-r rounds] [-M mode] shape..." >&2; exit 2; }

psql -qX -v ON_ERROR_STOP=1 -c "CREATE SCHEMA sqlshapes" >/dev/null
{ echo "SET search_path = sqlshapes;"; cat ../../store/postgres/schema.sql setup.sql; } | psql -qX -v ON_ERROR_STOP=1 >/dev/null

# ticks: the CPU the cluster has used so far, in clock ticks.
ticks() {
	local pm f t=0 c
	pm=$(head -1 "$pidfile")
	read -r -a f <"/proc/$pm/stat"
	t=$((f[13] + f[14] + f[15] + f[16]))
	for c in $(pgrep -P "$pm"); do
		if read -r -a f <"/proc/$c/stat" 2>/dev/null; then t=$((t + f[13] + f[14])); fi
	done
	echo "$t"
}
hz=$(getconf CLK_TCK)
declare -A tps cpu
order=("$@")
for r in $(seq "$rounds"); do
	for s in "${order[@]}"; do
		psql -qX -c "TRUNCATE sqlshapes.bench_payments" \
			-c "DELETE FROM sqlshapes.bench_typical_keys WHERE key LIKE 'k%'" \
			-c "DELETE FROM sqlshapes.idemkey_records WHERE key LIKE 'k%'" \
			-c "VACUUM sqlshapes.bench_typical_keys" -c "VACUUM sqlshapes.idemkey_records" -c "CHECKPOINT" >/dev/null
		b=$(ticks)
		out=$(PGOPTIONS="-c search_path=sqlshapes" pgbench -n -M "$mode" -c "$clients" -j 2 -T "$secs" -f "$s.sql" 2>&1)
		sleep 0.5 # the backends exit and are reaped
		a=$(ticks)
		n=$(awk '/number of transactions actually processed/ {split($NF, x, "/"); print x[1]}' <<<"$out")
		if grep -q "error" <<<"$out" || [ -z "$n" ] || [ "$n" -eq 0 ]; then
			echo "$s failed:" >&2
			echo "$out" >&2
			exit 1
		fi
		tps[$s]+="$(awk '/^tps/ {printf "%.0f", $3; exit}' <<<"$out") "
		cpu[$s]+="$(( (a - b) * 1000000 / hz / n )) "
	done
	order=("${order[@]:1}" "${order[0]}")
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : int((v[NR/2]+v[NR/2+1])/2)}'; }
echo "| shape | tx/s | DB CPU us/tx | rounds (DB CPU) |"
echo "|---|---:|---:|---|"
for s in "$@"; do
	echo "| $s | $(median <<<"${tps[$s]}") | $(median <<<"${cpu[$s]}") | ${cpu[$s]% } |"
done
