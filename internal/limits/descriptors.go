package limits

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/allowance"
	"github.com/sluicehq/sluice/pkg/descriptor"
)

// fileDescriptor is the file form of one descriptor limit: see fileDoc's
// services.api.descriptors.tenant.
type fileDescriptor struct {
	From      string              `yaml:"from"`
	Limit     *float64            `yaml:"limit"`
	Missing   *float64            `yaml:"missing,omitempty"`
	Quantile  *float64            `yaml:"quantile,omitempty"`
	Overrides map[string]*float64 `yaml:"overrides,omitempty"`
}

// errUpstreamDescriptors is why a service with descriptors can not be
// enforced upstream: a proxyless gRPC client or the callee's Envoy carries
// one ratio per caller (per method), none per descriptor value, so only the
// callee's own sidecars can decide a request's descriptors.
var errUpstreamDescriptors = errors.New("upstream: the service has descriptors, which only its own sidecars can decide (upstream data planes carry no ratio per value); use sidecar")

// upstreamErr is why s's callers can not be enforced upstream, nil when
// they can: its procedures (upstreamRefused), its descriptors, its
// tiers or its unit of cost.
func upstreamErr(s *Service) error {
	switch {
	case upstreamRefused(s):
		return errUpstream
	case len(s.Descriptors) > 0:
		return errUpstreamDescriptors
	case s.Criticality != nil:
		return errUpstreamCriticality
	case s.Counted():
		return errUpstreamCost
	}
	return nil
}

func (d *decoder) descriptor(n *yaml.Node, path string) fileDescriptor {
	var fd fileDescriptor
	d.mapping(n, path, func(key string, k, v *yaml.Node) {
		p := path + "." + key
		switch key {
		case "from":
			fd.From = d.text(v, p)
		case "limit":
			fd.Limit = d.number(v, p)
		case "missing":
			fd.Missing = d.number(v, p)
		case "quantile":
			fd.Quantile = d.number(v, p)
		case "overrides":
			fd.Overrides = map[string]*float64{}
			d.mapping(v, p, func(value string, _, v *yaml.Node) {
				fd.Overrides[value] = d.number(v, p+"."+value)
			})
		default:
			d.errorf(path, k, "field %s not found", key)
		}
	})
	return fd
}

// descriptors builds svc's Descriptors from their file form, sorted by
// name, each problem at its path.
func (b *builder) descriptors(svc *Service, fds map[string]fileDescriptor, path string) {
	if len(fds) == 0 {
		return
	}
	path += ".descriptors"
	if len(fds) > descriptor.MaxPerService {
		b.errs = append(b.errs, fmt.Errorf("%s: %d descriptors, at most %d per service (each costs a sketch on every sidecar)", path, len(fds), descriptor.MaxPerService))
	}
	for _, name := range slices.Sorted(maps.Keys(fds)) {
		fd, dpath := fds[name], path+"."+name
		if err := descriptor.CheckName(name); err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s: invalid descriptor name: %v", dpath, err))
		}
		d := Descriptor{Name: name, Quantile: allowance.DefaultQuantile}
		if fd.From == "" {
			b.errs = append(b.errs, fmt.Errorf("%s.from: missing", dpath))
		} else if src, err := descriptor.ParseSource(fd.From); err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s.from: %w", dpath, err))
		} else {
			d.Source = src
		}
		if fd.Limit == nil {
			b.errs = append(b.errs, fmt.Errorf("%s.limit: missing", dpath))
		}
		d.Limit = rate(dpath+".limit", fd.Limit, &b.errs)
		d.Missing = d.Limit
		if fd.Missing != nil {
			d.Missing = rate(dpath+".missing", fd.Missing, &b.errs)
		}
		if fd.Quantile != nil {
			d.Quantile = *fd.Quantile
			if err := allowance.CheckQuantile(d.Quantile); err != nil {
				b.errs = append(b.errs, fmt.Errorf("%s.quantile: %w", dpath, err))
			}
		}
		d.Overrides = b.overrides(fd.Overrides, dpath+".overrides")
		svc.Descriptors = append(svc.Descriptors, d)
	}
}

// overrides checks a descriptor's overrides: values a request can carry
// (descriptor.CheckValue), each with a finite limit. descriptor.Missing has
// its own field, missing, so that there is one way to say it.
func (b *builder) overrides(fo map[string]*float64, path string) map[string]float64 {
	if len(fo) == 0 {
		return nil
	}
	out := make(map[string]float64, len(fo))
	for _, value := range slices.Sorted(maps.Keys(fo)) {
		if b.stopped() {
			return out
		}
		vpath := path + "." + value
		switch err := descriptor.CheckValue(value); {
		case value == descriptor.Missing:
			b.errs = append(b.errs, fmt.Errorf("%s: the limit of requests without the attribute is the descriptor's missing, not an override", vpath))
			continue
		case err != nil:
			b.errs = append(b.errs, fmt.Errorf("%s: %v", vpath, err))
			continue
		}
		if fo[value] == nil {
			b.errs = append(b.errs, fmt.Errorf("%s: missing limit", vpath))
		}
		out[value] = rate(vpath, fo[value], &b.errs)
	}
	return out
}
