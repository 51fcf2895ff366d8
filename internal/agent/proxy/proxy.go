// Package proxy forwards requests from the sidecar's port to the local app, over HTTP/1.1 or h2c.
//
// HTTP/1.x requests go to the app over HTTP/1.1 and HTTP/2 requests (in practice gRPC) over
// cleartext HTTP/2 with prior knowledge, so the protocol the caller chose is the protocol the app
// sees. Responses are streamed without buffering and trailers pass through, which is what gRPC
// streaming and grpc-status need.
//
// Goal: the proxy adds at most 50 µs p99 to a round trip on loopback. BenchmarkAddedLatency
// measures it; run
//
//	go test -run x -bench AddedLatency -benchtime 20000x ./internal/agent/proxy
//
// BenchmarkProxyCost (make bench-proxy) sets the sidecar's whole handler beside a bare
// httputil.ReverseProxy with these transports, the floor any Go proxy pays: CPU per request and
// added latency, HTTP/1.1 and gRPC (docs/benchmarks.md, "What the sidecar proxy costs").
package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Options tune the connections to the app. Zero values take the defaults documented on each
// field.
type Options struct {
	// Logger receives upstream failures, at most one line per ErrorLogInterval; never one per
	// request. Nil discards.
	Logger *slog.Logger

	// DialTimeout bounds connecting to the app. Default 2s: a loopback connect either succeeds or
	// is refused at once; it only hangs when the app's accept queue is full, and 2s still covers
	// one SYN retransmission (1s) before the caller is told the app is unavailable.
	DialTimeout time.Duration

	// ResponseHeaderTimeout bounds the wait for the app's response headers once the request is
	// sent. Default 0, no limit: a gRPC server-streaming call may legitimately send no headers
	// until its first message, which can be minutes away (health Watch, for instance).
	ResponseHeaderTimeout time.Duration

	// IdleConnTimeout closes app connections idle this long. Default 90s. Keep it below the app's
	// own keep-alive timeout: a request sent on a connection the app is closing at that moment
	// fails with 502 when it has a body (it can not be retried safely).
	IdleConnTimeout time.Duration

	// MaxIdleConnsPerHost is how many idle HTTP/1.1 connections to the app are kept for reuse.
	// Default 256: there is one host, and every concurrent HTTP/1.1 request needs its own
	// connection; a pool smaller than the usual concurrency closes and redials connections
	// under load. HTTP/2 multiplexes and does not use it.
	MaxIdleConnsPerHost int

	// ErrorLogInterval is the least time between two upstream-failure log lines. Default 10s.
	ErrorLogInterval time.Duration

	// BodyTimeout is the time any request body may take to arrive, counted from the end of
	// its headers, whatever its size; a larger one may take n/MinBodyRate more for its n
	// bytes. A body that takes longer is cut and answered 408. gRPC calls over HTTP/2 are
	// exempt (see limitBody). Default DefaultBodyTimeout.
	BodyTimeout time.Duration

	// MinBodyRate is the least rate, in bytes per second, at which a request body must come
	// once BodyTimeout has passed (see limitBody). Default DefaultMinBodyRate; negative for
	// none, which makes BodyTimeout a total.
	MinBodyRate int

	// MaxRequests bounds the requests in flight to the app; one more is answered 503 (gRPC:
	// UNAVAILABLE) at once, with x-envoy-overloaded. Default DefaultMaxRequests.
	MaxRequests int

	// MaxConns bounds the connections open to the app; a request that would need one more is
	// answered 503 at once. Default DefaultMaxConns.
	MaxConns int

	// GRPCMaxMessage bounds one message, either way, through the gRPC forwarder, which
	// holds each whole while it carries it (the HTTP path streams bodies): one more byte is
	// RESOURCE_EXHAUSTED. Default DefaultGRPCMaxMessage; raise it with the app's own limit.
	GRPCMaxMessage int

	// Registerer, when set, receives the proxy's metrics (sluice_sidecar_proxy_*).
	Registerer prometheus.Registerer
}

