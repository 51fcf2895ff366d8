package controller

import (
	"math"
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/sidecar"
)

// A callee's fail mode reaches its policy as the sidecars read it; a value
// that is not a fail mode (only a hand-built Set can hold one) goes out as
// one the sidecars refuse, never as open.
func TestFailModeOnTheWire(t *testing.T) {
	for _, tc := range []struct {
		fm   dataplane.FailMode
		want sluicev1.FailMode
	}{
		{dataplane.FailOpen, sluicev1.FailMode_FAIL_MODE_OPEN},
		{dataplane.FailHold, sluicev1.FailMode_FAIL_MODE_HOLD},
		{dataplane.FailLocal, sluicev1.FailMode_FAIL_MODE_LOCAL},
		{dataplane.FailMode(7), -1},
	} {
		set := limits.NewSet(map[string]*limits.Service{"checkout": {
			Name: "checkout", Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: tc.fm,
		}})
		s := warmState(t)
		now := t0.Add(2 * time.Second)
		if err := s.Apply(zoneLoad("a", "zone-a", 1, map[string]float64{"checkout/web": 10}), now); err != nil {
			t.Fatal(err)
		}
		m := s.Tick(now, set).Changed["callee/checkout"]
		if got := m.GetFailMode(); got != tc.want {
			t.Errorf("%v: fail mode %v on the wire, want %v", tc.fm, got, tc.want)
		}
		p, err := sidecar.PolicyFromProto(m)
		switch {
		case tc.want < 0:
			if err == nil || !strings.Contains(err.Error(), "fail_mode") {
				t.Errorf("%v: sidecar accepted %v (%v); want a NACK naming fail_mode", tc.fm, p, err)
			}
		case err != nil || p.FailMode != tc.fm:
			t.Errorf("%v: sidecar read %v, %v", tc.fm, p, err)
		}
	}
}
