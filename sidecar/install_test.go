package sidecar

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

func TestInstallerTakesOnlyItsServiceAndDirection(t *testing.T) {
	lim := NewLimiter(LimiterOptions{})
	var removed []string
	in := Installer{Limiter: lim, Service: "checkout", Direction: Inbound, OnRemove: func(n string) { removed = append(removed, n) }}
	policy := func(name, svc string, dir sluicev1.Direction) *sluicev1.DropPolicy {
		return &sluicev1.DropPolicy{
			Name: name, Service: svc, Direction: dir, Ttl: durationpb.New(30e9),
			Peers: []*sluicev1.PeerPolicy{{Peer: "web", DropRatio: 0.5, Mode: sluicev1.Mode_MODE_ENFORCE}},
		}
	}
	if err := in.Update("callee/checkout", policy("callee/checkout", "checkout", sluicev1.Direction_DIRECTION_INBOUND)); err != nil {
		t.Fatalf("its own policy: %v", err)
	}
	if r, _ := lim.Service("checkout").Ratio("web"); r != 0.5 || lim.Policy("checkout") == nil {
		t.Fatalf("web's ratio after the update = %v, want 0.5", r)
	}
	for _, bad := range []*sluicev1.DropPolicy{
		policy("callee/payments", "payments", sluicev1.Direction_DIRECTION_INBOUND),
		policy("caller/checkout", "checkout", sluicev1.Direction_DIRECTION_OUTBOUND),
	} {
		if err := in.Update(bad.GetName(), bad); err == nil || !strings.Contains(err.Error(), "installs inbound \"checkout\"") {
			t.Errorf("Update(%s) = %v, want an error naming what it installs", bad.GetName(), err)
		}
	}
	in.Remove("callee/checkout")
	if r, _ := lim.Service("checkout").Ratio("web"); r != 0 || lim.Policy("checkout") != nil || len(removed) != 1 || removed[0] != "callee/checkout" {
		t.Errorf("after Remove: web's ratio %v, policy %v, OnRemove heard %v; want 0, none, [callee/checkout]", r, lim.Policy("checkout"), removed)
	}
}