const (
	defaultDialTimeout         = 2 * time.Second
	defaultIdleConnTimeout     = 90 * time.Second
	defaultMaxIdleConnsPerHost = 256
	defaultErrorLogInterval    = 10 * time.Second

	// flushHTTP1 is the FlushInterval of HTTP/1.1 responses. Streams are not buffered with it:
	// ReverseProxy flushes every write of a response without Content-Length (chunked, long
	// polls) and of text/event-stream, whatever FlushInterval says. What -1 would add is a
	// separate flush of the headers of every fixed-length response, from a timer goroutine: one
	// more write syscall per response and about 10 µs at p50 on loopback (measured with
	// BenchmarkAddedLatency), for no benefit to a body whose length is known. So fixed-length
	// bodies go out when they are complete or the server's 4 KiB buffer fills.
	flushHTTP1 = 0

	// flushH2C is the FlushInterval of HTTP/2 responses: a gRPC stream's messages must not wait
	// in a buffer. (gRPC responses have no Content-Length, so ReverseProxy would flush them at
	// once anyway; -1 says so.)
	flushH2C = -1

	// copyBufferSize matches io.Copy's buffer; pooling it saves a 32 KiB allocation per
	// response that httputil.ReverseProxy would otherwise make.
	copyBufferSize = 32 << 10
)

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.DialTimeout = cmp.Or(o.DialTimeout, defaultDialTimeout)
	o.IdleConnTimeout = cmp.Or(o.IdleConnTimeout, defaultIdleConnTimeout)
	o.MaxIdleConnsPerHost = cmp.Or(o.MaxIdleConnsPerHost, defaultMaxIdleConnsPerHost)
	o.ErrorLogInterval = cmp.Or(o.ErrorLogInterval, defaultErrorLogInterval)
	o.BodyTimeout = cmp.Or(o.BodyTimeout, DefaultBodyTimeout)
	o.MinBodyRate = cmp.Or(o.MinBodyRate, DefaultMinBodyRate)
	o.MaxRequests = cmp.Or(o.MaxRequests, DefaultMaxRequests)
	o.MaxConns = cmp.Or(o.MaxConns, DefaultMaxConns)
	o.GRPCMaxMessage = cmp.Or(o.GRPCMaxMessage, DefaultGRPCMaxMessage)
	return o
}

func (o Options) validate() error {
	var errs []error
	if o.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("DialTimeout %v: must be >= 0", o.DialTimeout))
	}
	if o.ResponseHeaderTimeout < 0 {
		errs = append(errs, fmt.Errorf("ResponseHeaderTimeout %v: must be >= 0", o.ResponseHeaderTimeout))
	}
	if o.IdleConnTimeout < 0 {
		errs = append(errs, fmt.Errorf("IdleConnTimeout %v: must be >= 0", o.IdleConnTimeout))
	}
	if o.MaxIdleConnsPerHost < 0 {
		errs = append(errs, fmt.Errorf("MaxIdleConnsPerHost %d: must be >= 0", o.MaxIdleConnsPerHost))
	}
	if o.ErrorLogInterval < 0 {
		errs = append(errs, fmt.Errorf("ErrorLogInterval %v: must be >= 0", o.ErrorLogInterval))
	}
	if o.BodyTimeout < 0 {
		errs = append(errs, fmt.Errorf("BodyTimeout %v: must be >= 0", o.BodyTimeout))
	}
	if o.MaxRequests < 0 {
		errs = append(errs, fmt.Errorf("MaxRequests %d: must be >= 0", o.MaxRequests))
	}
	if o.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("MaxConns %d: must be >= 0", o.MaxConns))
	}
	if o.GRPCMaxMessage < 0 {
		errs = append(errs, fmt.Errorf("GRPCMaxMessage %d: must be >= 0", o.GRPCMaxMessage))
	}
	return errors.Join(errs...)
}

func validateUpstream(u *url.URL) error {
	if u == nil {
		return errors.New("upstream: missing")
	}
	var errs []error
	if u.Scheme != "http" {
		errs = append(errs, fmt.Errorf("upstream %q: scheme must be http, not %q", u.Redacted(), u.Scheme))
	}
	if u.Host == "" {
		errs = append(errs, fmt.Errorf("upstream %q: host missing", u.Redacted()))
	}
	// The proxy forwards the caller's path unchanged; a base path, query or credentials on the
	// upstream would be silently merged into every request (and break gRPC, whose paths are
	// fixed), so they are refused rather than half-supported.
	if u.Path != "" && u.Path != "/" {
		errs = append(errs, fmt.Errorf("upstream %q: path %q not supported", u.Redacted(), u.Path))
	}
	if u.RawQuery != "" || u.ForceQuery {
		errs = append(errs, fmt.Errorf("upstream %q: query not supported", u.Redacted()))
	}
	if u.Fragment != "" {
		errs = append(errs, fmt.Errorf("upstream %q: fragment not supported", u.Redacted()))
	}
	if u.User != nil {
		errs = append(errs, fmt.Errorf("upstream %q: user info not supported", u.Redacted()))
	}
	return errors.Join(errs...)
}

