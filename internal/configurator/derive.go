package configurator

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/pkg/history"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// Flags a proposal may carry. Review shows them; approve --all skips
// proposals flagged FlagStepDown.
const (
	FlagNewLimit       = "new limit"                // the bucket has no limit of its own yet
	FlagStepDown       = "step down needs approval" // lowers the limit by more than MaxStepDown
	FlagHeldAtRecent   = "held at recent peak"      // the recent-peak guard raised it
	FlagReplacesManual = "replaces manual limit"    // an operator set the current limit by hand
	FlagCurrentHit     = "current below recent peak"
	// FlagBelowRecent is never set by Derive, whose guard prevents it;
	// review adds it to proposals that would lower a limit below the recent
	// peak, whoever wrote them.
	FlagBelowRecent = "lowers below recent peak"
)

// DeriveConfig tunes Derive. Start from DefaultDeriveConfig.
type DeriveConfig struct {
	Lookback    time.Duration // window whose peak the limit comes from: every UTC day it overlaps
	Headroom    float64       // limit = peak × (1 + Headroom)
	Recent      time.Duration // the limit is never below the peak of this window
	MaxStepDown float64       // a proposal below current × (1 − MaxStepDown) needs explicit approval
	MinDays     int           // days with enough coverage a bucket needs before anything is proposed
	MinCoverage float64       // share of a day's 1440 minutes a day needs to count
	MinLimit    float64       // floor of any proposal, so an idle bucket is not blocked
}

// DefaultDeriveConfig returns the defaults: 4 weeks, 25 % (docs/architecture.md).
func DefaultDeriveConfig() DeriveConfig {
	return DeriveConfig{
		Lookback:    4 * Week,
		Headroom:    0.25,
		Recent:      Week,
		MaxStepDown: 0.5,
		MinDays:     7,
		MinCoverage: 0.8,
		MinLimit:    1,
	}
}

// Validate reports every problem at once, naming the flag and its bound.
func (c DeriveConfig) Validate() error {
	var errs []error
	if c.Lookback < Day {
		errs = append(errs, fmt.Errorf("--lookback %s is shorter than 1d", duration.Format(c.Lookback)))
	}
	if !(c.Headroom >= 0 && c.Headroom <= 100) {
		errs = append(errs, fmt.Errorf("--headroom %v is outside [0, 100]", c.Headroom))
	}
	if c.Recent < Day {
		errs = append(errs, fmt.Errorf("--recent %s is shorter than 1d", duration.Format(c.Recent)))
	}
	if !(c.MaxStepDown >= 0 && c.MaxStepDown <= 1) {
		errs = append(errs, fmt.Errorf("--max-step-down %v is outside [0, 1]", c.MaxStepDown))
	}
	if c.MinDays < 1 {
		errs = append(errs, fmt.Errorf("--min-days %d is below 1", c.MinDays))
	} else if c.Lookback >= Day && c.MinDays > days(c.Lookback)+1 {
		errs = append(errs, fmt.Errorf("--min-days %d is more than the %d days --lookback %s overlaps", c.MinDays, days(c.Lookback)+1, duration.Format(c.Lookback)))
	}
	if !(c.MinCoverage >= 0 && c.MinCoverage <= 1) {
		errs = append(errs, fmt.Errorf("--min-coverage %v is outside [0, 1]", c.MinCoverage))
	}
	if !(c.MinLimit >= 0 && c.MinLimit < math.Inf(1)) {
		errs = append(errs, fmt.Errorf("--min-limit %v is outside [0, +Inf)", c.MinLimit))
	}
	return errors.Join(errs...)
}

// Window returns the days [from, to) Derive reads for cfg at now: every UTC
// day that overlaps the last Lookback or the last Recent, whichever is
// longer, today (partial) included.
func (c DeriveConfig) Window(now time.Time) (from, to time.Time) {
	return startOfDay(now.Add(-max(c.Lookback, c.Recent))), startOfDay(now).Add(Day)
}

func startOfDay(t time.Time) time.Time {
	return t.UTC().Truncate(Day)
}

// Refusal is a bucket with history but too little of it to propose from.
type Refusal struct {
	history.Bucket
	Days   int    // days with enough coverage
	Reason string // e.g. "3 days of history, need 7"
}

// Derivation is what Derive found.
type Derivation struct {
	Proposals []history.Proposal // sorted by callee, caller, procedure; IDs and statuses unset
	Refusals  []Refusal          // sorted by callee, caller, procedure
	Unchanged []history.Bucket   // buckets whose derived limit is already in force
}

