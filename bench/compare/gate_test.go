package compare

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// scripted answers decisions from a list: admit, drop or fail.
type scripted struct {
	answers []error // nil admits; errDrop drops; anything else fails
	keys    []string
}

var errDrop = errors.New("drop")

func (s *scripted) Decide(_ context.Context, key string) (bool, error) {
	s.keys = append(s.keys, key)
	a := s.answers[0]
	s.answers = s.answers[1:]
	switch {
	case a == nil:
		return true, nil
	case errors.Is(a, errDrop):
		return false, nil
	}
	return false, a
}

// TestGateFailsOpenAndCountsIt: the Redis design's proxy forwards what
// Redis admits, answers 429 to what it drops, forwards what it could not
// ask about and counts each.
func TestGateFailsOpenAndCountsIt(t *testing.T) {
	var reached int
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached++; io.WriteString(w, "ok") })
	d := &scripted{answers: []error{nil, errDrop, errors.New("dial tcp: connection refused"), context.DeadlineExceeded, nil}}
	g := &Gate{Decider: d, Service: "checkout", Next: app}
	var codes []int
	for _, caller := range []string{"web", "web", "web", "mobile", ""} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		if caller != "" {
			req.Header.Set(CallerHeader, caller)
		}
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		codes = append(codes, rec.Code)
	}
	wantCodes := []int{200, 429, 200, 200, 200}
	for i := range wantCodes {
		if codes[i] != wantCodes[i] {
			t.Errorf("request %d: status %d, want %d", i, codes[i], wantCodes[i])
		}
	}
	if reached != 4 {
		t.Errorf("the app saw %d requests, want 4: a drop must not reach it, a failed decision must", reached)
	}
	if got, want := g.Counts(), (GateCounts{Decisions: 5, Dropped: 1, FailedOpen: 2}); got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
	wantKeys := []string{"checkout:web", "checkout:web", "checkout:web", "checkout:mobile", "checkout:unknown"}
	for i := range wantKeys {
		if d.keys[i] != wantKeys[i] {
			t.Errorf("decision %d asked about %q, want %q", i, d.keys[i], wantKeys[i])
		}
	}
}

func TestWindowKey(t *testing.T) {
	base := time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)
	k := func(d time.Duration) string { return WindowKey("checkout:web", base.Add(d), time.Second) }
	if k(0) != k(999*time.Millisecond) {
		t.Errorf("one second, two windows: %q and %q", k(0), k(999*time.Millisecond))
	}
	if k(999*time.Millisecond) == k(time.Second) {
		t.Errorf("a new second must open a new window, both are %q", k(time.Second))
	}
	if want := "checkout:web:" + "1796014800"; k(0) != want {
		t.Errorf("key %q, want %q", k(0), want)
	}
}

// TestClosedLoopCountsWhatItMeasures runs the load loop against an
// operation that admits, drops and fails in turn: every completed operation
// of the measured phase is counted once, by outcome, and timed when asked.
func TestClosedLoopCountsWhatItMeasures(t *testing.T) {
	for _, every := range []int{1, 4} {
		var n int64
		op := func(context.Context, string) (bool, error) {
			n++ // one goroutine: no race
			switch n % 3 {
			case 0:
				return false, errors.New("boom")
			case 1:
				return false, nil
			}
			return true, nil
		}
		r := ClosedLoop(context.Background(), "test", 1, Keys("k", 5), 10*time.Millisecond, 50*time.Millisecond, every, op)
		if r.Ops == 0 || r.Elapsed < 50*time.Millisecond {
			t.Fatalf("every=%d: %d ops in %v", every, r.Ops, r.Elapsed)
		}
		if diff := int64(r.Dropped) - int64(r.Errors); diff < -1 || diff > 1 {
			t.Errorf("every=%d: %d dropped and %d errors, want a third of the ops each", every, r.Dropped, r.Errors)
		}
		if third := r.Ops / 3; r.Errors+1 < third || r.Errors > third+1 {
			t.Errorf("every=%d: %d errors of %d ops, want a third", every, r.Errors, r.Ops)
		}
		if want := (r.Ops + uint64(every) - 1) / uint64(every); r.Hist.Count() > want+1 || r.Hist.Count()+1 < want {
			t.Errorf("every=%d: %d timed of %d ops, want about %d", every, r.Hist.Count(), r.Ops, want)
		}
	}
}