// Proxy is an http.Handler that forwards every request to one local app.
type Proxy struct {
	upstream string // for log lines
	h1       *http.Transport
	h2c      *http.Transport
	rpH1     *httputil.ReverseProxy
	rpH2C    *httputil.ReverseProxy
	bounds   *bounds
	// dialTimeout and grpcMaxMessage are Options.DialTimeout and GRPCMaxMessage, for the
	// gRPC forwarder.
	dialTimeout    time.Duration
	grpcMaxMessage int

	log         *slog.Logger
	logInterval int64        // nanoseconds between upstream-failure log lines
	failures    atomic.Int64 // upstream failures since start, reported in the throttled log line
	lastLog     atomic.Int64 // unix nanoseconds of the last upstream-failure log line; 0 = never
}

// New returns a Proxy to upstream, which must be an http URL with a host and nothing else,
// such as http://127.0.0.1:8080.
func New(upstream *url.URL, opts Options) (*Proxy, error) {
	if err := errors.Join(validateUpstream(upstream), opts.validate()); err != nil {
		return nil, fmt.Errorf("new proxy: %w", err)
	}
	opts = opts.withDefaults()
	target := &url.URL{Scheme: upstream.Scheme, Host: upstream.Host}

	b := newBounds(opts)
	if opts.Registerer != nil {
		for _, c := range b.collectors {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("new proxy: register metrics: %w", err)
			}
		}
	}
	p := &Proxy{
		upstream:    target.String(),
		h1:          newTransport(opts, b, false),
		h2c:         newTransport(opts, b, true),
		bounds:      b,
		dialTimeout: opts.DialTimeout, grpcMaxMessage: opts.GRPCMaxMessage,
		log:         opts.Logger,
		logInterval: int64(opts.ErrorLogInterval),
	}
	pool := &bufferPool{}
	rewrite := func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		// A sidecar is transparent: the app sees the Host (or :authority) the caller asked
		// for, as behind Envoy, not the loopback address it happens to listen on.
		r.Out.Host = r.In.Host
		// Keep the chain of addresses from earlier proxies (an ingress, say) and append the
		// caller's; ReverseProxy strips inbound X-Forwarded-* before Rewrite.
		r.Out.Header["X-Forwarded-For"] = r.In.Header["X-Forwarded-For"]
		r.SetXForwarded()
	}
	// ReverseProxy logs (through the standard library's log package when nil) only errors of
	// one request: a body copy cut short by the caller or the app. They reach the caller as an
	// aborted response or a gRPC status already, and logging them would be logging per request.
	discard := log.New(io.Discard, "", 0)
	p.rpH1 = &httputil.ReverseProxy{
		Rewrite:       rewrite,
		Transport:     p.h1,
		FlushInterval: flushHTTP1,
		BufferPool:    pool,
		ErrorLog:      discard,
		ErrorHandler:  p.handleError,
	}
	p.rpH2C = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      p.h2c,
		FlushInterval:  flushH2C,
		BufferPool:     pool,
		ErrorLog:       discard,
		ErrorHandler:   p.handleError,
		ModifyResponse: p.guardGRPCStream,
	}
	return p, nil
}

func newTransport(o Options, b *bounds, h2c bool) *http.Transport {
	d := &net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}
	var protos http.Protocols
	if h2c {
		// UnencryptedHTTP2 without HTTP1 makes the Transport speak h2c with prior knowledge
		// to http:// URLs, as gRPC servers expect.
		protos.SetUnencryptedHTTP2(true)
	} else {
		protos.SetHTTP1(true)
	}
	return &http.Transport{
		// Proxy stays nil: HTTP_PROXY from the environment must never apply to the local app.
		DialContext:           b.dialer(d.DialContext),
		MaxIdleConns:          o.MaxIdleConnsPerHost,
		MaxIdleConnsPerHost:   o.MaxIdleConnsPerHost,
		IdleConnTimeout:       o.IdleConnTimeout,
		ResponseHeaderTimeout: o.ResponseHeaderTimeout,
		// Pass bodies through as they are. Otherwise the Transport asks for gzip when the caller
		// did not and decompresses on the fly: work for nothing, and Content-Length is lost.
		DisableCompression: true,
		Protocols:          &protos,
	}
}

