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
