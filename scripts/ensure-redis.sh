#!/usr/bin/env bash
# Makes sure redis-server is on this machine for `make bench-compare`, which
# starts its own throwaway server on a loopback port (bench/compare) and never
# uses a system one. As root with apt-get, it installs Debian's redis-server
# package when missing, then stops and disables the service the package
# starts: a system Redis left running would hold memory and a port for
# nothing, and would be mistaken for the benchmark's.
set -euo pipefail

if command -v redis-server >/dev/null; then
  exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "ensure-redis: installing Debian's redis-server package for the benchmark ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d refusing every start keeps the package's service from
  # running at all where invoke-rc.d honours it; the stop below covers the
  # rest (systemd machines, or a service that started anyway).
  policy=/usr/sbin/policy-rc.d
  made_policy=false
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    made_policy=true
  fi
  status=0
  apt-get install -y -qq --no-install-recommends redis-server >/dev/null || status=$?
  if $made_policy; then
    rm -f "$policy"
  fi
  if [ "$status" != 0 ]; then
    echo "ensure-redis: apt-get install redis-server failed ($status)" >&2
    exit "$status"
  fi
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl disable --now redis-server >/dev/null 2>&1 || true
  else
    service redis-server stop >/dev/null 2>&1 || true
  fi
  if command -v redis-server >/dev/null; then
    exit 0
  fi
fi

echo "ensure-redis: redis-server not found and not installable here; install the redis-server package" >&2
exit 1
