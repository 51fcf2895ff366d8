package limits

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/names"
)

// Criticality is how the sidecars of a callee that declares tiers find a
// request's tier (issue #16): the header, if it names a tier the caller may
// claim (lowered to the caller's Max, else the service's), else the most
// specific default: the procedure's, the caller's, the service's. Limits
// are not per tier: the tiers of a bucket share its limits, and the law
// gives each level's rate to them from the top down.
type Criticality struct {
	// Header is the lower-case header (gRPC metadata key) the tier is read
	// from; criticality.DefaultHeader unless the file names another.
	Header string
	// Default is the tier of a request whose header names none; Max the
	// highest tier a caller not listed in Callers may claim. Never None.
	Default, Max criticality.Tier
	// Procedures holds the procedures with a default of their own, over
	// the caller's and the service's; names.Other may be one.
	Procedures map[string]criticality.Tier
	// Callers holds the callers with a default or a maximum of their own.
	Callers map[string]CallerTier
}

// CallerTier is a caller's own default tier and the highest it may claim;
// None leaves the service's.
type CallerTier struct {
	Default, Max criticality.Tier
}

// Tiered reports whether svc declares tiers: its buckets are then keyed by
// tier too, and never by None.
func (svc *Service) Tiered() bool { return svc != nil && svc.Criticality != nil }

// DefaultTier returns the tier of a request of caller to procedure that
// carries no valid header: the most specific default. None when svc
// declares no tiers.
func (svc *Service) DefaultTier(caller, procedure string) criticality.Tier {
	if !svc.Tiered() {
		return criticality.None
	}
	c := svc.Criticality
	d := c.Default
	switch {
	case c.Procedures[procedure] != criticality.None:
		d = c.Procedures[procedure]
	case c.Callers[caller].Default != criticality.None:
		d = c.Callers[caller].Default
	}
	// A caller's own max bounds its defaults, as the sidecars resolve them.
	d, _ = criticality.Cap(d, c.Callers[caller].Max)
	return d
}

// MaxTier is the highest tier caller may claim at svc: its own max, else
// the service's. None at a service without tiers.
func (svc *Service) MaxTier(caller string) criticality.Tier {
	if !svc.Tiered() {
		return criticality.None
	}
	return orTier(svc.Criticality.Callers[caller].Max, svc.Criticality.Max)
}

// errUpstreamCriticality is why a service with tiers can not be enforced
// upstream: a proxyless gRPC client or the callee's Envoy carries one ratio
// per caller (per method), none per tier, so only the callee's own
// sidecars can decide a request's tier.
var errUpstreamCriticality = errors.New("upstream: the service has criticality tiers, which only its own sidecars can decide (upstream data planes carry no ratio per tier); use sidecar")

// fileCriticality is the file form of a service's tiers: see fileDoc's
// services.ledger.criticality.
type fileCriticality struct {
	From    string `yaml:"from,omitempty"`
	Default string `yaml:"default,omitempty"`
	Max     string `yaml:"max,omitempty"`
}

func (d *decoder) criticality(n *yaml.Node, path string) *fileCriticality {
	fc := &fileCriticality{}
	d.mapping(n, path, func(key string, k, v *yaml.Node) {
		p := path + "." + key
		switch key {
		case "from":
			fc.From = d.text(v, p)
		case "default":
			fc.Default = d.text(v, p)
		case "max":
			fc.Max = d.text(v, p)
		default:
			d.errorf(path, k, "field %s not found", key)
		}
	})
	return fc
}

// criticality builds svc's Criticality from fs: the service's block and
// its procedures' defaults (a caller's come with its bucket,
// callerCriticality). svc's procedures must be built.
func (b *builder) criticality(svc *Service, fs fileService, path string) {
	if fc := fs.Criticality; fc != nil {
		cpath := path + ".criticality"
		c := &Criticality{Header: criticality.DefaultHeader}
		if fc.From != "" {
			if h := b.headerName(cpath+".from", fc.From); h != "" {
				c.Header = h
			}
		}
		c.Default = tier(cpath+".default", fc.Default, criticality.Critical, &b.errs)
		c.Max = tier(cpath+".max", fc.Max, criticality.Critical, &b.errs)
		if c.Default < c.Max {
			b.warnf("%s.default: %v is above max %v, so a request that claims no tier outranks one that claims it", cpath, c.Default, c.Max)
		}
		svc.Criticality = c
	}
	for _, proc := range slices.Sorted(maps.Keys(fs.Procedures)) {
		s := fs.Procedures[proc].Criticality
		if s == "" {
			continue
		}
		ppath := path + ".procedures." + proc + ".criticality"
		if !svc.Tiered() {
			b.errs = append(b.errs, fmt.Errorf("%s: needs %s.criticality (the service declares no tiers)", ppath, path))
			continue
		}
		if _, ok := svc.Procedures[proc]; !ok {
			continue // not a procedure of svc: procedures reported it
		}
		if svc.Criticality.Procedures == nil {
			svc.Criticality.Procedures = map[string]criticality.Tier{}
		}
		svc.Criticality.Procedures[proc] = tier(ppath, s, criticality.None, &b.errs)
	}
}

// callerCriticality adds caller's default and maximum tier, from its file
// form fb at cpath, to svc's Criticality.
func (b *builder) callerCriticality(svc *Service, caller string, fb fileBucket, cpath string) {
	if fb.Criticality == "" && fb.MaxCriticality == "" {
		return
	}
	if !svc.Tiered() {
		for _, f := range []struct{ name, v string }{{"criticality", fb.Criticality}, {"max_criticality", fb.MaxCriticality}} {
			if f.v != "" {
				b.errs = append(b.errs, fmt.Errorf("%s.%s: needs services.%s.criticality (the service declares no tiers)", cpath, f.name, svc.Name))
			}
		}
		return
	}
	ct := CallerTier{
		Default: tier(cpath+".criticality", fb.Criticality, criticality.None, &b.errs),
		Max:     tier(cpath+".max_criticality", fb.MaxCriticality, criticality.None, &b.errs),
	}
	if max := orTier(ct.Max, svc.Criticality.Max); ct.Default != criticality.None && ct.Default < max {
		b.warnf("%s.criticality: %v is above the caller's max %v, so its requests that claim no tier outrank those that claim it", cpath, ct.Default, max)
	}
	if svc.Criticality.Callers == nil {
		svc.Criticality.Callers = map[string]CallerTier{}
	}
	if names.Check(caller) == nil {
		svc.Criticality.Callers[caller] = ct
	}
}

// orTier is t, else def when t is None.
func orTier(t, def criticality.Tier) criticality.Tier {
	if t == criticality.None {
		return def
	}
	return t
}

// tier reads an optional tier name: def when absent, else the tier it
// names, and an error at path for anything else.
func tier(path, s string, def criticality.Tier, errs *[]error) criticality.Tier {
	return setting(path, s, criticality.ParseConfig, def, errs)
}
