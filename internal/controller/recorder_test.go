package controller

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/pkg/history"
)

var minute0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func load(callee, caller string, offered, dropped float64) BucketLoad {
	return BucketLoad{Callee: callee, Caller: caller, Totals: Totals{Offered: offered, Dropped: dropped}}
}

func TestRecorderMinuteRows(t *testing.T) {
	mem := history.NewMemory()
	r := NewRecorder(DefaultRecorderConfig(), mem, nil, nil)
	// Four ticks in minute 0: web at 100, 300, 200, 200 (dropping 50 in
	// the last two); batch only in the first tick, so its mean counts the
	// other three ticks as silence.
	r.Observe(minute0, []BucketLoad{load("checkout", "web", 100, 0), load("checkout", "batch", 40, 0)})
	r.Observe(minute0.Add(15*time.Second), []BucketLoad{load("checkout", "web", 300, 0)})
	r.Observe(minute0.Add(30*time.Second), []BucketLoad{load("checkout", "web", 200, 50)})
	r.Observe(minute0.Add(45*time.Second), []BucketLoad{load("checkout", "web", 200, 50)})
	if r.Buffered() != 0 {
		t.Fatalf("rows buffered before the minute closed: %d", r.Buffered())
	}
	// The first tick of the next minute closes minute 0.
	r.Observe(minute0.Add(time.Minute), []BucketLoad{load("checkout", "web", 10, 0)})
	if r.Buffered() != 2 {
		t.Fatalf("buffered = %d, want 2 rows for minute 0", r.Buffered())
	}
	if err := r.write(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		caller           string
		peak, mean, drop float64
	}{
		{"web", 300, 200, 25},
		{"batch", 40, 10, 0},
	} {
		rows, err := mem.Minutes(context.Background(), history.Bucket{Callee: "checkout", Caller: tc.caller}, minute0, minute0.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 {
			t.Fatalf("%s: %d rows, want 1", tc.caller, len(rows))
		}
		got := rows[0]
		if got.PeakOffered != tc.peak || math.Abs(got.MeanOffered-tc.mean) > 1e-9 || math.Abs(got.MeanDropped-tc.drop) > 1e-9 || !got.Minute.Equal(minute0) {
			t.Errorf("%s row = %+v, want peak %v mean %v dropped %v at %v", tc.caller, got, tc.peak, tc.mean, tc.drop, minute0)
		}
	}
	if r.Buffered() != 0 {
		t.Errorf("buffered = %d after the write", r.Buffered())
	}
	// Flush closes the minute in progress too.
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	rows, _ := mem.Minutes(context.Background(), history.Bucket{Callee: "checkout", Caller: "web"}, minute0, minute0.Add(time.Hour))
	if len(rows) != 2 {
		t.Errorf("after Flush: %d rows of web, want 2", len(rows))
	}
}

func TestRecorderDropsOldestWhenFull(t *testing.T) {
	cfg := DefaultRecorderConfig()
	cfg.MaxBuffered = 3
	reg := prometheus.NewRegistry()
	r := NewRecorder(cfg, history.NewMemory(), nil, reg)
	for i := range 3 {
		// Two buckets a minute: six rows after three minutes, three kept.
		r.Observe(minute0.Add(time.Duration(i)*time.Minute), []BucketLoad{load("a", "x", 1, 0), load("b", "x", 1, 0)})
	}
	r.Observe(minute0.Add(3*time.Minute), nil)
	if got := r.Buffered(); got != 3 {
		t.Fatalf("buffered = %d, want the cap of 3", got)
	}
	if got := testutil.ToFloat64(r.m.dropped); got != 3 {
		t.Errorf("dropped = %v, want 3", got)
	}
	r.mu.Lock()
	oldest := r.buf[0].Minute
	r.mu.Unlock()
	if oldest.Before(minute0.Add(time.Minute)) {
		t.Errorf("oldest kept row is from %v: the oldest should have gone", oldest)
	}
}

// flaky fails WriteMinutes while down is set; a hand-written fake around
// the real in-memory store.
type flaky struct {
	history.LoadStore
	mu   sync.Mutex
	down bool
}

func (f *flaky) WriteMinutes(ctx context.Context, rows []history.MinuteRow) error {
	f.mu.Lock()
	down := f.down
	f.mu.Unlock()
	if down {
		return errors.New("connection refused")
	}
	return f.LoadStore.WriteMinutes(ctx, rows)
}

func TestRecorderKeepsRowsWhileTheStoreIsAway(t *testing.T) {
	mem := history.NewMemory()
	store := &flaky{LoadStore: mem, down: true}
	reg := prometheus.NewRegistry()
	r := NewRecorder(DefaultRecorderConfig(), store, nil, reg)
	r.Observe(minute0, []BucketLoad{load("checkout", "web", 100, 0)})
	r.Observe(minute0.Add(time.Minute), nil)
	if err := r.write(context.Background()); err == nil {
		t.Fatal("write succeeded against a store that is down")
	}
	if r.Buffered() != 1 || testutil.ToFloat64(r.m.errors) != 1 {
		t.Fatalf("after a failed write: buffered %d, errors %v; want the row kept and the error counted", r.Buffered(), testutil.ToFloat64(r.m.errors))
	}
	store.mu.Lock()
	store.down = false
	store.mu.Unlock()
	if err := r.write(context.Background()); err != nil {
		t.Fatal(err)
	}
	rows, _ := mem.Minutes(context.Background(), history.Bucket{Callee: "checkout", Caller: "web"}, minute0, minute0.Add(time.Hour))
	if len(rows) != 1 || r.Buffered() != 0 {
		t.Errorf("after the store came back: %d rows stored, %d buffered", len(rows), r.Buffered())
	}
}

func TestObserveNeverWaitsForTheStore(t *testing.T) {
	// A store that blocks forever: Observe must still return, minute after
	// minute, while a write hangs.
	block := make(chan struct{})
	defer close(block)
	r := NewRecorder(DefaultRecorderConfig(), blockingStore{block}, nil, nil)
	r.Observe(minute0, []BucketLoad{load("a", "x", 1, 0)})
	r.Observe(minute0.Add(time.Minute), nil)
	go r.write(context.Background())
	for i := range 100 {
		r.Observe(minute0.Add(time.Duration(i+2)*time.Minute), []BucketLoad{load("a", "x", 1, 0)})
	}
	if r.Buffered() < 100 {
		t.Errorf("buffered = %d, want the rows of 100 minutes kept while the store hangs", r.Buffered())
	}
}

type blockingStore struct{ block chan struct{} }

func (b blockingStore) WriteMinutes(ctx context.Context, _ []history.MinuteRow) error {
	<-b.block
	return nil
}
func (blockingStore) Minutes(context.Context, history.Bucket, time.Time, time.Time) ([]history.MinuteRow, error) {
	return nil, nil
}
func (blockingStore) DailyPeaks(context.Context, history.Filter, time.Time, time.Time) ([]history.DailyPeak, error) {
	return nil, nil
}
func (blockingStore) Retain(context.Context, time.Time) (int, error) { return 0, nil }

// rowStore is a LoadStore that keeps the rows it is given, by bucket,
// whatever their names: the recorder's rows, not the store's checks, are
// what TestRecorderLeafAndLevelRows tests.
type rowStore struct {
	history.LoadStore // nil: only WriteMinutes is called
	rows              map[history.Bucket][]history.MinuteRow
}

func (s *rowStore) WriteMinutes(_ context.Context, rows []history.MinuteRow) error {
	for _, r := range rows {
		s.rows[r.Bucket] = append(s.rows[r.Bucket], r)
	}
	return nil
}

// TestRecorderLeafAndLevelRows: a callee with procedures gets a row per
// leaf, per caller across procedures (procedure "") and per procedure
// across callers (caller *); a level's peak is the peak of its per-tick
// sum, not the sum of its leaves' peaks.
func TestRecorderLeafAndLevelRows(t *testing.T) {
	store := &rowStore{rows: map[history.Bucket][]history.MinuteRow{}}
	r := NewRecorder(DefaultRecorderConfig(), store, nil, nil)
	leaf := func(caller, proc string, offered, dropped float64) BucketLoad {
		l := load("checkout", caller, offered, dropped)
		l.Procedure = proc
		return l
	}
	r.Observe(minute0, []BucketLoad{leaf("mobile", "pay", 30, 0), leaf("web", "get-item", 100, 0), leaf("web", "pay", 10, 10), load("orders", "web", 5, 0)})
	r.Observe(minute0.Add(30*time.Second), []BucketLoad{leaf("mobile", "pay", 50, 0), leaf("web", "get-item", 20, 0), leaf("web", "pay", 50, 30)})
	r.Observe(minute0.Add(time.Minute), nil)
	if err := r.write(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		b                history.Bucket
		peak, mean, drop float64
	}{
		{history.Bucket{Callee: "checkout", Caller: "web", Procedure: "pay"}, 50, 30, 20},
		{history.Bucket{Callee: "checkout", Caller: "web", Procedure: "get-item"}, 100, 60, 0},
		{history.Bucket{Callee: "checkout", Caller: "mobile", Procedure: "pay"}, 50, 40, 0},
		{history.Bucket{Callee: "checkout", Caller: "web"}, 110, 90, 20},
		{history.Bucket{Callee: "checkout", Caller: "mobile"}, 50, 40, 0},
		{history.Bucket{Callee: "checkout", Caller: history.AnyCaller, Procedure: "pay"}, 100, 70, 20},
		{history.Bucket{Callee: "checkout", Caller: history.AnyCaller, Procedure: "get-item"}, 100, 60, 0},
		{history.Bucket{Callee: "orders", Caller: "web"}, 5, 2.5, 0}, // no procedures: one row, as before
	}
	if len(store.rows) != len(want) {
		t.Errorf("%d buckets written, want %d: %v", len(store.rows), len(want), store.rows)
	}
	for _, tc := range want {
		rows := store.rows[tc.b]
		if len(rows) != 1 {
			t.Errorf("%+v: %d rows, want 1", tc.b, len(rows))
			continue
		}
		if got := rows[0]; got.PeakOffered != tc.peak || math.Abs(got.MeanOffered-tc.mean) > 1e-9 || math.Abs(got.MeanDropped-tc.drop) > 1e-9 || !got.Minute.Equal(minute0) {
			t.Errorf("%+v row = %+v, want peak %v mean %v dropped %v", tc.b, got, tc.peak, tc.mean, tc.drop)
		}
	}
}
