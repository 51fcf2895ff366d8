package sim

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// RateKind says how a Rate varies over time.
type RateKind uint8

const (
	Constant RateKind = iota // one rate throughout
	Steps                    // each point's rate holds until the next point
	Ramp                     // straight lines between points
	Diurnal                  // a raised cosine between Min and Max with one peak per Period
)

func (k RateKind) String() string {
	switch k {
	case Constant:
		return "constant"
	case Steps:
		return "steps"
	case Ramp:
		return "ramp"
	case Diurnal:
		return "diurnal"
	}
	return fmt.Sprintf("RateKind(%d)", uint8(k))
}

// Point is a rate at a time since the start of a run.
type Point struct {
	At  time.Duration
	RPS float64
}

// Rate is an offered rate as a function of time since the start of a run,
// in requests per second. The zero value is a constant 0.
type Rate struct {
	Kind   RateKind
	Points []Point // Constant: one point; Steps, Ramp: sorted by At, at least one
	// Diurnal: Min + (Max-Min)·(1+cos(2π(t-PeakAt)/Period))/2.
	Min, Max       float64
	PeakAt, Period time.Duration
}

// ConstantRate returns a Rate of rps throughout.
func ConstantRate(rps float64) Rate { return Rate{Kind: Constant, Points: []Point{{RPS: rps}}} }

// At returns the rate at t. Before the first point Steps and Ramp take the
// first point's rate, after the last the last one's.
func (r Rate) At(t time.Duration) float64 {
	switch r.Kind {
	case Constant:
		if len(r.Points) == 0 {
			return 0
		}
		return r.Points[0].RPS
	case Steps, Ramp:
		ps := r.Points
		if len(ps) == 0 {
			return 0
		}
		if t <= ps[0].At {
			return ps[0].RPS
		}
		for i := 1; i < len(ps); i++ {
			if t < ps[i].At {
				a, b := ps[i-1], ps[i]
				if r.Kind == Steps {
					return a.RPS
				}
				frac := float64(t-a.At) / float64(b.At-a.At)
				// The conversion rounds the product: no fused multiply-add,
				// the same bits on every platform.
				return a.RPS + float64((b.RPS-a.RPS)*frac)
			}
		}
		return ps[len(ps)-1].RPS
	case Diurnal:
		if r.Period <= 0 {
			return r.Min
		}
		phase := float64((t-r.PeakAt)%r.Period) / float64(r.Period)
		c := (1 + math.Cos(2*math.Pi*phase)) / 2
		return r.Min + float64((r.Max-r.Min)*c)
	}
	return 0
}

// String describes the rate in a few words, e.g. "ramp 16000@0s … 16000@36s".
func (r Rate) String() string {
	switch r.Kind {
	case Constant:
		return fmt.Sprintf("constant %g", r.At(0))
	case Diurnal:
		return fmt.Sprintf("diurnal %g…%g, peak at %v every %v", r.Min, r.Max, r.PeakAt, r.Period)
	}
	var b strings.Builder
	b.WriteString(r.Kind.String())
	for _, p := range r.Points {
		fmt.Fprintf(&b, " %g@%v", p.RPS, p.At)
	}
	return b.String()
}
