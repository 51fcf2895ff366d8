#!/usr/bin/env bash
# Replays README's "Limits from history: the lifecycle" transcript against a
# throwaway Postgres: starts a cluster in a temp dir (unix socket only, no
# TCP port), builds the configurator, migrates, seeds four weeks of
# synthetic history, sets the one earlier manual limit, and runs the
# transcript's commands one by one, printing each as "$ configurator …"
# before its output. The cluster is stopped and its dir deleted on exit.
#
# stdout is the transcript, exactly as README shows it; stderr says what the
# script sets up. The clock of the history windows is fixed
# (SLUICE_CONFIGURATOR_NOW, LIFECYCLE_NOW to change it), so that every run
# prints the same but for the audit log's times, which are the real ones.
#
# make lifecycle-demo runs it. internal/configurator's TestReadmeLifecycle
# runs the same commands in-process and checks README against them.
set -euo pipefail

cd "$(dirname "$0")/.."
now="${LIFECYCLE_NOW:-2026-11-30T03:03:00Z}"

note() { printf '# %s\n' "$*" >&2; }

bash scripts/ensure-postgres.sh >&2
bin=""
if command -v initdb >/dev/null; then
  bin="$(dirname "$(readlink -f "$(command -v initdb)")")" # Debian links a few into PATH; the dir has them all
else
  bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
fi
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ] || [ ! -x "$bin/pg_ctl" ] || [ ! -x "$bin/createdb" ]; then
  echo "lifecycle-demo: Postgres binaries (initdb, pg_ctl, createdb) not found; install the postgresql package" >&2
  exit 1
fi

# Postgres refuses to run as root: then the cluster belongs to the postgres
# user, in a dir under /tmp that it can reach.
as_pg=()
base="${TMPDIR:-/tmp}"
if [ "$(id -u)" = 0 ]; then
  if ! id postgres >/dev/null 2>&1; then
    echo "lifecycle-demo: running as root, and there is no postgres user to run the cluster as" >&2
    exit 1
  fi
  as_pg=(runuser -u postgres --)
  base=/tmp
fi
dir="$(mktemp -d "$base/sluice-lifecycle.XXXXXX")"
started=""
cleanup() {
  if [ -n "$started" ]; then
    "${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
# A signal would end bash without its EXIT trap, and leave a postmaster.
trap 'exit 130' INT
trap 'exit 143' TERM
[ "${#as_pg[@]}" -eq 0 ] || chown postgres: "$dir"

# PG* variables of the caller would point the tools elsewhere.
unset PGDATA PGPORT PGUSER PGDATABASE PGPASSWORD PGSERVICE PGSSLMODE
note "Postgres: $("$bin/postgres" --version), a throwaway cluster in $dir"
"${as_pg[@]}" "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1 ||
  { cat "$dir/initdb.log" >&2; exit 1; }
"${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -s \
  -o "-c listen_addresses='' -c unix_socket_directories=$dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off" start ||
  { cat "$dir/postgres.log" >&2; exit 1; }
started=1
export PGHOST="$dir"
"$bin/createdb" -U postgres sluice

note "building the configurator into $dir/bin"
go build -o "$dir/bin/configurator" ./cmd/configurator
configurator() { "$dir/bin/configurator" "$@"; }

# run prints a command line as README shows it, then runs it: the line is
# shell, comments and quotes included.
run() {
  printf '$ %s\n' "$1"
  eval "$1"
}

note "the transcript follows on stdout; PGHOST=$PGHOST names the cluster's socket directory"
run 'export SLUICE_CONFIGURATOR_DATABASE_URL=postgres://postgres@/sluice   # the throwaway server, at PGHOST'
run "export SLUICE_CONFIGURATOR_NOW=$now   # a fixed clock for history windows, so every run prints this"
echo
run 'configurator migrate   # once, and after every upgrade; the controller has it too'
echo
run 'configurator history seed --synthetic 4w --actor alice --reason "lifecycle demo"'
echo
run 'configurator set checkout/mobile --limit 1000 --actor alice --reason "launch: generous until we know the traffic"'
echo
run 'configurator derive --actor bob   # peak over 4 weeks × 1.25, rounded up to 2 figures'
echo
run 'configurator review --caller mobile -o json'
echo
run 'configurator backtest checkout --proposed   # replay the stored minutes through the real control law'
echo
run 'configurator approve --all --actor carol --reason "weekly limit review"'
echo
run 'configurator approve checkout/mobile --actor carol --reason "launch traffic settled; 440 covers the 4-week peak"'
echo
run 'configurator shadow checkout/web --actor carol --reason "watch the new limit for a day"'
echo
run 'configurator history checkout/web --days 14'
echo
run 'configurator enforce checkout/web --actor carol --reason "no would-be drops in a day of shadow"'
echo
run 'configurator audit'
echo
run 'configurator routes set checkout "POST /v1/charges=create-charge" "GET /v1/items/{id}=get-item" --actor alice --reason "limit charges apart from reads"'
echo
run 'configurator history seed --synthetic 4w --force --bucket checkout/web/create-charge=250 --bucket checkout/mobile/create-charge=80 --actor alice --reason "lifecycle demo: procedures"'
echo
run 'configurator derive checkout/web/create-charge --actor bob'
echo
run 'configurator approve checkout/web/create-charge --actor carol --reason "charges: the 4-week peak with headroom"'
echo
run 'configurator set "checkout/*/create-charge" --limit 400 --actor carol --reason "the card processor takes 400 rps"'
echo
run 'configurator routes list checkout'
