package sidecar

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/pkg/allowance"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/names"
)

var (
	tenantSource = descriptor.Source{Kind: descriptor.Header, Header: "x-tenant-id"}
	clientSource = descriptor.Source{Kind: descriptor.ClientIP}
	xffSource    = descriptor.Source{Kind: descriptor.ForwardedFor, Hops: 1}
)

// hostile is a header value no descriptor may keep: 10 KiB, not UTF-8.
var hostile = strings.Repeat("\xff", 10<<10)

func TestHTTPValue(t *testing.T) {
	req := func(remote string, h http.Header) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr, r.Header = remote, h
		return r
	}
	xff2 := descriptor.Source{Kind: descriptor.ForwardedFor, Hops: 2}
	for _, tc := range []struct {
		name string
		r    *http.Request
		src  descriptor.Source
		want string
	}{
		{"header", req("", http.Header{"X-Tenant-Id": {"acme"}}), tenantSource, "acme"},
		{"first line", req("", http.Header{"X-Tenant-Id": {"acme", "other"}}), tenantSource, "acme"},
		{"no header", req("", http.Header{"X-Other": {"acme"}}), tenantSource, ""},
		{"empty header", req("", http.Header{"X-Tenant-Id": {""}}), tenantSource, ""},
		{"hostile header, raw", req("", http.Header{"X-Tenant-Id": {hostile}}), tenantSource, hostile},
		{"client-ip", req("192.0.2.1:5555", nil), clientSource, "192.0.2.1"},
		{"client-ip v6", req("[2001:db8::1]:5555", nil), clientSource, "2001:db8::1"},
		{"client-ip ignores xff", req("192.0.2.1:5555", http.Header{"X-Forwarded-For": {"198.51.100.1"}}), clientSource, "192.0.2.1"},
		{"client-ip unix", req("@", nil), clientSource, descriptor.Invalid},
		{"xff", req("10.0.0.1:1", http.Header{"X-Forwarded-For": {"spoofed, 192.0.2.1"}}), xffSource, "192.0.2.1"},
		{"xff 2 over lines", req("10.0.0.1:1", http.Header{"X-Forwarded-For": {"198.51.100.1, 192.0.2.1", "10.0.0.2"}}), xff2, "192.0.2.1"},
		{"xff missing", req("10.0.0.1:1", nil), xffSource, descriptor.Missing},
		{"xff hostile", req("10.0.0.1:1", http.Header{"X-Forwarded-For": {hostile}}), xffSource, descriptor.Invalid},
	} {
		key := ""
		if tc.src.Kind == descriptor.Header {
			key = http.CanonicalHeaderKey(tc.src.Header)
		}
		if got := httpValue(tc.r, tc.src, key); got != tc.want {
			t.Errorf("%s: %.40q, want %.40q", tc.name, got, tc.want)
		}
	}
}

