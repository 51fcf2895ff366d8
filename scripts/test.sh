#!/usr/bin/env bash
# make test, which CI runs: every stage, in order, even after one has
# failed, so that one run shows every failure; each stage says when it
# starts and how long it took, and the run ends with a table of the stages
# and one line of test counts. It fails if any stage failed.
#
# Stages: postgres (install the server binaries if missing), gofmt, vet,
# unit (go test -race, every package but e2e), e2e (the end-to-end tests,
# alone: they measure rates against a clock and should not share two cores
# with other packages' tests), sim (the simulator's scenarios that a goal
# bounds only at their full size, without -race: TestTenantsZipf's costs at
# 10,000 and 1,000,000 tenants, 300 sidecars, about 90 s), fuzz (a short
# run of every fuzz target). STAGES="unit e2e" runs only those.
set -uo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}
stages=${STAGES:-postgres gofmt vet unit e2e sim fuzz}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
counts=$tmp/counts
: >"$counts"

# The reporter is built once, before the stages: a stage's failure must be
# the tests', never the reporter's build.
if ! "$go" build -o "$tmp/testreport" ./internal/tools/testreport; then
	echo "make test: cannot build internal/tools/testreport" >&2
	exit 1
fi

gotest() {
	"$go" test -race -count=1 -json "$@" 2>&1 | "$tmp/testreport" -counts "$counts"
}

stage_postgres() { bash scripts/ensure-postgres.sh; }
stage_gofmt() {
	local bad
	bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*'))
	[ -z "$bad" ] && return 0
	echo "gofmt needed on:"
	echo "$bad"
	return 1
}
stage_vet() { "$go" vet ./...; }
stage_unit() {
	local pkgs
	pkgs=$("$go" list ./... | grep -v '/e2e$') || return 1
	# shellcheck disable=SC2086
	gotest -timeout 20m $pkgs
}
# e2e takes about 12 minutes on a quiet 2-core machine and 20 on a busy
# one, and a test whose load the machine could not deliver runs again
# (e2e's retryBusy, up to three times): go test's default 10-minute timeout
# would end it, and 60 minutes leaves room for a few retries.
stage_e2e() { gotest -timeout 60m ./e2e; }
stage_sim() {
	"$go" test -count=1 -json -timeout 20m -run '^TestTenantsZipf$' ./sim -args -tenants 2>&1 | "$tmp/testreport" -counts "$counts"
}
stage_fuzz() { bash scripts/fuzz.sh 4s; }

secs() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

results=()
failed=()
began=$(date +%s)
for s in $stages; do
	if ! declare -F "stage_$s" >/dev/null; then
		echo "make test: unknown stage $s (stages: postgres gofmt vet unit e2e sim fuzz)" >&2
		exit 1
	fi
	start=$(date +%s)
	echo "==> $s: started at $(date -u +%H:%M:%SZ)"
	if "stage_$s"; then
		status=ok
	else
		status=FAILED
		failed+=("$s")
	fi
	took=$(($(date +%s) - start))
	echo "<== $s: $status in $(secs "$took")"
	results+=("$(printf '  %-9s %-7s %s' "$s" "$status" "$(secs "$took")")")
done

echo
echo "make test: $(secs $(($(date +%s) - began))) in all, on $(nproc) cores (load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?'))"
printf '%s\n' "${results[@]}"
if [ -s "$counts" ]; then
	awk '{p += $1; f += $2; s += $3} END {printf "tests: %d passed, %d failed, %d skipped\n", p, f, s}' "$counts"
fi
if [ "${#failed[@]}" -gt 0 ]; then
	echo "make test: FAILED stages: ${failed[*]}"
	exit 1
fi
