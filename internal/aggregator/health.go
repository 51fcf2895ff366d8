package aggregator

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/zoneload"
	"github.com/sluicehq/sluice/pkg/health"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// Health (issue #18; pkg/health): a sidecar reports what its callee did
// with the requests it admitted, per procedure; the aggregator keeps each
// live sidecar's latest health as it keeps its descriptors, and the zone
// load carries the sums per (service, procedure) as rates. From them the
// controller reads the callee's fleet-wide p99 and error ratio.
//
// A sidecar's word on its callee's health moves every caller's share of
// it, so what one sidecar can claim is bounded by the traffic it saw:
// health answering more than twice the requests the report says reached
// the sidecar, and 10 rps, is left out. Offered, not admitted: the health
// window runs from one regular report to the next, and a surge report
// between them cuts the report's window short, to the seconds after the
// sidecar began dropping; answers counted before it (in the simulator's
// brownout, 16 reports' worth at the cold start) would pass for a claim.

// Reasons a health entry is left out of an accepted report, the rest
// kept. Metric label values, as EntryBadProcedure.
const (
	// EntryBadHealth: a procedure that fails names.ValidProcedure, latency
	// counts that are not health.Buckets long or do not add up to the
	// answers, or in_flight above MaxInFlight.
	EntryBadHealth       = "bad_health"
	EntryDuplicateHealth = "duplicate_health" // a procedure listed again: the first is kept
	EntryTooManyHealth   = "too_many_health"  // beyond maxReportHealth entries
	EntryOutboundHealth  = "outbound_health"  // in an outbound report: a callee's health is its own sidecars' to report
	// EntryHealthOverclaim: the entries answer more requests than reached
	// the sidecar (healthSlack); all of the report's are left out.
	EntryHealthOverclaim = "health_overclaim"
)

// maxReportHealth bounds a report's health entries: a sidecar reports its
// policy's procedures and names.Other, at most routes.MaxRoutes + 1, and
// for a window after a policy change the old ones beside them.
const maxReportHealth = 2 * (routes.MaxRoutes + 1)

// maxZoneHealth bounds a service's health entries in a zone load, the
// largest by answers kept, as maxZoneDescriptors does descriptors.
const maxZoneHealth = maxReportHealth

// healthSlack is how far a report's answered rate may exceed its offered
// rate, relatively and in requests per second: the health window and the
// report's differ at their edges, and requests admitted in one window are
// answered in the next.
const (
	healthSlackFactor = 2.0
	healthSlackRate   = 10.0
)

// healthRate is one procedure's health in a sidecar's latest report, as
// rates.
type healthRate struct {
	procedure        string
	latency          [health.Buckets]float64 // answers per second by bucket
	ok, failed, late float64                 // answers per second
	inFlight         uint32
	answered         float64 // ok + failed + late, for the bound and the cut
}

// checkHealth checks r's health entries and returns the good ones as rates,
// counting in bad what it left out. It never rejects the report.
func (s *State) checkHealth(r *sluicev1.LoadReport, bad *RejectedEntries) []healthRate {
	hs := r.GetHealth()
	if len(hs) == 0 {
		return nil
	}
	if r.GetDirection() != sluicev1.Direction_DIRECTION_INBOUND {
		bad.OutboundHealth += len(hs)
		return nil
	}
	secs := r.GetWindow().AsDuration().Seconds()
	if hw := r.GetHealthWindow(); hw != nil {
		w := hw.AsDuration()
		if hw.CheckValid() != nil || w < s.bounds.MinWindow || w > s.bounds.MaxWindow {
			bad.BadHealth += len(hs)
			return nil
		}
		secs = w.Seconds()
	}
	out := make([]healthRate, 0, min(len(hs), maxReportHealth))
	answered := 0.0
	for _, h := range hs {
		proc := h.GetProcedure()
		switch {
		case proc != "" && proc != names.Other && !names.ValidProcedure(proc),
			len(h.GetLatency()) != health.Buckets, h.GetInFlight() > MaxInFlight, !healthAddsUp(h):
			bad.BadHealth++
			continue
		case slices.ContainsFunc(out, func(o healthRate) bool { return o.procedure == proc }):
			bad.DuplicateHealth++
			continue
		case len(out) == maxReportHealth:
			bad.TooManyHealth++
			continue
		}
		hr := healthRate{procedure: strings.Clone(proc), inFlight: h.GetInFlight(),
			ok: float64(h.GetOk()) / secs, failed: float64(h.GetFailed()) / secs, late: float64(h.GetTimedOut()) / secs}
		for i, n := range h.GetLatency() {
			hr.latency[i] = float64(n) / secs
		}
		hr.answered = hr.ok + hr.failed + hr.late
		answered += hr.answered
		out = append(out, hr)
	}
	if offered := offeredRate(r); answered > offered*healthSlackFactor+healthSlackRate {
		bad.HealthOverclaim += len(out)
		return nil
	}
	return out
}