func TestGRPCValue(t *testing.T) {
	call := func(addr net.Addr, kv ...string) context.Context {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(kv...))
		if addr != nil {
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: addr})
		}
		return ctx
	}
	tcp := &net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 5555}
	tcp6 := &net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 5555, Zone: "eth0"}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		src  descriptor.Source
		want string
	}{
		{"metadata", call(nil, "x-tenant-id", "acme"), tenantSource, "acme"},
		{"metadata first", call(nil, "x-tenant-id", "acme", "x-tenant-id", "other"), tenantSource, "acme"},
		{"no metadata", call(nil), tenantSource, ""},
		{"no incoming metadata at all", context.Background(), tenantSource, ""},
		{"client-ip", call(tcp), clientSource, "192.0.2.1"},
		{"client-ip v6 without zone", call(tcp6), clientSource, "fe80::1"},
		{"client-ip unix", call(&net.UnixAddr{Name: "/run/s.sock", Net: "unix"}), clientSource, descriptor.Invalid},
		{"client-ip no peer", call(nil), clientSource, ""},
		{"xff", call(tcp, "x-forwarded-for", "spoofed, 192.0.2.7"), xffSource, "192.0.2.7"},
		{"xff missing", call(tcp), xffSource, descriptor.Missing},
	} {
		if got := grpcValue(tc.ctx, tc.src); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// The canonical header keys are rendered once per policy, with its
// descriptors: a request looks its header up by them and renders nothing.
func TestDescriptorHeaderKeys(t *testing.T) {
	srcs := []descriptor.Source{tenantSource, clientSource, {Kind: descriptor.Header, Header: "x-api-key"}}
	p := &Policy{Name: names.Callee("api"), Service: "api", Direction: Inbound, LiveInstances: 1}
	for i, src := range srcs {
		p.Descriptors = append(p.Descriptors, DescriptorPolicy{Name: fmt.Sprint("d", i), Source: src, LimitRPS: 10, MissingLimitRPS: 10, Quantile: 0.95})
	}
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(p)
	keys := l.Service("api").table.Load().desc.headerKeys
	if want := []string{"X-Tenant-Id", "", "X-Api-Key"}; strings.Join(keys, ",") != strings.Join(want, ",") {
		t.Fatalf("keys %q, want %q", keys, want)
	}
}

// edgePolicy is an inbound policy of service api, which limits no bucket
// and has three descriptors, each blocking every value (limit 0) but one:
// tenant (header x-tenant-id) admits acme, client (client-ip) 127.0.0.1 and
// ::1, ip (xff 1) 192.0.2.1.
func edgePolicy() *Policy {
	d := func(name string, src descriptor.Source, admitted ...string) DescriptorPolicy {
		p := DescriptorPolicy{Name: name, Source: src, Quantile: allowance.DefaultQuantile}
		for _, v := range admitted {
			p.Overrides = append(p.Overrides, ValueLimit{Value: v, LimitRPS: 1e9})
		}
		return p
	}
	return &Policy{Name: names.Callee("api"), Service: "api", Direction: Inbound, LiveInstances: 1, Descriptors: []DescriptorPolicy{
		d("tenant", tenantSource, "acme"),
		d("client", clientSource, "127.0.0.1", "::1"),
		d("ip", xffSource, "192.0.2.1"),
	}}
}

func edgeLimiter(t testing.TB) *ServiceLimiter {
	t.Helper()
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(edgePolicy())
	s := l.Service("api")
	if len(s.DescriptorSources()) != 3 {
		t.Fatalf("DescriptorSources() = %v, want the policy's three", s.DescriptorSources())
	}
	return s
}

// TestMiddlewareDescriptors: every descriptor decides a request the bucket
// admitted, by the value its source gives, and one drop refuses it with
// the descriptor's answer.
func TestMiddlewareDescriptors(t *testing.T) {
	s := edgeLimiter(t)
	reached := 0
	srv := httptest.NewServer(s.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached++
		w.WriteHeader(http.StatusTeapot)
	}), HTTPOptions{}))
	defer srv.Close()

	for _, tc := range []struct {
		name, tenant, xff string // "" sends no header
		grpc              bool
		droppedBy         string // "": admitted
	}{
		{"all admit", "acme", "spoofed, 192.0.2.1", false, ""},
		{"tenant drops", "other", "192.0.2.1", false, "tenant"},
		{"no tenant is missing", "", "192.0.2.1", false, "tenant"},
		{"hostile tenant", hostile, "192.0.2.1", false, "tenant"},
		{"xff: the client's entry is not read", "acme", "192.0.2.1, 198.51.100.1", false, "ip"},
		{"no xff is missing", "acme", "", false, "ip"},
		{"the first drop answers", "other", "198.51.100.1", false, "tenant"},
		{"grpc", "other", "192.0.2.1", true, "tenant"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.tenant != "" {
				req.Header["X-Tenant-Id"] = []string{tc.tenant}
			}
			if tc.xff != "" {
				req.Header.Set("X-Forwarded-For", tc.xff)
			}
			if tc.grpc {
				req.Header.Set("Content-Type", "application/grpc")
			}
			before := reached
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			switch {
			case tc.droppedBy == "":
				if resp.StatusCode != http.StatusTeapot || reached != before+1 {
					t.Errorf("got %d %q, want the app's 418", resp.StatusCode, body)
				}
			case tc.grpc:
				if resp.StatusCode != http.StatusOK || resp.Header.Get("Grpc-Status") != "8" ||
					!strings.Contains(resp.Header.Get("Grpc-Message"), tc.droppedBy) || reached != before {
					t.Errorf("got %d, grpc-status %q %q, want RESOURCE_EXHAUSTED naming %s",
						resp.StatusCode, resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message"), tc.droppedBy)
				}
			default:
				if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(body), tc.droppedBy) || reached != before ||
					resp.Header.Get("X-Envoy-Ratelimited") != "true" || resp.Header.Get("Retry-After") == "" {
					t.Errorf("got %d %q %v, want a 429 naming %s", resp.StatusCode, body, resp.Header, tc.droppedBy)
				}
			}
		})
	}
}

