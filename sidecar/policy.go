package sidecar

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// Direction says on which side of a call a policy is enforced. The zero value
// is Inbound, the common case.
type Direction uint8

const (
	// Inbound: the callee's sidecar drops; peers are callers. Resource
	// "callee/<service>".
	Inbound Direction = iota
	// Outbound: the caller's sidecar or client drops before the request
	// leaves; peers are callees. Resource "caller/<service>".
	Outbound
)

func (d Direction) String() string {
	switch d {
	case Inbound:
		return "inbound"
	case Outbound:
		return "outbound"
	}
	return "Direction(" + strconv.Itoa(int(d)) + ")"
}

// Reason mirrors sluicev1.DropReason: which rule of the control law produced
// a ratio. It is informational only (headers, debugging), so values this
// build does not know are carried through unchanged instead of rejected: a
// newer controller adding a reason must not make older sidecars NACK.
type Reason int32

const (
	ReasonNone     Reason = Reason(sluicev1.DropReason_DROP_REASON_UNSPECIFIED)
	ReasonLimit    Reason = Reason(sluicev1.DropReason_DROP_REASON_LIMIT)    // the bucket is over its own limit
	ReasonCapacity Reason = Reason(sluicev1.DropReason_DROP_REASON_CAPACITY) // the callee's capacity is shared out
)

func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "none"
	case ReasonLimit:
		return "limit"
	case ReasonCapacity:
		return "capacity"
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Policy is the domain form of a sluicev1.DropPolicy: what one enforcing
// service does to each of its peers. A Policy is immutable once built: the
// Limiter keeps the pointer it is given and hands it out to concurrent
// readers, so nobody may modify a Policy (or its Peers) after passing it on.
type Policy struct {
	Name          string // the xDS resource name, names.Callee(Service) or names.Caller(Service)
	Service       string // the enforcing service
	Direction     Direction
	Peers         []Rule        // sorted by Peer, Procedure, Tier, each (Peer, Procedure, Tier) at most once; an unlisted bucket is not dropped
	TTL           time.Duration // 0: not set, the holder applies its default (DESIGN.md: 10s)
	LiveInstances int
	// FailMode is what the Limiter does once the policy has outlived its
	// TTL; Limiter.Expire puts it in force (see failmode.go).
	FailMode      dataplane.FailMode
	FailOpenDecay time.Duration // 0: not set
	IssuedAt      time.Time     // zero: not set

	// Procedures are the procedures the service declares, in order,
	// without names.Other, which a service with procedures always has:
	// every request is counted and decided in exactly one leaf (peer,
	// procedure), and a request no declared procedure fits in (peer,
	// names.Other). Empty: the service declares none, and every bucket is
	// a whole (Service, Peer) pair, procedure "". Inbound policies only.
	Procedures []string
	// Routes are the service's HTTP routes, in order, each naming one of
	// Procedures: the first that matches a request names its procedure
	// (see ServiceLimiter.DecideHTTP).
	Routes []routes.Route
	// compiled is Routes compiled by PolicyFromProto, so that installing
	// the policy does not compile them again; nil: compiled on install.
	compiled *routes.Routes

	// Descriptors are the service's descriptor limits (issue #15), at most
	// descriptor.MaxPerService, each name at most once: a request its
	// bucket admits is admitted only if every descriptor admits its value
	// too. Inbound policies only.
	Descriptors []DescriptorPolicy

	// Criticality is how the service finds a request's tier (issue #16);
	// nil: it declares no tiers, and every rule's Tier is None. With it,
	// every rule has one of the four tiers, and a request is counted and
	// decided in the leaf (peer, procedure, tier). Inbound policies only.
	Criticality *CriticalityPolicy

	// Unit is what the service's limits count (issue #16); with UnitCost
	// every rate of its rules is in units per second, and Cost (nil: the
	// defaults, see costTable) prices each request. Inbound policies only.
	Unit Unit
	Cost *CostPolicy

	// Objective is the service's objective (issue #18); zero: none. A
	// sidecar whose callee misses it sheds at once, for at most the
	// controller's next tick (the health fast path, reporter.HealthGate).
	// Inbound policies only.
	Objective adaptive.Objective
}

