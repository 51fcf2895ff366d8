// Package adaptive estimates the rate a callee can admit from its health
// against an objective (issue #18): a callee that declares
// `slo: {latency_p99: 200ms, errors: 1%}` instead of a capacity gets one
// estimated from what its fleet does now.
//
// It is a pure law, like pkg/dropratio: no goroutines, no clocks, no I/O,
// no logging. Elapsed time arrives as an argument to [Estimator.Step], with
// one tick's fleet-wide [Sample] of the callee, and the only state is the
// [Estimator]'s. A hostile or broken sample (dt ≤ 0, NaN, infinite or
// negative figures, no traffic) leaves the estimate as it was; no input
// makes it NaN, infinite or negative.
//
// # The rule
//
// The estimate C is a rate, in requests per second. It moves by an
// increase/decrease rule on rates, closer to TCP CUBIC's than to plain AIMD,
// with a latency gradient sizing each decrease as Netflix's Gradient2 does.
// Each tick it reads, besides the objective, G, the callee's goodput (the
// median of the last three ticks), and whether it queues: whether its p99
// shows a queue (it is more than a quarter of the way from its latency
// without a queue to the aim; without a latency objective, twice that
// latency) that is not draining (the callee answered no
// more requests than it was admitted). With T the aim, Aim (0.8) of the
// objective's latency (and of its errors):
//
//   - Decrease, when the tick's p99 or errors violate the objective, or its
//     p99 is above T while the callee queues: C = min(C, G)·g, g the
//     gradient T/p99 (Aim·errors/errors for errors, the smaller), clamped to
//     [MinDecrease, 1]. Back to what the callee delivered, less what its
//     excess latency says: the queue an overload built must drain, which
//     takes admitting less than the goodput for a while. G at a decrease is
//     the knee K the estimator remembers. While the queue a decrease
//     left drains (the callee answers more than it is admitted) the p99
//     still shows it: the estimator holds rather than cut again for the
//     same overload.
//   - Trim, when the objective holds but the callee queues: C = min(C, G)·(1
//     − Increase), just under the knee it showed, before the queue costs
//     latency, and K = G. A probe past the knee ends here, a few per cent
//     above it. A trim is a probe's size and does not hold off the next
//     decrease (Settle): a queue that goes on growing is cut on the next
//     tick.
//     Rates alone would be too noisy for this: a fleet's admitted and
//     answered rates differ by more than a probe's queue; the latency tells.
//   - Single-tick noise: a bad tick (one that decreases) after a good one
//     costs at most a tenth of C (NoiseDecrease) and does not move K; only
//     a second one in a row takes the whole gradient, judged on the median
//     p99 and errors of the last three ticks.
//   - Increase, only while the objective holds under its aim, the callee is
//     limited by the estimate (offered above C, admitted at least 9/10 of
//     it) and its p99 has settled: no further than a quarter of the way
//     from its latency without a queue (the lowest p99 seen, or the p99
//     while it is admitted well under K; Envoy's adaptive concurrency
//     compares latency with a minimum it measures too) to T, so that the
//     queue the last probe built has drained. Below K, C returns toward
//     just under it, K·(1 − Increase), fast, half the gap every Recovery
//     (300ms), as CUBIC returns to its last window; from there it probes
//     by Increase (2 %), and past K by half that for the first two probes:
//     a probe past the knee builds a queue at the probe's size for as long
//     as the loop takes to show it (3 s through the real loop), and half a
//     probe keeps that queue within the objective. Probes past K that the
//     p99 let pass say the knee moved: the probe speeds up, by Increase
//     every second probed, to MaxIncrease (10 %/s) once 10 % past K and
//     to twice Increase nearer, so that a callee recovered from a
//     brownout is found in tens of seconds and a knee remembered a little
//     low is not overrun by a sped-up probe.
//   - No inflation without evidence: a callee offered less than C is not
//     limited by it and C holds. C starts at, and never exceeds,
//     CapMultiple (2) times the highest goodput seen healthy or at a
//     decrease.
//   - A floor: C never goes below max(MinRate, FloorFraction·the last
//     healthy goodput). An objective the callee misses whatever its load (a
//     bad deploy answering errors) sheds it to the floor, not to zero.
//
// One decision a Period (a second): the controller may tick more often (a
// surge brings its ticks forward) but its fleet's health changes once a
// report interval, and a decision taken again on the same health would
// compound it. Steps in between hold the estimate, and a step that comes
// late is still one decision: a probe it takes goes no further than one
// on time (the return toward the knee, bounded by it, takes the time it
// was given).
//
// A step waits to show: after a confirmed decrease the estimator does not
// decrease again until a sample shows the callee admitted no more than
// the new estimate, and after a probe it does not probe again until a
// sample shows the callee admitted more (each wait at most 5 s), and,
// past the knee, one sample more at the new rate, whose p99 shows the
// probe's queue. A fleet's samples lag its decisions by a tick and a
// report window, more on a busy machine; without the wait the estimator
// cut for an overload it had already answered (a callee offered twice its
// knee went to a fifth of it through the real loop) and probed past the
// knee by several steps (12 % in a tick, the p99 past the objective for
// seconds). Config.Settle adds a least wait.
//
// On the modelled knee of internal/testkit/knee (a fluid queue, one tick a
// second), a cold start offered twice the knee settles within 10 % of it,
// the p99 within the objective, in 3 to 4 ticks, and then runs a sawtooth
// from 2 % under the knee to 2 % over it; a capacity halved is found in 5
// ticks, one doubled again in 19, with no overshoot past 10 %. Measured
// through ±2 % noise on the rates (±6 % on the p99) it still settles within
// 10 %, in 3 ticks, then stays within −5 % and +3 %; through ±5 %, within
// 10 % (−9 % to +8 %).
//
// Why not a concurrency limit, as Envoy's adaptive concurrency and
// Netflix's concurrency-limits use? They run in one process, on one host's
// requests in flight; the controller sees the fleet's rates, gives the
// water-filling a rate, and has the objective declared. And why not plain
// AIMD (add a constant, halve)? Halving a callee offered twice its knee
// costs many ticks of adding back, while remembering the goodput it showed
// at its knee and returning to it fast finds the knee within a few ticks
// and then probes by a few per cent.
package adaptive

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Objective is what a callee declares it must meet: a p99 latency and an
// error ratio. Either may be 0, unset; not both.
type Objective struct {
	LatencyP99 time.Duration
	Errors     float64 // ratio of failed requests, in [0, 1)
}

