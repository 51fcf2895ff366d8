package reporter

import (
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/sidecar"
	"google.golang.org/protobuf/types/known/durationpb"
)

func projReport(urgent bool, window time.Duration, offered uint64) *sluicev1.LoadReport {
	return &sluicev1.LoadReport{
		Urgent: urgent, Window: durationpb.New(window),
		Peers: []*sluicev1.PeerCounts{{Peer: "web", Offered: offered}},
	}
}

func projPolicy(offered float64) *sidecar.Policy {
	return &sidecar.Policy{Service: "checkout", Peers: []sidecar.Rule{{
		Peer: "web", Mode: dropratio.Enforce, LimitRPS: 1000, AllowedRPS: 1000, OfferedRPS: offered,
	}}}
}

// TestProjectorHoldsTheShareThenYieldsToTheController: a sidecar carrying a
// tenth of a bucket's 1,000 rps sees it jump tenfold; from the second check
// after its surge report it drops what keeps it within a tenth of the
// allowed rate, and when the controller's policy shows the bucket did not
// jump globally (the traffic moved to this sidecar), it yields.
func TestProjectorHoldsTheShareThenYieldsToTheController(t *testing.T) {
	const check = 100 * time.Millisecond
	p := NewProjector(time.Second, check, DefaultSurgeMinCount)
	now := time.Unix(1000, 0)
	p.Policy(projPolicy(1000), now)
	p.Reported(projReport(false, time.Second, 100), now) // 100 rps: a share of 0.1

	cum := uint64(0)
	step := func(n uint64, rep *sluicev1.LoadReport) []sidecar.Provisional {
		now = now.Add(check)
		then := map[bucket]sidecar.PeerCounts{{peer: "web"}: {Peer: "web", Offered: cum}}
		cum += n
		cur := map[bucket]sidecar.PeerCounts{{peer: "web"}: {Peer: "web", Offered: cum}}
		if rep != nil {
			p.Reported(rep, now)
		}
		return p.Check(now, then, cur, check)
	}
	if got := step(10, nil); got != nil {
		t.Fatalf("a calm check projected %v", got)
	}
	if got := step(100, projReport(true, check, 100)); got != nil {
		t.Fatalf("the surge report's own check projected %v; the ratio waits for confirmation", got)
	}
	step(100, nil) // the first confirming window
	got := step(100, nil)
	if len(got) != 1 || got[0].Peer != "web" || !(got[0].Ratio > 0.85 && got[0].Ratio <= 0.99) {
		t.Fatalf("at 10x its share: projected %v, want web at about 0.9", got)
	}

	// The controller's answer, two checks after the surge report: the
	// bucket's global rate barely moved. The share did not hold.
	p.Policy(projPolicy(1100), now)
	if got := step(100, nil); got != nil {
		t.Fatalf("after the controller's denial: projected %v, want none", got)
	}
}
