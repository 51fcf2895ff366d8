package controller

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/pkg/history"
)

// RecorderConfig bounds the history recorder.
type RecorderConfig struct {
	// MaxBuffered is the most minute rows held while the store is slow or
	// away; when full, the oldest rows are dropped and counted.
	MaxBuffered int
	// Batch is the most rows written in one call.
	Batch int
	// Interval is how often buffered rows are written.
	Interval time.Duration
	// Retention is how long minute rows are kept; older days are dropped
	// every hour. 0 keeps everything.
	Retention time.Duration
}

// DefaultRecorderConfig holds an hour of minute rows for 5,000 buckets, or
// a few minutes for 100,000.
func DefaultRecorderConfig() RecorderConfig {
	return RecorderConfig{MaxBuffered: 300_000, Batch: 50_000, Interval: 5 * time.Second, Retention: 35 * 24 * time.Hour}
}

// Recorder turns each tick's bucket loads into per-minute rows (peak and
// mean offered, mean dropped) and writes them to the load store in batches.
// A bucket of a callee counting cost (BucketLoad.Cost) gets its offered and
// admitted cost rates too, peak and mean (history.CostLoad).
//
// Observe runs on the tick and never waits for the store: it takes a mutex
// that Run holds only to move rows in or out of the buffer. A full buffer
// drops its oldest rows, counted, rather than block or grow.
type Recorder struct {
	cfg   RecorderConfig
	store history.LoadStore
	log   *slog.Logger
	m     recorderMetrics

	mu     sync.Mutex // protects everything below
	minute time.Time  // the minute being accumulated; zero before the first tick
	ticks  int        // ticks observed in it
	acc    map[history.Bucket]*minuteAcc
	buf    []history.MinuteRow // oldest first
	head   uint64              // sequence number of buf[0]; rows are numbered as they enter
	wake   chan struct{}       // signalled when a minute is complete
}

type minuteAcc struct {
	peak, sumOffered, sumDropped float64
	// A callee counting cost: its cost rates likewise.
	cost                                             bool
	costPeakOff, costSumOff, costPeakAdm, costSumAdm float64
}

type recorderMetrics struct {
	written, dropped, errors prometheus.Counter
	buffered                 prometheus.Gauge
}

// NewRecorder returns a recorder writing to store.
func NewRecorder(cfg RecorderConfig, store history.LoadStore, logger *slog.Logger, reg prometheus.Registerer) *Recorder {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Recorder{
		cfg: cfg, store: store, log: logger,
		acc:  map[history.Bucket]*minuteAcc{},
		wake: make(chan struct{}, 1),
		m: recorderMetrics{
			written:  prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controller_history_rows_written_total", Help: "Minute rows written to the history store."}),
			dropped:  prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controller_history_rows_dropped_total", Help: "Minute rows dropped, oldest first, because the buffer was full while the store was slow or away."}),
			errors:   prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controller_history_write_errors_total", Help: "Failed writes of minute rows; the rows stay buffered and are retried."}),
			buffered: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_controller_history_rows_buffered", Help: "Minute rows waiting to be written."}),
		},
	}
	if reg != nil {
		reg.MustRegister(r.m.written, r.m.dropped, r.m.errors, r.m.buffered)
	}
	return r
}

// Observe adds one tick's loads to the current minute; the first tick of a
// new minute closes the previous one into the buffer.
//
// A leaf's load (a callee that declares procedures) makes three rows: the
// leaf's, {callee, caller, procedure}; its caller's across procedures,
// {callee, caller, ""}; and its procedure's across callers, {callee,
// history.AnyCaller, procedure}. Each level's rate is summed within the
// tick before its peak is taken, so a level's peak is the peak of its sum.
// loads are sorted, so the sums are the same on every replica.
func (r *Recorder) Observe(now time.Time, loads []BucketLoad) {
	minute := now.UTC().Truncate(time.Minute)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.minute.IsZero() && !minute.Equal(r.minute) {
		r.closeMinute()
	}
	r.minute = minute
	r.ticks++
	var (
		levels map[history.Bucket]*Totals // this tick's per-level sums
		costs  map[history.Bucket]bool    // whether each level's callee counts cost
	)
	for _, l := range loads {
		r.add(history.Bucket{Callee: l.Callee, Caller: l.Caller, Procedure: l.Procedure}, l.Totals, l.Cost)
		if l.Procedure == "" {
			continue
		}
		if levels == nil {
			levels = map[history.Bucket]*Totals{}
			costs = map[history.Bucket]bool{}
		}
		for _, b := range []history.Bucket{
			{Callee: l.Callee, Caller: l.Caller},
			{Callee: l.Callee, Caller: history.AnyCaller, Procedure: l.Procedure},
		} {
			t := levels[b]
			if t == nil {
				t = &Totals{}
				levels[b] = t
			}
			t.add(l.Totals)
			costs[b] = l.Cost
		}
	}
	for b, t := range levels {
		r.add(b, *t, costs[b])
	}
}