// Validate reports every field out of range at once, naming it.
func (o Objective) Validate() error {
	var errs []error
	if o.LatencyP99 < 0 {
		errs = append(errs, fmt.Errorf("latency_p99: %v, want 0 (unset) or above", o.LatencyP99))
	}
	if !(o.Errors >= 0 && o.Errors < 1) {
		errs = append(errs, fmt.Errorf("errors: %v, want 0 (unset) or a ratio in (0, 1)", o.Errors))
	}
	if o.LatencyP99 == 0 && o.Errors == 0 {
		errs = append(errs, errors.New("latency_p99, errors: neither is set"))
	}
	return errors.Join(errs...)
}

// Sample is one tick's fleet-wide measurement of a callee.
type Sample struct {
	Offered  float64       // requests per second sent to it, dropped ones included
	Admitted float64       // requests per second that reached it
	Goodput  float64       // requests per second it answered successfully
	P99      time.Duration // p99 latency of its answers
	Errors   float64       // ratio of its answers that failed, in [0, 1]
	InFlight float64       // requests in flight at the end of the tick; checked, not used by the rule yet
}

// valid says whether s carries information: finite, in range, with
// traffic that reached the callee and came back.
func (s Sample) valid() bool {
	for _, v := range [...]float64{s.Offered, s.Admitted, s.Goodput, s.InFlight} {
		if !(v >= 0) || math.IsInf(v, 1) {
			return false
		}
	}
	return s.P99 >= 0 && s.Errors >= 0 && s.Errors <= 1 && s.Admitted > 0 && (s.Goodput > 0 || s.Errors > 0)
}

