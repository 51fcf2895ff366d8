package controller

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/health"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
	"github.com/sluicehq/sluice/pkg/uplink"
)

// Health (issue #18; pkg/health): zone loads carry what each callee did
// with the requests its sidecars let through, per procedure, as rates on
// a fixed latency scale. The controller adds them up over zones, per
// callee and per procedure the callee declares (others fold into
// names.Other, as its buckets' do), and reads each one's fleet-wide p99
// and error ratio off the sums, for its metrics and for a capacity
// estimated from an objective (adaptive.go).

// MaxHealthEntries bounds a service entry's health entries: an aggregator
// sends at most this many (its maxZoneHealth).
const MaxHealthEntries = 2 * (routes.MaxRoutes + 1)

// Reasons a health entry of an applied service entry is left out, metric
// label values of sluice_controller_health_entries_rejected_total.
const (
	ReasonHealthOutbound  = "outbound"         // health on an outbound entry
	ReasonHealthProcedure = "bad_procedure"    // a procedure that fails names.ValidProcedure
	ReasonHealthBuckets   = "bad_buckets"      // latency_rps not health.Buckets long
	ReasonHealthRate      = "bad_rate"         // a rate that is NaN, negative or above MaxRate, or in_flight above 2^30
	ReasonHealthMismatch  = "latency_mismatch" // latency rates that do not add up to the answers
	ReasonHealthDuplicate = "duplicate_health" // a procedure listed twice: neither is kept
	ReasonHealthTooMany   = "too_many_health"  // beyond MaxHealthEntries
)

const (
	// healthSumSlack and healthSumSlackRPS are how far, relatively and
	// absolutely, latency rates may miss the answers they add up to:
	// float sums of rates, taken in another order.
	healthSumSlack, healthSumSlackRPS = 1e-6, 1e-6
	// healthInFlightBound bounds the requests in flight a zone may claim
	// for one procedure.
	healthInFlightBound = 1 << 30
	// healthMinAnswered is the answers per second under which a p99 says
	// nothing.
	healthMinAnswered = 1.0
)

// keepValidHealth removes from svc, in place, its bad health entries,
// counting each by reason in d. A duplicated procedure is removed every
// time it appears.
func keepValidHealth(svc *sluicev1.ServiceLoad, d *Dropped) {
	hs := svc.GetHealth()
	if len(hs) == 0 {
		return
	}
	if svc.GetDirection() != sluicev1.Direction_DIRECTION_INBOUND {
		d.addHealth(ReasonHealthOutbound, len(hs), "%s: health on an outbound entry", uplink.Truncate(svc.GetService()))
		svc.Health = nil
		return
	}
	count := make(map[string]int, len(hs))
	for _, h := range hs {
		count[h.GetProcedure()]++
	}
	kept := hs[:0]
	for _, h := range hs {
		proc := h.GetProcedure()
		switch {
		case proc != "" && proc != names.Other && !names.ValidProcedure(proc):
			d.addHealth(ReasonHealthProcedure, 1, "%s: health of procedure %q", uplink.Truncate(svc.GetService()), uplink.Truncate(proc))
		case len(h.GetLatencyRps()) != health.Buckets:
			d.addHealth(ReasonHealthBuckets, 1, "%s: health of %q: %d latency buckets, want %d", uplink.Truncate(svc.GetService()), uplink.Truncate(proc), len(h.GetLatencyRps()), health.Buckets)
		case !validHealthRates(h):
			d.addHealth(ReasonHealthRate, 1, "%s: health of %q: a rate out of range", uplink.Truncate(svc.GetService()), uplink.Truncate(proc))
		case !healthAddsUp(h):
			d.addHealth(ReasonHealthMismatch, 1, "%s: health of %q: latency rates do not add up to the answers", uplink.Truncate(svc.GetService()), uplink.Truncate(proc))
		case count[proc] > 1:
			d.addHealth(ReasonHealthDuplicate, 1, "%s: health of %q listed %d times", uplink.Truncate(svc.GetService()), uplink.Truncate(proc), count[proc])
		case len(kept) == MaxHealthEntries:
			d.addHealth(ReasonHealthTooMany, 1, "%s: health beyond %d procedures", uplink.Truncate(svc.GetService()), MaxHealthEntries)
		default:
			kept = append(kept, h)
		}
	}
	clear(hs[len(kept):])
	svc.Health = kept
}

