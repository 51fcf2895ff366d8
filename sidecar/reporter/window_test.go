package reporter

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/sidecar"
)

// step is one call of a Window script: add requests to the source, then
// Tick or Check at at, and the report expected, if any.
type step struct {
	at    time.Duration
	add   map[string]uint64
	check bool // Check; else Tick
	// want is the report expected, as "from–to urgent peer=n ..." in
	// milliseconds; "" for none.
	want string
}

func describe(rep *sluicev1.LoadReport, start time.Time) string {
	if rep == nil {
		return ""
	}
	from := rep.GetWindowStart().AsTime().Sub(start)
	to := from + rep.GetWindow().AsDuration()
	var b strings.Builder
	fmt.Fprintf(&b, "%d–%d", from.Milliseconds(), to.Milliseconds())
	if rep.GetUrgent() {
		b.WriteString(" urgent")
	}
	for _, p := range rep.GetPeers() {
		fmt.Fprintf(&b, " %s=%d", p.GetPeer(), p.GetOffered())
	}
	return b.String()
}

// TestWindow runs scripts of ticks and checks against the Window: the rules
// the Reporter's loop and the simulator share.
func TestWindow(t *testing.T) {
	const ms = time.Millisecond
	web := func(n uint64) map[string]uint64 { return map[string]uint64{"web": n} }
	// steady is web at 200 rps for a second, reported at 1s; a tick just
	// under half an interval in folds.
	steady := []step{
		{at: 499 * ms, add: web(100), want: ""},
		{at: 1000 * ms, add: web(100), want: "0–1000 web=200"},
	}
	// checks returns ten surge checks from..to every 100ms, with n
	// requests of web before each, reporting nothing.
	checks := func(from, to time.Duration, n uint64) []step {
		var s []step
		for at := from; at <= to; at += 100 * ms {
			s = append(s, step{at: at, add: web(n), check: true})
		}
		return s
	}
	cat := func(parts ...[]step) []step {
		var s []step
		for _, p := range parts {
			s = append(s, p...)
		}
		return s
	}
	for _, tc := range []struct {
		name   string
		checks bool
		before uint64 // web's requests before the window starts: the baseline
		script []step
	}{
		{
			name:   "a tick reports the window since the last report, not the baseline",
			before: 1000,
			script: append(steady,
				step{at: 2000 * ms, add: web(150), want: "1000–2000 web=150"}),
		},
		{
			name: "a window shorter than half an interval folds into the next",
			script: append(steady,
				step{at: 1499 * ms, add: web(10), want: ""},
				step{at: 2600 * ms, add: web(20), want: "1000–2600 web=30"}),
		},
		{
			name:   "a jump in a check window is reported over that window alone, and the rest folds",
			checks: true,
			script: cat(steady, checks(1100*ms, 1500*ms, 20), []step{
				{at: 1600 * ms, add: web(100), check: true, want: "1500–1600 urgent web=100"},
				{at: 2000 * ms, add: web(50), want: ""}, // 400ms since the surge report: folds
				{at: 3000 * ms, add: web(60), want: "1600–3000 web=110"},
			}),
		},
		{
			name:   "a check within MinInterval of the last is skipped, and its window grows",
			checks: true,
			script: cat(steady, checks(1100*ms, 1400*ms, 20), []step{
				{at: 1405 * ms, add: web(30), check: true, want: ""},
				{at: 1500 * ms, add: web(70), check: true, want: "1400–1500 urgent web=100"},
			}),
		},
		{
			name:   "a check at the instant of a report sees nothing",
			checks: true,
			script: cat(steady, []step{
				{at: 1000 * ms, add: web(0), check: true, want: ""},
				{at: 1100 * ms, add: web(100), check: true, want: "1000–1100 urgent web=100"},
			}),
		},
		{
			// 50 rps reported; then 170 rps: 17 per check, never MinCount
			// in one, but the window since the report adds up to it at
			// 6σ of both counts' noise two checks later (34 against 10
			// expected is 24, under the bar's 24.6). It is reported over
			// the last checks that hold MinCount, not since the report.
			name:   "a thin surge is reported over the last checks that hold MinCount requests",
			checks: true,
			script: cat([]step{
				{at: 1000 * ms, add: web(50), want: "0–1000 web=50"},
			}, checks(1100*ms, 1200*ms, 17), []step{
				{at: 1300 * ms, add: web(17), check: true, want: "1100–1300 urgent web=34"},
			}),
		},
		{
			name:   "without surge checks, Check reports nothing",
			checks: false,
			script: cat(steady, []step{
				{at: 1500 * ms, add: web(1000), check: true, want: ""},
				{at: 2000 * ms, add: web(0), want: "1000–2000 web=1000"},
			}),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			src := &manualSource{total: map[string]sidecar.PeerCounts{}}
			if tc.before > 0 {
				src.add("web", tc.before)
			}
			w := NewWindow(WindowConfig{
				Header:      Header{SidecarID: "pod-1", Service: "svc"},
				Interval:    time.Second,
				SurgeChecks: tc.checks,
			}, start, src)
			for i, s := range tc.script {
				for peer, n := range s.add {
					src.add(peer, n)
				}
				op, rep := "Tick", (*sluicev1.LoadReport)(nil)
				if s.check {
					op, rep = "Check", w.Check(start.Add(s.at), src)
				} else {
					rep = w.Tick(start.Add(s.at), src)
				}
				if got := describe(rep, start); got != s.want {
					t.Fatalf("step %d, %s at %v: report %q, want %q", i, op, s.at, got, s.want)
				}
			}
		})
	}
}

// TestLoopTimers runs the Reporter's loop on synctest's clock: a report every
// interval from the start, a surge check every SurgeCheck that sends a jump
// at once, and the rest of a window a surge report cut short folded into the
// next.
func TestLoopTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &manualSource{total: map[string]sidecar.PeerCounts{}}
		r, err := New(Config{SidecarID: "pod-1", Service: "svc", Interval: time.Second, Aggregators: []string{"127.0.0.1:1"}}, src)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		var mu sync.Mutex
		var got []string
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.loop(ctx, func(rep *sluicev1.LoadReport) {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, describe(rep, start))
			})
		}()
		// web: 2 requests every 10ms (200 rps), 5 times that from 2.5s.
		// They arrive 5ms off the timers' instants, so that no count
		// races a tick.
		time.Sleep(5 * time.Millisecond)
		for at := 5 * time.Millisecond; at < 4500*time.Millisecond; at += 10 * time.Millisecond {
			n := uint64(2)
			if at >= 2500*time.Millisecond {
				n = 10
			}
			src.add("web", n)
			time.Sleep(10 * time.Millisecond)
		}
		synctest.Wait()
		cancel()
		<-done
		want := []string{
			"0–1000 web=200",
			"1000–2000 web=200",
			"2500–2600 urgent web=100", // the first check that sees the jump, over its window alone
			// 2.7s: the confirming check sees the rate the surge report
			// had; 3s: 400ms since the last report, folded.
			"2600–4000 web=1400",
		}
		mu.Lock()
		defer mu.Unlock()
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("reports\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if v := testutil.ToFloat64(r.surges); v != 1 {
			t.Errorf("surges_total %v, want 1", v)
		}
	})
}
