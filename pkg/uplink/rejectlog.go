package uplink

import (
	"strings"
	"sync"
	"time"
)

// RejectLog lets a log line about a reason through at most once per Every
// (a minute when zero) per distinct reason, and counts the events it held
// back meanwhile, so that a peer that keeps sending (or refusing) the same
// bad message does not flood the log, and the line that does get through
// says how much it stands for. The one throttle of sluice's log lines about
// hostile or broken input. The zero value is ready; safe for concurrent
// use.
type RejectLog struct {
	// Every is the least time between two lines about one reason; zero
	// means a minute. Set it before first use.
	Every time.Duration

	mu   sync.Mutex              // protects last
	last map[string]*rejectState // reason label → its last line and what it held back since
}

type rejectState struct {
	at   time.Time // when a line was last let through
	held int       // events held back since
}

const (
	rejectLogEvery = time.Minute
	rejectLogMax   = 64 // distinct reasons remembered; more clears the memory
)

// Allow reports whether a line about reason may be logged at now.
func (l *RejectLog) Allow(reason string, now time.Time) bool {
	ok, _ := l.AllowN(reason, now, 1)
	return ok
}

// AllowN is Allow for a line that stands for n events. When it lets the
// line through, held is the number of events about reason it held back
// since the last line (lost if more than 64 reasons came meanwhile).
func (l *RejectLog) AllowN(reason string, now time.Time, n int) (ok bool, held int) {
	// Reasons begin with a short label ("bad_window: ..."); the details
	// after it vary too much to tell reasons apart by.
	if i := strings.Index(reason, ":"); i >= 0 {
		reason = reason[:i]
	}
	reason = Truncate(reason)
	every := l.Every
	if every <= 0 {
		every = rejectLogEvery
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if st, ok := l.last[reason]; ok && now.Sub(st.at) < every {
		st.held += n
		return false, 0
	}
	if l.last == nil || len(l.last) >= rejectLogMax {
		l.last = make(map[string]*rejectState)
	}
	if st := l.last[reason]; st != nil {
		held = st.held
	}
	l.last[reason] = &rejectState{at: now}
	return true, held
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
