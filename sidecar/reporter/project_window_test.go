package reporter

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
)

// projected wires a Window with surge projection to a real Limiter holding
// a policy for web whose global offered and allowed rates are given, with
// the controller's ratio.
func projected(t *testing.T, offered, allowed, ratio float64, at time.Time) (*sidecar.Limiter, *Window) {
	t.Helper()
	l := sidecar.NewLimiter(sidecar.LimiterOptions{})
	setWebPolicy(l, offered, allowed, ratio)
	w := NewWindow(WindowConfig{
		Header: Header{SidecarID: "pod-1", Service: "checkout"}, Interval: time.Second,
		SurgeChecks: true, Project: true, Check: 100 * time.Millisecond,
	}, at, l)
	return l, w
}

func setWebPolicy(l *sidecar.Limiter, offered, allowed, ratio float64) {
	l.SetPolicy(&sidecar.Policy{Name: names.Callee("checkout"), Service: "checkout", Direction: sidecar.Inbound,
		Peers: []sidecar.Rule{{Peer: "web", DropRatio: ratio, Mode: dropratio.Enforce, LimitRPS: allowed, AllowedRPS: allowed, OfferedRPS: offered}}})
}

// checked decides n of web's requests in each of k check windows of 100ms
// from now, checking at the end of each, and returns the time after them.
func checked(l *sidecar.Limiter, w *Window, now time.Time, k, n int) time.Time {
	for range k {
		decide(l, n)
		now = now.Add(100 * time.Millisecond)
		w.Check(now, l)
	}
	return now
}

// calmSecond decides web's 10 rps, one request a check, for a second from
// t0, and sends the regular report that ends it; it returns its end.
func calmSecond(t *testing.T, l *sidecar.Limiter, w *Window, t0 time.Time) time.Time {
	t.Helper()
	now := checked(l, w, t0, 10, 1)
	if rep := w.Tick(now, l); rep == nil || rep.GetUrgent() {
		t.Fatalf("the tick after a calm second sent %v, want a regular report", rep)
	}
	return now
}

func decide(l *sidecar.Limiter, n int) (dropped int) {
	for range n {
		if l.Decide("checkout", "web").Drop {
			dropped++
		}
	}
	return dropped
}

// TestProjectionStepDropsBeforeTheCheck: a sidecar carrying all of web's
// 100 rps (its limit) sees it jump tenfold; the projection step half a check
// after the last check starts the projection and drops before that check
// reports anything, though the controller's ratio is still 0.
func TestProjectionStepDropsBeforeTheCheck(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l, w := projected(t, 100, 100, 0, t0)
	now := t0
	for range 10 { // a calm second at 100 rps, checked every 100ms
		decide(l, 10)
		now = now.Add(100 * time.Millisecond)
		if rep := w.Check(now, l); rep.GetUrgent() {
			t.Fatalf("a calm check sent a surge report")
		}
	}
	if rep := w.Tick(now, l); rep == nil || rep.GetUrgent() {
		t.Fatalf("the tick sent %v, want a regular report", rep)
	}
	decide(l, 50) // 1,000 rps for 50ms
	w.Project(now.Add(50*time.Millisecond), l)
	s := l.Service("checkout")
	if r, _ := s.Ratio("web"); !(r > 0.8) {
		t.Fatalf("after the projection step: web's ratio %v, want the projection's, over 0.8", r)
	}
	if d := decide(l, 100); d < 80 {
		t.Errorf("after the projection step: %d of 100 dropped, want most", d)
	}
}

// fallen runs web at 1,000 rps, held at 0.9 against 100 allowed, through a
// sidecar that carries all of it, for a second, then a check window at 20
// rps, and returns the sidecar after the check that reports the fall.
func fallen(t *testing.T) (*sidecar.Limiter, *Window, time.Time) {
	t.Helper()
	t0 := time.Unix(1000, 0)
	l, w := projected(t, 1000, 100, 0.9, t0)
	now := checked(l, w, t0, 10, 100)
	w.Tick(now, l)
	decide(l, 2) // 20 rps
	now = now.Add(100 * time.Millisecond)
	if rep := w.Check(now, l); !rep.GetUrgent() {
		t.Fatalf("the fall sent %v, want a surge report", rep)
	}
	return l, w, now
}