// DescriptorPolicy is one descriptor limit: a limit per value of one
// request attribute, and the verdicts of the values the controller found
// heavy. A value it lists is decided by its rule; any other by the
// sidecar's local allowance, sized from the value's limit, the policy's
// LiveInstances, the report window and Quantile (pkg/allowance).
type DescriptorPolicy struct {
	Name   string            // descriptor.CheckName
	Source descriptor.Source // where a request's value comes from
	// LimitRPS is every value's global limit unless overridden; 0 blocks.
	LimitRPS float64
	// MissingLimitRPS is the limit of descriptor.Missing, the requests
	// without the attribute.
	MissingLimitRPS float64
	// Overrides are the values with a limit of their own, sorted by
	// Value, each at most once.
	Overrides []ValueLimit
	// Quantile is the allowance's quantile, in (0, 1).
	Quantile float64
	// Values are the heavy values' verdicts, sorted by Value, each at most
	// once.
	Values []ValueRule
}

// ValueLimit is a descriptor value's own limit.
type ValueLimit struct {
	Value    string
	LimitRPS float64
}

// ValueRule is the controller's verdict for one heavy descriptor value.
type ValueRule struct {
	Value      string
	DropRatio  float64 // in [0, 1)
	LimitRPS   float64 // the value's limit: LimitRPS, an override or MissingLimitRPS
	OfferedRPS float64 // its global offered rate the ratio was computed from
}

// Rule is the verdict for one bucket (Service, Peer, Procedure, Tier).
//
// Mode Enforce drops requests with the rule's ratio; Mode Shadow counts
// would-be drops as shadow drops and admits every request. Enforcement
// EnforceUpstream, whatever the mode, says the ratio was carried out before
// the requests arrived, by the caller's proxyless gRPC client or the
// callee's Envoy (PeerPolicy.enforced_upstream): every request is admitted,
// and each one counts as 1/(1−p) offered, p/(1−p) of it dropped upstream, so
// that the reports carry the load offered before those drops (see
// docs/dataplanes.md). PolicyFromProto gives such rules Mode Enforce: the
// controller marks only enforced buckets.
type Rule struct {
	Peer string
	// Procedure is the bucket's procedure: one of the policy's Procedures
	// or names.Other; "" when the policy declares none.
	Procedure string
	// Tier is the bucket's tier: one of the four when the policy has
	// Criticality, else None. Limits are not per tier: LimitRPS and
	// CallerLimitRPS are the (peer, procedure)'s, shared by its tiers.
	Tier        criticality.Tier
	DropRatio   float64 // in [0, 1)
	Mode        dropratio.Mode
	Enforcement dataplane.Enforcement
	LimitRPS    float64 // the bucket's configured limit; +Inf: none, 0: blocked
	// CallerLimitRPS is, for a leaf (Procedure set), its caller's limit
	// across procedures, which LimitRPS already bounds the leaf alone by;
	// +Inf: none, 0: blocked. Under fail mode local the caller's leaves
	// share a bucket of it. Meaningless when Procedure is "", and left 0
	// there by PolicyFromProto, so that a whole bucket's Rule is what it
	// was before procedures.
	CallerLimitRPS float64
	AllowedRPS     float64 // what the bucket may send now; +Inf: unbounded
	OfferedRPS     float64 // the global offered rate the ratio was computed from
	Reason         Reason
	// Bound is, for a leaf, the level of the callee's limits that sets
	// AllowedRPS (PeerPolicy.bound), which a rejection names as the
	// bucket that refused (see policyName). BoundNone, as BoundLeaf, is
	// the leaf itself; so is a value the wire gives that this sidecar
	// does not know. Left BoundNone for a whole bucket, which is the one
	// bucket that binds it.
	Bound dropratio.Bound
	// MaxConcurrency is the bucket's global cap on requests in flight at
	// the callee; 0: none. The sidecar holds its share of it (see
	// concurrency in cost.go). Inbound policies only.
	MaxConcurrency uint32
	// Debt is, for a service counting cost, the units the bucket admitted
	// above its limit and has not paid back (the controller lowers
	// AllowedRPS meanwhile): informational.
	Debt float64
}

