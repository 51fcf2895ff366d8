package compare

import "math"

// Sample is what one caller saw in one second of a load run, by the second
// requests left the generator.
type Sample struct {
	Offered  int64 // requests sent
	Admitted int64 // answered 200
	Dropped  int64 // answered 429
	Errors   int64 // transport errors and other statuses
	Skipped  int64 // not sent: the generator had too many in flight
	// FailedOpen is how many decisions the limiter could not make and
	// admitted anyway, over every caller (Redis gates only).
	FailedOpen int64
	// Decisions the limiter was asked for, over every caller (Redis gates
	// only); the denominator of FailedOpen.
	Decisions int64
}

// SurgeSummary condenses one caller's surge: the numbers the accuracy table
// shows for each design.
type SurgeSummary struct {
	FirstSecond   int64   // admitted in the surge's first second
	TimeToEnforce int     // seconds from the onset to the first second within ±5 % of the limit; -1 never
	Steady        float64 // mean admitted rps from 3 s after the onset to the end of the surge
	SteadyErr     float64 // (Steady − limit) / limit
	WorstErr      float64 // the largest |admitted − limit| / limit of a steady second
	OverLimit     int64   // requests admitted above the limit during the surge, second by second
	// AfterLost is what the caller lost after the surge although it was
	// under its limit again: Σ max(0, min(offered, limit) − admitted).
	AfterLost int64
	Dropped   int64 // answered 429 over the whole run
	Sent      int64 // over the whole run
	Problems  int64 // errors and skipped requests over the whole run: the rig's, not the limiter's
	// FailedOpen is how many decisions over the whole run the limiter
	// could not make and admitted anyway (Redis gates: every caller).
	FailedOpen int64
}

// steadyFrom is how long after a surge's onset the steady state begins:
// long enough for sluice's loop (a report, a flush, a tick) with margin.
const steadyFrom = 3

// SummarizeSurge reads series, whose surge covers seconds [start, end),
// against limit.
func SummarizeSurge(series []Sample, limit float64, start, end int) SurgeSummary {
	s := SurgeSummary{TimeToEnforce: -1}
	if start < 0 || end > len(series) || start >= end {
		return s
	}
	s.FirstSecond = series[start].Admitted
	for i := start; i < end; i++ {
		adm := float64(series[i].Admitted)
		if s.TimeToEnforce < 0 && math.Abs(adm-limit) <= 0.05*limit {
			s.TimeToEnforce = i - start
		}
		s.OverLimit += int64(max(0, adm-limit))
	}
	from := min(start+steadyFrom, end-1)
	var sum float64
	for i := from; i < end; i++ {
		adm := float64(series[i].Admitted)
		sum += adm
		s.WorstErr = max(s.WorstErr, math.Abs(adm-limit)/limit)
	}
	s.Steady = sum / float64(end-from)
	s.SteadyErr = (s.Steady - limit) / limit
	for i := end; i < len(series); i++ {
		want := min(float64(series[i].Offered), limit)
		s.AfterLost += int64(max(0, want-float64(series[i].Admitted)))
	}
	for _, x := range series {
		s.Dropped += x.Dropped
		s.Sent += x.Offered
		s.Problems += x.Errors + x.Skipped
		s.FailedOpen += x.FailedOpen
	}
	return s
}

// OutageSummary condenses one caller's run through a limiter outage
// covering seconds [start, end).
type OutageSummary struct {
	// Mean admitted rps over the outageLead seconds before the outage,
	// during it, and after it.
	Before, During, After float64
	// ExcessAdmitted is the share of the over-limit traffic admitted
	// during the outage: Σ max(0, admitted − limit) / Σ max(0, offered −
	// limit). 0 is a limiter still enforcing; 1 is no limiter at all.
	ExcessAdmitted float64
	// FailOpenShare is the share of decisions made without the limiter
	// during the outage, over every caller; NaN where the design does not
	// count them.
	FailOpenShare float64
	// HeldFor is how many seconds into the outage the admitted rate stayed
	// within +5 % of the limit.
	HeldFor  int
	Problems int64 // errors and skipped requests over the whole run
}

// outageLead is how many seconds before an outage its "before" covers: the
// loop's own start-up is not what an outage is compared with.
const outageLead = 5

// SummarizeOutage reads series, whose limiter was down over [start, end),
// against limit. counted says whether series carries fail-open counts.
func SummarizeOutage(series []Sample, limit float64, start, end int, counted bool) OutageSummary {
	o := OutageSummary{FailOpenShare: math.NaN()}
	if start < 0 || end > len(series) || start >= end {
		return o
	}
	o.Before = meanAdmitted(series[max(0, start-outageLead):start])
	o.During = meanAdmitted(series[start:end])
	o.After = meanAdmitted(series[end:])
	var excessIn, excessOut float64
	var failed, decisions int64
	held := true
	for i := start; i < end; i++ {
		x := series[i]
		excessIn += max(0, float64(x.Offered)-limit)
		excessOut += max(0, float64(x.Admitted)-limit)
		failed += x.FailedOpen
		decisions += x.Decisions
		if held && float64(x.Admitted) <= 1.05*limit {
			o.HeldFor++
		} else {
			held = false
		}
	}
	if excessIn > 0 {
		o.ExcessAdmitted = excessOut / excessIn
	}
	if counted && decisions > 0 {
		o.FailOpenShare = float64(failed) / float64(decisions)
	}
	for _, x := range series {
		o.Problems += x.Errors + x.Skipped
	}
	return o
}

func meanAdmitted(s []Sample) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	var sum int64
	for _, x := range s {
		sum += x.Admitted
	}
	return float64(sum) / float64(len(s))
}

// Deltas turns cumulative gate counts, sampled at the end of each second,
// into per-second counts. A counter that went backwards (it can not; a
// restarted gate would) counts as 0 that second.
func Deltas(cum []GateCounts) []GateCounts {
	out := make([]GateCounts, len(cum))
	var prev GateCounts
	for i, c := range cum {
		out[i] = GateCounts{
			Decisions:  max(0, c.Decisions-prev.Decisions),
			Dropped:    max(0, c.Dropped-prev.Dropped),
			FailedOpen: max(0, c.FailedOpen-prev.FailedOpen),
		}
		prev = c
	}
	return out
}