// ServeHTTP forwards r to the app over the protocol r arrived on, within the proxy's bounds.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !p.bounds.admit() {
		refuse(w, r, msgMaxRequests)
		return
	}
	defer p.bounds.done()
	r = p.bounds.limitBody(w, r)
	if r.ProtoMajor == 2 {
		p.rpH2C.ServeHTTP(w, r)
		return
	}
	p.rpH1.ServeHTTP(w, r)
}

// Close closes idle connections to the app. Requests in flight are not affected, and the Proxy
// stays usable: a later request dials again. Calling it more than once is harmless.
func (p *Proxy) Close() {
	p.h1.CloseIdleConnections()
	p.h2c.CloseIdleConnections()
}

// StatusClientClosedRequest is written when the caller went away before the app answered.
// It is nginx's convention; it keeps caller cancellations out of the 5xx a middleware counts
// as upstream failures. The caller never sees it.
const StatusClientClosedRequest = 499

// handleError answers a request the app did not answer: 502 (or UNAVAILABLE for gRPC) when
// the app failed, 504 (DEADLINE_EXCEEDED) when the request's context expired, and 499
// (CANCELLED) when the caller cancelled.
//
// It also writes the trailers-only gRPC responses that guardGRPCStream diverts here.
func (p *Proxy) handleError(w http.ResponseWriter, r *http.Request, err error) {
	if to, ok := err.(*trailersOnly); ok {
		to.write(w)
		return
	}
	switch {
	case bodyTimedOut(r):
		p.bounds.bodyTimeouts.Inc()
		// The connection can not carry another request: its read deadline has passed.
		w.Header().Set("Connection", "close")
		http.Error(w, "request body not received in time", http.StatusRequestTimeout)
		return
	case errors.Is(err, errMaxConns):
		p.bounds.refusedMaxConns.Inc()
		refuse(w, r, msgMaxConns)
		return
	}
	grpc := isGRPC(r.Header.Get("Content-Type"))
	switch ctxErr := r.Context().Err(); {
	case errors.Is(ctxErr, context.Canceled):
		if grpc {
			writeGRPCStatus(w, grpcCanceled, "sluice: request cancelled")
			return
		}
		w.WriteHeader(StatusClientClosedRequest)
	case errors.Is(ctxErr, context.DeadlineExceeded):
		if grpc {
			writeGRPCStatus(w, grpcDeadlineExceeded, "sluice: deadline exceeded before upstream answered")
			return
		}
		http.Error(w, "upstream timeout", http.StatusGatewayTimeout)
	default:
		p.noteUpstreamError(err)
		if grpc {
			writeGRPCStatus(w, grpcUnavailable, grpcUnavailableMessage)
			return
		}
		http.Error(w, "upstream unavailable", http.StatusBadGateway)
	}
}

// refuse answers a request the proxy will not forward because a bound is reached: 503 with
// x-envoy-overloaded (as Envoy's circuit breakers answer, which tells an Envoy in front not to
// retry it), or UNAVAILABLE to a gRPC call, which its client may retry elsewhere.
func refuse(w http.ResponseWriter, r *http.Request, msg string) {
	w.Header().Set("X-Envoy-Overloaded", "true")
	if isGRPC(r.Header.Get("Content-Type")) {
		writeGRPCStatus(w, grpcUnavailable, msg)
		return
	}
	http.Error(w, msg, http.StatusServiceUnavailable)
}

// noteUpstreamError counts an upstream failure and logs it if no failure was logged in the
// last ErrorLogInterval, so that an app that is down costs one line per interval, not one per
// request.
func (p *Proxy) noteUpstreamError(err error) {
	n := p.failures.Add(1)
	now := time.Now().UnixNano()
	last := p.lastLog.Load()
	if last != 0 && now-last < p.logInterval {
		return
	}
	if !p.lastLog.CompareAndSwap(last, now) {
		return // another request is logging this interval
	}
	p.log.Warn("upstream request failed", "upstream", p.upstream, "err", err, "failures_total", n)
}

// bufferPool lends ReverseProxy its copy buffers.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, copyBufferSize)
}

func (b *bufferPool) Put(buf []byte) {
	if cap(buf) != copyBufferSize {
		return
	}
	// Boxing the slice header costs a small allocation; it saves a 32 KiB one on the next Get.
	b.p.Put(&buf)
}
