package uplink

import (
	"testing"
	"time"
)

func TestRejectLogOncePerReasonPerMinute(t *testing.T) {
	var l RejectLog
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, step := range []struct {
		at     time.Duration
		reason string
		want   bool
	}{
		{0, "bad_window: window 2h", true},
		{time.Second, "bad_window: window 3h", false}, // same reason, other detail
		{time.Second, "absurd_rate: x", true},
		{59 * time.Second, "bad_window: window 2h", false},
		{61 * time.Second, "bad_window: window 2h", true},
	} {
		if got := l.Allow(step.reason, now.Add(step.at)); got != step.want {
			t.Errorf("at +%v allow(%q) = %v, want %v", step.at, step.reason, got, step.want)
		}
	}
}

// A line let through says how many events about its reason were held back
// since the last one, and Every sets the interval.
func TestRejectLogCountsWhatItHeldBack(t *testing.T) {
	l := RejectLog{Every: 10 * time.Second}
	t0 := time.Unix(1000, 0)
	if ok, held := l.AllowN("dropped", t0, 3); !ok || held != 0 {
		t.Fatalf("first line: ok %v held %d, want true 0", ok, held)
	}
	for i, n := range []int{2, 5} {
		if ok, _ := l.AllowN("dropped", t0.Add(time.Duration(i+1)*time.Second), n); ok {
			t.Fatalf("a line %ds after the last was let through, want held back for 10s", i+1)
		}
	}
	if ok, held := l.AllowN("other", t0.Add(time.Second), 1); !ok || held != 0 {
		t.Errorf("another reason: ok %v held %d, want true 0", ok, held)
	}
	if ok, held := l.AllowN("dropped", t0.Add(10*time.Second), 1); !ok || held != 7 {
		t.Errorf("10s later: ok %v held %d, want true 7", ok, held)
	}
	if ok, held := l.AllowN("dropped", t0.Add(20*time.Second), 1); !ok || held != 0 {
		t.Errorf("the next line: ok %v held %d, want true 0 (nothing held since)", ok, held)
	}
}
