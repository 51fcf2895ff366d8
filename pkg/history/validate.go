package history

import (
	"encoding"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// Bounds on free text, so that the audit log stays readable and a bad
// client can not fill it.
const (
	MaxActorLen  = 256
	MaxReasonLen = 4096
	MaxFlagLen   = 256
)

// Minutes outside these years are a bug upstream, and partition names have
// four-digit years.
var (
	minMinute = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	maxMinute = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
)

// invalid builds an error that wraps ErrInvalid and names the field.
func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...))
}

func checkName(field, s string) error {
	if err := names.Check(s); err != nil {
		return invalid(field, "%v", err)
	}
	return nil
}

// checkBucket: a callee and a caller, and a procedure when there is one;
// the caller may be AnyCaller only with a procedure.
func checkBucket(field string, b Bucket) error {
	if err := checkName(field+"callee", b.Callee); err != nil {
		return err
	}
	if b.Procedure == "" {
		if b.Caller == AnyCaller {
			return invalid(field+"caller", "%q stands for every caller of a procedure, and there is none", AnyCaller)
		}
		return checkName(field+"caller", b.Caller)
	}
	if err := checkProcedure(field+"procedure", b.Procedure); err != nil {
		return err
	}
	if b.Caller == AnyCaller {
		return nil
	}
	return checkName(field+"caller", b.Caller)
}

func checkProcedure(field, p string) error {
	if err := names.CheckProcedure(p); err != nil {
		return invalid(field, "%v", err)
	}
	return nil
}

// checkFilter allows empty fields (match all) and valid names.
func checkFilter(f Filter) error {
	if f.Callee != "" {
		if err := checkName("filter.callee", f.Callee); err != nil {
			return err
		}
	}
	if f.Caller != "" && f.Caller != AnyCaller {
		if err := checkName("filter.caller", f.Caller); err != nil {
			return err
		}
	}
	if f.Procedure != "" {
		return checkProcedure("filter.procedure", f.Procedure)
	}
	return nil
}

// checkRoutes: a callee's routes as routes.CompileRoutes takes them, with
// every problem it finds.
func checkRoutes(callee string, rs []routes.Route) error {
	if err := checkName("routes.callee", callee); err != nil {
		return err
	}
	if _, err := routes.CompileRoutes(rs); err != nil {
		return invalid("routes", "%v", err)
	}
	return nil
}

// checkRate: rates are finite and never negative.
func checkRate(field string, v float64) error {
	switch {
	case math.IsNaN(v):
		return invalid(field, "NaN is not a rate")
	case math.IsInf(v, 0):
		return invalid(field, "%v is not a finite rate", v)
	case v < 0:
		return invalid(field, "rate %v is negative", v)
	}
	return nil
}

func checkOptRate(field string, v *float64) error {
	if v == nil {
		return nil
	}
	return checkRate(field, *v)
}

