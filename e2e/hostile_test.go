//go:build unix

// Attacks by a workload that holds only what a real one holds: a port on
// the mesh, its own certificate, its own sidecar. Each TestHostile… test
// (hostile_*_test.go) runs one attack against the real binaries and asserts
// that the victims keep at least victimShare of their allowance and that
// the processes under attack stay within a stated memory bound, printing
// both figures. This file holds what they share.

package e2e

import (
	"testing"

	"github.com/sluicehq/sluice/internal/child"
)

// victimShare is the share of its allowance a victim must keep under
// attack: what it offered, up to its limit (or its max-min share of a
// capacity), and no less than this share of it may be admitted.
const victimShare = 0.95

// requireAllowance logs what victim was admitted against its allowance,
// both in requests per second over the same seconds, and fails the test
// when the share is below victimShare.
func requireAllowance(t *testing.T, victim string, admitted, allowance float64) {
	t.Helper()
	share := admitted / allowance
	t.Logf("victim %s: admitted %.1f rps of an allowance of %.1f rps (%.1f %%; bar %.0f %%)",
		victim, admitted, allowance, 100*share, 100*victimShare)
	if !(share >= victimShare) {
		t.Errorf("victim %s kept %.1f %% of its allowance (%.1f of %.1f rps), want at least %.0f %%",
			victim, 100*share, admitted, allowance, 100*victimShare)
	}
}

// raceMemFactor is how much more memory a binary built with the race
// detector may use: its shadow memory costs five to ten times the heap.
const raceMemFactor = 8

// requireRSS logs n's resident memory (process_resident_memory_bytes) and
// fails the test when it is above bound, in bytes, stated for a binary
// without the race detector (raceMemFactor times more with it).
func requireRSS(t *testing.T, n *node, bound float64) {
	t.Helper()
	rss, ok := metric(t, n.admin, "process_resident_memory_bytes")
	if !ok {
		t.Fatalf("%s: no process_resident_memory_bytes", n.Name())
	}
	if child.Race {
		bound *= raceMemFactor
	}
	t.Logf("%s: resident memory %.1f MiB (bound %.0f MiB)", n.Name(), rss/(1<<20), bound/(1<<20))
	if rss > bound {
		t.Errorf("%s: resident memory %.1f MiB, above its bound of %.0f MiB", n.Name(), rss/(1<<20), bound/(1<<20))
	}
}
