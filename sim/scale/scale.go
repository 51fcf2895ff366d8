// Package scale is the simulator's scale mode: planning past one machine.
//
// It runs the production aggregator and controller cores
// (aggregator.State, controller.State and through it pkg/dropratio) at mesh
// scale — by default 1,100 services × 100 callers (110,000 buckets), 100,000
// sidecars and 80M rps — without generating a single request. Traffic is
// counted: every virtual second each sidecar's counts are derived from the
// per-bucket rates, built into a real LoadReport by the reporter's own step
// (reporter.Window.Tick), sent through protobuf encoding (for its size and
// the aggregator's decoding cost) and applied; aggregators flush, the
// controller ticks, and the policies it publishes set the ratios the
// sidecars drop with in the next second.
//
// Time is virtual (the states take now as an argument); CPU cost is real wall
// time measured around each call, on one goroutine, so the figures are what
// one core of this machine spends. What is counted (rates, policies, bytes)
// is deterministic for a seed; what is timed is not.
package scale

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/pkg/shard"
)

// Config describes the mesh and the run. Intervals are fixed at one second
// (report, flush and tick, DESIGN.md's defaults): the loop advances in whole
// virtual seconds.
type Config struct {
	Services           int     // callees; each has its own sidecars and policy
	Callers            int     // callers per service: buckets = Services × Callers
	Sidecars           int     // sidecars in the mesh, split over services by traffic
	RPS                float64 // total offered rate before the surge
	Zones              int     // zones; a service's sidecars are spread over all of them
	AggregatorsPerZone int     // aggregators in each zone; sidecars are spread round-robin
	Seconds            int     // virtual seconds to run
	Seed               uint64  // seeds the mesh's shape, the surge and the noise
	// Procedures, when above 0, gives every service that many gRPC
	// procedures: each caller's rate is split evenly over them, each
	// (caller, procedure) leaf has its own limit (its share of the
	// caller's, with the same headroom) under the caller's limit across
	// them, and the law computes every leaf (issue #14's nested limits).
	Procedures int
	// ControllerShards splits the callees over that many controller
	// states by pkg/shard, as sharded controller processes do; each
	// aggregator's flush is split per shard. 0 and 1: one controller.
	ControllerShards int

	// Spread is the σ of the log-normal weights that shape the mesh: a
	// service's share of the traffic and of the sidecars, and a caller's
	// share of its service. 0 makes every bucket equal.
	Spread float64
	// Noise is each bucket's per-second relative jitter, uniform in
	// ±Noise: it makes surging buckets' ratios move a little, as real
	// traffic does, so the republish threshold has something to filter.
	Noise float64
	// Headroom sets every bucket's limit to its base rate × (1+Headroom),
	// as the configurator derives limits from peaks.
	Headroom float64
	// SurgeFraction of the buckets multiply their rate by SurgeFactor for
	// SurgeFor seconds starting at second SurgeAt: the law's work.
	SurgeFraction float64
	SurgeFactor   float64
	SurgeAt       int
	SurgeFor      int

	// XDSStreams, when above 0, also publishes every tick's changed
	// policies into a real internal/xdsserver and counts their delivery to
	// that many real sidecar xDS clients (delta, one named subscription
	// each, over in-memory gRPC connections).
	XDSStreams int

	// Controller configures the controller state; its defaults are the
	// controller binary's.
	Controller controller.StateConfig
}

// Default returns issue 4's mesh: 1,100 services × 100 callers, 100,000
// sidecars, 80M rps, 3 zones × 4 aggregators, 30 seconds, 1% of the buckets
// surging 15× (Uber's 22K → 367K) from second 10 to 20.
func Default() Config {
	return Config{
		Services:           1100,
		Callers:            100,
		Sidecars:           100000,
		RPS:                80e6,
		Zones:              3,
		AggregatorsPerZone: 4,
		Seconds:            30,
		Seed:               1,
		Spread:             1,
		Noise:              0.02,
		Headroom:           0.25,
		SurgeFraction:      0.01,
		SurgeFactor:        15,
		SurgeAt:            10,
		SurgeFor:           10,
		Controller:         controller.DefaultConfig().StateConfig,
	}
}

