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