// Reason says what the last step did to the estimate.
type Reason uint8

const (
	NoData     Reason = iota // the sample said nothing: the estimate held
	Holding                  // held: not limited by it, above the aim without a queue, or a queue draining
	ProbingUp                // healthy and limited by the estimate: raised
	BackingOff               // lowered: the objective violated, or a queue building
)

var reasonNames = [...]string{NoData: "no_data", Holding: "holding", ProbingUp: "probing_up", BackingOff: "backing_off"}

// String returns the reason's snake_case name, fit for a metric label.
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Estimate is a step's result.
type Estimate struct {
	// Capacity is the rate the callee is estimated to admit within its
	// objective, in requests per second: finite and ≥ 0, 0 until the first
	// sample with traffic.
	Capacity float64
	Reason   Reason
}

// Config tunes an Estimator. Build it from DefaultConfig.
type Config struct {
	Objective Objective
	// Aim is the fraction of each objective the estimate aims at, in
	// (0, 1].
	Aim float64
	// MinRate is the lowest estimate, in requests per second, > 0.
	MinRate float64
	// FloorFraction of the last healthy goodput is also a floor, in [0, 1).
	FloorFraction float64
	// CapMultiple times the highest goodput seen healthy caps the estimate,
	// ≥ 1.
	CapMultiple float64
	// MinDecrease is the deepest single decrease, a factor in (0, 1).
	MinDecrease float64
	// NoiseDecrease is the deepest decrease after one violated tick
	// following a healthy one, in [MinDecrease, 1].
	NoiseDecrease float64
	// Recovery is the half-life of the return toward the remembered knee,
	// > 0.
	Recovery time.Duration
	// Settle is how long after a decrease the estimator waits before it
	// decreases again, and after a probe past the knee before the next
	// one, ≥ 0: a loop whose samples lag its decisions (a
	// fleet's reports cover the window before its sidecars had the
	// policy) shows the overload a decrease answered for a tick or two
	// more, and cutting again for it took a callee offered twice its knee
	// to a fifth of it, and probing a second ahead of what it saw ran
	// past the knee by several steps. Meanwhile the goodput it shows still
	// teaches the knee. 0 in a loop that samples what it decided.
	Settle time.Duration
	// Increase is the first probe's rate, per second, and how much it grows
	// each second of probing, > 0.
	Increase float64
	// MaxIncrease is the fastest probe, per second, ≥ Increase.
	MaxIncrease float64
	// Period is the least time between two decisions, ≥ 0: steps closer
	// together than that hold the estimate and leave their time to the
	// next. A fleet's health changes once a report interval; the
	// controller ticks more often while a surge brings its ticks forward,
	// and every one of those ticks reads the same health again. Without a
	// period each would take the last decrease again, on the same
	// evidence: in the simulator's brownout scenario, 7,600 rps cut to 119
	// in the 300 ms after the controller's warm-up (six halvings, one an
	// urgent tick).
	Period time.Duration
}

// DefaultConfig returns the defaults for obj.
func DefaultConfig(obj Objective) Config {
	return Config{
		Objective:     obj,
		Aim:           0.8,
		MinRate:       1,
		FloorFraction: 0.1,
		CapMultiple:   2,
		MinDecrease:   0.5,
		NoiseDecrease: 0.9,
		Recovery:      300 * time.Millisecond,
		Increase:      0.02,
		MaxIncrease:   0.1,
		Period:        time.Second,
	}
}