// checkText: free text Postgres can store (valid UTF-8, no NUL bytes), so
// that both stores accept the same input.
func checkText(field, s string, max int, required bool) error {
	switch {
	case required && strings.TrimSpace(s) == "":
		return invalid(field, "required")
	case len(s) > max:
		return invalid(field, "%d bytes is longer than %d", len(s), max)
	case !utf8.ValidString(s):
		return invalid(field, "not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return invalid(field, "contains a NUL byte")
	}
	return nil
}

func checkNotes(notes []HistoryNote) error {
	for i, n := range notes {
		field := fmt.Sprintf("notes[%d].", i)
		if err := checkBucket(field, n.Bucket); err != nil {
			return err
		}
		if err := checkText(field+"what", n.What, MaxReasonLen, true); err != nil {
			return err
		}
	}
	return nil
}

func checkChange(c Change) error {
	if err := checkText("change.actor", c.Actor, MaxActorLen, true); err != nil {
		return err
	}
	return checkText("change.reason", c.Reason, MaxReasonLen, true)
}

// checkSetting: a mode, fail mode or enforcement must be one its type can
// spell (MarshalText, the text form the rows keep, refuses the others).
func checkSetting[T encoding.TextMarshaler](field string, v T) error {
	if _, err := v.MarshalText(); err != nil {
		return invalid(field, "%v", err)
	}
	return nil
}

// checkOptSetting: nil (keep or inherit) is fine too.
func checkOptSetting[T encoding.TextMarshaler](field string, v *T) error {
	if v == nil {
		return nil
	}
	return checkSetting(field, *v)
}

// setting is what a change to a setting leaves in force: v when given,
// else old when there is one, else def. It is a fresh pointer, so that the
// store shares none with its callers.
func setting[T any](v, old *T, def T) *T {
	switch {
	case v != nil:
		return new(*v)
	case old != nil:
		return new(*old)
	}
	return new(def)
}

// inheritedEnforcement is what a new bucket limit of b takes from its
// callee's enforcement (nil: the callee has no settings): the callee's,
// but never for the reserved callers, which no Envoy header names, so that
// a callee fronted by Envoy does not leave them unenforced.
func inheritedEnforcement(b Bucket, callee *dataplane.Enforcement) dataplane.Enforcement {
	if callee == nil || b.Caller == names.Unknown || b.Caller == names.Overflow {
		return dataplane.EnforceSidecar
	}
	return *callee
}

func checkSource(field string, s Source) error {
	switch s {
	case "", Manual, Derived:
		return nil
	}
	return invalid(field, "source %q is neither %q nor %q", s, Manual, Derived)
}

func checkStatus(field string, s ProposalStatus) error {
	switch s {
	case Pending, Approved, Rejected, Superseded:
		return nil
	}
	return invalid(field, "status %q is not one of pending, approved, rejected, superseded", s)
}

// checkMinutes validates a batch of minute rows; the error names the first
// bad row.
func checkMinutes(rows []MinuteRow) error {
	for i := range rows {
		if err := checkMinute(fmt.Sprintf("rows[%d].", i), &rows[i]); err != nil {
			return err
		}
	}
	return nil
}

func checkMinute(field string, r *MinuteRow) error {
	if err := checkBucket(field, r.Bucket); err != nil {
		return err
	}
	switch m := r.Minute; {
	case !m.Equal(m.Truncate(time.Minute)):
		return invalid(field+"minute", "%v is not the start of a minute", m)
	case m.Before(minMinute) || !m.Before(maxMinute):
		return invalid(field+"minute", "%v is outside the years 1970 to 9999", m)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"peak_offered", r.PeakOffered}, {"mean_offered", r.MeanOffered}, {"mean_dropped", r.MeanDropped}} {
		if err := checkRate(field+f.name, f.v); err != nil {
			return err
		}
	}
	if r.PeakOffered < r.MeanOffered {
		return invalid(field+"peak_offered", "peak %v is below the mean %v", r.PeakOffered, r.MeanOffered)
	}
	if c := r.Cost; c != nil {
		for _, f := range []struct {
			name string
			v    float64
		}{{"peak_offered_cost", c.PeakOffered}, {"mean_offered_cost", c.MeanOffered}, {"peak_admitted_cost", c.PeakAdmitted}, {"mean_admitted_cost", c.MeanAdmitted}} {
			if err := checkRate(field+f.name, f.v); err != nil {
				return err
			}
		}
		if c.PeakOffered < c.MeanOffered {
			return invalid(field+"peak_offered_cost", "peak %v is below the mean %v", c.PeakOffered, c.MeanOffered)
		}
		if c.PeakAdmitted < c.MeanAdmitted {
			return invalid(field+"peak_admitted_cost", "peak %v is below the mean %v", c.PeakAdmitted, c.MeanAdmitted)
		}
	}
	return nil
}

