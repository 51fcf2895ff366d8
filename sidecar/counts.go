// Package sidecar is sluice's data plane: it decides every request locally
// from a drop policy it already holds, and counts what it saw.
package sidecar

import "github.com/sluicehq/sluice/pkg/criticality"

// PeerCounts are cumulative counters of one bucket (service, peer,
// procedure, tier) since the Limiter first saw it. Counters only grow; a reporter
// turns successive snapshots into per-window counts.
type PeerCounts struct {
	Peer string
	// Procedure is the leaf's procedure for a service whose policy declares
	// procedures (a declared one or names.Other), "" for a service without
	// and for outbound limiters, whose peers' procedures are the callee's
	// business.
	Procedure string
	// Tier is the leaf's tier for a service whose policy has criticality,
	// as the request's header and the policy's defaults resolved it;
	// None for a service without and for outbound limiters.
	Tier          criticality.Tier
	Offered       uint64 // every request seen, dropped ones included, and for a peer enforced upstream the inferred upstream drops
	Dropped       uint64 // dropped by an enforced ratio, or inferred dropped upstream (rules enforced upstream); a subset of Offered
	ShadowDropped uint64 // a shadow ratio would have dropped; admitted
	// Incarnation tells the lives of one bucket's counters apart: a leaf
	// evicted from the table (LimiterOptions.PeerIdle) and seen again gets
	// fresh counters from zero under a new Incarnation. Two snapshots of a
	// peer can be subtracted only when their Incarnations are equal;
	// otherwise the newer one's counts are all new.
	Incarnation uint64
	// OfferedCost and AdmittedCost are, for a service whose policy counts
	// cost, the bucket's cumulative costs in milli-units (see cost.go and
	// PeerCounts.offered_cost on the wire): the prices of every request
	// decided, and the real costs of the admitted ones as they became
	// known. They wrap: subtract two snapshots of one incarnation in
	// uint64. 0 for a service that has never counted cost.
	OfferedCost, AdmittedCost uint64
	// InFlight is, for a bucket with a concurrency cap, its requests
	// holding a slot at the sidecar now; 0 otherwise.
	InFlight uint32
}
