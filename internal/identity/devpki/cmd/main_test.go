package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/identity"
)

// TestRunWritesUsableCertificates: every file `make certs` writes loads as
// the binaries load their --tls-* flags, with the identity its name says,
// and a second run reuses the CA, so earlier certificates stay trusted.
func TestRunWritesUsableCertificates(t *testing.T) {
	dir := t.TempDir()
	if err := run(dir, "example.org", []string{"checkout"}, []string{"zone-a"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := run(dir, "example.org", []string{"web"}, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]identity.ID{
		"controller":        {Kind: identity.Controller},
		"aggregator-zone-a": {Kind: identity.Aggregator, Zone: "zone-a"},
		"service-checkout":  {Kind: identity.Workload, Service: "checkout"},
		"service-web":       {Kind: identity.Workload, Service: "web"},
	} {
		src, err := identity.NewSource(identity.Config{
			CertFile: filepath.Join(dir, name+".crt"), KeyFile: filepath.Join(dir, name+".key"),
			CAFile: filepath.Join(dir, "ca.crt"), TrustDomain: "example.org"})
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if id := src.ID(); id.Kind != want.Kind || id.Zone != want.Zone || id.Service != want.Service {
			t.Errorf("%s: identity %+v, want %+v", name, id, want)
		}
	}
}