// Small returns a mesh small enough for tests (a second or two under -race)
// with the same shape of run as Default.
func Small() Config {
	c := Default()
	c.Services = 20
	c.Callers = 10
	c.Sidecars = 300
	c.RPS = 200e3
	c.AggregatorsPerZone = 2
	c.SurgeFraction = 0.05
	return c
}

// Buckets is the number of leaves the law computes: (callee, caller)
// pairs, times the procedures when services declare them.
func (c Config) Buckets() int { return c.Services * c.Callers * max(c.Procedures, 1) }

// Aggregators is the number of aggregators in the mesh.
func (c Config) Aggregators() int { return c.Zones * c.AggregatorsPerZone }

// Validate reports every problem at once, naming the flag.
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	// Names are "service-%04d", and callers are other services.
	check(c.Services >= 2 && c.Services <= 10000, "services: %d is outside [2, 10000]", c.Services)
	check(c.Callers >= 1 && c.Callers < c.Services, "callers: %d must be in [1, services−1 = %d]: callers are other services", c.Callers, c.Services-1)
	check(c.Sidecars >= c.Services, "sidecars: %d must be at least services (%d): every service has a sidecar", c.Sidecars, c.Services)
	check(c.Sidecars <= 10_000_000, "sidecars: %d is above 10,000,000", c.Sidecars)
	check(c.RPS > 0 && finite(c.RPS), "rps: %v must be a finite rate > 0", c.RPS)
	check(c.Zones >= 1 && c.Zones <= 100, "zones: %d is outside [1, 100]", c.Zones)
	check(c.AggregatorsPerZone >= 1 && c.AggregatorsPerZone <= 100, "aggregators-per-zone: %d is outside [1, 100]", c.AggregatorsPerZone)
	check(c.Aggregators() <= c.Controller.MaxAggregators, "aggregators: zones × aggregators-per-zone = %d is above the controller's max %d", c.Aggregators(), c.Controller.MaxAggregators)
	check(c.Procedures >= 0 && c.Procedures <= 100, "procedures: %d is outside [0, 100]", c.Procedures)
	check(c.ControllerShards >= 0 && c.ControllerShards <= shard.MaxCount, "controller-shards: %d is outside [0, %d]", c.ControllerShards, shard.MaxCount)
	check(c.Seconds >= 1 && c.Seconds <= 3600, "seconds: %d is outside [1, 3600]", c.Seconds)
	check(c.Spread >= 0 && c.Spread <= 4, "spread: %v is outside [0, 4]", c.Spread)
	check(c.Noise >= 0 && c.Noise < 1, "noise: %v is outside [0, 1)", c.Noise)
	check(c.Headroom >= 0 && finite(c.Headroom), "headroom: %v must be finite and >= 0", c.Headroom)
	check(c.SurgeFraction >= 0 && c.SurgeFraction <= 1, "surge-fraction: %v is outside [0, 1]", c.SurgeFraction)
	check(c.SurgeFactor >= 1 && finite(c.SurgeFactor), "surge-factor: %v must be finite and >= 1", c.SurgeFactor)
	check(c.SurgeAt >= 0, "surge-at: %d is negative", c.SurgeAt)
	check(c.SurgeFor >= 0, "surge-for: %d is negative", c.SurgeFor)
	// Each client costs ~200 KB (gRPC buffers on both ends of its
	// connection): 20,000 is 4 GB.
	check(c.XDSStreams >= 0 && c.XDSStreams <= 20000, "xds-streams: %d is outside [0, 20000]", c.XDSStreams)
	// The loop ticks once a virtual second.
	check(c.Controller.PolicyTTL >= 2*time.Second, "policy-ttl: %v must be at least two ticks (2s)", c.Controller.PolicyTTL)
	check(c.Controller.StaleAfter >= 1, "stale-after: %d must be at least 1", c.Controller.StaleAfter)
	return errors.Join(errs...)
}
