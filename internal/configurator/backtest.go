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
// A callee whose rows name procedures is replayed as the controller runs
// it: its (caller, procedure) leaves are the law's buckets, under the
// procedures' capacities (Limit of callee/*/procedure) and the callers'
// limits across procedures (Limit of callee/caller). Its rows of those
// levels are not buckets of the law: each reports what its leaves lost.
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
	rp := replay{lim: lim, results: map[history.Bucket]*BacktestResult{}, offered: map[history.Bucket]float64{}}
	var prev time.Time
	for i := 0; i < len(rows); {
		minute := rows[i].Minute
		j := i
		for j < len(rows) && rows[j].Minute.Equal(minute) {
			j++
		}
		services, levels := rp.minute(rows[i:j])
		i = j
		dt := time.Minute
		if !prev.IsZero() {
			dt = minute.Sub(prev)
		}
		prev = minute

		dropped := map[history.Bucket]float64{}
		for _, sv := range law.Step(dt, services) {
			for _, v := range sv.Verdicts {
				b := history.Bucket{Callee: sv.Service, Caller: v.Caller, Procedure: v.Procedure}
				n, ok := rp.offered[b]
				if !ok {
					continue // carried over by the law while it releases: no traffic this minute
				}
				ratio := sanitizeRate(v.Ratio)
				rp.results[b].add(minute, n, ratio)
				for _, l := range levels {
					if l.Callee == b.Callee && (l.Procedure == "" && l.Caller == b.Caller || l.Caller == history.AnyCaller && l.Procedure == b.Procedure) {
						dropped[l] += ratio * n
					}
				}
			}
		}
		for _, l := range levels {
			n := rp.offered[l]
			ratio := 0.0
			if n > 0 {
				ratio = min(dropped[l]/n, 1)
			}
			rp.results[l].add(minute, n, ratio)
		}
	}

	out := make([]BacktestResult, 0, len(rp.results))
	for _, r := range rp.results {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b BacktestResult) int { return compareBuckets(a.Bucket, b.Bucket) })
	return out, nil
}

// replay is Replay's state across minutes.
type replay struct {
	lim     ReplayLimits
	results map[history.Bucket]*BacktestResult
	offered map[history.Bucket]float64 // this minute's requests, by bucket
}

func (rp *replay) result(b history.Bucket) *BacktestResult {
	r := rp.results[b]
	if r == nil {
		r = &BacktestResult{Bucket: b, Limit: rp.lim.Limit(b)}
		rp.results[b] = r
	}
	return r
}

// minute turns one minute's rows, sorted by bucket, into the law's input,
// and returns the rows of the levels above leaves: the law does not see
// them.
func (rp *replay) minute(rows []history.MinuteRow) (services []dropratio.Service, levels []history.Bucket) {
	clear(rp.offered)
	for i := 0; i < len(rows); {
		callee := rows[i].Callee
		j := i
		hier := false
		for ; j < len(rows) && rows[j].Callee == callee; j++ {
			hier = hier || rows[j].Procedure != ""
		}
		s := dropratio.Service{Name: callee, Capacity: rp.lim.Capacity(callee)}
		for _, row := range rows[i:j] {
			r := rp.result(row.Bucket)
			r.Minutes++
			rp.offered[row.Bucket] += sanitizeRate(row.MeanOffered) * 60
			if hier && (row.Procedure == "" || row.Caller == history.AnyCaller) {
				levels = append(levels, row.Bucket)
				continue
			}
			s.Callers = append(s.Callers, dropratio.Caller{Name: row.Caller, Procedure: row.Procedure, Offered: row.MeanOffered, Limit: r.Limit})
			if hier {
				rp.addLevels(&s, row.Bucket)
			}
		}
		services = append(services, s)
		i = j
	}
	return services, levels
}

// addLevels gives s the limits of leaf's procedure and caller, once.
func (rp *replay) addLevels(s *dropratio.Service, leaf history.Bucket) {
	if !slices.ContainsFunc(s.Procedures, func(p dropratio.Procedure) bool { return p.Name == leaf.Procedure }) {
		capacity := rp.lim.Limit(history.Bucket{Callee: leaf.Callee, Caller: history.AnyCaller, Procedure: leaf.Procedure})
		s.Procedures = append(s.Procedures, dropratio.Procedure{Name: leaf.Procedure, Capacity: capacity})
	}
	if !slices.ContainsFunc(s.CallerLimits, func(c dropratio.CallerLimit) bool { return c.Name == leaf.Caller }) {
		limit := rp.lim.Limit(history.Bucket{Callee: leaf.Callee, Caller: leaf.Caller})
		s.CallerLimits = append(s.CallerLimits, dropratio.CallerLimit{Name: leaf.Caller, Limit: limit})
	}
}

// add counts n requests of one minute, of which ratio were dropped.
func (r *BacktestResult) add(minute time.Time, n, ratio float64) {
	r.Offered += n
	if !(ratio > 0) {
		return
	}
	r.Dropped += ratio * n
	r.DropMinutes++
	if r.FirstDrop.IsZero() {
		r.FirstDrop = minute
	}
	r.LastDrop = minute
	if ratio > r.WorstRatio {
		r.WorstRatio, r.WorstMinute = ratio, minute
	}
}

// CostRows returns rows with the buckets of callees counting cost
// (counted) replayed in cost: each such row's offered rates are its
// offered cost rates (MinuteRow.Cost), in units per second, and a row
// without a cost load (from before its callee counted cost) is left out.
// Other rows are returned as they are. rows is not changed.
func CostRows(rows []history.MinuteRow, counted func(callee string) bool) []history.MinuteRow {
	out := make([]history.MinuteRow, 0, len(rows))
	for _, r := range rows {
		if !counted(r.Callee) {
			out = append(out, r)
			continue
		}
		if r.Cost == nil {
			continue
		}
		r.PeakOffered, r.MeanOffered = r.Cost.PeakOffered, r.Cost.MeanOffered
		r.MeanDropped = max(r.Cost.MeanOffered-r.Cost.MeanAdmitted, 0)
		out = append(out, r)
	}
	return out
}

func compareMinuteRows(a, b history.MinuteRow) int {
	return cmp.Or(a.Minute.Compare(b.Minute), compareBuckets(a.Bucket, b.Bucket))
}
