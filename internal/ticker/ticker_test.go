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
