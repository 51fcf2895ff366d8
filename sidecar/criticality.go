package sidecar

import (
	"cmp"
	"net/textproto"
	"strconv"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/names"
)

// Criticality tiers (issue #16): a service whose policy has a
// CriticalityPolicy counts and decides every request in a leaf (peer,
// procedure, tier), its tier resolved from a header (gRPC metadata) and
// the policy's defaults (see critTable.resolve). A service without one
// has tier criticality.None in every leaf, and its leaves, reports and
// decide path are what they were before tiers.
//
// In the table a leaf's index packs the tier beside the procedure index
// (see leafIndex), so that the lookup stays one probe and an untiered
// leaf's index is its procedure's, as before.

// CriticalityPolicy is the domain form of a sluicev1.CriticalityPolicy:
// how a request's tier is found. A request's tier is its header's, if it
// names a tier, lowered to its caller's Max (else the service's); else the
// most specific default: its procedure's, its caller's, the service's.
// Immutable once in a Policy.
type CriticalityPolicy struct {
	// Header is the lower-case header (gRPC metadata key) that carries a
	// request's tier name; criticality.DefaultHeader when the wire leaves
	// it empty.
	Header string
	// Default is the tier of a request whose header is absent or names no
	// tier and that no procedure or caller default covers. Never None:
	// the wire's unspecified is criticality.Critical.
	Default criticality.Tier
	// Max is the highest tier a caller not listed in Callers (or listed
	// without a max) may claim; None: any.
	Max criticality.Tier
	// Procedures are per-procedure defaults, each procedure at most once,
	// a declared one or names.Other.
	Procedures []ProcedureCriticality
	// Callers are per-caller defaults and maxima, each caller at most
	// once.
	Callers []CallerCriticality
}

// ProcedureCriticality is one procedure's default tier.
type ProcedureCriticality struct {
	Procedure string
	Default   criticality.Tier // never None
}

// CallerCriticality is one caller's default tier and the highest tier it
// may claim; None in either: the service's.
type CallerCriticality struct {
	Caller       string
	Default, Max criticality.Tier
}

// tierFromProto converts a wire tier; ok is false for a value outside the
// enum.
func tierFromProto(c sluicev1.Criticality) (criticality.Tier, bool) {
	t := criticality.Tier(c)
	if c < 0 || c > sluicev1.Criticality(criticality.Sheddable) {
		return criticality.None, false
	}
	return t, true
}

// criticalityFromProto converts and checks a policy's criticality; nil
// when m has none. declared are the procedures a default may name.
func criticalityFromProto(m *sluicev1.CriticalityPolicy, dir Direction, declared map[string]struct{}, bad func(field, format string, args ...any)) *CriticalityPolicy {
	if m == nil {
		return nil
	}
	if dir == Outbound {
		// The caller side counts per callee; the callee's tiers are its own.
		bad("criticality", "set in an outbound policy")
	}
	tier := func(field string, c sluicev1.Criticality) criticality.Tier {
		t, ok := tierFromProto(c)
		if !ok {
			bad(field, "unknown value %d", int32(c))
		}
		return t
	}
	c := &CriticalityPolicy{
		Header:  m.GetHeader(),
		Default: tier("criticality.default_tier", m.GetDefaultTier()),
		Max:     tier("criticality.max_tier", m.GetMaxTier()),
	}
	if c.Header == "" {
		c.Header = criticality.DefaultHeader
	}
	checkHeaderKey("criticality.header", c.Header, bad)
	if c.Default == criticality.None {
		c.Default = criticality.Critical
	}
	if n := len(m.GetProcedures()); n > len(declared) {
		bad("criticality.procedures", "%d procedures, more than the policy declares", n)
	} else {
		keys := procedureKeys{section: "criticality.procedures", declared: declared, seen: make(map[string]int, n)}
		for i, pc := range m.GetProcedures() {
			f := "criticality.procedures[" + strconv.Itoa(i) + "]"
			q := ProcedureCriticality{Procedure: pc.GetProcedure(), Default: tier(f+".default_tier", pc.GetDefaultTier())}
			keys.check(i, q.Procedure, bad)
			if pc.GetDefaultTier() == sluicev1.Criticality_CRITICALITY_UNSPECIFIED {
				bad(f+".default_tier", "unspecified: a procedure's entry is its default")
			}
			c.Procedures = append(c.Procedures, q)
		}
	}
	if n := len(m.GetCallers()); n > MaxPolicyPeers {
		bad("criticality.callers", "%d callers, more than the %d a sidecar accepts", n, MaxPolicyPeers)
		return c
	}
	seen := make(map[string]int, len(m.GetCallers()))
	for i, cc := range m.GetCallers() {
		f := "criticality.callers[" + strconv.Itoa(i) + "]"
		k := CallerCriticality{
			Caller:  cc.GetCaller(),
			Default: tier(f+".default_tier", cc.GetDefaultTier()),
			Max:     tier(f+".max_tier", cc.GetMaxTier()),
		}
		if err := names.Check(k.Caller); err != nil {
			bad(f+".caller", "%v", err)
		} else if j, dup := seen[k.Caller]; dup {
			bad(f+".caller", "%q is listed again, first at criticality.callers[%d]", k.Caller, j)
		} else {
			seen[k.Caller] = i
		}
		c.Callers = append(c.Callers, k)
	}
	return c
}

