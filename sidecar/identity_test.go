package sidecar

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/pkg/names"
)

const testTD = "example.org"

func TestXFCCURI(t *testing.T) {
	for _, tc := range []struct {
		name, h string
		want    string // "" for not ok
	}{
		{"envoy's one element", `By=spiffe://example.org/ns/shop/sa/checkout;Hash=abc;Subject="/C=US/CN=Test, Client";URI=spiffe://example.org/ns/shop/sa/web`, "spiffe://example.org/ns/shop/sa/web"},
		{"the nearest proxy's element is the last", `URI=spiffe://example.org/ns/shop/sa/web,By=x;URI=spiffe://example.org/ns/shop/sa/abuser`, "spiffe://example.org/ns/shop/sa/abuser"},
		{"a quoted comma does not split elements", `URI=spiffe://example.org/sa/x;Subject="a,URI=spiffe://example.org/sluice/service/web"`, "spiffe://example.org/sa/x"},
		{"quoted value", `uri="spiffe://example.org/sluice/service/web"`, "spiffe://example.org/sluice/service/web"},
		{"no URI", `By=spiffe://example.org/ns/shop/sa/checkout;Hash=abc`, ""},
		{"two URIs", `URI=spiffe://example.org/sluice/service/web;URI=spiffe://example.org/sluice/service/abuser`, ""},
		{"unterminated quote", `URI="spiffe://example.org/sluice/service/web`, ""},
		{"escape in the URI", `URI="spiffe://example.org/sluice/service/w\"eb"`, ""},
		{"empty last element", `URI=spiffe://example.org/sluice/service/web,`, ""},
		{"empty", ``, ""},
	} {
		got, ok := xfccURI(tc.h)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: xfccURI(%q) = %q, %v; want %q", tc.name, tc.h, got, ok, tc.want)
		}
	}
}

func TestXFCCIdentity(t *testing.T) {
	id := XFCCIdentity([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}, testTD)
	web := "By=spiffe://example.org/ns/shop/sa/checkout;URI=spiffe://example.org/ns/shop/sa/web"
	for _, tc := range []struct {
		name, remote string
		xfcc         []string
		want         string
		res          IdentityResult
	}{
		{"trusted proxy", "127.0.0.1:4000", []string{web}, "web", Authenticated},
		{"trusted proxy, IPv6", "[::1]:4000", []string{web}, "web", Authenticated},
		{"untrusted address", "10.0.0.9:4000", []string{web}, "", UntrustedProxy},
		{"no header", "10.0.0.9:4000", nil, "", NoIdentity},
		{"two lines: the last one's element", "127.0.0.1:1", []string{web, "URI=spiffe://example.org/sluice/service/abuser"}, "abuser", Authenticated},
		{"another trust domain", "127.0.0.1:1", []string{"URI=spiffe://other.org/ns/shop/sa/web"}, "", InvalidIdentity},
		{"not a workload", "127.0.0.1:1", []string{"URI=spiffe://example.org/sluice/controller"}, "", InvalidIdentity},
		{"bad remote address", "pipe", []string{web}, "", UntrustedProxy},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = tc.remote
		for _, v := range tc.xfcc {
			r.Header.Add(XFCCHeader, v)
		}
		if got, res := id(r); got != tc.want || res != tc.res {
			t.Errorf("%s: %q, %v; want %q, %v", tc.name, got, res, tc.want, tc.res)
		}
	}
}