// Limited reports whether r is a peer the policy limits (dataplane.Listed):
// a ratio above 0, enforced or shadow, a limit, or enforcement upstream (its
// weights count). Such a peer always has counters of its own in a Limiter,
// never evicted; any other rule is as good as none, and its peer is
// observed only (see LimiterOptions.MaxPeers). A share of the callee's
// capacity alone (a bounded AllowedRPS) does not make a rule limited: the
// controller lists only limited peers, by the same rule on the wire form.
// A concurrency cap makes a rule limited too: its in-flight count must
// never be evicted while requests hold it.
func (r *Rule) Limited() bool {
	return dataplane.Listed(clampRatio(r.DropRatio), !math.IsInf(r.LimitRPS, 1), r.Enforcement) || r.MaxConcurrency > 0
}

// upstream reports whether r's ratio was carried out upstream, so that the
// sidecar only counts its requests.
func (r *Rule) upstream() bool { return r.Enforcement == dataplane.EnforceUpstream }

// modeLabel is r's mode as the drop ratio metric labels it: "enforce",
// "shadow", or "upstream" for a rule enforced upstream.
func (r *Rule) modeLabel() string {
	if r.upstream() {
		return dataplane.EnforceUpstream.String()
	}
	return r.Mode.String()
}

// Rule returns the rule for peer's bucket of procedure "", the whole (Service,
// peer) pair, or nil when the policy does not list it. For a service that
// declares procedures, see Leaf.
func (p *Policy) Rule(peer string) *Rule { return p.Leaf(peer, "") }

// Leaf returns the rule for the untiered bucket (peer, procedure), or nil
// when the policy does not list it. For a service with tiers, see
// LeafTier.
func (p *Policy) Leaf(peer, procedure string) *Rule {
	return p.LeafTier(peer, procedure, criticality.None)
}

// LeafTier returns the rule for the bucket (peer, procedure, tier), or nil
// when the policy does not list it.
func (p *Policy) LeafTier(peer, procedure string, tier criticality.Tier) *Rule {
	i, ok := slices.BinarySearchFunc(p.Peers, leaf{peer, procedure, tier}, func(r Rule, k leaf) int { return cmpRule(r.Peer, r.Procedure, r.Tier, k) })
	if !ok {
		return nil
	}
	return &p.Peers[i]
}

// cmpRule orders buckets by peer, procedure, then tier, as policies list
// them.
func cmpRule(peer, procedure string, tier criticality.Tier, k leaf) int {
	return cmp.Or(cmp.Compare(peer, k.peer), cmp.Compare(procedure, k.proc), cmp.Compare(tier, k.tier))
}

// MaxPolicyPeers bounds the peers of one policy that PolicyFromProto accepts
// (dataplane.MaxPolicyPeers): every limited peer of a policy has counters in
// the Limiter (about 1 KB each with its verdict), whatever
// LimiterOptions.MaxPeers says, so this bounds that memory to about 100 MB
// per service. The controller sheds peers before it publishes more.
const MaxPolicyPeers = dataplane.MaxPolicyPeers

