package controller

import (
	"fmt"
	"math"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/zoneload"
	"github.com/sluicehq/sluice/pkg/names"
)

// Zone loads come from other processes: each is checked whole before it
// replaces its aggregator's last one, and refused with a reason that is a
// metric label.

// RejectError says why a zone load was refused; Reason is a metric label.
type RejectError struct {
	Reason string
	Detail string
}

func (e *RejectError) Error() string { return e.Reason + ": " + e.Detail }

func reject(reason, format string, args ...any) error {
	return &RejectError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// maxRate bounds any single rate in a zone load: 10^10 rps is more than any
// real fleet sends, so a larger number is a bug or a lie.
const maxRate = zoneload.MaxRate

func validateZoneLoad(z *sluicev1.ZoneLoad) error {
	if err := names.Check(z.GetAggregatorId()); err != nil {
		return reject("bad_name", "aggregator_id: %v", err)
	}
	if err := names.Check(z.GetZone()); err != nil {
		return reject("bad_name", "zone: %v", err)
	}
	if iv := z.GetInterval(); iv == nil || iv.CheckValid() != nil || iv.AsDuration() < 10*time.Millisecond || iv.AsDuration() > time.Minute {
		return reject("bad_interval", "interval %v is outside [10ms, 1m]", iv.AsDuration())
	}
	type key struct {
		service string
		dir     sluicev1.Direction
	}
	seen := make(map[key]bool, len(z.GetServices()))
	for i, svc := range z.GetServices() {
		if err := names.Check(svc.GetService()); err != nil || svc.GetService() == names.Overflow {
			return reject("bad_name", "services[%d].service: %v", i, errOr(err, "reserved name"))
		}
		d := svc.GetDirection()
		if d != sluicev1.Direction_DIRECTION_INBOUND && d != sluicev1.Direction_DIRECTION_OUTBOUND {
			return reject("bad_direction", "services[%d].direction: %v", i, d)
		}
		k := key{svc.GetService(), d}
		if seen[k] {
			return reject("duplicate_service", "services[%d]: %s %v listed twice", i, k.service, d)
		}
		seen[k] = true
		peers := make(map[string]bool, len(svc.GetPeers()))
		for j, p := range svc.GetPeers() {
			if err := names.Check(p.GetPeer()); err != nil {
				return reject("bad_name", "services[%d].peers[%d].peer: %v", i, j, err)
			}
			if peers[p.GetPeer()] {
				return reject("duplicate_peer", "services[%d].peers[%d]: %q listed twice", i, j, p.GetPeer())
			}
			peers[p.GetPeer()] = true
			for _, r := range []struct {
				field string
				v     float64
			}{{"offered_rps", p.GetOfferedRps()}, {"dropped_rps", p.GetDroppedRps()}, {"shadow_dropped_rps", p.GetShadowDroppedRps()}} {
				if math.IsNaN(r.v) || r.v < 0 || r.v > maxRate {
					return reject("bad_rate", "services[%d].peers[%d].%s: %v is outside [0, %g]", i, j, r.field, r.v, maxRate)
				}
			}
		}
	}
	return nil
}

func errOr(err error, s string) any {
	if err != nil {
		return err
	}
	return s
}
