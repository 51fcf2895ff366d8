package configurator

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

// benchPeaks returns n buckets × days daily peaks in the store's order, and
// limits for half of the buckets.
func benchPeaks(n, days int) ([]history.DailyPeak, history.Limits) {
	peaks := make([]history.DailyPeak, 0, n*days)
	var lim history.Limits
	for i := range n {
		b := history.Bucket{Callee: fmt.Sprintf("svc-%03d", i/100), Caller: fmt.Sprintf("caller-%03d", i%100)}
		for d := days; d >= 1; d-- {
			peak := float64(100 + (i*7+d*13)%900)
			peaks = append(peaks, history.DailyPeak{Bucket: b, Day: daysAgo(d), PeakOffered: peak, MeanOffered: peak / 3, Minutes: 1440})
		}
		if i%2 == 0 {
			lim.Buckets = append(lim.Buckets, history.BucketLimit{Bucket: b, Limit: 800, Mode: new(dropratio.Enforce), Source: history.Derived})
		}
	}
	return peaks, lim
}

// BenchmarkDerive is the pure part of derive over 10k buckets × 28 days of
// daily peaks (280k rows). The goal for the whole derive, store read
// included, is under 2 s.
func BenchmarkDerive(b *testing.B) {
	peaks, lim := benchPeaks(10_000, 28)
	cfg := DefaultDeriveConfig()
	b.ReportAllocs()
	for b.Loop() {
		d := Derive(peaks, lim, cfg, now)
		if len(d.Proposals)+len(d.Unchanged) != 10_000 {
			b.Fatalf("%d proposals", len(d.Proposals))
		}
	}
}

// BenchmarkReplay is the pure part of backtest: one bucket over 4 weeks of
// minutes (40,320 steps of the law).
func BenchmarkReplay(b *testing.B) {
	const n = 28 * 1440
	rows := make([]history.MinuteRow, n)
	start := daysAgo(28)
	for i := range rows {
		r := float64(50 + (i*37)%200)
		rows[i] = history.MinuteRow{Bucket: web, Minute: start.Add(time.Duration(i) * time.Minute), PeakOffered: r, MeanOffered: r}
	}
	lim := fixed(map[history.Bucket]float64{web: 150}, nil)
	b.ReportAllocs()
	for b.Loop() {
		res, err := Replay(rows, lim, dropratio.DefaultConfig())
		if err != nil || len(res) != 1 || res[0].Minutes != n {
			b.Fatalf("Replay: %v, %+v", err, res)
		}
	}
}
