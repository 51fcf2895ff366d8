// Package dropratio turns offered load and limits into drop ratios.
//
// It is sluice's control law, kept pure so that every controller replica
// computes the same ratios from the same inputs: no goroutines, no clocks, no
// I/O, no logging. Elapsed time arrives as an argument to [Law.Step], and the
// only state is the previous ratio of each bucket, held by [Law].
//
// The law works on offered load (dropped requests included), never on
// admitted load: feeding back the admitted rate would make the ratio chase
// its own effect and oscillate.
package dropratio

import (
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Mode says whether a bucket's drops are carried out. The zero value is
// Enforce.
//
// It is sluice's one mode type: the limits, the store, the controller and
// the sidecars all use it, and every text form of it (limits files, the
// store's rows, flags, metric labels) is the one String, MarshalText and
// ParseMode spell: "enforce" or "shadow". The wire form, sluicev1.Mode, is
// converted at the edges that speak protobuf.
type Mode uint8

const (
	Enforce Mode = iota // drops are carried out
	Shadow              // drops are computed and reported, never carried out
)

var modeNames = [...]string{Enforce: "enforce", Shadow: "shadow"}

// String returns the mode's name, or "Mode(n)" for a value that is not a
// mode.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// MarshalText returns the mode's name; a value that is not a mode is an
// error.
func (m Mode) MarshalText() ([]byte, error) {
	if int(m) < len(modeNames) {
		return []byte(modeNames[m]), nil
	}
	return nil, fmt.Errorf("%v is not enforce or shadow", m)
}

// UnmarshalText sets m to the mode text names; see ParseMode.
func (m *Mode) UnmarshalText(text []byte) error {
	v, err := ParseMode(string(text))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// ParseMode returns the mode named s, "enforce" or "shadow", exactly.
// Anything else, the empty string included, is an error: where a mode may
// be left out, the caller decides what that means before parsing.
func ParseMode(s string) (Mode, error) {
	for m, name := range modeNames {
		if s == name {
			return Mode(m), nil
		}
	}
	return 0, fmt.Errorf("%q is not enforce or shadow", s)
}

// Reason says why a bucket's target ratio is above zero.
type Reason uint8

const (
	None         Reason = iota // ratio is zero
	OverLimit                  // the caller offers more than its own limit
	OverCapacity               // the callee's capacity is exhausted and the caller is over its fair share
)

func (r Reason) String() string {
	switch r {
	case None:
		return "none"
	case OverLimit:
		return "over_limit"
	case OverCapacity:
		return "over_capacity"
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Config tunes the law. Start from [DefaultConfig]; the zero value is invalid.
//
// MinRate spares callers whose rate is too low for 1 - Limit/Offered to mean
// anything, but not blocked callers (Limit 0): a block does not depend on the
// rate, so it holds from the first request, even for a caller listed with no
// traffic at all.
type Config struct {
	PMax        float64 // highest drop ratio ever returned; default 0.99; must be in (0,1)
	MinRate     float64 // offered rps below which a caller is never dropped (noise); default 1; >= 0
	ReleaseRate float64 // slow release: the admitted share (1-p) may grow at most by this factor per second; default 2; must be > 1
	// OpenBelow ends slow release for a bucket that is back under its
	// allowance: one whose offered rate is at most OpenBelow × its allowed
	// rate releases to its target (0) at once. Default 0.9; in [0, 1);
	// 0 never opens at once (the law before issue 17).
	//
	// Slow release keeps a ratio from swinging while the offered rate is
	// still high; a rate under its allowance needs no drops at all, and
	// holding it back only drops a caller within its rights. The margin is
	// the noise of an offered rate: in the simulator's steady states it
	// is a few percent (σ 0.4–5 %), its worst −17 %, on the fast path's
	// urgent ticks; noise can carry a bucket truly at its allowance under
	// 0.9 only when its ratio is below 0.1, which slow release at the
	// default rate opens within a second anyway. Only a step of at least
	// half a second opens at once (see Law.open): an urgent step's rates
	// may be a tenth of a second's.
	OpenBelow float64
}

// DefaultConfig returns the defaults. With ReleaseRate 2 a ratio falls from
// 0.99 to 0 in 7 one-second steps, and from 0.8 to 0 in 3, while its offered
// rate stays above OpenBelow (0.9) of its allowed rate; at once below it.
func DefaultConfig() Config {
	return Config{PMax: 0.99, MinRate: 1, ReleaseRate: 2, OpenBelow: 0.9}
}

// Validate reports every problem at once, each naming the field and its bound.
// Infinities are rejected too: an infinite MinRate would silently disable the
// law, and an infinite ReleaseRate would defeat slow release.
func (c Config) Validate() error {
	var errs []error
	if !(c.PMax > 0 && c.PMax < 1) {
		errs = append(errs, fmt.Errorf("dropratio: PMax %v is outside (0, 1)", c.PMax))
	}
	if !(c.MinRate >= 0 && c.MinRate < math.Inf(1)) {
		errs = append(errs, fmt.Errorf("dropratio: MinRate %v is outside [0, +Inf)", c.MinRate))
	}
	if !(c.ReleaseRate > 1 && c.ReleaseRate < math.Inf(1)) {
		errs = append(errs, fmt.Errorf("dropratio: ReleaseRate %v is outside (1, +Inf)", c.ReleaseRate))
	}
	if !(c.OpenBelow >= 0 && c.OpenBelow < 1) {
		errs = append(errs, fmt.Errorf("dropratio: OpenBelow %v is outside [0, 1)", c.OpenBelow))
	}
	return errors.Join(errs...)
}

// Caller is one bucket's input: the load a caller offers to a service and the
// limit it has there.
//
// Offered that is NaN, infinite or negative is treated as 0: a broken count
// must not make the law drop anything. Limit that is NaN or negative is
// treated as 0, which blocks the caller: a limit exists to protect the callee,
// so a limit that can not be read fails closed, and the verdict's Limit of 0
// makes the bad input visible. The configuration layer is expected to reject
// such limits before they get here.
//
// With procedures, a Caller is one leaf of the hierarchical law (see
// [Filler]): the caller's traffic to one procedure, and Limit is the
// (caller, procedure) limit. Procedure "" is the callee's implicit
// procedure, all of its traffic when it declares none: then Limit is the
// caller's limit at this callee, as it always was.
type Caller struct {
	Name      string
	Procedure string  // "" when the callee declares no procedures
	Tier      uint8   // criticality: 0 untiered; 1 (CRITICAL_PLUS) to 4 (SHEDDABLE), a larger number shed first
	Offered   float64 // global offered rate, rps, dropped requests included
	Limit     float64 // rps; math.Inf(1) means no limit; 0 means block (ratio PMax)
	Mode      Mode
}

// Service is one callee and the callers that offer it load.
//
// Callers may come in any order. Entries that share a Name, a Procedure and
// a Tier, within a service or across Services that share a Name, are merged
// into one bucket: offered rates are summed (rates of disjoint sources add
// up, as they do between tiers), the lowest limit and the lowest capacity apply, and Enforce wins over
// Shadow. Summing never hides load and the strictest limit never loosens
// protection, whatever the order of the input.
//
// Capacity follows the rules of Caller.Limit: NaN or negative means 0.
//
// Procedures and CallerLimits are the hierarchical law's other levels (see
// [Filler]); across Services that share a Name they are joined, and a name
// listed twice takes the lowest value. A service with neither, whose
// callers name no procedure, is split exactly as before they existed.
//
// Callers that share a Name and a Procedure but not a Tier are the tiers of
// one leaf: they share its Limit (the lowest, should they differ), and
// every limit and capacity above, top-down by tier, as [Filler] says. A
// service whose callers are all of tier 0 is split as before tiers existed.
type Service struct {
	Name         string
	Capacity     float64       // total rps all callers share; math.Inf(1) means none
	Callers      []Caller      // leaves, any order; duplicates are merged, see above
	Procedures   []Procedure   // capacities per procedure, shared by its callers
	CallerLimits []CallerLimit // limits per caller, across procedures
}

// Verdict is the law's output for one bucket (leaf).
//
// A caller's fair share of capacity is unbounded while the demands of all
// callers fit in the capacity; once they do not, it is the max-min fair level,
// for callers that demand less than the level too. Allowed is therefore the
// limit itself until the callee is over capacity.
//
// Reason explains Target, not Ratio: while a ratio releases towards a target
// of 0, Ratio is above zero and Reason is None.
//
// Offered and Limit echo the input after the rules for invalid values and
// duplicates were applied, so they are never NaN.
type Verdict struct {
	Caller    string
	Procedure string  // "" for the implicit procedure
	Tier      uint8   // echo of Caller.Tier
	Ratio     float64 // the drop ratio to push, after slow release, in [0, PMax]
	Target    float64 // p*, the ratio before slow release
	Allowed   float64 // rps the caller may send now: min(its limit, its fair share of capacity); math.Inf(1) when unbounded
	Offered   float64 // echo of the input (0 for a caller carried over from an earlier step)
	Limit     float64 // echo
	Mode      Mode
	Reason    Reason // OverLimit when Bound is a limit, OverCapacity when a capacity
	Bound     Bound  // the level that sets Allowed, whether or not the caller is over it
}

// ServiceVerdict holds the verdicts of one callee.
type ServiceVerdict struct {
	Service  string
	Verdicts []Verdict // sorted by Caller, then Procedure, then Tier
}