// PolicyFromProto converts and validates a DropPolicy received over xDS. It is
// the one validation at the edge: an error here makes the xDS client NACK the
// update and keep the previous policy. Every problem is reported at once
// (errors.Join), each naming its proto field, e.g.
// "peers[3].drop_ratio: 1.2 is outside [0, 1)".
//
// Lenient where being strict would only cause outages: peers need not arrive
// sorted (they are sorted here), MODE_UNSPECIFIED means enforce (proto3 drops
// zero values on the wire, and shadow is an explicit opt-in),
// enforced_upstream makes a peer's Enforcement EnforceUpstream and its Mode
// Enforce whatever the wire's mode (the controller sends MODE_SHADOW with it,
// for sidecars that do not know the field),
// FAIL_MODE_UNSPECIFIED means open (DESIGN.md's default), an unknown drop
// reason is carried through, and unset durations and timestamps become zero.
func PolicyFromProto(m *sluicev1.DropPolicy) (*Policy, error) {
	if m == nil {
		return nil, errors.New("drop policy is nil")
	}
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}

	p := &Policy{
		Name:          m.GetName(),
		Service:       m.GetService(),
		LiveInstances: int(m.GetLiveInstances()),
	}

	if err := names.Check(p.Service); err != nil {
		bad("service", "%v", err)
	} else if p.Service == names.Overflow {
		bad("service", "%q is reserved", p.Service)
	}
	var dirOK bool
	if p.Direction, dirOK = directionFromProto(m.GetDirection(), bad); dirOK {
		want := names.Callee(p.Service)
		if p.Direction == Outbound {
			want = names.Caller(p.Service)
		}
		if p.Name != want {
			bad("name", "%q does not match service and direction; want %q", p.Name, want)
		}
	}

	p.TTL = duration(m.GetTtl(), "ttl", bad)
	p.FailOpenDecay = duration(m.GetFailOpenDecay(), "fail_open_decay", bad)
	p.IssuedAt = timestamp(m.GetIssuedAt(), "issued_at", bad)
	p.FailMode = failModeFromProto(m.GetFailMode(), bad)

	if n := len(m.GetPeers()); n > MaxPolicyPeers {
		bad("peers", "%d peers, more than the %d a sidecar accepts", n, MaxPolicyPeers)
		return nil, fmt.Errorf("invalid drop policy %q: %w", m.GetName(), errors.Join(errs...))
	}
	declared := proceduresFromProto(m, p, bad)
	p.Criticality = criticalityFromProto(m.GetCriticality(), p.Direction, declared, bad)
	p.Peers = make([]Rule, 0, len(m.GetPeers()))
	seen := make(map[leaf]int, len(m.GetPeers()))
	for i, pp := range m.GetPeers() {
		r := ruleFromProto(i, pp, p.Direction, seen, bad)
		switch {
		case p.Criticality == nil && r.Tier != criticality.None:
			bad("peers["+strconv.Itoa(i)+"].criticality", "%v set, but the policy declares no criticality", r.Tier)
		case p.Criticality != nil && r.Tier == criticality.None:
			bad("peers["+strconv.Itoa(i)+"].criticality", "unspecified, but the policy declares criticality")
		}
		if _, ok := declared[r.Procedure]; !ok {
			switch {
			case len(p.Procedures) == 0:
				bad("peers["+strconv.Itoa(i)+"].procedure", "%.64q set, but the policy declares no procedures", r.Procedure)
			default:
				bad("peers["+strconv.Itoa(i)+"].procedure", "%.64q is neither declared in procedures nor %q", r.Procedure, names.Other)
			}
		}
		p.Peers = append(p.Peers, r)
	}
	p.Descriptors = descriptorsFromProto(m.GetDescriptors(), p.Direction, bad)
	costFromProto(m, p, declared, bad)
	p.Objective = objectiveFromProto(m.GetObjective(), p.Direction, bad)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("invalid drop policy %q: %w", m.GetName(), err)
	}
	slices.SortFunc(p.Peers, func(a, b Rule) int { return cmpRule(a.Peer, a.Procedure, a.Tier, leaf{b.Peer, b.Procedure, b.Tier}) })
	return p, nil
}

// proceduresFromProto converts and checks m's procedures and routes into p,
// compiling the routes once, and returns the procedures a rule of p may
// name: "" alone when m declares none, else the declared ones and
// names.Other.
func proceduresFromProto(m *sluicev1.DropPolicy, p *Policy, bad func(field, format string, args ...any)) map[string]struct{} {
	procs, rts := m.GetProcedures(), m.GetRoutes()
	if len(procs) == 0 && len(rts) == 0 {
		return map[string]struct{}{"": {}}
	}
	if p.Direction == Outbound {
		// The caller side does not know what a request does at the
		// callee: outbound buckets stay whole.
		bad("procedures", "set in an outbound policy")
	}
	if len(procs) > routes.MaxRoutes {
		bad("procedures", "%d procedures, more than the %d a sidecar accepts", len(procs), routes.MaxRoutes)
		return map[string]struct{}{}
	}
	declared := make(map[string]struct{}, len(procs)+1)
	p.Procedures = make([]string, 0, len(procs))
	for i, q := range procs {
		f := "procedures[" + strconv.Itoa(i) + "]"
		switch _, dup := declared[q]; {
		case q == names.Other:
			bad(f, "%q is implicit and reserved", q)
		case names.CheckProcedure(q) != nil:
			bad(f, "%v", names.CheckProcedure(q))
		case dup:
			bad(f, "%.64q is declared again", q)
		default:
			declared[q] = struct{}{}
		}
		p.Procedures = append(p.Procedures, q)
	}
	if len(rts) > routes.MaxRoutes {
		bad("routes", "%d routes, more than the %d a sidecar accepts", len(rts), routes.MaxRoutes)
		return declared
	}
	p.Routes = make([]routes.Route, 0, len(rts))
	for i, rt := range rts {
		if _, ok := declared[rt.GetProcedure()]; !ok {
			bad("routes["+strconv.Itoa(i)+"].procedure", "%.64q is not declared in procedures", rt.GetProcedure())
		}
		p.Routes = append(p.Routes, routes.Route{Pattern: rt.GetPattern(), Procedure: rt.GetProcedure()})
	}
	if len(p.Routes) > 0 {
		var err error
		if p.compiled, err = routes.CompileRoutes(p.Routes); err != nil {
			bad("routes", "%v", err)
		}
	}
	declared[names.Other] = struct{}{}
	return declared
}

