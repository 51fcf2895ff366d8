package history_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/history"
)

// Benchmarks of the Postgres store, on the pgtest cluster (fsync off: they
// measure the store's work, not the disk). Goals (issue 3; the numbers
// belong in docs/benchmarks.md): ingest >= 200k rows/s; DailyPeaks over 10k
// buckets × 28 days well under 2 s. Run with:
//
//	go test -run '^$' -bench . -benchtime 20x ./pkg/history

var benchDay = time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)

func benchBucket(i int) history.Bucket {
	return history.Bucket{Callee: fmt.Sprintf("svc-%03d", i/100), Caller: fmt.Sprintf("caller-%03d", i%100)}
}

// BenchmarkWriteMinutes writes batches of new rows, in three shapes: the
// controller's minute flush (10k buckets, one minute each: every row also
// updates a rollup row, the worst case), a backlog of 10k rows (1k buckets
// × 10 minutes), and what 10k buckets buffer in a 10-minute outage (100k
// rows).
func BenchmarkWriteMinutes(b *testing.B) {
	for _, shape := range []struct {
		name             string
		buckets, minutes int
	}{
		{"10kBuckets×1min", 10_000, 1},
		{"1kBuckets×10min", 1_000, 10},
		{"10kBuckets×10min", 10_000, 10},
	} {
		b.Run(shape.name, func(b *testing.B) {
			s := open(b, migrated(b))
			batch := make([]history.MinuteRow, shape.buckets*shape.minutes)
			next := 0 // the next batch's first minute
			fill := func() {
				for i := range shape.buckets {
					for m := range shape.minutes {
						batch[i*shape.minutes+m] = history.MinuteRow{
							Bucket:      benchBucket(i),
							Minute:      benchDay.Add(time.Duration(next+m) * time.Minute),
							PeakOffered: float64(100 + i%50), MeanOffered: float64(80 + i%50), MeanDropped: float64(i % 3),
						}
					}
				}
				next += shape.minutes
			}
			// The first batch creates the day's partition; that is not ingest.
			fill()
			if err := s.WriteMinutes(b.Context(), batch); err != nil {
				b.Fatal(err)
			}
			var elapsed time.Duration
			rows := 0
			for b.Loop() {
				b.StopTimer()
				fill()
				b.StartTimer()
				start := time.Now()
				if err := s.WriteMinutes(b.Context(), batch); err != nil {
					b.Fatal(err)
				}
				elapsed += time.Since(start)
				rows += len(batch)
			}
			b.ReportMetric(float64(rows)/elapsed.Seconds(), "rows/s")
		})
	}
}

// BenchmarkDailyPeaks reads the rollup of 10k buckets × 28 days (280k
// rows), what deriving limits over the default 4-week look-back reads, out
// of 35 stored days.
func BenchmarkDailyPeaks(b *testing.B) {
	const buckets, days, stored = 10_000, 28, 35
	s := open(b, migrated(b))
	batch := make([]history.MinuteRow, 0, buckets)
	for d := range stored {
		batch = batch[:0]
		for i := range buckets {
			batch = append(batch, history.MinuteRow{
				Bucket: benchBucket(i), Minute: benchDay.AddDate(0, 0, d).Add(time.Duration(i%1440) * time.Minute),
				PeakOffered: float64(100 + d), MeanOffered: 50, MeanDropped: 1,
			})
		}
		if err := s.WriteMinutes(b.Context(), batch); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := s.Pool().Exec(b.Context(), `VACUUM ANALYZE daily_load`); err != nil {
		b.Fatal(err)
	}
	from := benchDay.AddDate(0, 0, stored-days)
	to := benchDay.AddDate(0, 0, stored)
	for b.Loop() {
		ds, err := s.DailyPeaks(b.Context(), history.Filter{}, from, to)
		if err != nil {
			b.Fatal(err)
		}
		if len(ds) != buckets*days {
			b.Fatalf("%d daily rows, want %d", len(ds), buckets*days)
		}
	}
	b.ReportMetric(buckets*days, "rows/op")
}

// BenchmarkMinutesOneBucket4Weeks reads one bucket's 40,320 minutes, what a
// backtest of one bucket over 4 weeks replays.
func BenchmarkMinutesOneBucket4Weeks(b *testing.B) {
	const minutes = 28 * 1440
	s := open(b, migrated(b))
	target := benchBucket(0)
	// Two other buckets share the partitions: the read picks its rows out
	// of others'.
	for _, bk := range []history.Bucket{benchBucket(1), target, benchBucket(2)} {
		rows := make([]history.MinuteRow, minutes)
		for m := range rows {
			rows[m] = history.MinuteRow{Bucket: bk, Minute: benchDay.Add(time.Duration(m) * time.Minute),
				PeakOffered: float64(m % 500), MeanOffered: float64(m%500) / 2}
		}
		if err := s.WriteMinutes(b.Context(), rows); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := s.Pool().Exec(b.Context(), `VACUUM ANALYZE minute_load`); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		rs, err := s.Minutes(b.Context(), target, benchDay, benchDay.AddDate(0, 0, 28))
		if err != nil {
			b.Fatal(err)
		}
		if len(rs) != minutes {
			b.Fatalf("%d rows, want %d", len(rs), minutes)
		}
	}
	b.ReportMetric(minutes, "rows/op")
}
