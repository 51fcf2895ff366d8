package configurator

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/pkg/history"
)

// BenchmarkDerivePostgres measures derive over 10k buckets × 28 days on the
// real store: the store read (limits and 280k daily rows) with the pure
// Derive, then the whole command, with and without writing the proposals.
// Seeding writes one minute row per bucket and day, so the benchmark runs
// with --min-coverage 0; the daily rollup it reads is the same size as
// with full days.
func BenchmarkDerivePostgres(b *testing.B) {
	url := pgtest.URL(b)
	if _, err := history.Migrate(b.Context(), url); err != nil {
		b.Fatal(err)
	}
	st, err := history.Open(b.Context(), url)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	at := time.Now()
	const buckets, days = 10_000, 28
	rows := make([]history.MinuteRow, 0, buckets)
	start := time.Now()
	for d := days; d >= 1; d-- {
		rows = rows[:0]
		noon := startOfDay(at).AddDate(0, 0, -d).Add(12 * time.Hour)
		for i := range buckets {
			r := float64(100 + (i*7+d*13)%900)
			rows = append(rows, history.MinuteRow{
				Bucket: history.Bucket{Callee: fmt.Sprintf("svc-%03d", i/100), Caller: fmt.Sprintf("caller-%03d", i%100)},
				Minute: noon, PeakOffered: r, MeanOffered: r / 2,
			})
		}
		if err := st.WriteMinutes(b.Context(), rows); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("seeded %d minute rows in %v", buckets*days, time.Since(start).Round(time.Millisecond))

	cfg := DefaultDeriveConfig()
	cfg.MinCoverage = 0
	b.Run("read+derive", func(b *testing.B) {
		for b.Loop() {
			ctx := b.Context()
			lim, err := st.Limits(ctx)
			if err != nil {
				b.Fatal(err)
			}
			from, to := cfg.Window(at)
			peaks, err := st.DailyPeaks(ctx, history.Filter{}, from, to)
			if err != nil {
				b.Fatal(err)
			}
			if d := Derive(peaks, lim, cfg, at); len(d.Proposals) != buckets {
				b.Fatalf("%d proposals, %d refusals", len(d.Proposals), len(d.Refusals))
			}
		}
	})
	b.Run("read-only", func(b *testing.B) {
		for b.Loop() {
			from, to := cfg.Window(at)
			if peaks, err := st.DailyPeaks(b.Context(), history.Filter{}, from, to); err != nil || len(peaks) != buckets*days {
				b.Fatalf("DailyPeaks: %d rows, %v", len(peaks), err)
			}
		}
	})
	for _, mode := range []string{"dry-run", "write"} {
		b.Run("command "+mode, func(b *testing.B) {
			args := []string{"derive", "--min-coverage", "0", "-o", "json"}
			if mode == "dry-run" {
				args = append(args, "--dry-run")
			}
			for b.Loop() {
				if _, err := runPG(b, url, args...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkBacktestPostgres is the whole backtest command for one bucket
// over 4 weeks of minutes (40,320 rows read and replayed).
func BenchmarkBacktestPostgres(b *testing.B) {
	url := pgtest.URL(b)
	if _, err := history.Migrate(b.Context(), url); err != nil {
		b.Fatal(err)
	}
	st, err := history.Open(b.Context(), url)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	const n = 28 * 1440
	start := time.Now().UTC().Truncate(time.Minute).Add(-n * time.Minute)
	rows := make([]history.MinuteRow, n)
	for i := range rows {
		r := float64(50 + (i*37)%200)
		rows[i] = history.MinuteRow{Bucket: web, Minute: start.Add(time.Duration(i) * time.Minute), PeakOffered: r, MeanOffered: r}
	}
	if err := st.WriteMinutes(b.Context(), rows); err != nil {
		b.Fatal(err)
	}
	if err := st.SetLimit(b.Context(), history.BucketLimit{Bucket: web, Limit: 150}, history.Change{Actor: "bench", Reason: "bench"}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := runPG(b, url, "backtest", "checkout/web", "--current", "-o", "json"); err != nil {
			b.Fatal(err)
		}
	}
}
