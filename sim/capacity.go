package sim

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// What the loop made of a modelled callee's knee (issue #18): the run is
// split wherever the knee changes (a brownout's start and end), and in each
// phase the controller's estimate is judged against the knee of the phase.

// CapacityBand is how close to the knee an estimate must come to have
// found it, and how far past it an estimate overshoots: 10 %.
const CapacityBand = 0.1

// CapacityHeld is how long an estimate must stay within CapacityBand of
// the knee to have found it, rather than passed through on its way.
const CapacityHeld = 3 * time.Second

// CapacityMeasures are one modelled callee's measures.
type CapacityMeasures struct {
	Series *CapacitySeries
	Phases []CapacityPhase
}

// CapacityPhase is a stretch of the run with one knee.
type CapacityPhase struct {
	From, To time.Duration
	Knee     float64 // the fleet's knee, rps
	// Down says the knee fell at From: the loop must shed down to it.
	// Otherwise it rose (or the run began), and the loop must release up
	// to it.
	Down bool
	// Reached is how long after From the estimate first got to the knee's
	// side of the band, at the end of that second: at most Knee·(1 +
	// CapacityBand) when the knee fell, at least Knee·(1 − CapacityBand)
	// when it rose; Found, when it first came within CapacityBand of Knee
	// to stay there CapacityHeld. -1: never.
	Reached, Found time.Duration
	// From the second it was reached on: Overshoots counts the stretches
	// of seconds the estimate spent above Knee·(1 + CapacityBand),
	// Undershoots those below Knee·(1 − CapacityBand); Peak and Low are the
	// highest and lowest estimates, relative to Knee (+0.04 is 4 % above
	// it).
	Overshoots, Undershoots int
	Peak, Low               float64
	// Lowest is the lowest estimate in the whole phase, relative to Knee:
	// how deep the loop cut when the knee moved.
	Lowest float64
	// Estimate, Admitted and Goodput are means over the seconds from
	// Reached on, rps; P99 their worst p99; OverObjective counts those seconds whose
	// p99 or errors missed the objective.
	Estimate, Admitted, Goodput float64
	P99                         time.Duration
	OverObjective               int
}

// MeasureCapacity returns the measures of r's modelled callees that
// declare an objective; nil when none does.
func MeasureCapacity(r *Result) []CapacityMeasures {
	var out []CapacityMeasures
	for i := range r.Capacities {
		s := &r.Capacities[i]
		if s.Objective.LatencyP99 == 0 && s.Objective.Errors == 0 {
			continue
		}
		m := CapacityMeasures{Series: s}
		start := 0
		for bin := 1; bin <= len(s.Knee); bin++ {
			if bin < len(s.Knee) && s.Knee[bin] == s.Knee[start] {
				continue
			}
			m.Phases = append(m.Phases, measureCapacityPhase(s, start, bin, start > 0 && s.Knee[start] < s.Knee[start-1]))
			start = bin
		}
		out = append(out, m)
	}
	return out
}

// measureCapacityPhase measures the bins [from, to) of s, one knee.
func measureCapacityPhase(s *CapacitySeries, from, to int, down bool) CapacityPhase {
	k := s.Knee[from]
	p := CapacityPhase{From: time.Duration(from) * Bin, To: time.Duration(to) * Bin, Knee: k, Down: down, Reached: -1, Found: -1, Lowest: math.Inf(1)}
	rel := func(bin int) float64 { return s.Estimate[bin]/k - 1 }
	reached := -1
	for bin := from; bin < to; bin++ {
		r := rel(bin)
		p.Lowest = min(p.Lowest, r)
		if s.Estimate[bin] <= 0 {
			continue
		}
		if reached < 0 && (down && r <= CapacityBand || !down && r >= -CapacityBand) {
			reached = bin
			p.Reached = time.Duration(bin+1-from) * Bin
		}
		if p.Found < 0 && math.Abs(r) <= CapacityBand {
			held := bin
			for held < to && held-bin < int(CapacityHeld/Bin) && math.Abs(rel(held)) <= CapacityBand {
				held++
			}
			if held-bin == int(CapacityHeld/Bin) {
				p.Found = time.Duration(bin+1-from) * Bin
			}
		}
	}
	if reached < 0 {
		return p
	}
	found := reached
	p.Peak, p.Low = math.Inf(-1), math.Inf(1)
	over, under := false, false
	obj := s.Objective
	for bin := found; bin < to; bin++ {
		r := rel(bin)
		p.Peak, p.Low = max(p.Peak, r), min(p.Low, r)
		if r > CapacityBand && !over {
			p.Overshoots++
		}
		if r < -CapacityBand && !under {
			p.Undershoots++
		}
		over, under = r > CapacityBand, r < -CapacityBand
		p.Estimate += s.Estimate[bin]
		p.Admitted += s.Admitted[bin]
		p.Goodput += s.Goodput[bin]
		p.P99 = max(p.P99, s.P99[bin])
		if obj.LatencyP99 > 0 && s.P99[bin] > obj.LatencyP99 || obj.Errors > 0 && s.Errors[bin] > obj.Errors {
			p.OverObjective++
		}
	}
	n := float64(to - found)
	p.Estimate, p.Admitted, p.Goodput = p.Estimate/n, p.Admitted/n/Bin.Seconds(), p.Goodput/n
	return p
}

