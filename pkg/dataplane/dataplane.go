// Package dataplane names how the data plane carries out a bucket's drop
// ratio: which data plane enforces it (Enforcement: sluice's sidecar, or one
// upstream of it) and what a sidecar does once its policy has outlived its
// TTL (FailMode).
//
// Both are settings of a limit (limits files, the store, the configurator's
// flags) and fields of a drop policy (what the controller publishes and the
// sidecars enforce), so every tier uses them, and the package imports only
// the standard library. They are not the control law's business: the law
// (pkg/dropratio) computes ratios, whoever carries them out and however
// long they hold, and so it knows neither.
//
// Each type has one text form, used by every edge that reads or writes
// text (limits files, the store's rows, flags, logs): String and
// MarshalText write it, Parse… and UnmarshalText read it. The protobuf
// forms are converted where protobuf is spoken.
package dataplane

import (
	"fmt"
	"strconv"
)

// FailMode is what a sidecar does once its policy has outlived its TTL. The
// zero value is FailOpen, DESIGN.md's default.
type FailMode uint8

const (
	FailOpen  FailMode = iota // ratios decay to zero over the policy's fail-open decay
	FailHold                  // the last ratios stay in force
	FailLocal                 // each sidecar enforces limit / live instances locally
)

var failModeNames = [...]string{FailOpen: "open", FailHold: "hold", FailLocal: "local"}

// String returns the fail mode's name, or "FailMode(n)" for a value that is
// not a fail mode.
func (f FailMode) String() string {
	if int(f) < len(failModeNames) {
		return failModeNames[f]
	}
	return "FailMode(" + strconv.Itoa(int(f)) + ")"
}

// MarshalText returns the fail mode's name; a value that is not a fail mode
// is an error.
func (f FailMode) MarshalText() ([]byte, error) {
	if int(f) < len(failModeNames) {
		return []byte(failModeNames[f]), nil
	}
	return nil, fmt.Errorf("%v is not open, hold or local", f)
}

// UnmarshalText sets f to the fail mode text names; see ParseFailMode.
func (f *FailMode) UnmarshalText(text []byte) error {
	v, err := ParseFailMode(string(text))
	if err != nil {
		return err
	}
	*f = v
	return nil
}

// ParseFailMode returns the fail mode named s: "open", "hold" or "local",
// exactly. Anything else, the empty string included, is an error, never a
// silent open: where a fail mode may be left out, the caller decides what
// that means before parsing.
func ParseFailMode(s string) (FailMode, error) {
	for f, name := range failModeNames {
		if s == name {
			return FailMode(f), nil
		}
	}
	return 0, fmt.Errorf("%q is not open, hold or local", s)
}

// Enforcement says which data plane carries out a bucket's ratio. It is
// declared in the limits, never inferred from the clients that happen to be
// connected, so that every controller replica computes the same policies.
// The zero value is EnforceSidecar.
type Enforcement uint8

const (
	// EnforceSidecar: sluice's own sidecar or interceptors decide, on the
	// callee's side or, enforcing outbound, on the caller's. The default.
	EnforceSidecar Enforcement = iota
	// EnforceUpstream: the caller's proxyless gRPC client or the callee's
	// Envoy drops before a request reaches the callee's sidecar, which then
	// only counts: each arrival as 1/(1−p) offered, p/(1−p) of it dropped
	// upstream (docs/dataplanes.md).
	EnforceUpstream
)

var enforcementNames = [...]string{EnforceSidecar: "sidecar", EnforceUpstream: "upstream"}

// String returns the enforcement's name, or "Enforcement(n)" for a value
// that is not one.
func (e Enforcement) String() string {
	if int(e) < len(enforcementNames) {
		return enforcementNames[e]
	}
	return "Enforcement(" + strconv.Itoa(int(e)) + ")"
}

// MarshalText returns the enforcement's name; a value that is not one is an
// error.
func (e Enforcement) MarshalText() ([]byte, error) {
	if int(e) < len(enforcementNames) {
		return []byte(enforcementNames[e]), nil
	}
	return nil, fmt.Errorf("%v is not sidecar or upstream", e)
}

// UnmarshalText sets e to the enforcement text names; see ParseEnforcement.
func (e *Enforcement) UnmarshalText(text []byte) error {
	v, err := ParseEnforcement(string(text))
	if err != nil {
		return err
	}
	*e = v
	return nil
}

// ParseEnforcement returns the enforcement named s, "sidecar" or
// "upstream", exactly. Anything else, the empty string included, is an
// error.
func ParseEnforcement(s string) (Enforcement, error) {
	for e, name := range enforcementNames {
		if s == name {
			return Enforcement(e), nil
		}
	}
	return 0, fmt.Errorf("%q is not sidecar or upstream", s)
}

// Listed reports whether a drop policy lists a bucket, and so whether a
// sidecar keeps counters of its own for it, never evicted: the bucket has
// a ratio above 0 (enforced or shadow), a limit of its own (limited), or is
// enforced upstream (its arrivals are weighted by the ratio). A share of a
// callee's capacity alone does not list a bucket: once a callee is over its
// capacity every caller has one, made-up names included, so listing them
// would let a flood of names fill every policy and every sidecar of the
// callee. Every consumer reads an unlisted bucket as one at ratio 0 with no
// limit: sidecars admit it, counted as an observed peer, and announce no
// quota; proxyless routes and Envoy's runtime layers give it ratio 0; fail
// mode local has no limit to take a share of. The controller lists by this
// rule on the wire form and sidecars pin by it on theirs, so the two agree.
func Listed(ratio float64, limited bool, e Enforcement) bool {
	return ratio > 0 || limited || e == EnforceUpstream
}

// MaxPolicyPeers bounds the peers of one drop policy: sidecars refuse a
// policy with more (each listed peer has counters in every sidecar of the
// service, about 1 KB with its verdict, so this bounds that memory to about
// 100 MB), and the controller sheds peers rather than publish one. It is the
// scale the design is sized for (100,000 buckets), and below what an xDS
// message of a sidecar's receive limit holds with the longest names.
const MaxPolicyPeers = 100_000
