package configurator

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

// ReplayLimits are the limits a replay applies.
type ReplayLimits struct {
	// Limit returns a bucket's limit in rps, +Inf for none.
	Limit func(history.Bucket) float64
	// Capacity returns a callee's capacity in rps, +Inf for none.
	Capacity func(callee string) float64
}

// BacktestResult is what a replay found for one bucket.
type BacktestResult struct {
	history.Bucket
	Limit       float64   // the limit replayed, +Inf for none
	Minutes     int       // minute rows replayed
	Offered     float64   // requests offered: Σ mean offered rate × 60 s
	Dropped     float64   // requests the law would have dropped: Σ ratio × offered
	DropMinutes int       // minutes with a drop ratio above zero
	WorstMinute time.Time // the minute with the highest ratio, the first of equals; zero if none
	WorstRatio  float64
	FirstDrop   time.Time // zero if none
	LastDrop    time.Time
}

// Share is the share of offered traffic that would have been dropped.
func (r BacktestResult) Share() float64 {
	if r.Offered == 0 {
		return 0
	}
	return r.Dropped / r.Offered
}

// Replay runs minute rows through the control law, one Step per minute that
// has rows, with dt the time since the previous such minute (a minute when
// the rows are contiguous), and reports per bucket what the law would have
// dropped. The law sees each row's MeanOffered as the bucket's offered rate,
// so bursts shorter than a minute are averaged out: the replay is the
// controller at one-minute resolution, not at its one-second tick.
//
// Shadow or enforce makes no difference: the law computes both alike.
// Callers of one callee share its capacity, so rows of every caller of a
// callee with a capacity must be given for its split to be right.
//
// Replay is pure; rows may come in any order. It fails only on a cfg the law
// refuses.
func Replay(rows []history.MinuteRow, lim ReplayLimits, cfg dropratio.Config) ([]BacktestResult, error) {
	law, err := dropratio.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if !slices.IsSortedFunc(rows, compareMinuteRows) {
		rows = slices.Clone(rows)
		slices.SortStableFunc(rows, compareMinuteRows)
	}

	results := map[history.Bucket]*BacktestResult{}
	result := func(b history.Bucket) *BacktestResult {
		r := results[b]
		if r == nil {
			r = &BacktestResult{Bucket: b, Limit: lim.Limit(b)}
			results[b] = r
		}
		return r
	}
	offered := map[history.Bucket]float64{} // this minute's, for the verdicts

	var (
		services []dropratio.Service
		prev     time.Time
	)
	for i := 0; i < len(rows); {
		minute := rows[i].Minute
		services = services[:0]
		clear(offered)
		for ; i < len(rows) && rows[i].Minute.Equal(minute); i++ {
			row := &rows[i]
			if len(services) == 0 || services[len(services)-1].Name != row.Callee {
				services = append(services, dropratio.Service{Name: row.Callee, Capacity: lim.Capacity(row.Callee)})
			}
			s := &services[len(services)-1]
			r := result(row.Bucket)
			s.Callers = append(s.Callers, dropratio.Caller{Name: row.Caller, Offered: row.MeanOffered, Limit: r.Limit})
			r.Minutes++
			offered[row.Bucket] += sanitizeRate(row.MeanOffered) * 60
		}
		dt := time.Minute
		if !prev.IsZero() {
			dt = minute.Sub(prev)
		}
		prev = minute

		for _, sv := range law.Step(dt, services) {
			for _, v := range sv.Verdicts {
				b := history.Bucket{Callee: sv.Service, Caller: v.Caller}
				n, ok := offered[b]
				if !ok {
					continue // carried over by the law while it releases: no traffic this minute
				}
				r := results[b]
				r.Offered += n
				if !(v.Ratio > 0) {
					continue
				}
				r.Dropped += v.Ratio * n
				r.DropMinutes++
				if r.FirstDrop.IsZero() {
					r.FirstDrop = minute
				}
				r.LastDrop = minute
				if v.Ratio > r.WorstRatio {
					r.WorstRatio, r.WorstMinute = v.Ratio, minute
				}
			}
		}
	}

	out := make([]BacktestResult, 0, len(results))
	for _, r := range results {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b BacktestResult) int { return compareBuckets(a.Bucket, b.Bucket) })
	return out, nil
}

func compareMinuteRows(a, b history.MinuteRow) int {
	return cmp.Or(a.Minute.Compare(b.Minute), compareBuckets(a.Bucket, b.Bucket))
}
