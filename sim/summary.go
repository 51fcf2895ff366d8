package sim

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteSummary writes r's summary table and notes, as `sim run` prints them
// and the golden files hold them. It names the scenario and the seed.
func WriteSummary(w io.Writer, r *Result) error {
	sc := r.Scenario
	s := Summarize(r)
	var b strings.Builder
	lp := sc.Loop
	check := "off"
	if lp.SurgeCheck > 0 {
		check = lp.SurgeCheck.String()
	}
	fmt.Fprintf(&b, "%s · seed %d · %v simulated · %d zones, %d sidecars · report %v (surge check %s), flush %v, tick %v, push %v · %s arrivals every %v\n",
		sc.Name, r.Seed, sc.Duration, len(sc.Zones), sc.Sidecars(),
		lp.ReportInterval, check, lp.FlushInterval, lp.Controller.Tick, lp.PushDelay, sc.Arrivals, sc.Step)
	if r.Decisions > 0 {
		fmt.Fprintf(&b, "%s requests decided by the production Limiter\n", count(float64(r.Decisions)))
	}
	b.WriteString("\n")

	if len(s.Callers) > 0 { // a scenario of tenants alone has no flows
		if err := writeCallers(&b, s); err != nil {
			return err
		}
	}

	if m := MeasureTiers(r); m != nil {
		writeTiers(&b, m)
	}
	if m := MeasureCost(r); m != nil {
		writeCost(&b, m)
	}
	if ms := MeasureCapacity(r); ms != nil {
		writeCapacity(&b, r, ms)
	}

	for _, p := range r.Pipelines {
		writePipeline(&b, r, &p)
	}
	var tiered []string
	for i := range r.Buckets {
		if r.TieredBucket(i) {
			tiered = append(tiered, r.Buckets[i].Bucket().String())
		}
	}
	if len(tiered) > 0 {
		fmt.Fprintf(&b, "\nwhere the time to enforce goes: not followed for %s, whose flows carry a criticality: its stages are timed against one allowed rate per caller, which the tiers split (the callers' table measures them against the sum of what the law allows their tiers; the tier table, per tier)\n",
			strings.Join(tiered, ", "))
	}

	if r.Tenants != nil {
		writeTenants(&b, r.Tenants)
	}

	d := sc.Duration.Seconds()
	cp := r.ControlPlane
	fmt.Fprintf(&b, "\ncontrol plane: sidecars→aggregators %s (%s reports/s) · aggregators→controller %s (%s zone loads/s) · controller→sidecars %s (%s policy deliveries/s)\n",
		byteRate(s.ReportBytesPerSec), num(float64(cp.Reports.Messages)/d),
		byteRate(s.ZoneLoadBytesPerSec), num(float64(cp.ZoneLoads.Messages)/d),
		byteRate(s.PolicyBytesPerSec), num(float64(cp.Policies.Messages)/d))
	fp := r.FastPath
	fmt.Fprintf(&b, "fast path: %s surge reports (%s/s), %s urgent flushes, %s urgent ticks · live sidecars dropped from an aggregator's sums as silent: %s\n",
		count(float64(fp.SurgeReports)), num(math.Round(10*float64(fp.SurgeReports)/d)/10),
		count(float64(fp.UrgentFlushes)), count(float64(fp.UrgentTicks)), count(float64(fp.StaleSidecars)))
	if len(r.Timeline) > 0 {
		b.WriteString("timeline:\n")
		for _, h := range r.Timeline {
			fmt.Fprintf(&b, "  %8s  %s\n", at(h.At), h.What)
		}
	}
	if len(r.Expiries) > 0 {
		writeExpiries(&b, r)
	}
	if len(s.Targets) > 0 {
		b.WriteString("targets:\n")
		for _, t := range s.Targets {
			verdict := "met"
			if !t.Met {
				verdict = "NOT MET"
			}
			fmt.Fprintf(&b, "  %-19s %-8s got %-8s %s\n", t.Name, t.Goal, t.Got, verdict)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeCallers writes the table of the callers' measures.
func writeCallers(b *strings.Builder, s Summary) error {
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CALLER\tLIMIT\tPEAK OFFERED\tOVER LIMIT\tTIME TO ENFORCE\tPEAK OVERSHOOT\tSTEADY ERR\tCOLLATERAL\tWRONGLY DROPPED\tWRONGLY ALLOWED")
	for _, m := range s.Callers {
		name := m.Bucket.String()
		if m.Shadow {
			name += " (shadow)"
		}
		if m.Cost {
			name += " (units)"
		}
		over, tte := "-", "-"
		if m.Over() {
			over = secs(m.OverBins)
			if m.Episodes > 1 {
				over += fmt.Sprintf(" in %d", m.Episodes)
			}
			tte = "never"
			if m.TimeToEnforce >= 0 {
				tte = m.TimeToEnforce.String()
				if m.Unenforced > 0 {
					tte += fmt.Sprintf(" (%d never)", m.Unenforced)
				}
			}
		}
		extra := ""
		if m.Retries > 0 {
			extra = fmt.Sprintf("  (%s of the offered were retries)", pct(m.Retries/m.Offered))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s%s\n", name, rate(m.Limit), rate(m.PeakOffered),
			over, tte, signedPct(m.PeakOvershoot), pct(m.SteadyStateError), pct(m.Collateral),
			pct(m.WronglyDropped), pct(m.WronglyAllowed), extra)
	}
	bys := "-"
	if s.Bystanders > 0 {
		bys = pct(s.BystanderCollateral) + " (bystanders)"
	}
	fmt.Fprintf(tw, "all callers\t\t\t\t\t\t\t%s\t%s\t%s\n", bys, pct(s.WronglyDropped), pct(s.WronglyAllowed))
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeAfter(b, s)
}

// writeAfter writes what each caller lost once back within its allowed
// rate after being over it, and how often its ratio turned.
func writeAfter(b *strings.Builder, s Summary) error {
	b.WriteString("\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CALLER\tLOSS BACK UNDER: 1ST SECOND\tFROM THE 2ND ON\tWORST SECOND FROM THE 2ND\tRATIO REVERSALS/MIN")
	all := 0.0 // every series is as long as the run: their rates add up
	for _, m := range s.Callers {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Bucket.String(), pct(m.AfterFirst), pct(m.AfterRest), pct(m.AfterWorst), perMin(m.ReversalsPerMinute))
		all += m.ReversalsPerMinute
	}
	fmt.Fprintf(tw, "all callers\t\t\t\t%s\n", perMin(all))
	return tw.Flush()
}

// perMin formats a count per minute with one decimal.
func perMin(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// writeExpiries says what each callee's sidecars did while their policy was
// expired: per caller, the ratio in force and the admitted rate in the first
// and the last whole second of the stretch, the mean admitted rate over it,
// against the caller's limit, and the admitted rate once a fresh policy
// ended it. Under local a token bucket decides and
// there is no ratio: the bucket's rate is the limit over the live
// instances the policy named.
func writeExpiries(b *strings.Builder, r *Result) {
	b.WriteString("policies expired: the fail mode in force, and each caller in the first → last whole second of it\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for _, x := range r.Expiries {
		first := int((x.From + Bin - 1) / Bin) // the first whole second in the stretch
		last := int(x.To/Bin) - 1              // the last
		head := fmt.Sprintf("  %s\t%s\t%s–%s", x.Callee, x.FailMode, at(x.From), at(x.To))
		for _, bs := range r.Buckets {
			if bs.Callee != x.Callee {
				continue
			}
			if last < first {
				fmt.Fprintf(tw, "%s\t%s: no whole second\n", head, bs.Bucket().Leaf())
				head = "\t\t"
				continue
			}
			mean := 0.0
			for i := first; i <= last; i++ {
				mean += bs.Admitted[i]
			}
			mean /= float64(last - first + 1)
			how := fmt.Sprintf("ratio %.3f → %.3f", bs.Ratio[first], bs.Ratio[last])
			if x.FailMode == "local" && !math.IsInf(bs.Limit, 1) {
				n := max(x.LiveInstances, 1)
				how = fmt.Sprintf("token buckets of %s ÷ %d instances = %s rps", rate(bs.Limit), n, rate(bs.Limit/float64(n)))
			}
			after := ""
			if next := int((x.To + Bin - 1) / Bin); next < len(bs.Admitted) {
				after = fmt.Sprintf("; %s rps in the first whole second after", rate(bs.Admitted[next]))
			}
			fmt.Fprintf(tw, "%s\t%s: %s, admitted %s → %s rps (mean %s, limit %s)%s\n", head, bs.Bucket().Leaf(), how,
				rate(bs.Admitted[first]), rate(bs.Admitted[last]), rate(mean), rate(bs.Limit), after)
			head = "\t\t"
		}
	}
	tw.Flush()
}

func writePipeline(b *strings.Builder, r *Result, p *Pipeline) {
	fmt.Fprintf(b, "\nwhere the time to enforce goes: %s, nominal %s rps against an allowed %s rps; offered crosses the allowed rate at %s\n",
		p.Bucket, rate(p.Offered), rate(p.Allowed), at(p.Onset))
	lp := r.Scenario.Loop
	surge := "surge checks off"
	if lp.SurgeCheck > 0 {
		surge = "surge checks every " + lp.SurgeCheck.String()
	}
	stages := []struct {
		t    time.Duration
		what string
	}{
		{p.Reported, fmt.Sprintf("the reports the aggregators hold add up to 95%% of the offered rate (reports every %v, %s)", lp.ReportInterval, surge)},
		{p.Flushed, fmt.Sprintf("the zone loads the controller holds add up to 95%% (flushes every %v, and on a surge)", lp.FlushInterval)},
		{p.Published, fmt.Sprintf("a tick publishes a ratio that admits within ±5%% of the allowed rate (ticks every %v, and on a surge)", lp.Controller.Tick)},
		{p.Applied, fmt.Sprintf("every sidecar holds it (push delay %v)", lp.PushDelay)},
	}
	prev := p.Onset
	for _, st := range stages {
		if st.t < 0 {
			fmt.Fprintf(b, "  %7s  %8s  %s: not before the episode ended at %s\n", "", "never", st.what, at(p.End))
			return
		}
		fmt.Fprintf(b, "  %7s  %8s  %s\n", "+"+dur(st.t-prev), at(st.t), st.what)
		prev = st.t
	}
	fmt.Fprintf(b, "  %7s            from the onset to an accurate ratio at every sidecar\n", "="+dur(p.Applied-p.Onset))
	if p.FirstPublished >= 0 && p.FirstPublished < p.Published {
		fmt.Fprintf(b, "  (a first ratio went out at %s, %s after the onset, computed from reports that covered only part of the surge)\n",
			at(p.FirstPublished), dur(p.FirstPublished-p.Onset))
	}
}

// at formats a time since the start: 17.35s.
func at(t time.Duration) string { return dur(t) }

func dur(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + "s"
}

func secs(n int) string { return strconv.Itoa(n) + "s" }

// rate formats requests per second: 40,000; 12.5; none.
func rate(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "none"
	case math.IsNaN(v):
		return "-"
	case v >= 100 || v == math.Trunc(v):
		return count(v)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// count formats a number with thousands separators, rounded.
func count(v float64) string {
	s := strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// num formats a message rate: whole numbers as such, else one decimal.
func num(v float64) string {
	if v == math.Trunc(v) {
		return count(v)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// pct formats a fraction as a percentage with two significant decimals
// below 10 %: 0.12%, 3.4%, 13%, 802%.
func pct(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case v == 0:
		return "0%"
	}
	x := v * 100
	a := math.Abs(x)
	switch {
	case a >= 100:
		return strconv.FormatFloat(x, 'f', 0, 64) + "%"
	case a >= 10:
		return strconv.FormatFloat(x, 'f', 1, 64) + "%"
	case a >= 0.1:
		return strconv.FormatFloat(x, 'f', 2, 64) + "%"
	}
	return strconv.FormatFloat(x, 'f', 4, 64) + "%"
}

// goalPct formats a target: 2%, 0.1%.
func goalPct(v float64) string { return strconv.FormatFloat(v*100, 'f', -1, 64) + "%" }

func signedPct(v float64) string {
	if v > 0 {
		return "+" + pct(v)
	}
	return pct(v)
}

// byteRate formats bytes per second: 31.3 kB/s.
func byteRate(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 2, 64) + " MB/s"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + " kB/s"
	}
	return strconv.FormatFloat(v, 'f', 0, 64) + " B/s"
}
