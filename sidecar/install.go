package sidecar

import (
	"fmt"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// Installer puts the policies an xDS client receives for one service and
// direction into a Limiter; it is the xdsclient.Handler of the sidecar
// binary and of an app that embeds the sidecar package. Safe for concurrent
// use as far as the Limiter is.
type Installer struct {
	Limiter   *Limiter
	Service   string
	Direction Direction
	// OnRemove, if set, hears of each removal after the policy is gone.
	OnRemove func(name string)
}

// Update installs a new version of the policy, fresh: its TTL runs from now,
// on this machine's clock. The xDS client hands over only versions whose
// content changed; the controller stamps a new issued_at on every re-issue
// (at least every half TTL), so a controller that is alive but has nothing
// new to say still refreshes the policy here. A policy for another service
// or direction is an error, which the client NACKs.
func (in Installer) Update(name string, m *sluicev1.DropPolicy) error {
	p, err := PolicyFromProto(m)
	if err != nil {
		return err
	}
	if p.Service != in.Service || p.Direction != in.Direction {
		return fmt.Errorf("policy %s is for %v service %q, this one installs %v %q", name, p.Direction, p.Service, in.Direction, in.Service)
	}
	in.Limiter.SetPolicyAt(p, time.Now())
	return nil
}

// Remove drops the service's policy: its callers are admitted undecided.
func (in Installer) Remove(name string) {
	in.Limiter.RemovePolicy(in.Service)
	if in.OnRemove != nil {
		in.OnRemove(name)
	}
}
