package xdsserver

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/names"
)

// Endpoints lists, per callee service, the host:port addresses of its gRPC
// backends. Each callee listed is served to proxyless gRPC clients as
// xds:///<callee>: the controller knows ratios, not addresses, so the
// addresses come from the operator (the controller's --proxyless-endpoints
// file). Kubernetes EndpointSlices could feed the same map later.
type Endpoints map[string][]string

// Validate reports every bad entry at once, each named by its place in the
// file ("services.checkout[1]").
func (e Endpoints) Validate() error {
	var errs []error
	for _, svc := range slices.Sorted(maps.Keys(e)) {
		if err := names.Check(svc); err != nil || svc == names.Overflow {
			errs = append(errs, fmt.Errorf("services.%s: not a service name: %v", svc, errOrReserved(err)))
			continue
		}
		addrs := e[svc]
		if len(addrs) == 0 {
			errs = append(errs, fmt.Errorf("services.%s: no addresses", svc))
		}
		seen := make(map[string]bool, len(addrs))
		for i, a := range addrs {
			if err := checkHostPort(a); err != nil {
				errs = append(errs, fmt.Errorf("services.%s[%d]: %q: %w", svc, i, a, err))
				continue
			}
			if seen[a] {
				errs = append(errs, fmt.Errorf("services.%s[%d]: %q listed twice", svc, i, a))
			}
			seen[a] = true
		}
	}
	return errors.Join(errs...)
}

// LoadEndpoints reads an endpoints file:
//
//	services:
//	  checkout: ["10.0.0.11:8080", "10.0.0.12:8080"]
//
// It is read once, at start-up; unknown keys and bad entries are errors.
func LoadEndpoints(path string) (Endpoints, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read endpoints file: %w", err)
	}
	var f struct {
		Services Endpoints `yaml:"services"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("parse endpoints file %s: %w", path, err)
	}
	if err := f.Services.Validate(); err != nil {
		return nil, fmt.Errorf("endpoints file %s: %w", path, err)
	}
	return f.Services, nil
}

// checkHostPort accepts what an xDS SocketAddress can carry: a host (name or
// IP literal) and a numeric port in [1, 65535].
func checkHostPort(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("not host:port: %w", err)
	}
	if host == "" {
		return errors.New("empty host")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number in [1, 65535]", port)
	}
	return nil
}

func errOrReserved(err error) error {
	if err != nil {
		return err
	}
	return errors.New("reserved name")
}