// TestProjectionOpensAFallTheControllerSaw: web, held at 0.9 at 1,000 rps
// against 100 allowed, falls to 20 rps at this sidecar, which carries all of
// it. The fall is reported at once; once the controller's next policy
// shows the fall (its ratio still releasing, at 0.5), the sidecar opens.
func TestProjectionOpensAFallTheControllerSaw(t *testing.T) {
	l, w, now := fallen(t)
	s := l.Service("checkout")
	if r, _ := s.Ratio("web"); r != 0.9 {
		t.Fatalf("before the controller saw the fall: ratio %v, want its 0.9", r)
	}
	now = checked(l, w, now, 2, 2) // the controller's answer takes a flush, a tick and a push
	if r, _ := s.Ratio("web"); r != 0.9 {
		t.Fatalf("before the controller saw the fall: ratio %v, want its 0.9", r)
	}
	setWebPolicy(l, 300, 100, 0.5) // the controller saw the fall; its ratio releases slowly
	checked(l, w, now, 2, 2)
	if r, _ := s.Ratio("web"); r != 0 {
		t.Fatalf("after the controller saw the fall: ratio %v, want 0", r)
	}
}

// TestProjectionOff: with projection off (--surge-projection=false) the
// same jump leaves the controller's ratio in force.
func TestProjectionOff(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := sidecar.NewLimiter(sidecar.LimiterOptions{})
	setWebPolicy(l, 100, 100, 0)
	w := NewWindow(WindowConfig{
		Header: Header{SidecarID: "pod-1", Service: "checkout"}, Interval: time.Second,
		SurgeChecks: true, Check: 100 * time.Millisecond,
	}, t0, l)
	now := checked(l, w, t0, 10, 10)
	w.Tick(now, l)
	decide(l, 50)
	w.Project(now.Add(50*time.Millisecond), l)
	w.Check(now.Add(100*time.Millisecond), l)
	if r, _ := l.Service("checkout").Ratio("web"); r != 0 {
		t.Fatalf("projection off: web's ratio %v, want the controller's 0", r)
	}
}

// TestProjectionCountsTheOnsetBeforeTheLastCheck: a sidecar with a sixth of
// web's 60 rps (10 rps, one request a check) sees it jump to 167 rps 60ms
// before a check. Neither the window since that check nor the one since
// the report shows the jump 50ms after it (8 requests since the check; 21
// over the report's 450ms against 4.5 expected), but the window since the
// check before does (18 against 1.5): the projection starts there and
// counts the onset's requests, which put the sidecar past its share.
func TestProjectionCountsTheOnsetBeforeTheLastCheck(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l, w := projected(t, 60, 100, 0, t0)
	now := checked(l, w, calmSecond(t, l, w, t0), 3, 1)
	decide(l, 10) // the onset, 60ms before the check
	now = checked(l, w, now, 1, 0)
	if r, _ := l.Service("checkout").Ratio("web"); r != 0 {
		t.Fatalf("at the check after the onset: web's ratio %v, want 0 (10 requests in its window are no surge yet)", r)
	}
	decide(l, 8)
	w.Project(now.Add(50*time.Millisecond), l)
	wantProjection(t, l, "50ms after the check (18 admitted in 150ms against a share of 16.7 rps)")
}

// TestProjectionJudgesAgainstTheRateBeforeTheOnset: a sidecar with a sixth
// of web's 60 rps (10 rps) sees it jump to 167 rps 50ms before its regular
// report, which then measures 17 rps. Judged against 17, the 18 requests
// since the check before the report would be noise; against the report
// before's 10 they are a jump, and the projection starts.
//
// The Reporter's report and check tickers fire together every tenth check,
// in either order: a check a moment before the report must not move the
// check before on to itself.
func TestProjectionJudgesAgainstTheRateBeforeTheOnset(t *testing.T) {
	for _, checkFirst := range []bool{false, true} {
		t0 := time.Unix(1000, 0)
		l, w := projected(t, 60, 100, 0, t0)
		now := checked(l, w, calmSecond(t, l, w, t0), 9, 1)
		decide(l, 8) // the onset, 50ms before the tick
		now = now.Add(100 * time.Millisecond)
		if checkFirst {
			w.Check(now.Add(-time.Microsecond), l)
		}
		rep := w.Tick(now, l)
		if rep == nil || rep.GetUrgent() || rep.GetPeers()[0].GetOffered() != 17 {
			t.Fatalf("check first %v: the second tick sent %v, want a regular report of 17 requests", checkFirst, rep)
		}
		decide(l, 10)
		w.Project(now.Add(60*time.Millisecond), l)
		wantProjection(t, l, fmt.Sprintf("check first %v: 60ms after the report (18 admitted in 160ms against a share of 16.7 rps)", checkFirst))
	}
}

