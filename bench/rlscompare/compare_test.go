package rlscompare

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user and system CPU time so far: servers and
// client alike, for everything runs in this process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDecision asks each trio b.N decisions, round-robin over its
// replicas, from 1 and from 64 goroutines, and reports the latency of one
// decision (p50, p99), decisions a second and CPU per decision (the
// client's gRPC included, the same for both).
func BenchmarkDecision(b *testing.B) {
	for _, sys := range systems {
		b.Run(sys.name, func(b *testing.B) {
			tr := sys.start(b)
			defer tr.close()
			for _, conc := range []int{1, 64} {
				b.Run(map[int]string{1: "c1", 64: "c64"}[conc], func(b *testing.B) {
					measure(b, tr, conc)
				})
			}
		})
	}
}

func measure(b *testing.B, tr trio, conc int) {
	ctx := context.Background()
	var next atomic.Uint64
	lats := make([][]time.Duration, conc)
	var errs atomic.Int64
	cpu0, t0 := cpuTime(), time.Now()
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range conc {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > uint64(b.N) {
					return
				}
				start := time.Now()
				if _, err := tr.decide(ctx, i, "batch"); err != nil {
					errs.Add(1)
				}
				lats[w] = append(lats[w], time.Since(start))
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	elapsed, cpu := time.Since(t0), cpuTime()-cpu0
	if n := errs.Load(); n > 0 {
		b.Fatalf("%d of %d decisions failed", n, b.N)
	}
	all := slices.Concat(lats...)
	slices.Sort(all)
	q := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))]) / 1e3 }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
}

// TestAccuracy sends web at 5× its limit and batch at half of it through
// each trio, round-robin over its replicas, paced, for accuracyRun, and
// logs what each admitted per second over the seconds after
// accuracySettle. gubernator counts every decision at one owner and is
// exact to its bucket; sluice's sidecars decide from ratios the loop
// computes from a second ago, which the test shows as the spread of its
// seconds. It asserts only what each must do: hold web near its limit
// (within 15 %) and let batch, under its limit, through (loss < 1 %);
// gubernator's GLOBAL behaviour is measured, not judged (systems).
func TestAccuracy(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of load")
	}
	const (
		webRate, batchRate = 5 * limit, limit / 2
		accuracyRun        = 20
		accuracySettle     = 5
	)
	for _, sys := range systems {
		t.Run(sys.name, func(t *testing.T) {
			tr := sys.start(t)
			defer tr.close()
			var web, batch [accuracyRun]atomic.Int64
			var sentBatch, errs atomic.Int64
			ctx, cancel := context.WithTimeout(context.Background(), (accuracyRun+5)*time.Second)
			defer cancel()
			start := time.Now()
			var wg sync.WaitGroup
			var i atomic.Uint64
			send := func(caller string, admitted *[accuracyRun]atomic.Int64, sec int) {
				defer wg.Done()
				ok, err := tr.decide(ctx, i.Add(1), caller)
				switch {
				case err != nil:
					errs.Add(1)
				case ok:
					admitted[sec].Add(1)
				}
			}
			// Paced open loop: each tick sends what the schedule owes.
			tick := time.NewTicker(2 * time.Millisecond)
			var sentWeb, sentB float64
			for now := range tick.C {
				el := now.Sub(start)
				sec := int(el / time.Second)
				if sec >= accuracyRun {
					break
				}
				for ; sentWeb < webRate*el.Seconds(); sentWeb++ {
					wg.Add(1)
					go send("web", &web, sec)
				}
				for ; sentB < batchRate*el.Seconds(); sentB++ {
					wg.Add(1)
					sentBatch.Add(1)
					go send("batch", &batch, sec)
				}
			}
			tick.Stop()
			wg.Wait()
			if n := errs.Load(); n > 0 {
				t.Fatalf("%d decisions failed", n)
			}
			var per []float64
			var webSum, batchSum int64
			for s := accuracySettle; s < accuracyRun; s++ {
				per = append(per, float64(web[s].Load()))
				webSum += web[s].Load()
				batchSum += batch[s].Load()
			}
			mean := float64(webSum) / float64(len(per))
			lo, hi := slices.Min(per), slices.Max(per)
			batchLoss := 1 - float64(batchSum)/(batchRate*float64(accuracyRun-accuracySettle))
			t.Logf("%s: web offered %d rps, limit %d: admitted %.1f rps mean over seconds [%d, %d) (%+.1f %%), seconds from %.0f to %.0f; batch at %d rps lost %.2f %%",
				sys.name, webRate, limit, mean, accuracySettle, accuracyRun, 100*(mean-limit)/limit, lo, hi, batchRate, 100*max(batchLoss, 0))
			if !sys.holds {
				t.Logf("%s: not judged (see systems)", sys.name)
				return
			}
			if mean < 0.85*limit || mean > 1.15*limit {
				t.Errorf("web admitted %.1f rps, want %d ± 15 %%", mean, limit)
			}
			if batchLoss > 0.01 {
				t.Errorf("batch, under its limit, lost %.2f %%", 100*batchLoss)
			}
		})
	}
}
