package sidecar

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/pkg/spiffe"
)

// Who the caller is. By default the caller header names it, which trusts
// the network: any client that reaches the port can name any caller, and
// spend its limit. With an Identify function (HTTPOptions.Identify,
// GRPCOptions.Identify) an authenticated source names it instead: the SPIFFE
// ID of the peer's verified client certificate (PeerCertIdentity,
// PeerTLSIdentity), or the x-forwarded-client-cert header that a local
// proxy which verified that certificate added, believed only from the
// proxy's addresses (XFCCIdentity). The caller header is then only compared
// with the identity: a request whose header names another caller is counted
// as a mismatch and decided as its identity (or refused, with
// RejectMismatch). A request without a usable identity counts as
// names.Unknown, whatever its header says.

// IdentityResult is what an Identify function made of a request.
type IdentityResult uint8

const (
	// Authenticated: the caller is the service of a verified identity.
	Authenticated IdentityResult = iota
	// NoIdentity: the request carries none (no client certificate, no
	// x-forwarded-client-cert): it counts as names.Unknown.
	NoIdentity
	// UntrustedProxy: an x-forwarded-client-cert header from an address
	// that is not a trusted proxy's, ignored: the request counts as
	// names.Unknown.
	UntrustedProxy
	// InvalidIdentity: an identity that names no workload of the trust
	// domain (another trust domain, a malformed header, not exactly one
	// URI): the request counts as names.Unknown.
	InvalidIdentity

	numIdentityResults
)

func (r IdentityResult) String() string {
	switch r {
	case Authenticated:
		return "authenticated"
	case NoIdentity:
		return "missing"
	case UntrustedProxy:
		return "untrusted_proxy"
	case InvalidIdentity:
		return "invalid"
	}
	return "IdentityResult(" + strconv.Itoa(int(r)) + ")"
}

// Identify names the caller of an inbound HTTP request from what
// authenticates it: the caller's service name when res is Authenticated,
// else "". It runs on every request: one that allocates costs the request
// its allocation-free decision.
type Identify func(r *http.Request) (caller string, res IdentityResult)

// IdentifyContext is Identify for a gRPC call, from its context.
type IdentifyContext func(ctx context.Context) (caller string, res IdentityResult)

// PeerCertIdentity names the caller by the one URI SAN of the client
// certificate the TLS handshake verified (http.Request.TLS), a workload's
// SPIFFE ID in trustDomain (see pkg/spiffe). The server must verify client
// certificates: this only reads them.
func PeerCertIdentity(trustDomain string) Identify {
	return func(r *http.Request) (string, IdentityResult) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			return "", NoIdentity
		}
		return certService(r.TLS.PeerCertificates[0].URIs, trustDomain)
	}
}

// PeerTLSIdentity is PeerCertIdentity for gRPC servers with TLS transport
// credentials that verify client certificates.
func PeerTLSIdentity(trustDomain string) IdentifyContext {
	return func(ctx context.Context) (string, IdentityResult) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.AuthInfo == nil {
			return "", NoIdentity
		}
		info, ok := p.AuthInfo.(credentials.TLSInfo)
		if !ok || len(info.State.PeerCertificates) == 0 {
			return "", NoIdentity
		}
		return certService(info.State.PeerCertificates[0].URIs, trustDomain)
	}
}

func certService(uris []*url.URL, trustDomain string) (string, IdentityResult) {
	if len(uris) != 1 {
		return "", InvalidIdentity
	}
	if svc, ok := spiffe.ServiceOfURL(uris[0], trustDomain); ok {
		return svc, Authenticated
	}
	return "", InvalidIdentity
}

// XFCCHeader is the header in which Envoy (and Istio's sidecars) pass the
// client certificate they verified on to the app.
const XFCCHeader = "X-Forwarded-Client-Cert"