// criticalityProto is the inverse of criticalityFromProto.
func criticalityProto(c *CriticalityPolicy) *sluicev1.CriticalityPolicy {
	if c == nil {
		return nil
	}
	m := &sluicev1.CriticalityPolicy{
		Header:      c.Header,
		DefaultTier: sluicev1.Criticality(c.Default),
		MaxTier:     sluicev1.Criticality(c.Max),
	}
	for _, q := range c.Procedures {
		m.Procedures = append(m.Procedures, &sluicev1.ProcedureCriticality{Procedure: q.Procedure, DefaultTier: sluicev1.Criticality(q.Default)})
	}
	for _, k := range c.Callers {
		m.Callers = append(m.Callers, &sluicev1.CallerCriticality{Caller: k.Caller, DefaultTier: sluicev1.Criticality(k.Default), MaxTier: sluicev1.Criticality(k.Max)})
	}
	return m
}

// tierShift places a leaf's tier beside its procedure index in a table
// index: idx = procedure | tier<<tierShift. Procedure indexes are below
// routes.MaxRoutes+1, far below 1<<tierShift.
const (
	tierShift = 16
	procMask  = 1<<tierShift - 1
)

// leafIndex is the table index of the leaf of procedure index proc and
// tier: proc itself for tier None.
func leafIndex(proc uint32, tier criticality.Tier) uint32 {
	return proc | uint32(tier)<<tierShift
}

// critTable is a policy's CriticalityPolicy compiled for the request
// path, once per policy; nil for a policy without one. Immutable.
type critTable struct {
	header  string // lower case: the gRPC metadata key
	httpKey string // header's canonical form, an http.Header key
	def     criticality.Tier
	max     criticality.Tier // None: no cap
	// procDefault is each procedure's default by procedure index; None:
	// none of its own.
	procDefault []criticality.Tier
	// callers maps a listed caller to its index in callerDefault and
	// callerMax; empty when none are listed, so that a request then
	// hashes nothing.
	callers       nameTable
	callerDefault []criticality.Tier // None: the service's
	callerMax     []criticality.Tier // None: the service's
}

