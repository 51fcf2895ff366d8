// Command devpki writes a development CA and SPIFFE certificates for every
// sluice component into a directory, for running the binaries with mutual
// TLS on one machine (`make certs`). Running it again reuses the CA in the
// directory, so that certificates issued earlier stay trusted.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/internal/identity/devpki"
)

func main() {
	dir := flag.String("dir", "certs", "directory to write ca.crt, ca.key and <name>.crt/.key into")
	td := flag.String("trust-domain", identity.DefaultTrustDomain, "SPIFFE trust domain")
	services := flag.String("services", "checkout,web", "comma-separated services to issue workload certificates for (service-<name>.crt)")
	zones := flag.String("zones", "zone-a", "comma-separated zones to issue aggregator certificates for (aggregator-<zone>.crt)")
	validity := flag.Duration("validity", 30*24*time.Hour, "validity of the issued certificates")
	flag.Parse()
	if err := run(*dir, *td, split(*services), split(*zones), *validity); err != nil {
		fmt.Fprintln(os.Stderr, "devpki:", err)
		os.Exit(1)
	}
}

func run(dir, td string, services, zones []string, validity time.Duration) error {
	if err := identity.CheckTrustDomain(td); err != nil {
		return fmt.Errorf("trust-domain: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ca, err := loadOrCreateCA(dir)
	if err != nil {
		return err
	}
	issue := func(name, uri string) error {
		if _, err := identity.Parse(uri, td); err != nil {
			return err
		}
		leaf, err := ca.Issue(uri, validity, "localhost")
		if err != nil {
			return err
		}
		f, err := ca.WriteLeaf(dir, name, leaf)
		if err != nil {
			return err
		}
		fmt.Printf("%-28s %s\n", filepath.Base(f.Cert), uri)
		return nil
	}
	if err := issue("controller", identity.ControllerURI(td)); err != nil {
		return err
	}
	for _, z := range zones {
		if err := issue("aggregator-"+z, identity.AggregatorURI(td, z)); err != nil {
			return err
		}
	}
	for _, s := range services {
		if err := issue("service-"+s, identity.WorkloadURI(td, s)); err != nil {
			return err
		}
	}
	fmt.Printf("CA bundle: %s\n", filepath.Join(dir, "ca.crt"))
	return nil
}

func loadOrCreateCA(dir string) (*devpki.CA, error) {
	certPath, keyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	certPEM, errC := os.ReadFile(certPath)
	keyPEM, errK := os.ReadFile(keyPath)
	if errC == nil && errK == nil {
		return devpki.LoadCA(certPEM, keyPEM)
	}
	ca, err := devpki.NewCA("sluice development CA", 5*365*24*time.Hour)
	if err != nil {
		return nil, err
	}
	key, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := devpki.WriteFileAtomic(keyPath, key, 0o600); err != nil {
		return nil, err
	}
	if err := devpki.WriteFileAtomic(certPath, ca.PEM, 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

func split(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}