func checkBucketLimit(l BucketLimit) error {
	if err := checkBucket("limit.", l.Bucket); err != nil {
		return err
	}
	if err := checkRate("limit.limit", l.Limit); err != nil {
		return err
	}
	if err := checkOptSetting("limit.mode", l.Mode); err != nil {
		return err
	}
	if err := checkOptSetting("limit.enforcement", l.Enforcement); err != nil {
		return err
	}
	if err := checkOptRate("limit.burst", l.Burst); err != nil {
		return err
	}
	if p := l.Payback; p != nil && (*p < 0 || *p > MaxPayback || *p%time.Millisecond != 0) {
		return fmt.Errorf("limit.payback: %v is not whole milliseconds in [0, %v]: %w", *p, MaxPayback, ErrInvalid)
	}
	return checkSource("limit.source", l.Source)
}

func checkServiceLimits(s ServiceLimits) error {
	if err := checkName("service.callee", s.Callee); err != nil {
		return err
	}
	if err := checkOptRate("service.default_limit", s.DefaultLimit); err != nil {
		return err
	}
	if err := checkOptRate("service.capacity", s.Capacity); err != nil {
		return err
	}
	if err := checkOptSetting("service.mode", s.Mode); err != nil {
		return err
	}
	if err := checkOptSetting("service.enforcement", s.Enforcement); err != nil {
		return err
	}
	if err := checkOptSetting("service.fail_mode", s.FailMode); err != nil {
		return err
	}
	if c := s.Cost; c != nil {
		if err := checkCost("service.cost.default", c.Default); err != nil {
			return err
		}
		if c.Max != nil {
			if v := *c.Max; !(v > 0) || math.IsInf(v, 1) {
				return invalid("service.cost.max", "%v is not a finite cost > 0", v)
			}
		}
		def, max := DefaultCost, DefaultMaxCost
		if c.Default != nil {
			def = *c.Default
		}
		if c.Max != nil {
			max = *c.Max
		}
		if def > max {
			return invalid("service.cost.default", "%v is above the cost's max %v", def, max)
		}
		if err := checkHeader("service.cost.request_header", c.RequestHeader); err != nil {
			return err
		}
		if err := checkHeader("service.cost.response_header", c.ResponseHeader); err != nil {
			return err
		}
	}
	if c := s.Criticality; c != nil {
		if err := checkHeader("service.criticality.header", c.Header); err != nil {
			return err
		}
		if err := checkTier("service.criticality.default", c.Default); err != nil {
			return err
		}
		if err := checkTier("service.criticality.max", c.Max); err != nil {
			return err
		}
	}
	if o := s.SLO; o != nil {
		switch {
		case o.LatencyP99 < 0 || o.LatencyP99 > MaxObjectiveLatency:
			return invalid("service.slo.latency_p99", "%v is neither 0 (unset) nor in (0, %v]", o.LatencyP99, MaxObjectiveLatency)
		case !(o.Errors >= 0 && o.Errors < 1):
			return invalid("service.slo.errors", "%v is neither 0 (unset) nor a ratio in (0, 1)", o.Errors)
		case o.LatencyP99 == 0 && o.Errors == 0:
			return invalid("service.slo", "neither latency_p99 nor errors is set")
		case s.Cost != nil:
			return invalid("service.slo", "not with unit cost: the estimate is in requests")
		}
	}
	return nil
}

// checkCost: an optional cost is finite and never negative.
func checkCost(field string, v *float64) error {
	if v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0) || *v < 0) {
		return invalid(field, "%v is not a finite cost >= 0", *v)
	}
	return nil
}

// checkHeader: "" (none), or a lower-case HTTP header name (an RFC 9110
// token), as the limits file's sources spell it.
func checkHeader(field, h string) error {
	if len(h) > MaxFlagLen {
		return invalid(field, "%d bytes is longer than %d", len(h), MaxFlagLen)
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return invalid(field, "%q is not a lower-case header name", h)
		}
	}
	return nil
}

