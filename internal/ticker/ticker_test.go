package ticker

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestPeriodAndPokes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tk := New(time.Second, 100*time.Millisecond)
		var mu sync.Mutex
		var runs []time.Duration
		start := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			tk.Run(ctx, func(now time.Time) {
				mu.Lock()
				runs = append(runs, now.Sub(start))
				mu.Unlock()
			})
		}()
		at := func(d time.Duration) {
			time.Sleep(d - time.Since(start))
			synctest.Wait()
		}
		at(1 * time.Second) // periodic run at 1s
		at(1050 * time.Millisecond)
		tk.Poke() // within 100ms of the last run: waits until 1.1s
		tk.Poke() // coalesces
		at(1500 * time.Millisecond)
		tk.Poke() // runs at once
		at(2500 * time.Millisecond)
		cancel()
		<-done
		want := []time.Duration{time.Second, 1100 * time.Millisecond, 1500 * time.Millisecond, 2 * time.Second}
		mu.Lock()
		defer mu.Unlock()
		if len(runs) != len(want) {
			t.Fatalf("runs at %v, want %v", runs, want)
		}
		for i := range want {
			if runs[i] != want[i] {
				t.Fatalf("runs at %v, want %v", runs, want)
			}
		}
	})
}

func TestMinGap(t *testing.T) {
	for _, tc := range []struct{ period, want time.Duration }{
		{time.Second, 50 * time.Millisecond},
		{100 * time.Millisecond, 10 * time.Millisecond}, // the floor
		{10 * time.Second, 500 * time.Millisecond},
	} {
		if got := MinGap(tc.period); got != tc.want {
			t.Errorf("MinGap(%v) = %v, want %v", tc.period, got, tc.want)
		}
	}
}

func TestAlignedRunsOnMultiplesOfThePeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// synctest's clock starts at midnight 2000-01-01 UTC: move off the
		// boundary first.
		time.Sleep(300 * time.Millisecond)
		tk := New(time.Second, 50*time.Millisecond).Aligned()
		var mu sync.Mutex
		var runs []time.Time
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			tk.Run(ctx, func(now time.Time) {
				mu.Lock()
				runs = append(runs, now)
				mu.Unlock()
			})
		}()
		time.Sleep(2500 * time.Millisecond)
		synctest.Wait()
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		if len(runs) != 2 {
			t.Fatalf("runs at %v, want two", runs)
		}
		for _, r := range runs {
			if !r.Equal(r.Truncate(time.Second)) {
				t.Errorf("run at %v is not on a whole second", r)
			}
		}
	})
}

// TestSchedule drives the clock-free rule directly: each step is a poke, a
// periodic run or a fire at an instant, and what it returned.
func TestSchedule(t *testing.T) {
	const ms = time.Millisecond
	type op int
	const (
		poke op = iota // want: Poke's result; next: Next afterwards (-1: none)
		ran            // a periodic run
		fire           // want: Fire's result
	)
	type step struct {
		at   time.Duration
		op   op
		want bool
		next time.Duration
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"the first poke is due at once", []step{
			{at: 0, op: poke, want: true, next: 0},
			{at: 0, op: fire, want: true},
			{at: 0, op: fire, want: false},
		}},
		{"a poke within the gap of a run waits for its end, and later pokes coalesce", []step{
			{at: 1000 * ms, op: ran},
			{at: 1050 * ms, op: poke, want: true, next: 1100 * ms},
			{at: 1060 * ms, op: poke, want: false, next: 1100 * ms},
			{at: 1099 * ms, op: fire, want: false},
			{at: 1100 * ms, op: fire, want: true},
			{at: 1120 * ms, op: poke, want: true, next: 1200 * ms}, // the gap counts from the poked run
		}},
		{"a poke after the gap is due at once", []step{
			{at: 1000 * ms, op: ran},
			{at: 1100 * ms, op: poke, want: true, next: 1100 * ms},
			{at: 1100 * ms, op: fire, want: true},
		}},
		{"a periodic run does not cancel a poked run already wanted", []step{
			{at: 1000 * ms, op: ran},
			{at: 1050 * ms, op: poke, want: true, next: 1100 * ms},
			{at: 1080 * ms, op: ran},
			{at: 1100 * ms, op: fire, want: true},
			{at: 1150 * ms, op: poke, want: true, next: 1200 * ms},
		}},
		{"a fire late, as a timer's, runs at its own time", []step{
			{at: 1000 * ms, op: ran},
			{at: 1010 * ms, op: poke, want: true, next: 1100 * ms},
			{at: 1130 * ms, op: fire, want: true},
			{at: 1140 * ms, op: poke, want: true, next: 1230 * ms},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			s := NewSchedule(100 * ms)
			for i, st := range tc.steps {
				now := start.Add(st.at)
				switch st.op {
				case poke:
					if got := s.Poke(now); got != st.want {
						t.Fatalf("step %d: Poke at %v = %v, want %v", i, st.at, got, st.want)
					}
					next, ok := s.Next()
					if !ok || !next.Equal(start.Add(st.next)) {
						t.Fatalf("step %d: Next after a poke at %v = %v, %v; want %v", i, st.at, next.Sub(start), ok, st.next)
					}
				case ran:
					s.Ran(now)
				case fire:
					if got := s.Fire(now); got != st.want {
						t.Fatalf("step %d: Fire at %v = %v, want %v", i, st.at, got, st.want)
					}
					if _, ok := s.Next(); ok && st.want {
						t.Fatalf("step %d: a poked run is still wanted after it fired", i)
					}
				}
			}
		})
	}
}