// Validate reports every field out of range at once, naming it and its
// bound.
func (c Config) Validate() error {
	errs := []error{}
	if err := c.Objective.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("objective: %w", err))
	}
	bad := func(name string, v float64, ok bool, want string) {
		if !ok || math.IsNaN(v) {
			errs = append(errs, fmt.Errorf("%s: %v, want %s", name, v, want))
		}
	}
	bad("aim", c.Aim, c.Aim > 0 && c.Aim <= 1, "in (0, 1]")
	bad("min_rate", c.MinRate, c.MinRate > 0 && !math.IsInf(c.MinRate, 1), "above 0, finite")
	bad("floor_fraction", c.FloorFraction, c.FloorFraction >= 0 && c.FloorFraction < 1, "in [0, 1)")
	bad("cap_multiple", c.CapMultiple, c.CapMultiple >= 1 && !math.IsInf(c.CapMultiple, 1), "at least 1, finite")
	bad("min_decrease", c.MinDecrease, c.MinDecrease > 0 && c.MinDecrease < 1, "in (0, 1)")
	bad("noise_decrease", c.NoiseDecrease, c.NoiseDecrease >= c.MinDecrease && c.NoiseDecrease <= 1, "in [min_decrease, 1]")
	if c.Recovery <= 0 {
		errs = append(errs, fmt.Errorf("recovery: %v, want above 0", c.Recovery))
	}
	if c.Settle < 0 {
		errs = append(errs, fmt.Errorf("settle: %v, want 0 or above", c.Settle))
	}
	bad("increase", c.Increase, c.Increase > 0 && c.Increase <= 1, "in (0, 1]")
	bad("max_increase", c.MaxIncrease, c.MaxIncrease >= c.Increase && c.MaxIncrease <= 1, "in [increase, 1]")
	if c.Period < 0 {
		errs = append(errs, fmt.Errorf("period: %v, want 0 or above", c.Period))
	}
	return errors.Join(errs...)
}

// Estimator is one callee's estimate and what it remembers. Its zero value
// is not ready: use New.
type Estimator struct {
	cfg Config

	est  Estimate
	knee float64 // goodput at the last decrease: the knee remembered
	peak float64 // highest goodput seen healthy or at a decrease: the cap's base
	good float64 // the last healthy goodput: the floor's base

	// The last three valid ticks' figures, a ring; n of them are held.
	p99, errs, goodput [3]float64
	n, next            int

	base    float64       // the callee's p99 without a queue, in seconds: see Step
	pending time.Duration // valid steps' time since the last decision, under Period
	wasBad  bool          // the last decision's tick was bad: the objective violated, or above the aim while queueing
	lowered bool          // the last valid tick lowered the estimate, or held while its queue drained
	probing float64       // seconds probed past the knee in a row: the probe's speed-up
	settle  float64       // seconds left before another decrease (Config.Settle)
	paced   float64       // seconds left before another probe past the knee (Config.Settle)
	// downTo is the estimate of the last decrease until a sample shows
	// the callee admitted no more than it; upTo that of the last probe
	// until a sample shows it admitted that much (or was offered less).
	// Until then the loop has not carried the step out, and what the
	// samples show is the step before's: the estimator neither
	// decreases again nor probes, however long its loop's lag.
	downTo, upTo float64
	upFrom       float64 // the estimate before the probe to upTo
	awaited      float64 // seconds since the step downTo or upTo waits for
}

// New returns an estimator with no estimate yet.
func New(cfg Config) (*Estimator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("adaptive config: %w", err)
	}
	return &Estimator{cfg: cfg}, nil
}

// Estimate returns the last step's estimate.
func (e *Estimator) Estimate() Estimate { return e.est }

