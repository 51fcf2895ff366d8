package e2e

import (
	"fmt"
	"sync"
	"testing"
)

// verdict is a test's failures, said again as the last thing it logs. A
// test that starts processes logs their whole output when it fails, after
// its own messages (start's cleanup): hundreds of lines, and a CI summary
// that shows a failing test's last lines then showed only the processes'
// start-up logs, not why the test failed.
type verdict struct {
	t       *testing.T
	mu      sync.Mutex
	msgs    []string
	details []string
}

// newVerdict returns t's verdict. Call it before the test starts any
// process: its recap is a cleanup, and cleanups run last first.
func newVerdict(t *testing.T) *verdict {
	v := &verdict{t: t}
	t.Cleanup(func() {
		v.mu.Lock()
		defer v.mu.Unlock()
		if len(v.msgs) == 0 {
			return
		}
		for _, d := range v.details {
			t.Log(d)
		}
		for _, m := range v.msgs {
			t.Log("FAILED: " + m)
		}
	})
	return v
}

func (v *verdict) record(format string, args ...any) string {
	m := fmt.Sprintf(format, args...)
	v.mu.Lock()
	v.msgs = append(v.msgs, m)
	v.mu.Unlock()
	return m
}

// Logf is t.Logf, and recapped before the failures if there are any: the
// figures a failure is read against (a run second by second).
func (v *verdict) Logf(format string, args ...any) {
	v.t.Helper()
	m := fmt.Sprintf(format, args...)
	v.t.Log(m)
	v.mu.Lock()
	v.details = append(v.details, m)
	v.mu.Unlock()
}

// Errorf is t.Errorf, recapped.
func (v *verdict) Errorf(format string, args ...any) {
	v.t.Helper()
	v.t.Error(v.record(format, args...))
}

// Fatalf is t.Fatalf, recapped.
func (v *verdict) Fatalf(format string, args ...any) {
	v.t.Helper()
	v.t.Fatal(v.record(format, args...))
}

// requireDelivered is requireDelivered, recapped.
func (v *verdict) requireDelivered(late []int, from, to int) {
	v.t.Helper()
	if len(late) == 0 {
		return
	}
	msg := offScheduleMsg(late, from, to)
	retryIfBusy(v.t, msg)
	endBusy(v.t, msg, func(m string) { v.Fatalf("%s", m) })
}