// Derive computes proposals from daily peaks: for each bucket, the peak over
// the look-back window (rows outside it are ignored) times 1 + Headroom,
// rounded up to two significant figures (RoundUp), never below the rounded
// peak of the recent window nor below MinLimit.
//
// A bucket with fewer than MinDays days of at least MinCoverage × 1440
// minutes in the window is refused with the reason. A bucket whose own
// derived limit is already the proposed one is unchanged, not proposed
// again. Flags say what a reviewer should look at; see the Flag constants.
//
// Current is the limit in force: the bucket's own, else its callee's
// default. Derive is pure: the same input gives the same output.
//
// A bucket of a callee counting cost (its settings in current have a
// cost block) is derived from its cost history alike: the peaks are of its
// offered cost rate (DailyPeak.Cost), in units per second, its coverage is
// the minutes that carry one (CostMinutes), and the same guard rails hold.
// Days before the callee counted cost have no cost minutes: they count as
// days without history.
func Derive(peaks []history.DailyPeak, current history.Limits, cfg DeriveConfig, now time.Time) Derivation {
	if !slices.IsSortedFunc(peaks, comparePeaks) {
		peaks = slices.Clone(peaks)
		slices.SortStableFunc(peaks, comparePeaks)
	}
	// A window is every UTC day that overlaps it: 28d at noon is 29 days,
	// the first and today partial.
	from, to := startOfDay(now.Add(-cfg.Lookback)), startOfDay(now).Add(Day)
	recentFrom := startOfDay(now.Add(-cfg.Recent))
	minMinutes := int(math.Ceil(cfg.MinCoverage*1440 - 1e-9))
	lim := newLimitIndex(current)

	var out Derivation
	for i := 0; i < len(peaks); {
		b := peaks[i].Bucket
		counted := lim.counted(b.Callee)
		var (
			peak, recent     float64
			covered, partial int
			seen             bool
		)
		for ; i < len(peaks) && peaks[i].Bucket == b; i++ {
			p := &peaks[i]
			if !p.Day.Before(to) {
				continue
			}
			v, minutes := sanitizeRate(p.PeakOffered), p.Minutes
			if counted {
				v, minutes = 0, p.CostMinutes
				if p.Cost != nil {
					v = sanitizeRate(p.Cost.PeakOffered)
				}
			}
			if !p.Day.Before(recentFrom) {
				recent = max(recent, v)
			}
			if p.Day.Before(from) {
				continue
			}
			seen = true
			peak = max(peak, v)
			if minutes >= minMinutes && (!counted || minutes > 0) {
				covered++
			} else {
				partial++
			}
		}
		if !seen {
			continue
		}
		if covered < cfg.MinDays {
			reason := refusalReason(covered, partial, cfg)
			if counted {
				reason = strings.Replace(reason, " of history", " of cost history", 1)
			}
			out.Refusals = append(out.Refusals, Refusal{Bucket: b, Days: covered, Reason: reason})
			continue
		}
		if why := lim.undeclared(b); why != "" {
			out.Refusals = append(out.Refusals, Refusal{Bucket: b, Days: covered, Reason: why})
			continue
		}

		proposed := RoundUp(peak * (1 + cfg.Headroom))
		var flags []string
		if floor := RoundUp(recent); proposed < floor {
			proposed = floor
			flags = append(flags, FlagHeldAtRecent)
		}
		proposed = max(proposed, cfg.MinLimit)

		own, hasOwn := lim.buckets[b]
		cur, hasCur := lim.inForce(b)
		switch {
		case !hasOwn:
			flags = append(flags, FlagNewLimit)
		case own.Source == history.Derived && own.Limit == proposed:
			out.Unchanged = append(out.Unchanged, b)
			continue
		case own.Source == history.Manual:
			flags = append(flags, FlagReplacesManual)
		}
		if hasCur && proposed < cur*(1-cfg.MaxStepDown) {
			flags = append(flags, FlagStepDown)
		}
		if hasCur && cur < recent {
			flags = append(flags, FlagCurrentHit)
		}
		p := history.Proposal{
			Bucket:       b,
			Proposed:     proposed,
			PeakLookback: peak,
			PeakRecent:   recent,
			Flags:        flags,
		}
		if hasCur {
			p.Current = &cur
		}
		out.Proposals = append(out.Proposals, p)
	}
	return out
}