// The gRPC form reads the same header from metadata and the peer's address
// from the call's context, and agrees with the HTTP form on every case.
func TestXFCCIdentityContext(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}
	id := XFCCIdentityContext(trusted, testTD)
	web := "By=spiffe://example.org/ns/shop/sa/checkout;URI=spiffe://example.org/ns/shop/sa/web"
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	for _, tc := range []struct {
		name string
		addr net.Addr
		xfcc []string
		want string
		res  IdentityResult
	}{
		{"trusted proxy", tcp("127.0.0.1:4000"), []string{web}, "web", Authenticated},
		{"trusted proxy, IPv6", tcp("[::1]:4000"), []string{web}, "web", Authenticated},
		{"trusted proxy, IPv4 in IPv6", tcp("[::ffff:127.0.0.1]:4000"), []string{web}, "web", Authenticated},
		{"untrusted address", tcp("10.0.0.9:4000"), []string{web}, "", UntrustedProxy},
		{"no header", tcp("10.0.0.9:4000"), nil, "", NoIdentity},
		{"two values: the last one's element", tcp("127.0.0.1:1"), []string{web, "URI=spiffe://example.org/sluice/service/abuser"}, "abuser", Authenticated},
		{"another trust domain", tcp("127.0.0.1:1"), []string{"URI=spiffe://other.org/ns/shop/sa/web"}, "", InvalidIdentity},
		{"no peer address", nil, []string{web}, "", UntrustedProxy},
		{"not TCP", &net.UnixAddr{Name: "/tmp/x", Net: "unix"}, []string{web}, "", UntrustedProxy},
	} {
		ctx := context.Background()
		if tc.addr != nil {
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: tc.addr})
		}
		md := metadata.MD{}
		for _, v := range tc.xfcc {
			md.Append("x-forwarded-client-cert", v)
		}
		ctx = metadata.NewIncomingContext(ctx, md)
		if got, res := id(ctx); got != tc.want || res != tc.res {
			t.Errorf("%s: %q, %v; want %q, %v", tc.name, got, res, tc.want, tc.res)
		}
	}
}

// withCert is a request as the TLS server hands it over after a handshake
// that verified a client certificate with the given URI SANs.
func withCert(uris ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	c := &x509.Certificate{}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			panic(err)
		}
		c.URIs = append(c.URIs, pu)
	}
	r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{c}}
	return r
}

func TestPeerCertIdentity(t *testing.T) {
	id := PeerCertIdentity(testTD)
	plain := httptest.NewRequest(http.MethodGet, "/", nil)
	for _, tc := range []struct {
		name string
		r    *http.Request
		want string
		res  IdentityResult
	}{
		{"istio form", withCert("spiffe://example.org/ns/shop/sa/web"), "web", Authenticated},
		{"sluice form", withCert("spiffe://example.org/sluice/service/web"), "web", Authenticated},
		{"plaintext", plain, "", NoIdentity},
		{"two URIs", withCert("spiffe://example.org/sluice/service/web", "spiffe://example.org/sluice/service/x"), "", InvalidIdentity},
		{"aggregator", withCert("spiffe://example.org/sluice/aggregator"), "", InvalidIdentity},
	} {
		if got, res := id(tc.r); got != tc.want || res != tc.res {
			t.Errorf("%s: %q, %v; want %q, %v", tc.name, got, res, tc.want, tc.res)
		}
	}
}