// Step takes one tick of dt in which the callee did s, and returns the
// new estimate.
func (e *Estimator) Step(dt time.Duration, s Sample) Estimate {
	if dt <= 0 || !s.valid() {
		e.est.Reason = NoData
		return e.est
	}
	cfg := e.cfg
	if e.pending += dt; e.est.Capacity > 0 && e.pending < cfg.Period-cfg.Period/earlyTick {
		e.est.Reason = Holding // too soon after the last decision
		return e.est
	}
	secs := e.pending.Seconds()
	e.pending = 0
	e.settle = max(e.settle-secs, 0)
	e.paced = max(e.paced-secs, 0)
	e.p99[e.next], e.errs[e.next], e.goodput[e.next] = s.P99.Seconds(), s.Errors, s.Goodput
	e.next = (e.next + 1) % len(e.p99)
	e.n = min(e.n+1, len(e.p99))
	p99, errs, goodput := median(e.p99, e.n), median(e.errs, e.n), median(e.goodput, e.n)

	lat, errObj := cfg.Objective.LatencyP99.Seconds(), cfg.Objective.Errors
	aimLat, aimErrs := cfg.Aim*lat, cfg.Aim*errObj
	raw := s.P99.Seconds()
	violated := lat > 0 && raw > lat || errObj > 0 && s.Errors > errObj
	aboveAim := lat > 0 && raw > aimLat || errObj > 0 && s.Errors > aimErrs

	// The callee answers fewer than it was admitted: a queue is
	// building. It answers more: the queue a decrease left is draining.
	answered := s.Admitted * (1 - s.Errors)
	growing := answered > s.Goodput*(1+slack)
	draining := answered < s.Goodput*(1-slack)

	// The callee's latency without a queue, base, is the lowest p99 seen,
	// or the median p99 while it is admitted well under the knee it showed
	// and no queue grows or drains: probing waits until the queue the last
	// probe built has drained (as Envoy's adaptive concurrency compares
	// latency with the minimum it measured), and a callee that has become
	// slower without a queue (a brownout's slow database) is seen so.
	unloaded := !growing && !draining && (e.knee == 0 || answered < (1-2*slack)*e.knee)
	switch {
	case unloaded:
		e.base = p99
	case e.base == 0 || raw < e.base:
		e.base = raw
	}
	// Without a latency objective a queue still shows: as a p99 twice
	// the base.
	settled := raw <= 2*e.base
	if lat > 0 {
		settled = raw <= e.base+(aimLat-e.base)/4
	}
	// The callee queues when its latency shows a queue (its p99 has not
	// settled) that is not plainly draining: rates alone are too noisy to
	// tell a queue growing by a few per cent of a tick from a fleet's
	// measurement, and a trim costs less than a queue missed.
	queueing := !settled && answered > s.Goodput*(1-slack/10)

	c := e.est.Capacity
	first := c == 0
	reason, held := Holding, false
	deep := false // a confirmed decrease: the next waits for it to show
	bad := violated || aboveAim && queueing
	switch {
	case bad:
		if draining && e.lowered || e.settle > 0 || e.downTo > 0 {
			// The latency lags the last decrease: wait for it. What
			// the callee answers meanwhile, overloaded, is its knee:
			// the median of its last ticks, as at a decrease, for the
			// highest of a few noisy ticks would overstate it, and the
			// return to the knee would then build a queue.
			held = true
			e.knee = max(e.knee, goodput)
			e.peak = max(e.peak, goodput)
			break
		}
		confirmed := first || e.wasBad
		sig, sigErrs := raw, s.Errors
		if confirmed {
			sig, sigErrs = p99, errs
		}
		g := 1.0
		if lat > 0 && sig > aimLat {
			g = aimLat / sig
		}
		if errObj > 0 && sigErrs > aimErrs {
			g = min(g, aimErrs/sigErrs)
		}
		if !confirmed {
			// One tick costs at most a tenth, and teaches nothing of the
			// knee.
			c = max(e.lower(c, goodput, min(max(g, cfg.MinDecrease), 1)), c*cfg.NoiseDecrease)
		} else {
			c = e.decrease(c, goodput, min(max(g, cfg.MinDecrease), 1))
			deep = true
		}
		reason = BackingOff
	case first:
		// Not limited yet: as far as the goodput seen allows.
		e.peak = goodput
		if !aboveAim {
			e.good = goodput
		}
		c = cfg.CapMultiple * goodput
	case aboveAim:
		e.probing = 0 // above the aim, not queueing: hold
	case queueing:
		// Healthy, but admitted past its knee: back to just under the
		// goodput before the queue costs latency. A trim is a probe's
		// size and sets no Settle: a queue that goes on growing past the
		// aim must be cut on the next tick, not held for what the trim
		// did (through the real loop on a busy machine, a trim's wait
		// kept the p99 past the objective for four seconds).
		e.good = goodput
		c = e.trim(c, goodput, 1-cfg.Increase)
		reason = BackingOff
	default:
		e.peak = max(e.peak, goodput)
		e.good = goodput
		if !(s.Offered > c && s.Admitted >= 0.9*c) {
			e.probing = 0
			break // not limited by the estimate: no evidence for more
		}
		if !settled {
			break // a queue is left: wait for it
		}
		reason = ProbingUp
		// Back to just under the knee, not onto it: the knee was
		// measured overloaded and a machine (or a callee) that has since
		// slowed answers a little less; from there a probe finds it.
		if under := e.knee * (1 - cfg.Increase); c < under*(1-cfg.Increase/2) {
			c += (under - c) * (1 - math.Exp2(-secs/cfg.Recovery.Seconds()))
			if c >= under*(1-cfg.Increase/2) {
				c = under
			}
			break
		}
		if e.paced > 0 || e.upTo > 0 {
			// The last probe has not shown yet. Far from the knee too:
			// probes sped up there and taken each tick before the last
			// showed went 12 % past the knee in a tick through the real
			// loop, their queue not yet in the p99.
			reason = Holding
			break
		}
		rate := min(cfg.Increase*(1+e.probing), cfg.MaxIncrease)
		switch {
		case c >= e.knee && e.probing < halfProbes:
			// The first probes past the knee it showed are half probes:
			// their queue grows at the probe's size for as long as the
			// loop takes to see it, a few seconds, and at a knee that
			// has not moved half a probe keeps that queue within the
			// objective.
			rate = cfg.Increase / 2
		case c <= e.knee*(1+farFromKnee):
			// Probes that the p99 let pass past the knee are evidence
			// that it moved: the next ones speed up, but near it by
			// twice a probe at most. A knee remembered a few per cent
			// low (a trim's noisy goodput) lets small probes pass up to
			// the real one, and a sped-up probe then went 8 % past it in
			// a step through the real loop, the p99 past the objective
			// for three seconds.
			rate = min(rate, nearKneeProbes*cfg.Increase)
		}
		// A probe is one decision's: a step that comes late (a busy
		// machine's tick) does not probe further for it.
		if cfg.Period > 0 {
			secs = min(secs, cfg.Period.Seconds())
		}
		e.upFrom = c
		c *= 1 + min(rate*secs, 1)
		e.paced = cfg.Settle.Seconds()
		e.upTo, e.awaited = c, -secs // its wait starts with the next sample
		if c > e.knee {
			e.probing = min(e.probing+secs, 1e6)
		}
	}
	e.wasBad = bad
	e.lowered = reason == BackingOff || held
	// This sample showed the last steps carried out, or the wait for
	// them ran out (a loop that can not carry a step out, say a tier the
	// law keeps whatever the capacity, must not freeze the estimate): the
	// next may act.
	e.awaited += secs
	if e.downTo > 0 && (s.Admitted <= e.downTo*(1+slack) || e.awaited >= maxAwait) {
		e.downTo = 0
	}
	// A probe is a few per cent: it shows once the callee admits more
	// than halfway from the estimate before it. Its latency shows later:
	// a queue of a few per cent of the knee takes a tick or two to reach
	// the p99, and a probe taken on the tick the rate showed ran past
	// the knee by a probe more before the first one's queue was seen
	// (through the real loop on a busy machine: p99 past the objective
	// for three seconds). The next probe waits for probeSamples samples
	// at the new rate.
	if e.upTo > 0 && (s.Admitted >= (e.upFrom+e.upTo)/2 || s.Offered < e.upTo || e.awaited >= maxAwait) {
		if s.Admitted >= (e.upFrom+e.upTo)/2 && e.upTo > e.knee && e.upTo <= e.knee*(1+farFromKnee) {
			e.paced = max(e.paced, probeSamples*cfg.Period.Seconds())
		}
		e.upTo = 0
	}
	switch {
	case deep:
		e.downTo, e.upTo, e.awaited = c, 0, 0
	case reason == BackingOff:
		e.upTo = 0 // a tenth at most, or a trim: the next may follow at once
	case reason == ProbingUp:
		e.downTo = 0 // the estimate rose past it
	}
	if c == 0 && reason != BackingOff {
		e.est = Estimate{Reason: reason} // still none
		return e.est
	}

	floor := max(cfg.MinRate, cfg.FloorFraction*e.good)
	ceiling := max(cfg.CapMultiple*e.peak, floor)
	c = min(max(c, floor), ceiling, math.MaxFloat64)
	e.est = Estimate{Capacity: c, Reason: reason}
	return e.est
}