// TestProjectionEndedStaysEnded: traffic moves to a sidecar that had a
// tenth of web's 10,000 rps (a drain elsewhere): its rate triples, it
// projects, and its regular report catches the rise. The controller's
// next policy shows the global rate where it was and denies the
// projection; the next step must not start it again by judging the window
// that spans the report against the rate before the rise.
func TestProjectionEndedStaysEnded(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l, w := projected(t, 10000, 10000, 0, t0)
	now := checked(l, w, t0, 10, 100) // a calm second at 1,000 rps
	w.Tick(now, l)
	now = checked(l, w, now, 10, 300) // 3,000 rps: the traffic moved here
	s := l.Service("checkout")
	if r, _ := s.Ratio("web"); !(r > 0.5) {
		t.Fatalf("after the move: ratio %v, want the projection's, about 0.67", r)
	}
	w.Tick(now, l)
	setWebPolicy(l, 11000, 10000, 0) // the controller: the global rate barely moved
	for i := 1; i <= 4; i++ {
		decide(l, 8)
		w.Project(now.Add(time.Duration(i)*25*time.Millisecond), l)
		if r, _ := s.Ratio("web"); r != 0 {
			t.Fatalf("%dms after the denial: ratio %v, want the controller's 0", 25*i, r)
		}
	}
}

// wantProjection fails t unless web's ratio is a projection's, over 0.9.
func wantProjection(t *testing.T, l *sidecar.Limiter, when string) {
	t.Helper()
	if r, _ := l.Service("checkout").Ratio("web"); !(r > 0.9) {
		t.Fatalf("%s: web's ratio %v, want the projection's, over 0.9", when, r)
	}
}

// TestProjectionOpensOnTheFirstPolicyThatShowsTheFall: the controller's
// first policy after a fall report opens the fall if its offered rate shows
// the fall, however soon after the report it arrives: what it shows, not
// when, is the proof that it saw the report (a policy computed before it
// still shows the old rate). A policy that shows the global rate where it
// was (traffic moved away from this sidecar) keeps the fall closed.
func TestProjectionOpensOnTheFirstPolicyThatShowsTheFall(t *testing.T) {
	for _, tc := range []struct {
		name    string
		offered float64
		open    bool
	}{
		{"the fall", 300, true},
		{"a drain", 1000, false},
	} {
		l, w, now := fallen(t)
		setWebPolicy(l, tc.offered, 100, 0.9) // the controller's next tick, 50ms later
		now = now.Add(50 * time.Millisecond)
		w.Project(now, l)
		r, _ := l.Service("checkout").Ratio("web")
		if tc.open && r != 0 || !tc.open && r != 0.9 {
			t.Errorf("%s: the policy after the fall report offered %v rps: ratio %v, want it open: %v", tc.name, tc.offered, r, tc.open)
		}
	}
}

// TestProjectionFallToldByThePolicy: a policy that shows the bucket's
// global rate fallen by the jump factor, read by the check that sees this
// sidecar's own count fall, opens the bucket at that check: the
// controller has seen the fall in the fleet, and a fall report from this
// sidecar would add nothing but a tick's wait (toldFall). A sidecar whose
// count did not fall keeps the controller's ratio.
func TestProjectionFallToldByThePolicy(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name string
		n    int // web's requests in the check after the fall
		open bool
	}{
		{"its count fell too", 2, true},
		{"its count held", 100, false},
	} {
		l, w := projected(t, 1000, 100, 0.9, t0)
		now := checked(l, w, t0, 10, 100)
		w.Tick(now, l)
		decide(l, tc.n)
		setWebPolicy(l, 300, 100, 0.9) // the fleet's rate fell; the ratio is released a step a tick
		now = now.Add(100 * time.Millisecond)
		w.Check(now, l)
		if r, _ := l.Service("checkout").Ratio("web"); tc.open && r != 0 || !tc.open && r != 0.9 {
			t.Errorf("%s: ratio %v after the check, want it open: %v", tc.name, r, tc.open)
		}
	}
}
