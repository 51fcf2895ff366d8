package configurator

import (
	"math"
	"testing"

	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

// TestReplayProcedures replays one minute of a callee with procedures:
//
//	leaf                       offered  limit                   p*
//	web/create-charge          100      50 (its own)            1 − 50/100 = 1/2
//	web/get-item               20       none                    0
//	mobile/create-charge       30       none                    0
//
// create-charge's capacity 200 and web's limit 500 across procedures do
// not bind. The levels' rows are not buckets of the law: web's own row
// (120 rps) reports its leaves' drops, 50 of 120 rps, and
// *//create-charge's (130 rps) 50 of 130.
func TestReplayProcedures(t *testing.T) {
	var (
		webPay    = history.Bucket{Callee: "checkout", Caller: "web", Procedure: "create-charge"}
		webItem   = history.Bucket{Callee: "checkout", Caller: "web", Procedure: "get-item"}
		mobilePay = history.Bucket{Callee: "checkout", Caller: "mobile", Procedure: "create-charge"}
		anyPay    = history.Bucket{Callee: "checkout", Caller: history.AnyCaller, Procedure: "create-charge"}
		webAll    = history.Bucket{Callee: "checkout", Caller: "web"}
	)
	var rows []history.MinuteRow
	for b, r := range map[history.Bucket]float64{webPay: 100, webItem: 20, mobilePay: 30, anyPay: 130, webAll: 120} {
		rows = append(rows, minutes(b, t0, r)...)
	}
	got, err := Replay(rows, fixed(map[history.Bucket]float64{webPay: 50, anyPay: 200, webAll: 500}, nil), dropratio.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	dropped := map[history.Bucket]float64{}
	for _, r := range got {
		dropped[r.Bucket] = r.Dropped
	}
	want := map[history.Bucket]float64{webPay: 3000, webItem: 0, mobilePay: 0, anyPay: 3000, webAll: 3000}
	for b, w := range want {
		if d, ok := dropped[b]; !ok || math.Abs(d-w) > 1e-6 {
			t.Errorf("%s dropped %v (reported %v); want %v", b.Path(), d, ok, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d results, want %d: %+v", len(got), len(want), got)
	}

	// A procedure's capacity binds across its callers: at 60, web and
	// mobile share it max-min fairly, 30 each, so web drops 70 of 100.
	got, err = Replay(rows, fixed(map[history.Bucket]float64{anyPay: 60}, nil), dropratio.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range got {
		if r.Bucket == webPay && math.Abs(r.Dropped-70*60) > 1e-6 {
			t.Errorf("web/create-charge under capacity 60 dropped %v, want %v", r.Dropped, 70*60)
		}
		if r.Bucket == mobilePay && r.Dropped > 1e-6 {
			t.Errorf("mobile/create-charge under capacity 60 dropped %v, want 0 (its 30 is its share)", r.Dropped)
		}
	}
}