// The admitted path allocates nothing with descriptors of every source,
// and a hostile value costs nothing either.
func TestMiddlewareDescriptorAllocs(t *testing.T) {
	s := edgeLimiter(t)
	reached := 0
	h := s.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached++ }), HTTPOptions{})
	for _, tc := range []struct {
		name, tenant string
		admitted     bool
	}{{"admitted", "acme", true}, {"hostile", hostile, false}} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "127.0.0.1:5555"
		req.Header.Set("X-Tenant-Id", tc.tenant)
		req.Header.Set("X-Forwarded-For", "spoofed, 192.0.2.1")
		w := &discardWriter{h: http.Header{}}
		before := reached
		if got := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, req) }); got != 0 {
			t.Errorf("%s: %v allocations per request", tc.name, got)
		}
		if got := reached > before; got != tc.admitted {
			t.Errorf("%s: reached next: %v, want %v", tc.name, got, tc.admitted)
		}
	}
}

// TestGRPCInterceptorDescriptors: the interceptors take values from
// metadata and the peer's address, on loopback.
func TestGRPCInterceptorDescriptors(t *testing.T) {
	s := edgeLimiter(t)
	client := startHealthServer(t, s, GRPCOptions{})
	for _, tc := range []struct {
		name, tenant, xff string // "" sends none
		droppedBy         string // "": admitted
	}{
		{"all admit", "acme", "spoofed, 192.0.2.1", ""},
		{"tenant drops", "other", "192.0.2.1", "tenant"},
		{"no tenant", "", "192.0.2.1", "tenant"},
		// grpc-go sends printable ASCII metadata only: long, then.
		{"hostile tenant", strings.Repeat("a", 10<<10), "192.0.2.1", "tenant"},
		{"xff: the client's entry is not read", "acme", "192.0.2.1, 198.51.100.1", "ip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if tc.tenant != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "x-tenant-id", tc.tenant)
			}
			if tc.xff != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "x-forwarded-for", tc.xff)
			}
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			checkDescriptorRPC(t, "unary", err, tc.droppedBy)
			stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			_, err = stream.Recv()
			checkDescriptorRPC(t, "stream", err, tc.droppedBy)
		})
	}
}

func checkDescriptorRPC(t *testing.T, kind string, err error, droppedBy string) {
	t.Helper()
	st := status.Convert(err)
	switch {
	case droppedBy == "" && err != nil:
		t.Errorf("%s: %v, want admitted", kind, err)
	case droppedBy != "" && (st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), droppedBy)):
		t.Errorf("%s: %v, want RESOURCE_EXHAUSTED naming %s", kind, err, droppedBy)
	}
}

// BenchmarkGRPCValue measures what taking a value from a call costs: grpc-go
// copies a metadata key's values (one slice per present key) and a peer's
// address is rendered per call.
func BenchmarkGRPCValue(b *testing.B) {
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(
		"x-tenant-id", "acme", "x-forwarded-for", "spoofed, 192.0.2.1", "user-agent", "grpc-go", ":authority", "api"))
	ctx = peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 5555}})
	for _, bc := range []struct {
		name string
		src  descriptor.Source
	}{
		{"header", tenantSource},
		{"header-absent", descriptor.Source{Kind: descriptor.Header, Header: "x-api-key"}},
		{"client-ip", clientSource},
		{"xff", xffSource},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				grpcValue(ctx, bc.src)
			}
		})
	}
}

// BenchmarkMiddlewareDescriptors is an admitted request's cost with the
// three descriptors of edgePolicy, next to BenchmarkMiddlewareDecide's
// without.
func BenchmarkMiddlewareDescriptors(b *testing.B) {
	h := edgeLimiter(b).Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), HTTPOptions{})
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "127.0.0.1:5555"
	req.Header.Set("X-Tenant-Id", "acme")
	req.Header.Set("X-Forwarded-For", "spoofed, 192.0.2.1")
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, req)
	}
}

// A request its caller decided (TrustDecided) passes its bucket uncounted,
// but not the callee's descriptors, which no caller decides.
func TestMiddlewareDescriptorsDecidedUpstream(t *testing.T) {
	s := edgeLimiter(t)
	h := s.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), HTTPOptions{TrustDecided: true})
	for tenant, want := range map[string]int{"acme": http.StatusOK, "other": http.StatusTooManyRequests} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "127.0.0.1:5555"
		req.Header.Set(DefaultCallerHeader, "web")
		req.Header.Set(DecidedHeader, "web")
		req.Header.Set("X-Tenant-Id", tenant)
		req.Header.Set("X-Forwarded-For", "192.0.2.1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != want {
			t.Errorf("tenant %s: %d, want %d", tenant, w.Code, want)
		}
	}
	if s.DecidedUpstream() != 2 {
		t.Errorf("DecidedUpstream() = %d, want 2: the marks were not believed", s.DecidedUpstream())
	}
}