// XFCCIdentity names the caller by the x-forwarded-client-cert header, in
// Envoy's format: comma-separated elements, one per proxy that verified a
// client certificate, each of semicolon-separated key=value pairs whose
// values may be double-quoted. The element of the nearest proxy, the last,
// is read, and its one URI key must be a workload's SPIFFE ID in
// trustDomain (see pkg/spiffe); an element with no URI or several is
// InvalidIdentity. The header is believed only when the request's
// connection comes from an address in trusted (the local proxy's): from
// anywhere else it is ignored (UntrustedProxy), since any client can write
// it.
//
// Parsing allocates nothing: the caller is a substring of the header.
func XFCCIdentity(trusted []netip.Prefix, trustDomain string) Identify {
	trusted = append([]netip.Prefix(nil), trusted...)
	return func(r *http.Request) (string, IdentityResult) {
		v := r.Header[XFCCHeader]
		if len(v) == 0 {
			return "", NoIdentity
		}
		if !fromTrusted(r.RemoteAddr, trusted) {
			return "", UntrustedProxy
		}
		return xfccService(v, trustDomain)
	}
}

// xfccService names the caller of the values v of a believed
// x-forwarded-client-cert header (see XFCCIdentity).
func xfccService(v []string, trustDomain string) (string, IdentityResult) {
	// Header lines join with commas: the last line holds the last
	// element.
	uri, ok := xfccURI(v[len(v)-1])
	if !ok {
		return "", InvalidIdentity
	}
	if svc, ok := spiffe.Service(uri, trustDomain); ok {
		return svc, Authenticated
	}
	return "", InvalidIdentity
}

// XFCCIdentityContext is XFCCIdentity for a gRPC call: the header is its
// incoming metadata's x-forwarded-client-cert, believed when the call's
// peer address is in trusted.
func XFCCIdentityContext(trusted []netip.Prefix, trustDomain string) IdentifyContext {
	trusted = append([]netip.Prefix(nil), trusted...)
	key := strings.ToLower(XFCCHeader)
	return func(ctx context.Context) (string, IdentityResult) {
		v := metadata.ValueFromIncomingContext(ctx, key)
		if len(v) == 0 {
			return "", NoIdentity
		}
		p, ok := peer.FromContext(ctx)
		if !ok || !addrTrusted(p.Addr, trusted) {
			return "", UntrustedProxy
		}
		return xfccService(v, trustDomain)
	}
}

// addrTrusted reports whether a, a call's peer address, is in one of
// trusted; without allocating for a TCP address.
func addrTrusted(a net.Addr, trusted []netip.Prefix) bool {
	switch a := a.(type) {
	case *net.TCPAddr:
		return inPrefixes(a.AddrPort().Addr(), trusted)
	case nil:
		return false
	}
	return fromTrusted(a.String(), trusted)
}

// fromTrusted reports whether remote, a request's RemoteAddr (ip:port), is
// in one of trusted.
func fromTrusted(remote string, trusted []netip.Prefix) bool {
	ap, err := netip.ParseAddrPort(remote)
	return err == nil && inPrefixes(ap.Addr(), trusted)
}