func refusalReason(covered, partial int, cfg DeriveConfig) string {
	unit := "days"
	if covered == 1 {
		unit = "day"
	}
	s := fmt.Sprintf("%d %s of history, need %d", covered, unit, cfg.MinDays)
	if partial > 0 {
		s += fmt.Sprintf(" (%d more below %s coverage)", partial, formatPercent(cfg.MinCoverage))
	}
	return s
}

func formatPercent(share float64) string {
	return strings.TrimSuffix(fmt.Sprintf("%.1f", share*100), ".0") + "%"
}

func comparePeaks(a, b history.DailyPeak) int {
	return cmp.Or(compareBuckets(a.Bucket, b.Bucket), a.Day.Compare(b.Day))
}

func compareBuckets(a, b history.Bucket) int {
	return cmp.Or(strings.Compare(a.Callee, b.Callee), strings.Compare(a.Caller, b.Caller), strings.Compare(a.Procedure, b.Procedure))
}

// sanitizeRate maps what can not be a rate (NaN, infinite, negative) to 0,
// as the control law does: a broken row must not raise a limit.
func sanitizeRate(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 1) {
		return 0
	}
	return v
}

// limitIndex looks limits up by bucket.
type limitIndex struct {
	buckets  map[history.Bucket]history.BucketLimit
	services map[string]history.ServiceLimits
	routed   map[string]map[string]bool // callee → the procedures its routes name
	leaves   map[string]bool            // callees with a limit on a procedure
}

func newLimitIndex(l history.Limits) limitIndex {
	x := limitIndex{
		buckets:  make(map[history.Bucket]history.BucketLimit, len(l.Buckets)),
		services: make(map[string]history.ServiceLimits, len(l.Services)),
	}
	for _, b := range l.Buckets {
		x.buckets[b.Bucket] = b
	}
	for _, s := range l.Services {
		x.services[s.Callee] = s
	}
	x.routed = make(map[string]map[string]bool, len(l.Routes))
	for _, sr := range l.Routes {
		m := make(map[string]bool, len(sr.Routes))
		for _, r := range sr.Routes {
			m[r.Procedure] = true
		}
		x.routed[sr.Callee] = m
	}
	x.leaves = map[string]bool{}
	for _, b := range l.Buckets {
		if b.Procedure != "" {
			x.leaves[b.Callee] = true
		}
	}
	return x
}

// undeclared says why a limit on b, a bucket with history, could not be
// loaded (limits.FromHistory), or "" when it could: history outlives a
// callee's routes, so a leaf of a procedure its routes no longer name
// would, once approved, be a limit on a request no route can be. A gRPC
// method is declared by its limit; names.Other needs a declared procedure
// beside it.
func (x limitIndex) undeclared(b history.Bucket) string {
	switch {
	case b.Procedure == "" || x.routed[b.Callee][b.Procedure]:
		return ""
	case b.Procedure == names.Other:
		if len(x.routed[b.Callee]) == 0 && !x.leaves[b.Callee] {
			return fmt.Sprintf("%s declares no procedure now", b.Callee)
		}
		return ""
	case routes.IsGRPCMethod(b.Procedure):
		return ""
	}
	return fmt.Sprintf("no route of %s names %s now", b.Callee, b.Procedure)
}

// inForce returns the limit that applies to b: its own, else, for a
// caller's bucket, its callee's default. A leaf or a procedure has only
// its own: the default is a caller's.
func (x limitIndex) inForce(b history.Bucket) (float64, bool) {
	if l, ok := x.buckets[b]; ok {
		return l.Limit, true
	}
	if s, ok := x.services[b.Callee]; ok && s.DefaultLimit != nil && b.Procedure == "" {
		return *s.DefaultLimit, true
	}
	return 0, false
}

// counted reports whether callee counts cost: its limits, capacities and
// rates are cost units per second.
func (x limitIndex) counted(callee string) bool {
	s, ok := x.services[callee]
	return ok && s.Cost != nil
}

// unit is what callee's rates count, for people: "units/s" or "rps".
func (x limitIndex) unit(callee string) string {
	if x.counted(callee) {
		return "units/s"
	}
	return "rps"
}

// capacity returns the callee's capacity, +Inf when none.
func (x limitIndex) capacity(callee string) float64 {
	if s, ok := x.services[callee]; ok && s.Capacity != nil {
		return *s.Capacity
	}
	return math.Inf(1)
}
