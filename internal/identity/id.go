// Package identity gives every sluice link mutual TLS with SPIFFE-style
// identities: TLS 1.3 only, a client certificate on both ends, each
// certificate verified against a CA bundle read from a file, and the peer's
// identity taken from the certificate's one URI SAN. Certificates, keys and
// the CA bundle are re-read when their files change, so that cert-manager or
// SPIRE can rotate them under a running process.
//
// # Identities
//
// Every identity lives in one trust domain (--trust-domain); any other is
// refused at the handshake. Within it sluice understands four forms:
//
//	spiffe://<td>/ns/<namespace>/sa/<service-account>   a workload, Istio's form: the service is the service account
//	spiffe://<td>/sluice/service/<service>              a workload whose service name is not its service account
//	spiffe://<td>/sluice/aggregator[/<zone>]            a zone aggregator; with a zone it may speak for that zone only
//	spiffe://<td>/sluice/controller                     a controller replica
//
// The mapping from workload to service is in the certificate, not in a flag,
// so that the aggregator, the controller and the sidecar cannot disagree
// about it. Sluice service names are global: the namespace of Istio's form is
// not part of the service (two namespaces with the same service account are
// one sluice service). Where that is wrong, issue the sluice/service form.
package identity

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/spiffe"
)

// Kind is what a peer is.
type Kind uint8

const (
	// Workload is a service's sidecar (or in-process library).
	Workload Kind = iota + 1
	// Aggregator is a zone aggregator.
	Aggregator
	// Controller is a controller replica.
	Controller
)

func (k Kind) String() string {
	switch k {
	case Workload:
		return "workload"
	case Aggregator:
		return "aggregator"
	case Controller:
		return "controller"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// ID is a parsed identity. The zero ID is no identity (plaintext).
type ID struct {
	// URI is the SPIFFE ID as the certificate has it.
	URI         string
	TrustDomain string
	Kind        Kind
	// Service is a Workload's sluice service name.
	Service string
	// Namespace is the Kubernetes namespace of Istio's form, informative.
	Namespace string
	// Zone is an Aggregator's zone; empty means it may speak for any.
	Zone string
}

func (id ID) String() string { return id.URI }

// IsZero reports whether id is no identity.
func (id ID) IsZero() bool { return id.URI == "" }

// ErrTrustDomain is wrapped by Parse's error for an identity from another
// trust domain.
var ErrTrustDomain = errors.New("wrong trust domain")

// Parse reads a SPIFFE ID in one of the forms of the package comment. A
// non-empty trustDomain must match the ID's.
func Parse(uri, trustDomain string) (ID, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return ID{}, fmt.Errorf("identity %q: %w", short(uri), err)
	}
	if u.Scheme != "spiffe" || u.Host == "" || u.User != nil || u.Port() != "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return ID{}, fmt.Errorf("identity %q: not a spiffe://<trust-domain>/<path> ID", short(uri))
	}
	if trustDomain != "" && u.Host != trustDomain {
		return ID{}, fmt.Errorf("identity %q: %w: %q, want %q", short(uri), ErrTrustDomain, u.Host, trustDomain)
	}
	id := ID{URI: uri, TrustDomain: u.Host}
	seg := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	bad := func(why string) (ID, error) {
		return ID{}, fmt.Errorf("identity %q: %s; sluice accepts /ns/<ns>/sa/<sa>, /sluice/service/<service>, /sluice/aggregator[/<zone>], /sluice/controller", short(uri), why)
	}
	checkName := func(what, s string) error {
		if err := names.Check(s); err != nil || s == names.Overflow {
			return fmt.Errorf("identity %q: %s: %v", short(uri), what, errOr(err, "reserved name"))
		}
		return nil
	}
	// The workload forms are pkg/spiffe's, which the sidecar's request
	// path reads callers with.
	if svc, ns, ok := spiffe.Workload(u.Path); ok {
		what := "service"
		if seg[0] == "ns" {
			what = "service account"
		}
		if err := checkName(what, svc); err != nil {
			return ID{}, err
		}
		id.Kind, id.Namespace, id.Service = Workload, ns, svc
		return id, nil
	}
	switch {
	case len(seg) == 2 && seg[0] == "sluice" && seg[1] == "aggregator":
		id.Kind = Aggregator
	case len(seg) == 3 && seg[0] == "sluice" && seg[1] == "aggregator":
		if err := checkName("zone", seg[2]); err != nil {
			return ID{}, err
		}
		id.Kind, id.Zone = Aggregator, seg[2]
	case len(seg) == 2 && seg[0] == "sluice" && seg[1] == "controller":
		id.Kind = Controller
	default:
		return bad("unknown path")
	}
	return id, nil
}

// CheckTrustDomain reports whether td can be a SPIFFE trust domain: lower
// case letters, digits, dots, dashes and underscores.
func CheckTrustDomain(td string) error {
	if td == "" {
		return errors.New("empty")
	}
	if len(td) > 255 {
		return fmt.Errorf("%d bytes is longer than 255", len(td))
	}
	for i := 0; i < len(td); i++ {
		c := td[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("%q has character %q; allowed are [a-z0-9._-]", td, c)
		}
	}
	return nil
}

// WorkloadURI is the sluice/service form of a workload's identity.
func WorkloadURI(trustDomain, service string) string {
	return "spiffe://" + trustDomain + "/sluice/service/" + service
}

// AggregatorURI is an aggregator's identity; an empty zone gives the
// zone-less form.
func AggregatorURI(trustDomain, zone string) string {
	if zone == "" {
		return "spiffe://" + trustDomain + "/sluice/aggregator"
	}
	return "spiffe://" + trustDomain + "/sluice/aggregator/" + zone
}

// ControllerURI is a controller's identity.
func ControllerURI(trustDomain string) string {
	return "spiffe://" + trustDomain + "/sluice/controller"
}

// Allow decides whether a verified peer may talk to us at all (the dialer's
// check of the server, the server's check of any client). Finer decisions
// (which service a report may be for) are made per stream.
type Allow func(ID) error

// Kinds allows peers of the given kinds.
func Kinds(kinds ...Kind) Allow {
	return func(id ID) error {
		for _, k := range kinds {
			if id.Kind == k {
				return nil
			}
		}
		return fmt.Errorf("peer %s is a %v, want %v", id, id.Kind, kinds)
	}
}

// Any allows every identity of the trust domain.
func Any(ID) error { return nil }

func short(s string) string {
	if len(s) > 128 {
		return s[:128] + "…"
	}
	return s
}

func errOr(err error, s string) any {
	if err != nil {
		return err
	}
	return s
}
