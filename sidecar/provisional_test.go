package sidecar

import (
	"math"
	"testing"

	"github.com/sluicehq/sluice/pkg/dropratio"
)

// TestProvisionalReplacesTheControllersRatio: a provisional ratio takes the
// controller's place for its leaf only, survives the controller's next
// policy, and is gone when the projection ends; a shadow rule keeps its own.
func TestProvisionalReplacesTheControllersRatio(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	s := l.Service("checkout")
	rule := func(peer string, p float64, mode dropratio.Mode) Rule {
		return Rule{Peer: peer, DropRatio: p, Mode: mode, LimitRPS: 100, AllowedRPS: 100, OfferedRPS: 50}
	}
	l.SetPolicy(policy("checkout", rule("web", 0, dropratio.Enforce), rule("batch", 0.5, dropratio.Enforce), rule("shadowed", 0, dropratio.Shadow)))
	ratio := func(peer string) float64 {
		r, ok := s.Ratio(peer)
		if !ok {
			t.Fatalf("%s: no ratio", peer)
		}
		return r
	}
	l.SetProvisional("checkout", []Provisional{{Peer: "web", Ratio: 0.8}, {Peer: "shadowed", Ratio: 0.8}, {Peer: "batch", Ratio: 0}})
	if got := ratio("web"); got != 0.8 {
		t.Errorf("web under a provisional 0.8: ratio %v", got)
	}
	if got := ratio("batch"); got != 0 {
		t.Errorf("batch under a provisional 0 (a fall's opening): ratio %v, want 0", got)
	}
	if got := ratio("shadowed"); got != 0 {
		t.Errorf("a shadow rule took a provisional ratio: %v", got)
	}
	dropped := 0
	for range 1000 {
		if l.Decide("checkout", "web").Drop {
			dropped++
		}
	}
	if math.Abs(float64(dropped)-800) > 1 {
		t.Errorf("web: %d of 1000 dropped under 0.8", dropped)
	}

	// The controller's next policy: the projection still stands.
	l.SetPolicy(policy("checkout", rule("web", 0.3, dropratio.Enforce), rule("batch", 0.6, dropratio.Enforce)))
	if got := ratio("web"); got != 0.8 {
		t.Errorf("web after a new policy: ratio %v, want the provisional 0.8", got)
	}
	l.SetProvisional("checkout", nil)
	if got, want := ratio("web"), 0.3; got != want {
		t.Errorf("web after the projection ended: ratio %v, want the controller's %v", got, want)
	}
	if got, want := ratio("batch"), 0.6; got != want {
		t.Errorf("batch after the projection ended: ratio %v, want %v", got, want)
	}
}

// TestProvisionalEndHeardWithoutATable: the end of provisional ratios
// (SetProvisional with none) is heard while the service takes none, its
// policy removed or metered; the next policy comes without them, not with
// ratios whose giver had ended them.
func TestProvisionalEndHeardWithoutATable(t *testing.T) {
	rule := Rule{Peer: "web", Mode: dropratio.Enforce, LimitRPS: 100, AllowedRPS: 100, OfferedRPS: 50}
	capped := rule
	capped.MaxConcurrency = 4
	for _, c := range []struct {
		name    string
		between func(l *Limiter)
	}{
		{"removed", func(l *Limiter) { l.RemovePolicy("checkout") }},
		{"metered", func(l *Limiter) { l.SetPolicy(policy("checkout", capped)) }},
	} {
		l := NewLimiter(LimiterOptions{})
		l.SetPolicy(policy("checkout", rule))
		l.SetProvisional("checkout", []Provisional{{Peer: "web", Ratio: 0.8}})
		c.between(l)
		l.SetProvisional("checkout", nil)
		l.SetPolicy(policy("checkout", rule))
		if r, _ := l.Service("checkout").Ratio("web"); r != 0 {
			t.Errorf("%s: web's ratio %v under the next policy, want the controller's 0: an ended provisional ratio came back", c.name, r)
		}
	}
}