// writeCapacity writes the modelled callees' measures and their estimate,
// second by second.
func writeCapacity(b *strings.Builder, r *Result, ms []CapacityMeasures) {
	for _, m := range ms {
		s := m.Series
		svc := r.Scenario.Service(s.Callee)
		k := svc.Knee
		var obj []string
		if s.Objective.LatencyP99 > 0 {
			obj = append(obj, "p99 "+s.Objective.LatencyP99.String())
		}
		if s.Objective.Errors > 0 {
			obj = append(obj, "errors "+pct(s.Objective.Errors))
		}
		fmt.Fprintf(b, "\ncapacity from the objective: %s (%s), each instance a knee of %d workers × %v, queue %d; the estimate is judged against the fleet's knee in each phase, found once within %s of it for %v:\n",
			s.Callee, strings.Join(obj, ", "), k.Workers, k.Service, k.Queue, pct(CapacityBand), CapacityHeld)
		fmt.Fprintf(b, "  %-11s %7s %-7s %7s %7s %8s %5s %6s %7s %7s %7s %9s %8s %8s %6s\n",
			"phase", "knee", "to", "reached", "found", "lowest", "over", "under", "peak", "low", "mean", "admitted", "goodput", "max p99", "missed")
		for _, p := range m.Phases {
			span := fmt.Sprintf("%v–%v", p.From, p.To)
			dir := "release"
			if p.Down {
				dir = "shed"
			}
			never := func(d time.Duration) string {
				if d < 0 {
					return "never"
				}
				return d.String()
			}
			if p.Reached < 0 {
				fmt.Fprintf(b, "  %-11s %7s %-7s %7s %7s %8s\n", span, rate(p.Knee), dir, "never", never(p.Found), signedPct(p.Lowest))
				continue
			}
			fmt.Fprintf(b, "  %-11s %7s %-7s %7s %7s %8s %5d %6d %7s %7s %7s %9s %8s %8s %5ds\n",
				span, rate(p.Knee), dir, p.Reached, never(p.Found), signedPct(p.Lowest), p.Overshoots, p.Undershoots, signedPct(p.Peak), signedPct(p.Low),
				rate(p.Estimate), rate(p.Admitted), rate(p.Goodput), p.P99.Round(time.Millisecond), p.OverObjective)
		}
		b.WriteString("  (to: shed down to a knee that fell, release up to one that rose; reached: after the phase's start, by the end of the second, the estimate on the knee's side of the band; found: within the band, to stay there; lowest: the lowest estimate in the phase; from the second reached on: overshoots (over) and undershoots (under) past the band, peak and low estimate, mean estimate, admitted and goodput rps, max p99, seconds the objective was missed)\n")
		fmt.Fprintf(b, "  estimated capacity, rps, by second (the controller's last tick in it; - before its first):\n")
		for row := 0; row < len(s.Estimate); row += 10 {
			fmt.Fprintf(b, "    %4ds", row)
			for bin := row; bin < min(row+10, len(s.Estimate)); bin++ {
				v := "-"
				if s.Estimate[bin] > 0 {
					v = count(math.Round(s.Estimate[bin]))
				}
				fmt.Fprintf(b, " %7s", v)
			}
			b.WriteString("\n")
		}
	}
}
