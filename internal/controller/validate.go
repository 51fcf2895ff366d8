package controller

import (
	"fmt"
	"math"
	"slices"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/zoneload"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/uplink"
)

// Zone loads come from other processes. A zone load's envelope (aggregator
// id, zone, interval) is checked whole: a load that fails it is refused, and
// its aggregator's last one stays. Each service entry is then checked on its
// own: a bad one is left out of the load and counted, and the zone's other
// services are applied, so that one service's bad numbers cost that
// service's buckets, never its neighbours' (issue 13: one service's absurd
// sum used to refuse its whole zone and let web through at twice its limit).

// RejectError says why a zone load, or one service entry of it, was
// refused; Reason is a metric label.
type RejectError struct {
	Reason string
	Detail string
}

func (e *RejectError) Error() string { return e.Reason + ": " + e.Detail }

func reject(reason, format string, args ...any) error {
	return &RejectError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// maxRate bounds any single rate in a zone load: 10^10 rps is more than any
// real fleet sends, so a larger number is a bug or a lie.
const maxRate = zoneload.MaxRate

// maxLiveSidecars bounds the live sidecars one service entry may claim for
// its zone: what an aggregator can hold (its --max-sidecars is at most
// this). The count divides limits under fail mode local and is summed
// across zones, so 2^32−1 from one zone would make every local bucket 0.
const maxLiveSidecars = zoneload.MaxLiveSidecars

// dropSlack is the relative rounding an entry's dropped + shadow-dropped
// rates may exceed its offered rate by: each is a float sum over sidecars
// of count ÷ window, so the sums can differ in their last bits.
const dropSlack = 1e-9

// validateEnvelope checks what a zone load must get right as a whole.
func validateEnvelope(z *sluicev1.ZoneLoad) error {
	if err := names.Check(z.GetAggregatorId()); err != nil {
		return reject("bad_name", "aggregator_id: %v", err)
	}
	if err := names.Check(z.GetZone()); err != nil {
		return reject("bad_name", "zone: %v", err)
	}
	if iv := z.GetInterval(); iv == nil || iv.CheckValid() != nil || iv.AsDuration() < 10*time.Millisecond || iv.AsDuration() > time.Minute {
		return reject("bad_interval", "interval %v is outside [10ms, 1m]", iv.AsDuration())
	}
	return nil
}

// CheckedLoad is a zone load CheckZoneLoad let through, its bad entries
// removed and counted, for ApplyChecked.
type CheckedLoad struct {
	load    *sluicev1.ZoneLoad
	dropped Dropped
}

// CheckZoneLoad does to a zone load what Apply does before it looks at
// the state: it refuses a bad envelope with a *RejectError, and removes,
// and counts, the entries of callees another shard owns (cfg.Shard) and
// the bad ones. It owns load and shares nothing else, so that a
// controller checks each aggregator's loads on that aggregator's stream,
// in parallel, and holds its state only to apply them: at 110,000 buckets
// the check is two thirds of Apply.
func CheckZoneLoad(cfg StateConfig, load *sluicev1.ZoneLoad) (CheckedLoad, error) {
	if err := validateEnvelope(load); err != nil {
		return CheckedLoad{}, err
	}
	c := CheckedLoad{load: load}
	d, id := &c.dropped, load.GetAggregatorId()
	d.NotOwned = keepOwned(load, cfg.Shard)
	errs, bad := keepValidServices(load)
	d.add(id, errs)
	d.BadProcedures, d.BadCriticality = bad.procedures, bad.tiers
	for _, svc := range load.GetServices() {
		keepValidDescriptors(svc, cfg.maxDescriptorValues(), d)
		keepValidHealth(svc, d)
	}
	if d.BadDescriptors != nil {
		d.FirstDescriptor = "aggregator " + id + ": " + d.FirstDescriptor
	}
	if d.BadHealth != nil {
		d.FirstHealth = "aggregator " + id + ": " + d.FirstHealth
	}
	return c, nil
}

// serviceKey names a service entry of a zone load.
type serviceKey struct {
	service string
	dir     sluicev1.Direction
}

// keepValidServices removes the bad service entries from z, in place, and
// returns why each was removed, in the order of the entries; and the counts
// of peer entries it removed from the services it kept (keepValidPeers).
//
// An entry listed twice is removed both times: neither copy is known to be
// the right one, and keeping the first would make the sums depend on the
// wire order of a load that is already wrong. The service's load from this
// zone is missing until its aggregator sends a good one, which costs that
// service alone.
func keepValidServices(z *sluicev1.ZoneLoad) (dropped []*RejectError, badPeers badPeerCounts) {
	count := make(map[serviceKey]int, len(z.GetServices()))
	for _, svc := range z.GetServices() {
		count[serviceKey{svc.GetService(), svc.GetDirection()}]++
	}
	kept := z.Services[:0]
	for i, svc := range z.GetServices() {
		bad := keepValidPeers(svc)
		err := validateService(i, svc)
		if err == nil && count[serviceKey{svc.GetService(), svc.GetDirection()}] > 1 {
			err = &RejectError{Reason: "duplicate_service", Detail: fmt.Sprintf("services[%d]: %s %v listed twice", i, uplink.Truncate(svc.GetService()), svc.GetDirection())}
		}
		if err != nil {
			dropped = append(dropped, err)
			continue
		}
		badPeers.procedures += bad.procedures
		badPeers.tiers += bad.tiers
		kept = append(kept, svc)
	}
	clear(z.Services[len(kept):]) // let the removed entries go
	z.Services = kept
	return dropped, badPeers
}

// ReasonBadProcedure is why a peer entry is removed from a service entry
// that is kept: its procedure is neither "" nor a valid procedure name.
// A metric label.
const ReasonBadProcedure = "bad_procedure"

// ReasonBadCriticality is why a peer entry is removed from a service
// entry that is kept: its criticality is outside the enum. A metric label.
const ReasonBadCriticality = "bad_criticality"

// badPeerCounts counts the peer entries keepValidPeers removed, by reason.
type badPeerCounts struct{ procedures, tiers int }

// keepValidPeers removes from svc, in place, the peer entries whose
// procedure is neither "" nor a valid name (names.ValidProcedure), or
// whose criticality is outside the enum, and returns how many of each.
// Only the entry goes, as an aggregator leaves out such an entry of a
// report: a procedure is a name the controller will fold into the
// callee's declared ones and a tier one it will fold into the callee's
// (foldBuckets), and one it can not even read is no bucket, while the
// callee's other buckets are fine.
func keepValidPeers(svc *sluicev1.ServiceLoad) (bad badPeerCounts) {
	peers := svc.GetPeers()
	kept := peers[:0]
	for _, p := range peers {
		switch c := p.GetCriticality(); {
		case p.GetProcedure() != "" && !names.ValidProcedure(p.GetProcedure()):
			bad.procedures++
		case c < 0 || c > sluicev1.Criticality(criticality.Sheddable):
			bad.tiers++
		default:
			kept = append(kept, p)
		}
	}
	clear(peers[len(kept):])
	if svc != nil {
		svc.Peers = kept
	}
	return bad
}

// validateService checks one service entry, the i-th of its zone load.
func validateService(i int, svc *sluicev1.ServiceLoad) *RejectError {
	fail := func(reason, format string, args ...any) *RejectError {
		return &RejectError{Reason: reason, Detail: fmt.Sprintf("services[%d] (%s): ", i, uplink.Truncate(svc.GetService())) + fmt.Sprintf(format, args...)}
	}
	if err := names.Check(svc.GetService()); err != nil || svc.GetService() == names.Overflow {
		return fail("bad_name", "service: %v", errOr(err, "reserved name"))
	}
	d := svc.GetDirection()
	if d != sluicev1.Direction_DIRECTION_INBOUND && d != sluicev1.Direction_DIRECTION_OUTBOUND {
		return fail("bad_direction", "direction: %v", d)
	}
	if n := svc.GetLiveSidecars(); n > maxLiveSidecars {
		return fail("bad_live_sidecars", "live_sidecars: %d is above %d", n, maxLiveSidecars)
	}
	// Sorted here, as sum and zoneSurged read them: the aggregators send
	// them sorted, and a load that is not is sorted, not refused. So a
	// bucket listed twice is next to itself: a map of every bucket to
	// find one cost the controller half its allocations at 110,000
	// buckets. Indexes in errors are the sorted order's.
	// One comparison of each pair finds both an unsorted load (sorted and
	// walked again) and the first duplicate, which the walk below reports
	// in its turn among the entries' other faults.
	dup := -1
	for sorted := false; !sorted; {
		sorted, dup = true, -1
		for j := 1; j < len(svc.GetPeers()); j++ {
			c := comparePeerRates(svc.Peers[j-1], svc.Peers[j])
			if c > 0 {
				slices.SortFunc(svc.Peers, comparePeerRates)
				sorted = false
				break
			}
			if c == 0 && dup < 0 {
				dup = j
			}
		}
	}
	for j, p := range svc.GetPeers() {
		if err := names.Check(p.GetPeer()); err != nil {
			return fail("bad_name", "peers[%d].peer: %v", j, err)
		}
		if j == dup {
			return fail("duplicate_peer", "peers[%d]: %q procedure %q criticality %v listed twice", j, p.GetPeer(), p.GetProcedure(), p.GetCriticality())
		}
		for _, r := range []struct {
			field string
			v     float64
		}{{"offered_rps", p.GetOfferedRps()}, {"dropped_rps", p.GetDroppedRps()}, {"shadow_dropped_rps", p.GetShadowDroppedRps()}} {
			if math.IsNaN(r.v) || r.v < 0 || r.v > maxRate {
				return fail("bad_rate", "peers[%d].%s: %v is outside [0, %g]", j, r.field, r.v, maxRate)
			}
		}
		for _, r := range []struct {
			field string
			v     float64
		}{{"offered_cost_rps", p.GetOfferedCostRps()}, {"admitted_cost_rps", p.GetAdmittedCostRps()}} {
			if math.IsNaN(r.v) || r.v < 0 || r.v > zoneload.MaxCostRate {
				return fail("bad_rate", "peers[%d].%s: %v is outside [0, %g]", j, r.field, r.v, zoneload.MaxCostRate)
			}
		}
		if off, drop := p.GetOfferedRps(), p.GetDroppedRps()+p.GetShadowDroppedRps(); drop > off*(1+dropSlack)+dropSlack {
			return fail("dropped_above_offered", "peers[%d]: dropped_rps + shadow_dropped_rps = %v is above offered_rps %v", j, drop, off)
		}
	}
	return nil
}

func errOr(err error, s string) any {
	if err != nil {
		return err
	}
	return s
}
