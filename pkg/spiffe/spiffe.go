// Package spiffe maps a workload's SPIFFE ID to its sluice service name: the
// one place for that mapping, which the control plane (internal/identity,
// from peer certificates) and the request path (the sidecar library, from a
// peer certificate or an x-forwarded-client-cert header) share, so that they
// cannot disagree about who a workload is.
//
// Two forms name a workload:
//
//	spiffe://<td>/ns/<namespace>/sa/<service-account>   Istio's: the service is the service account
//	spiffe://<td>/sluice/service/<service>              when the service is not the service account
//
// Nothing here allocates: the request path calls it per request.
package spiffe

import (
	"net/url"
	"strings"

	"github.com/sluicehq/sluice/pkg/names"
)

const scheme = "spiffe://"

// Split splits a SPIFFE ID into its trust domain and its path (which starts
// with '/'). ok is false unless id is "spiffe://<td>/<path>" with a trust
// domain of [a-z0-9._-] and a path of non-empty segments of
// [A-Za-z0-9._-], as the SPIFFE ID specification requires: no port, user
// info, query, fragment or percent-encoding, so that one ID has one
// spelling.
func Split(id string) (trustDomain, path string, ok bool) {
	if !strings.HasPrefix(id, scheme) {
		return "", "", false
	}
	rest := id[len(scheme):]
	i := strings.IndexByte(rest, '/')
	if i <= 0 {
		return "", "", false
	}
	trustDomain, path = rest[:i], rest[i:]
	for k := 0; k < len(trustDomain); k++ {
		c := trustDomain[k]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			return "", "", false
		}
	}
	if !validPath(path) {
		return "", "", false
	}
	return trustDomain, path, true
}

// validPath reports whether path is '/' and segments of [A-Za-z0-9._-],
// none empty.
func validPath(path string) bool {
	if path == "" || path[0] != '/' {
		return false
	}
	for k := 0; k < len(path); k++ {
		c := path[k]
		switch {
		case c == '/':
			if k+1 == len(path) || path[k+1] == '/' {
				return false
			}
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// Workload returns the service a workload path names ("/ns/<ns>/sa/<sa>":
// sa, with namespace ns; "/sluice/service/<svc>": svc), and false for any
// other path. The service is not checked: see Service.
func Workload(path string) (service, namespace string, ok bool) {
	p, found := strings.CutPrefix(path, "/")
	if !found {
		return "", "", false
	}
	if rest, found := strings.CutPrefix(p, "ns/"); found {
		ns, sa, found := strings.Cut(rest, "/sa/")
		if !found || strings.IndexByte(ns, '/') >= 0 || strings.IndexByte(sa, '/') >= 0 {
			return "", "", false
		}
		return sa, ns, true
	}
	if svc, found := strings.CutPrefix(p, "sluice/service/"); found && strings.IndexByte(svc, '/') < 0 {
		return svc, "", true
	}
	return "", "", false
}

// Service returns the sluice service of the workload SPIFFE ID id in
// trustDomain, and false when id is not a workload's ID of that trust
// domain (see Split and Workload) or names no valid service (names.Check;
// the reserved _overflow included, which no workload may be).
func Service(id, trustDomain string) (string, bool) {
	td, path, ok := Split(id)
	if !ok || td != trustDomain {
		return "", false
	}
	return workloadService(path)
}

// ServiceOfURL is Service for a SPIFFE ID parsed as a URL, as a
// certificate's URI SAN is (x509.Certificate.URIs).
func ServiceOfURL(u *url.URL, trustDomain string) (string, bool) {
	if u == nil || u.Scheme != "spiffe" || u.Host != trustDomain || u.User != nil || u.Opaque != "" ||
		u.RawPath != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || !validPath(u.Path) {
		return "", false
	}
	return workloadService(u.Path)
}

func workloadService(path string) (string, bool) {
	svc, _, ok := Workload(path)
	if !ok || svc == names.Overflow || !names.Valid(svc) {
		return "", false
	}
	return svc, true
}
