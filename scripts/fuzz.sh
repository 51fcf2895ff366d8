#!/usr/bin/env bash
# Runs every fuzz target of the module, one after another, for FUZZTIME
# each (default 5s), and prints how long each took, compile included.
#
# Targets are found, not listed: every `func FuzzX(f *testing.F)` in a
# *_test.go file. Their committed seeds (testdata/fuzz/FuzzX/) also run in
# plain `go test`. A crash makes go test write the input to the package's
# testdata/fuzz/FuzzX/; commit it with the fix, as a regression seed.
#
# Usage: scripts/fuzz.sh [FUZZTIME] [REGEXP]   e.g. scripts/fuzz.sh 1m Policy
set -euo pipefail

fuzztime=${1:-5s}
only=${2:-}
go=${GO:-go}
cd "$(dirname "$0")/.."

mapfile -t targets < <(
	grep -rHo --include='*_test.go' --exclude-dir=.git --exclude-dir=testdata \
		'^func Fuzz[A-Za-z0-9_]*(f \*testing\.F)' . |
		sed -E 's#^\./(.*)/[^/]*:func (Fuzz[A-Za-z0-9_]*)\(.*#./\1 \2#' |
		grep -E -- "${only:-.}" | sort
)
if [ "${#targets[@]}" -eq 0 ]; then
	echo "no fuzz targets match ${only:-anything}" >&2
	exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=0
all=$(date +%s%N)
for t in "${targets[@]}"; do
	read -r pkg name <<<"$t"
	start=$(date +%s%N)
	status=FAIL
	for attempt in 1 2; do
		if "$go" test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg" >"$log" 2>&1; then
			status=ok
			break
		fi
		# The go command's fuzzer sometimes ends a run whose time is up
		# with "context deadline exceeded" and no failing input: its own
		# race between the deadline and a worker, not a crash of the
		# target (a crash writes "Failing input written to ..."). Run
		# such a target once more; anything else fails at once.
		if grep -q 'Failing input written' "$log" || ! grep -q 'context deadline exceeded' "$log"; then
			break
		fi
		echo "     $name: the fuzzer's own deadline error, no failing input; once more" >&2
	done
	if [ "$status" = FAIL ]; then
		failed=$((failed + 1))
	fi
	# A short run may end while fuzzing still gathers its baseline: no execs yet.
	execs=$(grep -o 'execs: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
	printf '%-4s %6.1fs %10s execs  %-22s %s\n' "$status" "$((($(date +%s%N) - start) / 1000000))e-3" "${execs:-?}" "$pkg" "$name"
	if [ "$status" = FAIL ]; then
		sed 's/^/    /' "$log"
	fi
done
printf '%d targets in %.1fs, %d failed\n' "${#targets[@]}" "$((($(date +%s%N) - all) / 1000000))e-3" "$failed"
[ "$failed" -eq 0 ]