// directionFromProto converts a policy's direction; ok is false (and the
// direction Inbound) when it is neither.
func directionFromProto(d sluicev1.Direction, bad func(field, format string, args ...any)) (dir Direction, ok bool) {
	switch d {
	case sluicev1.Direction_DIRECTION_INBOUND:
		return Inbound, true
	case sluicev1.Direction_DIRECTION_OUTBOUND:
		return Outbound, true
	}
	bad("direction", "%v is neither inbound nor outbound", d)
	return Inbound, false
}

// failModeFromProto converts a policy's fail mode; unspecified is open.
func failModeFromProto(fm sluicev1.FailMode, bad func(field, format string, args ...any)) dataplane.FailMode {
	switch fm {
	case sluicev1.FailMode_FAIL_MODE_UNSPECIFIED, sluicev1.FailMode_FAIL_MODE_OPEN:
		return dataplane.FailOpen
	case sluicev1.FailMode_FAIL_MODE_HOLD:
		return dataplane.FailHold
	case sluicev1.FailMode_FAIL_MODE_LOCAL:
		return dataplane.FailLocal
	}
	bad("fail_mode", "unknown value %d", int32(fm))
	return dataplane.FailOpen
}

// ruleFromProto converts and checks peers[i] of a policy of direction dir.
// seen maps the buckets before it to their index, for duplicates; it adds
// pp's. The caller checks the procedure against the policy's.
func ruleFromProto(i int, pp *sluicev1.PeerPolicy, dir Direction, seen map[leaf]int, bad func(field, format string, args ...any)) Rule {
	f := func(name string) string { return "peers[" + strconv.Itoa(i) + "]." + name }
	r := Rule{
		Peer:       pp.GetPeer(),
		Procedure:  pp.GetProcedure(),
		DropRatio:  pp.GetDropRatio(),
		LimitRPS:   rateOrInf(pp.LimitRps),
		AllowedRPS: rateOrInf(pp.AllowedRps),
		OfferedRPS: pp.GetOfferedRps(),
		Reason:     Reason(pp.GetReason()),
	}
	var tierOK bool
	if r.Tier, tierOK = tierFromProto(pp.GetCriticality()); !tierOK {
		bad(f("criticality"), "unknown value %d", int32(pp.GetCriticality()))
	}
	k := leaf{r.Peer, r.Procedure, r.Tier}
	if err := names.Check(r.Peer); err != nil {
		bad(f("peer"), "%v", err)
	} else if j, dup := seen[k]; dup {
		switch {
		case r.Tier != criticality.None:
			bad(f("peer"), "%q with procedure %.64q and criticality %v is listed again, first at peers[%d]", r.Peer, r.Procedure, r.Tier, j)
		case r.Procedure == "":
			bad(f("peer"), "%q is listed again, first at peers[%d]", r.Peer, j)
		default:
			bad(f("peer"), "%q with procedure %.64q is listed again, first at peers[%d]", r.Peer, r.Procedure, j)
		}
	} else if tierOK {
		seen[k] = i
	}
	if !(r.DropRatio >= 0 && r.DropRatio < 1) { // also catches NaN
		bad(f("drop_ratio"), "%v is outside [0, 1)", r.DropRatio)
	}
	switch pp.GetMode() {
	case sluicev1.Mode_MODE_UNSPECIFIED, sluicev1.Mode_MODE_ENFORCE:
		r.Mode = dropratio.Enforce
	case sluicev1.Mode_MODE_SHADOW:
		r.Mode = dropratio.Shadow
	default:
		bad(f("mode"), "unknown value %d", int32(pp.GetMode()))
	}
	if pp.GetEnforcedUpstream() {
		r.Mode, r.Enforcement = dropratio.Enforce, dataplane.EnforceUpstream
		if dir == Outbound {
			// Upstream of an outbound sidecar is the caller's app:
			// nobody would drop the bucket.
			bad(f("enforced_upstream"), "set in an outbound policy")
		}
	}
	// Absent limits mean none, so the wire never needs an infinity.
	for _, rate := range []struct {
		name string
		v    *float64
	}{{"limit_rps", pp.LimitRps}, {"caller_limit_rps", pp.CallerLimitRps}, {"allowed_rps", pp.AllowedRps}, {"offered_rps", &pp.OfferedRps}} {
		switch {
		case rate.v == nil:
		case math.IsNaN(*rate.v) || math.IsInf(*rate.v, 0):
			bad(f(rate.name), "%v is not a finite number", *rate.v)
		case *rate.v < 0:
			bad(f(rate.name), "%v is negative", *rate.v)
		}
	}
	switch {
	case r.Procedure != "":
		r.CallerLimitRPS = rateOrInf(pp.CallerLimitRps)
		r.Bound = boundFromProto(pp.GetBound())
	case pp.CallerLimitRps != nil:
		// A whole (service, peer) bucket: its limit is the caller's.
		bad(f("caller_limit_rps"), "set on a peer without a procedure")
	}
	ruleCostFromProto(f, pp, dir, &r, bad)
	return r
}