func validHealthRates(h *sluicev1.HealthRates) bool {
	for _, x := range h.GetLatencyRps() {
		if !isRate(x) {
			return false
		}
	}
	return isRate(h.GetOkRps()) && isRate(h.GetFailedRps()) && isRate(h.GetTimedOutRps()) && h.GetInFlight() <= healthInFlightBound
}

// healthAddsUp reports whether h's latency rates add up to its answers,
// within the rounding of rates summed in another order.
func healthAddsUp(h *sluicev1.HealthRates) bool {
	sum := 0.0
	for _, x := range h.GetLatencyRps() {
		sum += x
	}
	answered := h.GetOkRps() + h.GetFailedRps() + h.GetTimedOutRps()
	return math.Abs(sum-answered) <= healthSumSlack*max(sum, answered)+healthSumSlackRPS
}

// addHealth counts n health entries left out for reason, and keeps the
// first one's detail for a log line, as addDescriptor does.
func (d *Dropped) addHealth(reason string, n int, format string, args ...any) {
	if d.BadHealth == nil {
		d.BadHealth = map[string]int{}
		d.FirstHealth = fmt.Sprintf(reason+": "+format, args...)
	}
	d.BadHealth[reason] += n
}

// UpstreamHealth is what a callee (or one of its procedures) did with the
// requests the fleet's sidecars let through, over their last reports.
type UpstreamHealth struct {
	OK, Failed, TimedOut float64       // answers per second, by outcome
	InFlight             float64       // requests sent and not answered, summed over zones
	P99                  time.Duration // the answers' p99; 0 unless HasP99
	HasP99               bool          // at least healthMinAnswered answers a second to read it from
}

// Answered is the answers per second.
func (h UpstreamHealth) Answered() float64 { return h.OK + h.Failed + h.TimedOut }

// Errors is the share of answers that failed or timed out; 0 without any.
func (h UpstreamHealth) Errors() float64 {
	if a := h.Answered(); a > 0 {
		return (h.Failed + h.TimedOut) / a
	}
	return 0
}

// healthSums is one callee's or procedure's health summed over zones.
type healthSums struct {
	latency              [health.Buckets]float64
	ok, failed, timedOut float64
	inFlight             float64
}

func (t *healthSums) add(h *sluicev1.HealthRates) {
	for i, x := range h.GetLatencyRps() {
		t.latency[i] += x
	}
	t.ok += h.GetOkRps()
	t.failed += h.GetFailedRps()
	t.timedOut += h.GetTimedOutRps()
	t.inFlight += float64(h.GetInFlight())
}

func (t *healthSums) health() UpstreamHealth {
	h := UpstreamHealth{OK: t.ok, Failed: t.failed, TimedOut: t.timedOut, InFlight: t.inFlight}
	if h.Answered() >= healthMinAnswered {
		h.P99, h.HasP99 = health.Quantile(t.latency[:], 0.99)
	}
	return h
}

// sumHealth adds up the live aggregators' health, in sorted aggregator
// order (replicas agree to the bit), per callee and procedure: the
// callee's declared procedures, names.Other for the rest, and "" for the
// callee as a whole (which, for a callee without procedures, is its one
// entry).
func (s *State) sumHealth(set *limits.Set) map[ServiceProcedure]UpstreamHealth {
	sums := map[ServiceProcedure]*healthSums{}
	at := func(k ServiceProcedure) *healthSums {
		t := sums[k]
		if t == nil {
			t = &healthSums{}
			sums[k] = t
		}
		return t
	}
	for _, id := range slices.Sorted(maps.Keys(s.aggs)) {
		for _, svc := range s.aggs[id].load.GetServices() {
			if len(svc.GetHealth()) == 0 || svc.GetDirection() != sluicev1.Direction_DIRECTION_INBOUND {
				continue
			}
			name := svc.GetService()
			lim := set.Service(name)
			for _, h := range svc.GetHealth() {
				at(ServiceProcedure{name, ""}).add(h)
				if !lim.HasProcedures() {
					continue
				}
				proc := h.GetProcedure()
				if !slices.Contains(lim.Declared, proc) {
					proc = names.Other
				}
				at(ServiceProcedure{name, proc}).add(h)
			}
		}
	}
	out := make(map[ServiceProcedure]UpstreamHealth, len(sums))
	for k, t := range sums {
		out[k] = t.health()
	}
	return out
}
