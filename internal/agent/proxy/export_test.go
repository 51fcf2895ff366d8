package proxy

import (
	"net/http"
	"net/http/httputil"
	"net/url"
	"testing"
)

// The test helpers cost_test.go (package proxy_test, which may import internal/agent) shares
// with this package's tests.
var (
	Serve         = serve
	NewHTTPClient = newHTTPClient
)

// StartGRPCApp runs the tests' gRPC app (the standard health service, SERVING for "orders")
// and returns its address.
func StartGRPCApp(t testing.TB) string {
	app := startGRPCApp(t)
	app.health.SetServingStatus("orders", 1) // healthpb.HealthCheckResponse_SERVING
	return app.addr
}

// NewBare returns the floor the proxy is measured against: an httputil.ReverseProxy to
// upstream with the Proxy's transports (the same settings, one for HTTP/1.1 and one for
// h2c), flush intervals and buffer pool, and nothing else: no bounds, no body deadline, no
// X-Forwarded-For, no gRPC error handling.
func NewBare(upstream *url.URL) http.Handler {
	o := Options{}.withDefaults()
	b := newBounds(o)
	pool := &bufferPool{}
	rewrite := func(r *httputil.ProxyRequest) {
		r.SetURL(upstream)
		r.Out.Host = r.In.Host
	}
	h1 := &httputil.ReverseProxy{Rewrite: rewrite, Transport: newTransport(o, b, false), FlushInterval: flushHTTP1, BufferPool: pool}
	h2c := &httputil.ReverseProxy{Rewrite: rewrite, Transport: newTransport(o, b, true), FlushInterval: flushH2C, BufferPool: pool}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 {
			h2c.ServeHTTP(w, r)
			return
		}
		h1.ServeHTTP(w, r)
	})
}
