#!/usr/bin/env bash
# Makes sure the Postgres server binaries the tests need are on this machine.
# internal/pgtest starts a throwaway cluster from them (or uses
# SLUICE_TEST_DATABASE_URL). As root with apt-get, it installs Debian's
# postgresql package when they are missing. With CI=true a machine without
# them fails here, loudly, instead of skipping the tests that need them.
set -euo pipefail

have_postgres() {
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null
}

if [ -n "${SLUICE_TEST_DATABASE_URL:-}" ] || have_postgres; then
  exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "ensure-postgres: installing Debian's postgresql package for the tests ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  if have_postgres; then
    exit 0
  fi
fi

if [ "${CI:-}" = true ]; then
  echo "ensure-postgres: Postgres server binaries (initdb, postgres) not found and not installable here; install the postgresql package" >&2
  exit 1
fi
echo "ensure-postgres: warning: Postgres server binaries not found; the tests that need Postgres will skip (CI=true makes them fail)" >&2