// An authenticated caller is decided as its identity whatever its caller
// header says; a disagreeing header is counted, or refused; a decided mark
// is believed only with TrustDecided and only for the authenticated caller.
func TestMiddlewareAuthenticatedCaller(t *testing.T) {
	blocked := math.Nextafter(1, 0)
	for _, tc := range []struct {
		name           string
		reject, trust  bool
		cert           string // "" for a plaintext request
		header, mark   string
		want           int
		peer           string // counted as
		mismatch, igno uint64
	}{
		{"identity wins over the header", false, false, "abuser", "web", "", http.StatusTooManyRequests, "abuser", 1, 0},
		{"identity and header agree", false, false, "web", "web", "", http.StatusOK, "web", 0, 0},
		{"mismatch refused", true, false, "abuser", "web", "", http.StatusForbidden, "", 1, 0},
		{"no identity is unknown", false, false, "", "web", "", http.StatusOK, names.Unknown, 0, 0},
		{"own mark not trusted", false, false, "abuser", "abuser", "abuser", http.StatusTooManyRequests, "abuser", 0, 1},
		{"own mark trusted", false, true, "abuser", "abuser", "abuser", http.StatusOK, "", 0, 0},
		{"another's mark", false, true, "abuser", "web", "web", http.StatusTooManyRequests, "abuser", 1, 1},
		{"a mark without identity", false, true, "", "web", "web", http.StatusOK, names.Unknown, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLimiter(LimiterOptions{})
			l.SetPolicy(policy("checkout", Rule{Peer: "abuser", DropRatio: blocked}, Rule{Peer: "web", DropRatio: 0}))
			s := l.Service("checkout")
			reached := 0
			h := s.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached++ }),
				HTTPOptions{Identify: PeerCertIdentity(testTD), RejectMismatch: tc.reject, TrustDecided: tc.trust})
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			if tc.cert != "" {
				r = withCert("spiffe://example.org/ns/shop/sa/" + tc.cert)
			}
			r.Header.Set(DefaultCallerHeader, tc.header)
			if tc.mark != "" {
				r.Header.Set(DecidedHeader, tc.mark)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.want || (reached == 1) != (tc.want == http.StatusOK) {
				t.Errorf("status %d, reached the app %d times; want %d", w.Code, reached, tc.want)
			}
			for _, peer := range []string{"abuser", "web", names.Unknown} {
				want := uint64(0)
				if peer == tc.peer {
					want = 1
				}
				if c := counts(l, "checkout", peer); c.Offered != want {
					t.Errorf("%s counted %d, want %d", peer, c.Offered, want)
				}
			}
			if got := s.ident.mismatch.Load(); got != tc.mismatch {
				t.Errorf("mismatches %d, want %d", got, tc.mismatch)
			}
			if got := s.ident.decidedIgnore.Load(); got != tc.igno {
				t.Errorf("decided marks ignored %d, want %d", got, tc.igno)
			}
			if tc.want == http.StatusOK && tc.peer == "" && s.DecidedUpstream() != 1 {
				t.Errorf("DecidedUpstream %d, want 1", s.DecidedUpstream())
			}
		})
	}
}

// A refused mismatch is a gRPC status for a gRPC call.
func TestMiddlewareRefusesGRPCMismatch(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	h := l.Service("checkout").Middleware(http.NotFoundHandler(), HTTPOptions{Identify: PeerCertIdentity(testTD), RejectMismatch: true})
	r := withCert("spiffe://example.org/ns/shop/sa/abuser")
	r.Header.Set(DefaultCallerHeader, "web")
	r.Header.Set("Content-Type", "application/grpc")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK || w.Header().Get("Grpc-Status") != "7" || w.Body.Len() != 0 {
		t.Errorf("gRPC mismatch: %d grpc-status %q body %q; want 200, 7 (PERMISSION_DENIED), no body", w.Code, w.Header().Get("Grpc-Status"), w.Body)
	}
}

// Identifying the caller, from a certificate or an XFCC header, costs the
// request no allocation, nor does a mismatch or an ignored mark.
func TestMiddlewareIdentityAllocatesNothing(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout", Rule{Peer: "abuser", DropRatio: 0.5, LimitRPS: 10, AllowedRPS: 10}))
	s := l.Service("checkout")
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	xfcc := httptest.NewRequest(http.MethodGet, "/", nil)
	xfcc.RemoteAddr = "127.0.0.1:5000"
	xfcc.Header.Set(XFCCHeader, `By=spiffe://example.org/ns/shop/sa/checkout;Subject="CN=a, O=b";URI=spiffe://example.org/ns/shop/sa/abuser`)
	for _, tc := range []struct {
		name string
		opts HTTPOptions
		r    *http.Request
	}{
		{"certificate", HTTPOptions{Identify: PeerCertIdentity(testTD)}, withCert("spiffe://example.org/ns/shop/sa/abuser")},
		{"xfcc", HTTPOptions{Identify: XFCCIdentity([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, testTD)}, xfcc},
	} {
		tc.r.Header.Set(DefaultCallerHeader, "web")
		tc.r.Header.Set(DecidedHeader, "web")
		h := s.Middleware(next, tc.opts)
		w := &discardWriter{h: http.Header{}}
		if got := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, tc.r) }); got != 0 {
			t.Errorf("%s: %v allocations per request, want 0", tc.name, got)
		}
	}
	if s.ident.mismatch.Load() == 0 || s.ident.load(Authenticated) == 0 {
		t.Fatal("the requests were not authenticated mismatches: the test measured the wrong path")
	}
}
