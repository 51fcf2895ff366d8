package live

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sluicehq/sluice/sim"
)

// WriteSummary writes a live run's summary: the deterministic mode's table
// and notes (sim.WriteSummary: the same measures, computed the same way),
// under a header that says what ran, with the lines that need the
// simulator's own bookkeeping (control-plane bytes, fast-path counters)
// replaced by what the processes' metrics and the load generators tell.
func WriteSummary(w io.Writer, r *Result) error {
	var body bytes.Buffer
	if err := sim.WriteSummary(&body, &r.Result); err != nil {
		return err
	}
	sc := r.Scaled
	lp := sc.Loop
	check := "off"
	if lp.SurgeCheck > 0 {
		check = lp.SurgeCheck.String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s · live, scale %g · %v of load on 127.0.0.1 · %d zones, %d sidecars · report %v (surge check %s), flush %v, tick %v · paced arrivals (internal/loadgen)\n",
		sc.Name, r.Scaling.Factor, sc.Duration, len(sc.Zones), r.Sidecars,
		lp.ReportInterval, check, lp.FlushInterval, lp.Controller.Tick)
	lines := strings.SplitAfter(body.String(), "\n")
	for i, line := range lines {
		switch {
		case i == 0: // the simulator's header: replaced above
		case strings.HasPrefix(line, "control plane:"):
			fmt.Fprintf(&b, "processes: %d controller, %d aggregators, %d sidecars (real binaries) · the sidecars sent %s load reports, %s of them surge reports, and failed over %s times\n",
				r.Controllers, r.Aggregators, r.Sidecars, count(r.Reports), count(r.SurgeReports), count(r.Failovers))
			l := r.Load
			fmt.Fprintf(&b, "load: %s requests sent by the load generators, %s errors, %s skipped", count(float64(l.Sent)), count(float64(l.Errors)), count(float64(l.Skipped)))
			if l.Late > 0 {
				fmt.Fprintf(&b, ", %d seconds off schedule", l.Late)
			}
			fmt.Fprintf(&b, " · %d scheduler stalls of %v or more (longest %v)", l.Stalls, l.StallThreshold, l.MaxStall.Round(time.Millisecond))
			if !l.Healthy() {
				fmt.Fprintf(&b, " · WARNING: the machine could not keep up (%s); the measures describe it as much as the loop", l.trouble())
			}
			fmt.Fprintf(&b, " · %v wall time\n", r.Wall.Round(100*time.Millisecond))
		case strings.HasPrefix(line, "fast path:"):
		default:
			b.WriteString(line)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// count formats a number with thousands separators.
func count(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// trouble says what made a run unhealthy.
func (s LoadStats) trouble() string {
	var why []string
	if s.Late > 0 {
		why = append(why, fmt.Sprintf("%d seconds in which the load went out late", s.Late))
	}
	if s.Lost() > 0.001 {
		why = append(why, fmt.Sprintf("%.2f%% of the requests lost by the rig", 100*s.Lost()))
	}
	if s.Stalled() {
		why = append(why, fmt.Sprintf("%d stalls of the scheduler of %v or more in %d s, more than %g a second", s.Stalls, s.StallThreshold, s.Seconds, maxStallRate))
	}
	return strings.Join(why, ", ")
}
