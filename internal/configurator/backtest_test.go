package configurator

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

var t0 = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

func minutes(b history.Bucket, start time.Time, rates ...float64) []history.MinuteRow {
	rows := make([]history.MinuteRow, len(rates))
	for i, r := range rates {
		rows[i] = history.MinuteRow{Bucket: b, Minute: start.Add(time.Duration(i) * time.Minute), PeakOffered: r, MeanOffered: r}
	}
	return rows
}

func fixed(limits map[history.Bucket]float64, capacity map[string]float64) ReplayLimits {
	return ReplayLimits{
		Limit: func(b history.Bucket) float64 {
			if l, ok := limits[b]; ok {
				return l
			}
			return math.Inf(1)
		},
		Capacity: func(c string) float64 {
			if v, ok := capacity[c]; ok {
				return v
			}
			return math.Inf(1)
		},
	}
}

// TestReplayHandComputed replays limit 100 against four minutes at 50, 150,
// 200 and 80 rps with the default law (PMax 0.99, MinRate 1, ReleaseRate 2),
// dt = 1 minute:
//
//	minute  offered  p* = max(0, 1 − 100/R)   p (fast attack, slow release)   offered req   dropped req
//	0        50      0                        0                               3000          0
//	1       150      1/3                      1/3 (rises at once)             9000          3000
//	2       200      1/2                      1/2                             12000         6000
//	3        80      0                        0, see below                    4800          0
//
// Slow release lets the admitted share 1 − p grow by ReleaseRate^dt, and at
// dt = 60 s that is 2^60 ≈ 1.15e18: from p = 1/2 the eased ratio is
// 1 − 0.5 × 2^60 < 0, so p falls to its target 0 in one step. At minute
// resolution the law's hysteresis is spent within each minute, and every
// minute stands on its own.
//
// Share dropped: (3000 + 6000) / (3000 + 9000 + 12000 + 4800) = 9000 / 28800
// = 0.3125; 2 minutes with drops, the worst minute 2 at 0.5, first drop at
// minute 1, last at minute 2.
func TestReplayHandComputed(t *testing.T) {
	rows := minutes(web, t0, 50, 150, 200, 80)
	got, err := Replay(rows, fixed(map[history.Bucket]float64{web: 100}, nil), dropratio.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	want := BacktestResult{
		Bucket: web, Limit: 100, Minutes: 4,
		Offered: 28800, Dropped: 9000, DropMinutes: 2,
		WorstMinute: t0.Add(2 * time.Minute), WorstRatio: 0.5,
		FirstDrop: t0.Add(time.Minute), LastDrop: t0.Add(2 * time.Minute),
	}
	if len(got) != 1 {
		t.Fatalf("Replay returned %d results; want 1: %+v", len(got), got)
	}
	checkResult(t, got[0], want)
	if s := got[0].Share(); math.Abs(s-0.3125) > 1e-12 {
		t.Errorf("Share() = %v; want 0.3125", s)
	}
}

// TestReplayKeepsLawState shows that the replay steps one law through the
// minutes rather than computing each alone: with ReleaseRate 1.01 per second
// a minute lets the admitted share grow only by 1.01^60 = e^(60 ln 1.01)
// ≈ e^0.597 ≈ 1.8167, so at minute 3 the ratio is 1 − 0.5 × 1.8167 ≈ 0.0917
// instead of 0, and 0.0917 × 4800 ≈ 440 more requests are dropped.
func TestReplayKeepsLawState(t *testing.T) {
	cfg := dropratio.DefaultConfig()
	cfg.ReleaseRate = 1.01
	cfg.OpenBelow = 0 // the slow release all the way down: 80 rps would open at once under the default 0.9
	rows := minutes(web, t0, 50, 150, 200, 80)
	got, err := Replay(rows, fixed(map[history.Bucket]float64{web: 100}, nil), cfg)
	if err != nil {
		t.Fatal(err)
	}
	p3 := 1 - 0.5*math.Pow(1.01, 60)
	if math.Abs(p3-0.0917) > 1e-4 {
		t.Fatalf("hand computation is off: p3 = %v", p3)
	}
	want := BacktestResult{
		Bucket: web, Limit: 100, Minutes: 4,
		Offered: 28800, Dropped: 9000 + p3*4800, DropMinutes: 3,
		WorstMinute: t0.Add(2 * time.Minute), WorstRatio: 0.5,
		FirstDrop: t0.Add(time.Minute), LastDrop: t0.Add(3 * time.Minute),
	}
	checkResult(t, got[0], want)
}

// TestReplayCapacity splits a callee's capacity of 100 max-min fairly
// between a caller offering 150 and one offering 50, neither with a limit of
// its own: the small one gets its 50 and is not dropped, the large one the
// other 50 and loses 1 − 50/150 = 2/3 of its traffic. Rows of another callee
// in the same minutes are unaffected.
func TestReplayCapacity(t *testing.T) {
	big := history.Bucket{Callee: "checkout", Caller: "big"}
	small := history.Bucket{Callee: "checkout", Caller: "small"}
	other := history.Bucket{Callee: "search", Caller: "big"}
	var rows []history.MinuteRow
	rows = append(rows, minutes(other, t0, 150, 150)...)
	rows = append(rows, minutes(small, t0, 50, 50)...)
	rows = append(rows, minutes(big, t0, 150, 150)...)
	got, err := Replay(rows, fixed(nil, map[string]float64{"checkout": 100}), dropratio.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("Replay returned %d results; want 3", len(got))
	}
	checkResult(t, got[0], BacktestResult{
		Bucket: big, Limit: math.Inf(1), Minutes: 2, Offered: 18000, Dropped: 12000, DropMinutes: 2,
		WorstMinute: t0, WorstRatio: 2.0 / 3, FirstDrop: t0, LastDrop: t0.Add(time.Minute),
	})
	checkResult(t, got[1], BacktestResult{Bucket: small, Limit: math.Inf(1), Minutes: 2, Offered: 6000})
	checkResult(t, got[2], BacktestResult{Bucket: other, Limit: math.Inf(1), Minutes: 2, Offered: 18000})
}

// TestReplayGapsAndNoise: a minute missing from the rows is no traffic, not a
// step; a rate below MinRate is never dropped; a broken rate counts as 0.
func TestReplayGapsAndNoise(t *testing.T) {
	rows := minutes(web, t0, 0.5, math.NaN(), 200)
	rows[2].Minute = t0.Add(10 * time.Minute)
	got, err := Replay(rows, fixed(map[history.Bucket]float64{web: 0.1}, nil), dropratio.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	// Minute 10: p* = min(1 − 0.1/200, 0.99) = 0.99.
	checkResult(t, got[0], BacktestResult{
		Bucket: web, Limit: 0.1, Minutes: 3, Offered: 30 + 12000, Dropped: 0.99 * 12000, DropMinutes: 1,
		WorstMinute: t0.Add(10 * time.Minute), WorstRatio: 0.99, FirstDrop: t0.Add(10 * time.Minute), LastDrop: t0.Add(10 * time.Minute),
	})
}

func TestReplayRefusesBadConfig(t *testing.T) {
	if _, err := Replay(nil, fixed(nil, nil), dropratio.Config{}); err == nil {
		t.Fatal("Replay with a zero Config succeeded")
	}
}

func checkResult(t *testing.T, got, want BacktestResult) {
	t.Helper()
	near := func(a, b float64) bool { return a == b || math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b)) }
	if got.Bucket != want.Bucket || !near(got.Limit, want.Limit) || got.Minutes != want.Minutes ||
		!near(got.Offered, want.Offered) || !near(got.Dropped, want.Dropped) || got.DropMinutes != want.DropMinutes ||
		!got.WorstMinute.Equal(want.WorstMinute) || !near(got.WorstRatio, want.WorstRatio) ||
		!got.FirstDrop.Equal(want.FirstDrop) || !got.LastDrop.Equal(want.LastDrop) {
		t.Errorf("result:\n got %+v\nwant %+v", got, want)
	}
}