// compileCriticality compiles p's criticality against its procedures;
// nil when it has none. A hand-built policy's values that PolicyFromProto
// would refuse are ignored (unknown procedures, repeated callers) or
// replaced (an invalid default is Critical, an invalid max None).
func compileCriticality(p *Policy, procs *procedures) *critTable {
	if p == nil || p.Criticality == nil {
		return nil
	}
	c := p.Criticality
	valid := func(t criticality.Tier) criticality.Tier {
		if !t.Valid() {
			return criticality.None
		}
		return t
	}
	ct := &critTable{
		header:      cmp.Or(c.Header, criticality.DefaultHeader),
		def:         valid(c.Default),
		max:         valid(c.Max),
		procDefault: make([]criticality.Tier, len(procs.names)),
	}
	ct.httpKey = textproto.CanonicalMIMEHeaderKey(ct.header)
	if ct.def == criticality.None {
		ct.def = criticality.Critical
	}
	for _, q := range c.Procedures {
		if i, ok := procs.index(q.Procedure); ok && q.Procedure != "" {
			ct.procDefault[i] = valid(q.Default)
		}
	}
	var listed []string
	seen := make(map[string]bool, len(c.Callers))
	for _, k := range c.Callers {
		if seen[k.Caller] || !validName(k.Caller) {
			continue
		}
		seen[k.Caller] = true
		listed = append(listed, k.Caller)
		ct.callerDefault = append(ct.callerDefault, valid(k.Default))
		ct.callerMax = append(ct.callerMax, valid(k.Max))
	}
	ct.callers = newNameTable(listed, func(i int) uint32 { return uint32(i) })
	return ct
}

// current reports whether tier is one a leaf of a table compiled with c
// may have: None alone without criticality, one of the four with it.
func (c *critTable) current(tier criticality.Tier) bool {
	if c == nil {
		return tier == criticality.None
	}
	return tier != criticality.None && tier.Valid()
}

// fallback is the tier of a request whose tier a table compiled with c
// does not have (one resolved under an earlier policy): None without
// criticality, else the service's default.
func (c *critTable) fallback() criticality.Tier {
	if c == nil {
		return criticality.None
	}
	return c.def
}

// critOutcome says what resolve made of a request's header.
type critOutcome uint8

const (
	critTaken   critOutcome = iota // a valid header, or none: nothing to count
	critInvalid                    // a header that names no tier: the default taken
	critLowered                    // a claim above the caller's max, lowered
)

// resolve returns the tier of a request of caller to procedure index proc
// whose header value is raw ("": none). It allocates nothing, and hashes
// the caller only when the policy lists callers.
func (c *critTable) resolve(caller string, proc uint32, raw string) (criticality.Tier, critOutcome) {
	ci, listed := uint32(0), false
	if len(c.callers.slots) > 0 && len(caller) <= names.MaxLen {
		ci, listed = c.callers.get(caller)
	}
	out := critTaken
	if raw != "" {
		if t, ok := criticality.Parse(raw); ok {
			max := c.max
			if listed && c.callerMax[ci] != criticality.None {
				max = c.callerMax[ci]
			}
			if t, lowered := criticality.Cap(t, max); lowered {
				return t, critLowered
			}
			return t, critTaken
		}
		out = critInvalid
	}
	d := c.def
	switch {
	case c.procDefault[proc] != criticality.None:
		d = c.procDefault[proc]
	case listed && c.callerDefault[ci] != criticality.None:
		d = c.callerDefault[ci]
	}
	// A caller's max bounds its defaults too: a procedure that defaults
	// above it must not lift a caller that sends no header, or garbage,
	// over what it may claim.
	if listed {
		d, _ = criticality.Cap(d, c.callerMax[ci])
	}
	return d, out
}

// tierIndex returns the table index of a request of peer to procedure
// index proc with header value raw under t, which has criticality: proc
// with the resolved tier, counting an invalid header or a lowered claim.
func (s *ServiceLimiter) tierIndex(t *table, peer string, proc uint32, raw string) uint32 {
	tier, out := t.crit.resolve(peer, proc, raw)
	switch out {
	case critInvalid:
		s.critInvalid.Add(1)
	case critLowered:
		s.critLowered.Add(1)
	}
	return leafIndex(proc, tier)
}

// CriticalityHeader returns the lower-case header (gRPC metadata key) the
// current policy reads a request's tier from; "" when it has no
// criticality, and requests need not be asked.
func (s *ServiceLimiter) CriticalityHeader() string {
	if c := s.table.Load().crit; c != nil {
		return c.header
	}
	return ""
}
