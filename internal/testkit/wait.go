package testkit

import (
	"testing"
	"time"
)

// WaitFor polls cond until it holds, and fails the test (t.Fatalf) naming
// what it waited for if it does not within timeout. It polls often at
// first, then every 50ms, so that a cond that scrapes processes does not
// load a busy machine.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := 5 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", timeout, what)
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}