// boundFromProto reads a leaf's bound. A value it does not know, from a
// newer controller, is the leaf itself, as before the field: the name of a
// rejection is advice, not worth refusing a policy for.
func boundFromProto(b sluicev1.DropBound) dropratio.Bound {
	switch b {
	case sluicev1.DropBound_DROP_BOUND_LEAF:
		return dropratio.BoundLeaf
	case sluicev1.DropBound_DROP_BOUND_CALLER:
		return dropratio.BoundCaller
	case sluicev1.DropBound_DROP_BOUND_PROCEDURE:
		return dropratio.BoundProcedure
	case sluicev1.DropBound_DROP_BOUND_CALLEE:
		return dropratio.BoundCallee
	}
	return dropratio.BoundNone
}

// boundProto is the inverse of boundFromProto for the values it returns.
func boundProto(b dropratio.Bound) sluicev1.DropBound {
	switch b {
	case dropratio.BoundLeaf:
		return sluicev1.DropBound_DROP_BOUND_LEAF
	case dropratio.BoundCaller:
		return sluicev1.DropBound_DROP_BOUND_CALLER
	case dropratio.BoundProcedure:
		return sluicev1.DropBound_DROP_BOUND_PROCEDURE
	case dropratio.BoundCallee:
		return sluicev1.DropBound_DROP_BOUND_CALLEE
	}
	return sluicev1.DropBound_DROP_BOUND_UNSPECIFIED
}

// timestamp converts an optional proto timestamp; nil is zero.
func timestamp(ts *timestamppb.Timestamp, field string, bad func(field, format string, args ...any)) time.Time {
	if ts == nil {
		return time.Time{}
	}
	if err := ts.CheckValid(); err != nil {
		bad(field, "%v", err)
		return time.Time{}
	}
	return ts.AsTime()
}

// duration converts an optional proto duration; nil is zero.
func duration(d *durationpb.Duration, field string, bad func(field, format string, args ...any)) time.Duration {
	if d == nil {
		return 0
	}
	if err := d.CheckValid(); err != nil {
		bad(field, "%v", err)
		return 0
	}
	v := d.AsDuration()
	if v < 0 {
		bad(field, "%v is negative", v)
		return 0
	}
	return v
}

