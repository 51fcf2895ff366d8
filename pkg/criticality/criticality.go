// Package criticality names a request's tier: Google's four, highest first.
//
// A callee that declares tiers (the limits' "criticality:") sheds by them:
// when a capacity binds, it goes to tiers from the top down, max-min fairly
// within a tier, so that every caller's sheddable traffic goes before
// anyone's critical traffic; within a caller's own limit, its lower tiers go
// first. A callee that declares none has one tier, None, and its buckets
// are what they were before tiers.
//
// The numbering is the wire's (sluice.v1.Criticality) and the law's
// (dropratio.Leaf.Tier): a larger number is a lower tier, shed first.
package criticality

import (
	"strconv"
	"strings"
)

// Tier is a request's criticality. The zero value, None, is the one tier of
// a callee that declares none.
type Tier uint8

const (
	None          Tier = iota // untiered
	CriticalPlus              // CRITICAL_PLUS: would cause serious user-visible impact if it failed
	Critical                  // CRITICAL: the default of a request that says nothing
	SheddablePlus             // SHEDDABLE_PLUS: partial unavailability is expected; retried later
	Sheddable                 // SHEDDABLE: frequent partial unavailability is expected
)

// Count is the number of tiers a callee with tiers has: CriticalPlus to
// Sheddable.
const Count = 4

// DefaultHeader is the header (gRPC metadata key) a request's tier is read
// from unless the limits name another.
const DefaultHeader = "x-sluice-criticality"

// Tiers lists the tiers of a callee that declares them, highest first.
var Tiers = [Count]Tier{CriticalPlus, Critical, SheddablePlus, Sheddable}

var tierNames = [...]string{"", "CRITICAL_PLUS", "CRITICAL", "SHEDDABLE_PLUS", "SHEDDABLE"}

// String returns the tier's name, as the limits and the header spell it;
// "" for None.
func (t Tier) String() string {
	if int(t) < len(tierNames) {
		return tierNames[t]
	}
	return "Tier(" + strconv.Itoa(int(t)) + ")"
}

// Valid reports whether t is None or one of the four tiers.
func (t Tier) Valid() bool { return t <= Sheddable }

// Parse returns the tier a header value or a limits file names: one of the
// four names, in upper or lower case ("CRITICAL_PLUS", "critical_plus"). It
// allocates nothing, so the request path may call it on a header value;
// anything else is not a tier (false), None included.
func Parse(s string) (Tier, bool) {
	switch s {
	case "CRITICAL_PLUS", "critical_plus":
		return CriticalPlus, true
	case "CRITICAL", "critical":
		return Critical, true
	case "SHEDDABLE_PLUS", "sheddable_plus":
		return SheddablePlus, true
	case "SHEDDABLE", "sheddable":
		return Sheddable, true
	}
	return None, false
}

// ParseConfig is Parse for configuration, whose errors name what is
// accepted.
func ParseConfig(s string) (Tier, error) {
	if t, ok := Parse(s); ok {
		return t, nil
	}
	return None, &Error{Value: s}
}

// Error is a name that is not a tier.
type Error struct{ Value string }

func (e *Error) Error() string {
	return "criticality " + quote(e.Value) + " is not one of " + strings.Join(tierNames[1:], ", ")
}

// quote quotes s for an error without letting a long hostile value through
// whole.
func quote(s string) string {
	const max = 64
	if len(s) > max {
		s = s[:max] + "…"
	}
	return `"` + strings.ToValidUTF8(s, "\uFFFD") + `"`
}

// Cap returns t lowered to at most max (a higher tier claimed than allowed
// becomes max), and whether it was lowered. None caps nothing.
func Cap(t, max Tier) (Tier, bool) {
	if max != None && t != None && t < max {
		return max, true
	}
	return t, false
}
