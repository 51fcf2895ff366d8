package compare

import (
	"math"
	"testing"
)

func admitted(offered int64, adm ...int64) []Sample {
	s := make([]Sample, len(adm))
	for i, a := range adm {
		s[i] = Sample{Offered: offered, Admitted: a, Dropped: offered - a}
	}
	return s
}

func TestSummarizeSurge(t *testing.T) {
	// Limit 100; surge over seconds [2, 8); calm at 60 before and after.
	s := admitted(1000, 60, 60, 400, 130, 100, 104, 96, 100, 5, 30, 60)
	for _, i := range []int{0, 1, 8, 9, 10} {
		s[i].Offered, s[i].Dropped = 60, 60-s[i].Admitted
	}
	s[4].Errors, s[9].Skipped = 2, 1
	s[3].FailedOpen, s[9].FailedOpen = 7, 1
	got := SummarizeSurge(s, 100, 2, 8)
	want := SurgeSummary{
		FirstSecond:   400,
		TimeToEnforce: 2,   // 130 is out, 100 is in
		Steady:        100, // seconds 5..7: 104, 96, 100
		SteadyErr:     0,
		WorstErr:      0.04,
		OverLimit:     300 + 30 + 4,
		AfterLost:     55 + 30 + 0,
		Sent:          5*60 + 6*1000,
		Problems:      3,
		FailedOpen:    8,
	}
	for _, x := range s {
		want.Dropped += x.Dropped
	}
	if math.Abs(got.WorstErr-want.WorstErr) > 1e-12 {
		t.Errorf("WorstErr %v, want %v", got.WorstErr, want.WorstErr)
	}
	got.WorstErr = want.WorstErr
	if got != want {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}

	if never := SummarizeSurge(admitted(1000, 1000, 1000, 1000, 1000), 100, 0, 4); never.TimeToEnforce != -1 || never.OverLimit != 3600 {
		t.Errorf("a surge never held: %+v", never)
	}
	if bad := SummarizeSurge(s, 100, 5, 99); bad.TimeToEnforce != -1 || bad.Sent != 0 {
		t.Errorf("a surge past the series must summarize to nothing: %+v", bad)
	}
}

func TestSummarizeOutage(t *testing.T) {
	// Limit 100, offered 500; down over [6, 10). Seconds 0..5 before, 10..11 after.
	s := admitted(500, 500, 100, 100, 100, 100, 100, 100, 104, 300, 500, 100, 100)
	for i := 6; i < 10; i++ {
		s[i].Decisions, s[i].FailedOpen = 560, int64([]int{0, 0, 280, 560}[i-6])
	}
	s[0].Errors = 4
	o := SummarizeOutage(s, 100, 6, 10, true)
	if o.Before != 100 {
		t.Errorf("Before %v: the 5 s before the outage admitted 100 each, the start-up second must not count", o.Before)
	}
	if want := (100.0 + 104 + 300 + 500) / 4; o.During != want || o.After != 100 {
		t.Errorf("During %v After %v, want %v and 100", o.During, o.After, want)
	}
	if want := (0.0 + 4 + 200 + 400) / (4 * 400); math.Abs(o.ExcessAdmitted-want) > 1e-12 {
		t.Errorf("ExcessAdmitted %v, want %v", o.ExcessAdmitted, want)
	}
	if want := 840.0 / 2240; math.Abs(o.FailOpenShare-want) > 1e-12 {
		t.Errorf("FailOpenShare %v, want %v", o.FailOpenShare, want)
	}
	if o.HeldFor != 2 || o.Problems != 4 {
		t.Errorf("HeldFor %d Problems %d, want 2 (100 and 104 are within +5 %%) and 4", o.HeldFor, o.Problems)
	}
	if u := SummarizeOutage(s, 100, 6, 10, false); !math.IsNaN(u.FailOpenShare) {
		t.Errorf("a design that does not count fail-opens has no share, got %v", u.FailOpenShare)
	}
}

func TestDeltas(t *testing.T) {
	cum := []GateCounts{{10, 1, 0}, {25, 1, 5}, {25, 3, 5}, {20, 3, 5}}
	want := []GateCounts{{10, 1, 0}, {15, 0, 5}, {0, 2, 0}, {0, 0, 0}}
	got := Deltas(cum)
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("second %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}