// Proto converts p back to its wire form, for tests and debug endpoints. Zero
// durations and a zero IssuedAt are left unset; enums are always explicit, so
// PolicyFromProto(p.Proto()) equals p for any valid p (one whose rules
// enforced upstream have Mode Enforce, as PolicyFromProto makes them).
func (p *Policy) Proto() *sluicev1.DropPolicy {
	m := &sluicev1.DropPolicy{
		Name:          p.Name,
		Service:       p.Service,
		LiveInstances: uint32(min(max(p.LiveInstances, 0), math.MaxUint32)),
	}
	switch p.Direction {
	case Inbound:
		m.Direction = sluicev1.Direction_DIRECTION_INBOUND
	case Outbound:
		m.Direction = sluicev1.Direction_DIRECTION_OUTBOUND
	}
	switch p.FailMode {
	case dataplane.FailOpen:
		m.FailMode = sluicev1.FailMode_FAIL_MODE_OPEN
	case dataplane.FailHold:
		m.FailMode = sluicev1.FailMode_FAIL_MODE_HOLD
	case dataplane.FailLocal:
		m.FailMode = sluicev1.FailMode_FAIL_MODE_LOCAL
	}
	if p.TTL != 0 {
		m.Ttl = durationpb.New(p.TTL)
	}
	if p.FailOpenDecay != 0 {
		m.FailOpenDecay = durationpb.New(p.FailOpenDecay)
	}
	if !p.IssuedAt.IsZero() {
		m.IssuedAt = timestamppb.New(p.IssuedAt)
	}
	m.Procedures = slices.Clone(p.Procedures)
	for _, rt := range p.Routes {
		m.Routes = append(m.Routes, &sluicev1.Route{Pattern: rt.Pattern, Procedure: rt.Procedure})
	}
	m.Peers = make([]*sluicev1.PeerPolicy, 0, len(p.Peers))
	for _, r := range p.Peers {
		pp := &sluicev1.PeerPolicy{
			Peer:        r.Peer,
			Procedure:   r.Procedure,
			DropRatio:   r.DropRatio,
			LimitRps:    rateOrNil(r.LimitRPS),
			AllowedRps:  rateOrNil(r.AllowedRPS),
			OfferedRps:  r.OfferedRPS,
			Reason:      sluicev1.DropReason(r.Reason),
			Criticality: sluicev1.Criticality(r.Tier),
			Debt:        r.Debt,
		}
		if r.MaxConcurrency > 0 {
			pp.MaxConcurrency = &r.MaxConcurrency
		}
		if r.Procedure != "" {
			pp.CallerLimitRps = rateOrNil(r.CallerLimitRPS)
			pp.Bound = boundProto(r.Bound)
		}
		switch {
		case r.upstream():
			pp.Mode = sluicev1.Mode_MODE_SHADOW // as the controller sends it
			pp.EnforcedUpstream = true
		case r.Mode == dropratio.Enforce:
			pp.Mode = sluicev1.Mode_MODE_ENFORCE
		case r.Mode == dropratio.Shadow:
			pp.Mode = sluicev1.Mode_MODE_SHADOW
		}
		m.Peers = append(m.Peers, pp)
	}
	m.Descriptors = descriptorsProto(p.Descriptors)
	m.Criticality = criticalityProto(p.Criticality)
	costProto(p, m)
	if p.Objective != (adaptive.Objective{}) {
		m.Objective = &sluicev1.HealthObjective{Errors: p.Objective.Errors}
		if p.Objective.LatencyP99 != 0 {
			m.Objective.LatencyP99 = durationpb.New(p.Objective.LatencyP99)
		}
	}
	return m
}

// objectiveFromProto converts and checks a policy's objective: absent is
// none; present, it is an inbound policy's and valid
// (adaptive.Objective.Validate), each bad field named.
func objectiveFromProto(m *sluicev1.HealthObjective, dir Direction, bad func(field, format string, args ...any)) adaptive.Objective {
	if m == nil {
		return adaptive.Objective{}
	}
	if dir == Outbound {
		bad("objective", "set in an outbound policy")
		return adaptive.Objective{}
	}
	o := adaptive.Objective{
		LatencyP99: duration(m.GetLatencyP99(), "objective.latency_p99", bad),
		Errors:     m.GetErrors(),
	}
	if err := o.Validate(); err != nil {
		bad("objective", "%v", err)
		return adaptive.Objective{}
	}
	return o
}

// rateOrInf reads an optional rate: absent means unbounded.
func rateOrInf(v *float64) float64 {
	if v == nil {
		return math.Inf(1)
	}
	return *v
}

func rateOrNil(v float64) *float64 {
	if math.IsInf(v, 1) {
		return nil
	}
	return &v
}