// healthAddsUp reports whether h's latency counts add up to its answers,
// without overflow.
func healthAddsUp(h *sluicev1.UpstreamHealth) bool {
	var sum uint64
	for _, n := range h.GetLatency() {
		if n > math.MaxUint64-sum {
			return false
		}
		sum += n
	}
	ok, failed, late := h.GetOk(), h.GetFailed(), h.GetTimedOut()
	if failed > math.MaxUint64-ok || late > math.MaxUint64-ok-failed {
		return false
	}
	return sum == ok+failed+late
}

// offeredRate is the requests per second r says reached its sidecar,
// over its peers.
func offeredRate(r *sluicev1.LoadReport) float64 {
	var n uint64
	for _, p := range r.GetPeers() {
		n += min(p.GetOffered(), math.MaxUint64-n)
	}
	return float64(n) / r.GetWindow().AsDuration().Seconds()
}

// keepHealth returns the health a sidecar keeps after report r replaced
// old (nil for a new sidecar), checked as hs, and when it was reported:
// an urgent report carries none and keeps the last, as keepDescriptors.
func keepHealth(old *sidecarLoad, r *sluicev1.LoadReport, hs []healthRate, now time.Time) ([]healthRate, time.Time) {
	if r.GetUrgent() && len(r.GetHealth()) == 0 && old != nil &&
		old.service == r.GetService() && old.direction == r.GetDirection() {
		return old.health, old.healthSeen
	}
	return hs, now
}

// healthLive reports whether sc's health counts at now: the sidecar's
// staleness, measured from its own report.
func (s *State) healthLive(sc *sidecarLoad, now time.Time) bool {
	return len(sc.health) > 0 && now.Sub(sc.healthSeen) <= time.Duration(s.staleAfter)*sc.interval
}

// sumHealth adds up the health of scs per procedure, sorted by procedure,
// at most maxZoneHealth of them (the most answered; State.healthCut counts
// the rest), each rate at most zoneload.MaxRate.
func (s *State) sumHealth(scs []*sidecarLoad) []*sluicev1.HealthRates {
	if len(scs) == 0 {
		return nil
	}
	sums := map[string]*healthRate{}
	for _, sc := range scs {
		for i := range sc.health {
			h := &sc.health[i]
			t := sums[h.procedure]
			if t == nil {
				t = &healthRate{procedure: h.procedure}
				sums[h.procedure] = t
			}
			for b, x := range h.latency {
				t.latency[b] += x
			}
			t.ok += h.ok
			t.failed += h.failed
			t.late += h.late
			t.answered += h.answered
			t.inFlight += min(h.inFlight, math.MaxUint32-t.inFlight)
		}
	}
	procs := slices.Collect(maps.Keys(sums))
	if len(procs) > maxZoneHealth {
		slices.SortFunc(procs, func(a, b string) int {
			return cmp.Or(cmp.Compare(sums[b].answered, sums[a].answered), strings.Compare(a, b))
		})
		s.healthCut += len(procs) - maxZoneHealth
		procs = procs[:maxZoneHealth]
	}
	slices.Sort(procs)
	out := make([]*sluicev1.HealthRates, len(procs))
	for i, p := range procs {
		t := sums[p]
		hr := &sluicev1.HealthRates{Procedure: p, LatencyRps: make([]float64, health.Buckets),
			OkRps: min(t.ok, zoneload.MaxRate), FailedRps: min(t.failed, zoneload.MaxRate), TimedOutRps: min(t.late, zoneload.MaxRate), InFlight: t.inFlight}
		for b, x := range t.latency {
			hr.LatencyRps[b] = min(x, zoneload.MaxRate)
		}
		out[i] = hr
	}
	return out
}