// add accumulates one bucket's load of one tick; r.mu is held.
func (r *Recorder) add(b history.Bucket, t Totals, cost bool) {
	a := r.acc[b]
	if a == nil {
		a = &minuteAcc{}
		r.acc[b] = a
	}
	a.peak = max(a.peak, t.Offered)
	a.sumOffered += t.Offered
	a.sumDropped += t.Dropped
	if cost {
		a.cost = true
		a.costPeakOff, a.costPeakAdm = max(a.costPeakOff, t.OfferedCost), max(a.costPeakAdm, t.AdmittedCost)
		a.costSumOff += t.OfferedCost
		a.costSumAdm += t.AdmittedCost
	}
}

// closeMinute moves the accumulated minute into the buffer. A bucket absent
// from some ticks had no traffic in them, so means divide by every tick.
func (r *Recorder) closeMinute() {
	if r.ticks == 0 {
		return
	}
	n := float64(r.ticks)
	for b, a := range r.acc {
		mean := a.sumOffered / n
		row := history.MinuteRow{
			Bucket: b, Minute: r.minute,
			PeakOffered: max(a.peak, mean), // guards float rounding: peak ≥ mean
			MeanOffered: mean,
			MeanDropped: a.sumDropped / n,
		}
		if a.cost {
			// Ticks of the minute without the bucket had no cost either.
			off, adm := a.costSumOff/n, a.costSumAdm/n
			row.Cost = &history.CostLoad{PeakOffered: max(a.costPeakOff, off), MeanOffered: off, PeakAdmitted: max(a.costPeakAdm, adm), MeanAdmitted: adm}
		}
		r.buf = append(r.buf, row)
	}
	clear(r.acc)
	r.ticks = 0
	if over := len(r.buf) - r.cfg.MaxBuffered; over > 0 {
		r.buf = append(r.buf[:0], r.buf[over:]...)
		r.head += uint64(over)
		r.m.dropped.Add(float64(over))
		r.log.Warn("history buffer full; dropped the oldest minute rows", "rows", over)
	}
	r.m.buffered.Set(float64(len(r.buf)))
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run writes buffered rows every interval and whenever a minute closes,
// until ctx ends. A failed write keeps the rows and backs off.
func (r *Recorder) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	retain := time.NewTicker(time.Hour)
	defer retain.Stop()
	r.retain(ctx)
	backoff := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-retain.C:
			r.retain(ctx)
			continue
		case <-t.C:
		case <-r.wake:
		}
		if backoff > 0 {
			// After a failure, wait out the backoff before trying again;
			// ticks and wakes meanwhile only shorten nothing.
			wait := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				wait.Stop()
				return nil
			case <-wait.C:
			}
		}
		if err := r.write(ctx); err != nil {
			backoff = min(max(2*backoff, time.Second), 30*time.Second)
			if ctx.Err() == nil {
				r.log.Error("writing minute rows failed; keeping them buffered", "err", err, "retry_in", backoff)
			}
			continue
		}
		backoff = 0
	}
}

// retain drops days of history older than the retention window. Failures
// are logged and retried at the next hour: retention is housekeeping.
func (r *Recorder) retain(ctx context.Context) {
	if r.cfg.Retention <= 0 {
		return
	}
	days, err := r.store.Retain(ctx, time.Now().Add(-r.cfg.Retention))
	switch {
	case err != nil && ctx.Err() == nil:
		r.log.Warn("dropping old history failed; retrying in an hour", "err", err)
	case days > 0:
		r.log.Info("dropped old history", "days", days, "retention", r.cfg.Retention)
	}
}

// write sends the buffer in batches, oldest first, and stops at the first
// failure, leaving the unwritten rows buffered.
func (r *Recorder) write(ctx context.Context) error {
	for {
		r.mu.Lock()
		n := min(len(r.buf), r.cfg.Batch)
		batch := append([]history.MinuteRow(nil), r.buf[:n]...)
		end := r.head + uint64(n)
		r.mu.Unlock()
		if n == 0 {
			return nil
		}
		if err := r.store.WriteMinutes(ctx, batch); err != nil {
			r.m.errors.Inc()
			return err
		}
		r.m.written.Add(float64(n))
		r.mu.Lock()
		// While the write ran, a full buffer may have dropped some of
		// these rows already: remove only those still at the head.
		if end > r.head {
			k := end - r.head
			r.buf = append(r.buf[:0], r.buf[k:]...)
			r.head = end
		}
		r.m.buffered.Set(float64(len(r.buf)))
		r.mu.Unlock()
	}
}

// Flush closes the current minute and writes everything buffered, for
// shutdown; ctx bounds it.
func (r *Recorder) Flush(ctx context.Context) error {
	r.mu.Lock()
	r.closeMinute()
	r.mu.Unlock()
	return r.write(ctx)
}

// Buffered is the number of rows waiting to be written.
func (r *Recorder) Buffered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.buf)
}