// checkTier: None (the default) or one of the four tiers.
func checkTier(field string, t criticality.Tier) error {
	if !t.Valid() {
		return invalid(field, "%v is not a tier", t)
	}
	return nil
}

// checkBucketSettings: what each shape of bucket may set (BucketSettings).
func checkBucketSettings(s BucketSettings) error {
	if err := checkBucket("settings.", s.Bucket); err != nil {
		return err
	}
	if err := checkTier("settings.criticality", s.Criticality); err != nil {
		return err
	}
	if err := checkTier("settings.max_criticality", s.MaxCriticality); err != nil {
		return err
	}
	if err := checkCost("settings.cost", s.Cost); err != nil {
		return err
	}
	switch {
	case s.Caller == AnyCaller:
		if s.MaxCriticality != criticality.None {
			return invalid("settings.max_criticality", "%s is a procedure: a caller's maximum tier needs a caller", s.Path())
		}
		if s.MaxConcurrency != 0 {
			return invalid("settings.max_concurrency", "%s is a procedure: a cap on requests in flight is a caller's or a leaf's", s.Path())
		}
	case s.Procedure != "":
		if s.Criticality != criticality.None || s.MaxCriticality != criticality.None {
			return invalid("settings.criticality", "%s is a leaf: tiers default per caller or per procedure", s.Path())
		}
		if s.Cost != nil {
			return invalid("settings.cost", "%s is a leaf: a static cost is a procedure's (%s/%s/%s)", s.Path(), s.Callee, AnyCaller, s.Procedure)
		}
	case s.Cost != nil:
		return invalid("settings.cost", "%s is a caller: a static cost is a procedure's", s.Path())
	}
	return nil
}

// checkProposals validates what Propose's caller sets, and that no bucket
// has two proposals.
func checkProposals(ps []Proposal) error {
	seen := make(map[Bucket]int, len(ps))
	for i, p := range ps {
		field := fmt.Sprintf("proposals[%d].", i)
		if err := checkBucket(field, p.Bucket); err != nil {
			return err
		}
		if j, dup := seen[p.Bucket]; dup {
			return invalid(field+"bucket", "%s already has proposals[%d]", p.Path(), j)
		}
		seen[p.Bucket] = i
		if err := checkOptRate(field+"current", p.Current); err != nil {
			return err
		}
		for _, f := range []struct {
			name string
			v    float64
		}{{"proposed", p.Proposed}, {"peak_lookback", p.PeakLookback}, {"peak_recent", p.PeakRecent}} {
			if err := checkRate(field+f.name, f.v); err != nil {
				return err
			}
		}
		for j, flag := range p.Flags {
			if err := checkText(fmt.Sprintf("%sflags[%d]", field, j), flag, MaxFlagLen, true); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkStatuses(statuses []ProposalStatus) ([]ProposalStatus, error) {
	if len(statuses) == 0 {
		return []ProposalStatus{Pending}, nil
	}
	for i, s := range statuses {
		if err := checkStatus(fmt.Sprintf("statuses[%d]", i), s); err != nil {
			return nil, err
		}
	}
	return statuses, nil
}

// uniqueIDs returns ids without repeats, sorted.
func uniqueIDs(ids []int64) []int64 {
	out := append([]int64(nil), ids...)
	slices.Sort(out)
	return slices.Compact(out)
}

// days: the UTC midnights D with from <= D < to are exactly those with
// ceilDay(from) <= D < ceilDay(to).
func ceilDay(t time.Time) time.Time {
	d := t.UTC().Truncate(24 * time.Hour) // UTC midnight: the zero time is one
	if d.Before(t) {
		d = d.Add(24 * time.Hour)
	}
	return d
}

// dayOf is the UTC midnight starting t's day.
func dayOf(t time.Time) time.Time { return t.UTC().Truncate(24 * time.Hour) }
