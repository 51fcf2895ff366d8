package uplink

import (
	"strings"
	"sync"
	"time"
)

// RejectLog lets a log line about a rejection reason through at most once a
// minute per distinct reason, so that a peer that keeps refusing messages on
// an uplink for the same reason does not flood the log. The zero value is
// ready; safe for concurrent use.
type RejectLog struct {
	mu   sync.Mutex           // protects last
	last map[string]time.Time // reason label → when it was last let through
}

const (
	rejectLogEvery = time.Minute
	rejectLogMax   = 64 // distinct reasons remembered; more clears the memory
)

// Allow reports whether a line about reason may be logged at now.
func (l *RejectLog) Allow(reason string, now time.Time) bool {
	// Reasons begin with a short label ("bad_window: ..."); the details
	// after it vary too much to tell reasons apart by.
	if i := strings.Index(reason, ":"); i >= 0 {
		reason = reason[:i]
	}
	reason = Truncate(reason)
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.last[reason]; ok && now.Sub(t) < rejectLogEvery {
		return false
	}
	if l.last == nil || len(l.last) >= rejectLogMax {
		l.last = make(map[string]time.Time)
	}
	l.last[reason] = now
	return true
}

// Truncate bounds a string that came from the network before it reaches a
// log line or an error.
func Truncate(s string) string {
	const n = 128
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "?") + "…"
}