// decrease returns the estimate c lowered to factor times the smaller of
// c and goodput (goodput alone before the first estimate), and remembers
// goodput as the knee.
func (e *Estimator) decrease(c, goodput, factor float64) float64 {
	e.settle = e.cfg.Settle.Seconds()
	return e.trim(c, goodput, factor)
}

// trim is decrease without the Settle that holds off the next one.
func (e *Estimator) trim(c, goodput, factor float64) float64 {
	e.knee = goodput
	e.peak = max(e.peak, goodput)
	return e.lower(c, goodput, factor)
}

// lower returns c lowered to factor times the smaller of c and goodput
// (goodput alone before the first estimate), and stops probing.
func (e *Estimator) lower(c, goodput, factor float64) float64 {
	if c == 0 || goodput < c {
		c = goodput
	}
	e.probing = 0
	return c * factor
}

// earlyTick: a step that comes a Period/earlyTick early (1 ms at the
// default Period of 1 s) still decides. A controller's ticks a second
// apart come microseconds either side of it; held to the exact Period,
// one tick in two held as too soon, and the next took two seconds' step
// at once. Not more: a tick a surge brought forward a little before a
// regular one reads the health the last decision read (in the simulator's
// brownout scenario, a tolerance of 10ms kept the estimate from releasing
// after the brownout).
const earlyTick = 1000

// maxAwait is how long, in seconds, the estimator waits at most for a
// sample that shows its last step carried out (Estimator.downTo, upTo).
const maxAwait = 5.0

// probeSamples is how many samples at a probe's rate near the knee the
// next probe waits for, their p99 settled (see Step).
const probeSamples = 1

// nearKneeProbes bounds a probe within farFromKnee of the knee, in
// probes (Config.Increase); see Step.
const nearKneeProbes = 2

// halfProbes is how long, in seconds of probing, probes past the knee
// are half probes (see Step).
const halfProbes = 2.0

// farFromKnee is how far past the remembered knee a probe is far from it:
// there a probe does not wait for probeSamples more samples, and probes
// speed up.
const farFromKnee = 0.1

// slack is how far a callee's answers may fall short of, or run past, what
// it was admitted before the law reads a queue building or draining.
const slack = 0.05

// median returns the median of the first n of v (the mean of two).
func median(v [3]float64, n int) float64 {
	switch n {
	case 1:
		return v[0]
	case 2:
		return v[0]/2 + v[1]/2
	}
	return max(min(v[0], v[1]), min(max(v[0], v[1]), v[2]))
}
