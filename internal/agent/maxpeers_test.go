package agent

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/aggregator"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
	"github.com/sluicehq/sluice/sidecar/reporter"
)

// A sidecar at its largest table sends reports a default aggregator accepts,
// and one more tracked caller is refused at start-up rather than having
// every full report rejected later.
func TestMaxPeersFitsTheAggregatorsReportBound(t *testing.T) {
	bounds := aggregator.DefaultBounds()
	if MaxPeersBound+2 > bounds.MaxPeersPerReport {
		t.Fatalf("MaxPeersBound %d + unknown + _overflow > the aggregator's default max-peers-per-report %d", MaxPeersBound, bounds.MaxPeersPerReport)
	}

	cfg := DefaultConfig()
	cfg.Service = "checkout"
	cfg.MaxPeers = MaxPeersBound + 1
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "max-peers") {
		t.Fatalf("max-peers %d: Validate() = %v, want an error naming max-peers", cfg.MaxPeers, err)
	}
	cfg.MaxPeers = MaxPeersBound
	if err := cfg.Validate(); err != nil {
		t.Fatalf("max-peers %d: Validate() = %v, want nil", cfg.MaxPeers, err)
	}

	// The largest report such a sidecar sends — every tracked caller, the
	// unknown and the _overflow peer (the sidecar's own tests hold it to
	// that) — is one a default aggregator takes.
	peers := make([]sidecar.PeerCounts, 0, MaxPeersBound+2)
	for i := range MaxPeersBound {
		peers = append(peers, sidecar.PeerCounts{Peer: fmt.Sprintf("caller-%05d", i), Offered: 1})
	}
	peers = append(peers, sidecar.PeerCounts{Peer: names.Unknown, Offered: 1}, sidecar.PeerCounts{Peer: names.Overflow, Offered: 1})
	now := time.Now()
	st := aggregator.NewState("zone-a", "agg-a", 3, bounds)
	h := reporter.Header{SidecarID: "checkout-1", Service: "checkout", Zone: "zone-a", Direction: sidecar.Inbound}
	if err := st.Apply(reporter.Build(h, nil, peers, now.Add(-time.Second), time.Second), now); err != nil {
		t.Fatalf("the aggregator rejected a full report: %v", err)
	}
	if f := st.TakeFolds(); f.Total() != 0 {
		t.Fatalf("the aggregator folded %+v of a full report into _overflow", f)
	}
	// One more caller than the aggregator keeps of a report (the reserved
	// peers aside), and one would lose its own bucket.
	for i := MaxPeersBound; i <= bounds.MaxPeersPerReport; i++ {
		peers = append(peers, sidecar.PeerCounts{Peer: fmt.Sprintf("caller-%05d", i), Offered: 1})
	}
	if err := st.Apply(reporter.Build(h, nil, peers, now.Add(-time.Second), time.Second), now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if f := st.TakeFolds(); f.Report != 1 {
		t.Fatalf("a report of %d peers: folded %+v, want one beyond max-peers-per-report; the bound this test relies on has moved", len(peers), f)
	}
}