func inPrefixes(a netip.Addr, trusted []netip.Prefix) bool {
	a = a.Unmap()
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// xfccURI returns the value of the one URI key of the last element of an
// x-forwarded-client-cert value, unquoted; ok is false when that element has
// no URI key or more than one, or the value is malformed (an unterminated
// quote; a quoted URI with an escape, which no SPIFFE ID needs).
func xfccURI(h string) (uri string, ok bool) {
	// The last element starts after the last comma outside quotes.
	start, quoted := 0, false
	for i := 0; i < len(h); i++ {
		switch c := h[i]; {
		case c == '\\' && quoted:
			i++ // an escaped character
		case c == '"':
			quoted = !quoted
		case c == ',' && !quoted:
			start = i + 1
		}
	}
	if quoted {
		return "", false
	}
	found := 0
	for el := h[start:]; el != ""; {
		pair, rest := cutUnquoted(el, ';')
		el = rest
		key, value, hasValue := strings.Cut(pair, "=")
		if !hasValue || !strings.EqualFold(strings.TrimSpace(key), "URI") {
			continue
		}
		found++
		uri = strings.TrimSpace(value)
	}
	if found != 1 {
		return "", false
	}
	if len(uri) >= 2 && uri[0] == '"' && uri[len(uri)-1] == '"' {
		uri = uri[1 : len(uri)-1]
	}
	if strings.ContainsAny(uri, `"\`) {
		return "", false
	}
	return uri, true
}

// cutUnquoted cuts s at the first sep outside double quotes.
func cutUnquoted(s string, sep byte) (before, after string) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			return s[:i], s[i+1:]
		}
	}
	return s, ""
}

// identityCounts are one service's counts of what its Identify functions
// made of requests, and of the caller headers and decided marks it did not
// believe. Authenticated requests are most of them, so their count is
// striped like a peer's (see stackStripe); the rest are rare but for an
// attack, whose cost a shared counter is.
type identityCounts struct {
	authenticated [nStripes]paddedCounter
	others        [numIdentityResults]atomic.Uint64 // Authenticated unused
	mismatch      atomic.Uint64                     // caller header disagreed with an authenticated identity
	decidedIgnore atomic.Uint64                     // DecidedHeader marks not believed
	// decidedLeaf counts the DecidedHeader marks that would be believed
	// but for the service's procedures (see resolveCaller).
	decidedLeaf atomic.Uint64
}

type paddedCounter struct {
	n atomic.Uint64
	_ [56]byte // one cache line each
}

func (c *identityCounts) add(res IdentityResult, stripeMask uint64) {
	if res == Authenticated {
		c.authenticated[stackStripe()&stripeMask].n.Add(1)
		return
	}
	if res < numIdentityResults {
		c.others[res].Add(1)
	}
}

func (c *identityCounts) load(res IdentityResult) uint64 {
	if res != Authenticated {
		return c.others[res].Load()
	}
	var n uint64
	for i := range c.authenticated {
		n += c.authenticated[i].n.Load()
	}
	return n
}

// callerRules are what Middleware and the server interceptors do about who
// the caller is, fixed when they are built.
type callerRules struct {
	// authenticated: an Identify function names the caller, not the
	// caller header.
	authenticated bool
	// rejectMismatch refuses a request whose caller header disagrees with
	// its authenticated identity.
	rejectMismatch bool
	// trustDecided honours DecidedHeader marks that name the caller.
	trustDecided bool
}

// resolveCaller applies rules to one request: header is its caller
// header's value ("" for none), id and res what the Identify function made
// of it (ignored without one), marks its DecidedHeader values, procedures
// whether the service's policy declares procedures or criticality (see
// table.fineLeaves). It returns the caller
// to decide under; decided when the request's caller decided it already
// and it passes uncounted (counted in DecidedUpstream); reject when it is
// to be refused (a mismatch under rejectMismatch). It counts what it did
// not believe, and allocates nothing.
//
// A mark is believed only with trustDecided, and only when it names the
// caller the request is decided under: with an identity, the
// authenticated service, so that no one can mark another's calls, and none
// when there is no authenticated identity. It is never believed when the
// service declares procedures: a caller's outbound enforcement decides per
// callee, not per procedure, and the controller publishes it no rule
// toward such a service and leaves its claims out of the law, so the
// request is decided and counted here, in its leaf, or no leaf limit or
// procedure capacity would ever hold for it. Likewise when it declares
// criticality: the caller decides no tier, and the mark is counted under
// reason "procedures" too (a leaf finer than the callee).
func (s *ServiceLimiter) resolveCaller(rules callerRules, header, id string, res IdentityResult, marks []string, procedures bool) (caller string, decided, reject bool) {
	caller = header
	if rules.authenticated {
		s.ident.add(res, s.stripeMask)
		caller = id
		if res == Authenticated && header != "" && header != id {
			s.ident.mismatch.Add(1)
			if rules.rejectMismatch {
				return caller, false, true
			}
		}
	}
	if len(marks) == 0 {
		return caller, false, false
	}
	switch {
	case !rules.trustDecided || rules.authenticated && res != Authenticated || !decidedUpstream(marks, caller):
		s.ident.decidedIgnore.Add(1)
	case procedures:
		s.ident.decidedLeaf.Add(1)
	default:
		s.upstream.Add(1)
		return caller, true, false
	}
	return caller, false, false
}
