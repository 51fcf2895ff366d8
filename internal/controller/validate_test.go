package controller

import (
	"strings"
	"testing"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestValidateFindsTheFirstFaultInSortedOrder: one walk finds an unsorted
// load and its duplicates, and the entry's faults are reported as they
// always were, the first in sorted order whatever its kind, its index
// the sorted one.
func TestValidateFindsTheFirstFaultInSortedOrder(t *testing.T) {
	for _, c := range []struct {
		name   string
		peers  []*sluicev1.PeerRate
		reason string
		detail string
	}{
		{"duplicate after an unsorted pair", []*sluicev1.PeerRate{{Peer: "b"}, {Peer: "b"}, {Peer: "a"}}, "duplicate_peer", "peers[2]"},
		{"a bad rate before a duplicate", []*sluicev1.PeerRate{{Peer: "a", OfferedRps: -1}, {Peer: "b"}, {Peer: "b"}}, "bad_rate", "peers[0]"},
		{"a duplicate before a bad rate", []*sluicev1.PeerRate{{Peer: "c", OfferedRps: -1}, {Peer: "a"}, {Peer: "a"}}, "duplicate_peer", "peers[1]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := validateService(0, &sluicev1.ServiceLoad{Service: "checkout", Direction: sluicev1.Direction_DIRECTION_INBOUND, Peers: c.peers})
			if err == nil || err.Reason != c.reason || !strings.Contains(err.Detail, c.detail) {
				t.Errorf("got %v, want %s at %s", err, c.reason, c.detail)
			}
		})
	}
}

// TestCheckedLoadsCountAsApplyDid: the check a stream runs outside the
// lock counts what it removed, and the state adds it up when it applies
// the load, the first fault of each kind kept; a load refused for too
// many aggregators counts nothing.
func TestCheckedLoadsCountAsApplyDid(t *testing.T) {
	cfg := testConfig()
	cfg.MaxAggregators = 2
	s, err := NewState(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	bad := func(agg string) *sluicev1.ZoneLoad {
		z := zoneLoad(agg, "z", 1, map[string]float64{"checkout/web": 1, "orders/web": 2})
		z.Services[1].Peers = append(z.Services[1].Peers, z.Services[1].Peers[0]) // orders: duplicate_peer
		z.Services[0].Descriptors = []*sluicev1.DescriptorRates{{Descriptor_: "BAD NAME"}}
		return z
	}
	for _, agg := range []string{"a", "b", "c"} {
		c, err := CheckZoneLoad(cfg, bad(agg))
		if err != nil {
			t.Fatal(err)
		}
		err = s.ApplyChecked(c, t0)
		if (err != nil) != (agg == "c") {
			t.Fatalf("aggregator %s: %v", agg, err)
		}
	}
	d := s.TakeDropped()
	if d.ByReason["duplicate_peer"] != 2 || d.AggregatorID != "a" || !strings.Contains(d.First.Detail, "orders") {
		t.Errorf("service entries dropped: %+v, want 2 duplicate_peer, the first from a", d)
	}
	if d.BadDescriptors[ReasonDescriptorName] != 2 || !strings.HasPrefix(d.FirstDescriptor, "aggregator a: ") {
		t.Errorf("descriptors dropped: %v, first %q, want 2, the first from a", d.BadDescriptors, d.FirstDescriptor)
	}
}
