// Package agent is the sluice sidecar process: a reverse proxy in front of
// the local app that decides every request with a sidecar.Limiter, takes its
// DropPolicy over xDS and reports what it saw to the zone aggregator.
//
// The request path is the Limiter's Decide and the proxy; the xDS client and
// the reporter run beside it and only swap policies in and read counters, so
// a lost controller or aggregator never holds up a request. A third worker
// owns the clock of the policy's TTL: every 100ms it calls Limiter.Expire,
// which puts the policy's fail mode in force once the controller has been
// silent for the TTL (see sidecar/failmode.go).
package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/agent/proxy"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
	"github.com/sluicehq/sluice/pkg/shard"
	"github.com/sluicehq/sluice/sidecar"
	"github.com/sluicehq/sluice/sidecar/reporter"
	"github.com/sluicehq/sluice/sidecar/rls"
	"github.com/sluicehq/sluice/sidecar/xdsclient"
)

// MaxPeersBound is the most unlimited callers a sidecar may track: its
// reports name each of them, and an aggregator folds the callers of a
// report beyond its --max-peers-per-report (10,000 by default) into
// _overflow. A larger table would have every full report lose some of its
// callers' buckets.
const MaxPeersBound = 10000 - 2

// MaxLeavesBound is MaxPeersBound for a callee that declares procedures:
// its reports name each tracked leaf (caller, procedure), and the reserved
// callers' leaves of every procedure (at most routes.MaxRoutes + 1 each).
const MaxLeavesBound = 10000 - 2*(routes.MaxRoutes+1)

// Config is the sidecar's configuration.
type Config struct {
	// Service is the service the sidecar runs next to, the callee of every
	// request it sees. Required.
	Service string
	// ID identifies this sidecar; default hostname-pid.
	ID string
	// Zone is the sidecar's zone as far as it knows; the aggregator has the
	// last word.
	Zone string
	// Upstream is the local app, e.g. http://127.0.0.1:8080.
	Upstream string
	// Aggregators are the zone aggregators' addresses, in failover order.
	Aggregators []string
	// Controllers are the xDS servers' addresses, in failover order; with
	// sharded controllers, templates naming "{shard}" (pkg/shard).
	Controllers []string
	// ControllerShards is the shard count assumed at start (the shards
	// announce the real one); see xdsclient.Config.ShardCount.
	ControllerShards int
	// XDSProtocol is "delta" or "sotw".
	XDSProtocol string
	// ReportInterval is how often load reports go out.
	ReportInterval time.Duration
	// SurgeCheck is how often the counters are checked for a surge between
	// reports; 0 means a tenth of ReportInterval, negative none.
	SurgeCheck time.Duration
	// SurgeProjection has the sidecar project a surge's ratio itself
	// until the controller's arrives (reporter.Projector). Default on;
	// it needs surge checks.
	SurgeProjection bool
	// HealthFastPath has the sidecar shed at once when its app misses
	// the objective its policy declares, until the controller's next
	// tick (reporter.HealthGate); it needs surge checks.
	HealthFastPath bool
	// CallerHeader names the request header that carries the caller. In
	// header mode it names the caller; otherwise it is only compared with
	// the authenticated identity.
	CallerHeader string
	// CallerIdentity is where the caller comes from: "header" (the caller
	// header, which trusts the network: any client that reaches the port
	// can name any caller), "xfcc" (the x-forwarded-client-cert header,
	// believed only from TrustedProxies) or "mtls" (the client certificate
	// the proxy port's TLS handshake verified; needs ServerTLS).
	CallerIdentity string
	// TrustedProxies are the addresses (CIDRs) whose
	// x-forwarded-client-cert headers are believed, in xfcc mode: the local
	// Envoy's. From anywhere else the header is ignored and the request
	// counts as unknown.
	TrustedProxies []string
	// TrustDomain is the SPIFFE trust domain of callers' identities, in
	// xfcc and mtls modes.
	TrustDomain string
	// CallerMismatch is what happens to a request whose caller header
	// disagrees with its authenticated identity: "ignore" (decided as the
	// identity) or "reject" (403, PERMISSION_DENIED). Counted either way.
	CallerMismatch string
	// TrustDecided lets requests their caller marked as decided by its
	// own outbound enforcement (x-sluice-decided) through uncounted, when
	// the mark names the caller (the authenticated one, in xfcc and mtls
	// modes). Off, every request is decided and counted: a caller that
	// marks without enforcing would escape its limit.
	TrustDecided bool
	// ServerTLS, in mtls mode, is the proxy port's TLS configuration: it
	// must require and verify client certificates
	// (identity.Source.ServerTLS).
	ServerTLS *tls.Config
	// MaxPeers bounds the distinct callers tracked, besides the ones the
	// policy limits, before the rest share one overflow bucket; at most
	// MaxPeersBound.
	MaxPeers int
	// MaxLeaves is MaxPeers for a callee whose policy declares
	// procedures: it bounds the distinct leaves (caller, procedure)
	// tracked besides the ones the policy limits, before a new leaf (c, q)
	// shares (_overflow, q); at most MaxLeavesBound.
	MaxLeaves int
	// DescriptorCounters and DescriptorHeavy size each descriptor's
	// sketch (sidecar.LimiterOptions): the slots of one window, and the
	// heavy values it holds and reports. Memory is set by them, never by
	// the number of distinct values.
	DescriptorCounters, DescriptorHeavy int
	// PeerIdle is how long a caller the policy does not limit keeps its
	// place among the MaxPeers without a request (sidecar.LimiterOptions);
	// at least two report intervals, so that its last requests have been
	// reported when it goes. 0 means sidecar.DefaultPeerIdle or two
	// report intervals, whichever is longer.
	PeerIdle time.Duration
	// Strategy is "diffuse" (exact, deterministic) or "random".
	Strategy string
	// RateLimitHeaders is which rate-limit headers admitted responses
	// carry: "none", "draft" (RateLimit-Policy and RateLimit, as on every
	// 429) or "x-ratelimit" (Envoy's X-RateLimit-*, then on 429s too); see
	// sidecar.RateLimitHeaders.
	RateLimitHeaders string
	// ReportDialOptions and XDSDialOptions dial the aggregators and the
	// xDS servers; default plaintext. Under mutual TLS they carry
	// credentials that check the server's identity (internal/identity).
	ReportDialOptions, XDSDialOptions []grpc.DialOption

	// What callers may hold of the app through the proxy (see
	// internal/agent/proxy): the time to read a request body (gRPC over
	// HTTP/2 exempt): ProxyBodyTimeout plus its size at ProxyMinBodyRate
	// (bytes per second; 0 for none), the requests in flight and the
	// connections open to the app. Past a bound the proxy answers itself
	// (408, 503).
	ProxyBodyTimeout time.Duration
	ProxyMinBodyRate int
	ProxyMaxRequests int
	ProxyMaxConns    int
	// GRPCForwarder has the proxy port's h2c connections (gRPC clients')
	// served by grpc-go and carried to the app on grpc-go's transport
	// (proxy.GRPCForwarder), with a third to a half less CPU than
	// net/http's HTTP/2; off, net/http's server and ReverseProxy carry
	// them, and HTTP/2 clients other than gRPC's are served too.
	// Plaintext only: under mtls the port's TLS server keeps every
	// connection.
	GRPCForwarder bool
	// GRPCMaxMessage bounds one message through the forwarder, either
	// way, in bytes: it holds each whole while carrying it. Larger ones
	// fail with RESOURCE_EXHAUSTED, as an app with the same limit would.
	GRPCMaxMessage int

	// RLS is Envoy's rate limit service, answered from the limiter.
	RLS RLSConfig
}

// DefaultConfig returns the defaults; Service is left for the caller.
func DefaultConfig() Config {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "sidecar"
	}
	return Config{
		ID:                 host + "-" + strconv.Itoa(os.Getpid()),
		Upstream:           "http://127.0.0.1:8080",
		Aggregators:        []string{"127.0.0.1:18100"},
		Controllers:        []string{"127.0.0.1:18000"},
		XDSProtocol:        "delta",
		ReportInterval:     time.Second,
		SurgeProjection:    true,
		HealthFastPath:     true,
		CallerHeader:       "x-sluice-caller",
		CallerIdentity:     "header",
		TrustedProxies:     []string{"127.0.0.1/32", "::1/128", "127.0.0.6/32", "::6/128"}, // inject.XFCCTrustedProxies too
		TrustDomain:        "cluster.local",
		CallerMismatch:     "ignore",
		MaxPeers:           1024,
		MaxLeaves:          sidecar.DefaultMaxLeaves,
		DescriptorCounters: sidecar.DefaultDescriptorCounters,
		DescriptorHeavy:    sidecar.DefaultDescriptorHeavy,
		Strategy:           "diffuse",
		RateLimitHeaders:   sidecar.NoRateLimitHeaders.String(),

		ProxyBodyTimeout: proxy.DefaultBodyTimeout,
		ProxyMinBodyRate: proxy.DefaultMinBodyRate,
		ProxyMaxRequests: proxy.DefaultMaxRequests,
		ProxyMaxConns:    proxy.DefaultMaxConns,
		GRPCForwarder:    true,
		GRPCMaxMessage:   proxy.DefaultGRPCMaxMessage,

		RLS: defaultRLS(),
	}
}

// Validate reports every bad field at once, by flag name.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Service == "" {
		add("service: required: the name of the service this sidecar fronts")
	} else if err := names.Check(c.Service); err != nil || c.Service == names.Overflow {
		add("service: %v", errOr(err, "reserved name"))
	}
	if err := names.Check(c.ID); err != nil {
		add("id: %v", err)
	}
	if c.Zone != "" {
		if err := names.Check(c.Zone); err != nil {
			add("zone: %v", err)
		}
	}
	if u, err := url.Parse(c.Upstream); err != nil || u.Scheme != "http" || u.Host == "" {
		add("upstream: %q is not an http://host:port URL", c.Upstream)
	}
	if c.ControllerShards < 0 || c.ControllerShards > shard.MaxCount {
		add("controller-shards: %d is not in [0, %d]", c.ControllerShards, shard.MaxCount)
	}
	for _, list := range []struct {
		flag  string
		addrs []string
	}{{"aggregators", c.Aggregators}, {"controllers", c.Controllers}} {
		if len(list.addrs) == 0 {
			add("%s: at least one address is required", list.flag)
		}
		for i, a := range list.addrs {
			if _, _, err := net.SplitHostPort(a); err != nil {
				add("%s[%d]: %q is not host:port", list.flag, i, a)
			}
		}
	}
	if c.XDSProtocol != "delta" && c.XDSProtocol != "sotw" {
		add("xds-protocol: %q is not delta or sotw", c.XDSProtocol)
	}
	if c.ReportInterval < reporter.MinInterval || c.ReportInterval > reporter.MaxInterval {
		add("report-interval: %v is outside [%v, %v]", c.ReportInterval, reporter.MinInterval, reporter.MaxInterval)
	}
	if c.SurgeCheck > 0 && (c.SurgeCheck < reporter.MinInterval || c.SurgeCheck > c.ReportInterval) {
		add("surge-check: %v is outside [%v, report-interval %v]; 0 for a tenth of it, negative for none", c.SurgeCheck, reporter.MinInterval, c.ReportInterval)
	}
	if !validHeaderName(c.CallerHeader) {
		add("caller-header: %q is not a valid header name", c.CallerHeader)
	}
	errs = append(errs, c.validateIdentity()...)
	if c.MaxLeaves < 1 || c.MaxLeaves > MaxLeavesBound {
		add("max-leaves: %d is outside [1, %d]: a report names every tracked (caller, procedure) leaf, "+
			"and aggregators fold the entries of a report beyond their --max-peers-per-report (default 10000) into _overflow", c.MaxLeaves, MaxLeavesBound)
	}
	if err := c.limiterOptions(sidecar.Diffuse).Validate(); err != nil {
		add("descriptor-counters/descriptor-heavy: %v", err)
	}
	if c.MaxPeers < 1 || c.MaxPeers > MaxPeersBound {
		add("max-peers: %d is outside [1, %d]: a report names every tracked caller, "+
			"and aggregators fold the callers of a report beyond their --max-peers-per-report (default 10000) into _overflow", c.MaxPeers, MaxPeersBound)
	}
	if c.PeerIdle != 0 && c.PeerIdle < 2*c.ReportInterval {
		add("peer-idle: %v is under two report intervals (%v): an evicted caller's last requests would go unreported", c.PeerIdle, 2*c.ReportInterval)
	}
	if c.Strategy != "diffuse" && c.Strategy != "random" {
		add("strategy: %q is not diffuse or random", c.Strategy)
	}
	if _, err := sidecar.ParseRateLimitHeaders(c.RateLimitHeaders); err != nil {
		add("ratelimit-headers: %v", err)
	}
	errs = append(errs, c.RLS.validate(c.Service)...)
	return errors.Join(append(errs, c.proxyBoundsErrors()...)...)
}

// proxyBoundsErrors checks the proxy's bounds, by flag name.
func (c Config) proxyBoundsErrors() []error {
	var errs []error
	if c.ProxyBodyTimeout <= 0 {
		errs = append(errs, fmt.Errorf("proxy-body-timeout: %v must be positive", c.ProxyBodyTimeout))
	}
	if c.ProxyMinBodyRate < 0 {
		errs = append(errs, fmt.Errorf("proxy-min-body-rate: %d must be at least 0 (0: none, the body timeout is a total)", c.ProxyMinBodyRate))
	}
	if c.ProxyMaxRequests < 1 {
		errs = append(errs, fmt.Errorf("proxy-max-requests: %d must be at least 1", c.ProxyMaxRequests))
	}
	if c.ProxyMaxConns < 1 {
		errs = append(errs, fmt.Errorf("proxy-max-connections: %d must be at least 1", c.ProxyMaxConns))
	}
	if c.GRPCMaxMessage < 1 || c.GRPCMaxMessage > math.MaxInt32 {
		errs = append(errs, fmt.Errorf("grpc-max-message-size: %d must be from 1 to %d bytes", c.GRPCMaxMessage, math.MaxInt32))
	}
	return errs
}

// proxyMinBodyRate is the proxy's MinBodyRate for the flag's rate: the flag's 0 (none) is
// the proxy's negative, its 0 being the default.
func proxyMinBodyRate(rate int) int {
	if rate == 0 {
		return -1
	}
	return rate
}

// Caller identity modes (Config.CallerIdentity).
const (
	HeaderIdentity = "header"
	XFCCIdentity   = "xfcc"
	MTLSIdentity   = "mtls"
)

// validateIdentity checks the caller-identity settings; ServerTLS is
// checked by New, since the command sets it after validation.
func (c Config) validateIdentity() []error {
	var errs []error
	switch c.CallerIdentity {
	case HeaderIdentity, XFCCIdentity, MTLSIdentity:
	default:
		errs = append(errs, fmt.Errorf("caller-identity: %q is not header, xfcc or mtls", c.CallerIdentity))
	}
	if _, err := parsePrefixes(c.TrustedProxies); err != nil {
		errs = append(errs, fmt.Errorf("trusted-proxies: %w", err))
	} else if c.CallerIdentity == XFCCIdentity && len(c.TrustedProxies) == 0 {
		errs = append(errs, errors.New("trusted-proxies: xfcc needs at least one: the local proxy's address"))
	}
	switch c.CallerMismatch {
	case "ignore":
	case "reject":
		if c.CallerIdentity == HeaderIdentity {
			errs = append(errs, errors.New("caller-mismatch: reject needs an authenticated caller-identity, xfcc or mtls: in header mode the header is the caller"))
		}
	default:
		errs = append(errs, fmt.Errorf("caller-mismatch: %q is not ignore or reject", c.CallerMismatch))
	}
	return errs
}

// parsePrefixes parses CIDRs; a bare address is its own /32 or /128.
func parsePrefixes(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	var errs []error
	for i, s := range list {
		s = strings.TrimSpace(s)
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				errs = append(errs, fmt.Errorf("[%d] %q is not a CIDR or an address", i, s))
				continue
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, errors.Join(errs...)
}

// identify is the configured mode's Identify, for the middleware, and
// IdentifyContext, for the gRPC forwarder's interceptor; both nil in header
// mode.
func (c Config) identify() (sidecar.Identify, sidecar.IdentifyContext, error) {
	switch c.CallerIdentity {
	case XFCCIdentity:
		trusted, err := parsePrefixes(c.TrustedProxies)
		if err != nil {
			return nil, nil, err
		}
		return sidecar.XFCCIdentity(trusted, c.TrustDomain), sidecar.XFCCIdentityContext(trusted, c.TrustDomain), nil
	case MTLSIdentity:
		if c.ServerTLS == nil || c.ServerTLS.ClientAuth != tls.RequireAnyClientCert && c.ServerTLS.ClientAuth != tls.RequireAndVerifyClientCert {
			return nil, nil, errors.New("caller-identity: mtls needs --tls-cert, --tls-key and --tls-ca: the proxy port serves TLS and requires client certificates")
		}
		return sidecar.PeerCertIdentity(c.TrustDomain), sidecar.PeerTLSIdentity(c.TrustDomain), nil
	}
	return nil, nil, nil
}

// peerIdle is PeerIdle, its default filled in.
func (c Config) peerIdle() time.Duration {
	if c.PeerIdle == 0 {
		return max(sidecar.DefaultPeerIdle, 2*c.ReportInterval)
	}
	return c.PeerIdle
}

// validHeaderName reports whether s is an HTTP field name (an RFC 9110
// token). Anything else could never match a request header, and every caller
// would silently count as unknown.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func errOr(err error, s string) any {
	if err != nil {
		return err
	}
	return s
}

// Agent is one sidecar. Build it with New, serve Handler, run Workers.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	limiter  *sidecar.Limiter
	svc      *sidecar.ServiceLimiter
	proxy    *proxy.Proxy
	handler  http.Handler
	xds      *xdsclient.Client
	reporter *reporter.Reporter
	rls      *rls.Service         // nil: off
	fwd      *proxy.GRPCForwarder // nil: off
}

// New builds a sidecar; it starts nothing.
func New(cfg Config, logger *slog.Logger, reg prometheus.Registerer) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	strategy := sidecar.Diffuse
	if cfg.Strategy == "random" {
		strategy = sidecar.Random
	}
	a := &Agent{cfg: cfg, log: logger}
	a.limiter = sidecar.NewLimiter(cfg.limiterOptions(strategy))
	a.svc = a.limiter.Service(cfg.Service)
	if reg != nil {
		reg.MustRegister(a.limiter.Collector())
	}

	up, _ := url.Parse(cfg.Upstream) // checked by Validate
	p, err := proxy.New(up, proxy.Options{
		Logger:      logger,
		BodyTimeout: cfg.ProxyBodyTimeout, MinBodyRate: proxyMinBodyRate(cfg.ProxyMinBodyRate),
		MaxRequests: cfg.ProxyMaxRequests, MaxConns: cfg.ProxyMaxConns,
		GRPCMaxMessage: cfg.GRPCMaxMessage,
		Registerer:     reg,
	})
	if err != nil {
		return nil, err
	}
	a.proxy = p
	headers, _ := sidecar.ParseRateLimitHeaders(cfg.RateLimitHeaders) // checked by Validate
	identify, identifyCtx, err := cfg.identify()
	if err != nil {
		return nil, err
	}
	// The middleware decides, descriptors included, before the proxy
	// rewrites anything: an "xff N" descriptor reads X-Forwarded-For as it
	// arrived, so N counts the proxies in front of the sidecar, not the
	// sidecar, and the app then sees the header with the caller appended.
	a.handler = a.svc.Middleware(p, sidecar.HTTPOptions{
		CallerHeader:     cfg.CallerHeader,
		Identify:         identify,
		RejectMismatch:   cfg.CallerMismatch == "reject",
		TrustDecided:     cfg.TrustDecided,
		RateLimitHeaders: headers,
	})
	if cfg.GRPCForwarder && cfg.CallerIdentity != MTLSIdentity {
		// The same decision as the middleware's, by the interceptor that
		// proxyless gRPC servers use, and the same health records.
		a.fwd, err = p.NewGRPCForwarder(a.svc.StreamServerInterceptor(sidecar.GRPCOptions{
			CallerHeader:     cfg.CallerHeader,
			Identify:         identifyCtx,
			RejectMismatch:   cfg.CallerMismatch == "reject",
			TrustDecided:     cfg.TrustDecided,
			RateLimitHeaders: headers,
			StreamHealth:     true,
		}))
		if err != nil {
			return nil, err
		}
	}

	if cfg.RLS.Listen != "" {
		if a.rls, err = rls.New(a.svc, cfg.RLS.mapping(cfg.Service), reg); err != nil {
			return nil, err
		}
	}

	protocol := xdsclient.Delta
	if cfg.XDSProtocol == "sotw" {
		protocol = xdsclient.SotW
	}
	a.xds, err = xdsclient.New(xdsclient.Config{
		Servers:     cfg.Controllers,
		ShardCount:  cfg.ControllerShards,
		NodeID:      cfg.ID,
		Cluster:     cfg.Service,
		Zone:        cfg.Zone,
		Resources:   []string{names.Callee(cfg.Service)},
		Protocol:    protocol,
		DialOptions: cfg.XDSDialOptions,
		Logger:      logger,
		Registerer:  reg,
	}, sidecar.Installer{
		Limiter: a.limiter, Service: cfg.Service, Direction: sidecar.Inbound,
		OnRemove: func(name string) { logger.Info("policy removed by the controller", "resource", name) },
	})
	if err != nil {
		return nil, err
	}
	a.reporter, err = reporter.New(reporter.Config{
		SidecarID:    cfg.ID,
		Service:      cfg.Service,
		Zone:         cfg.Zone,
		Direction:    sidecar.Inbound,
		Interval:     cfg.ReportInterval,
		SurgeCheck:   cfg.SurgeCheck,
		NoProjection: !cfg.SurgeProjection,
		NoHealthGate: !cfg.HealthFastPath,
		Aggregators:  cfg.Aggregators,
		DialOptions:  cfg.ReportDialOptions,
		Logger:       logger,
		Registerer:   reg,
	}, a.limiter)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// Server is the proxy port's server for Handler: TLS with client
// certificates in mtls mode, else HTTP/1.1 and h2c.
func (a *Agent) Server(addr string) *http.Server {
	if a.cfg.CallerIdentity == MTLSIdentity {
		return proxy.NewTLSServer(addr, a.handler, a.cfg.ServerTLS)
	}
	return proxy.NewServer(addr, a.handler)
}

// H2C is the gRPC forwarder's server, for the proxy port's h2c
// connections (process.Process.H2C); nil when the forwarder is off or
// the port serves TLS.
func (a *Agent) H2C() *grpc.Server {
	if a.fwd == nil {
		return nil
	}
	return a.fwd.Server
}

// Handler is the request path: decide, then proxy to the app.
func (a *Agent) Handler() http.Handler { return a.handler }

// Limiter is the sidecar's limiter, for tests and the demo's read-outs.
func (a *Agent) Limiter() *sidecar.Limiter { return a.limiter }

// Workers are the goroutines the sidecar needs besides its server.
func (a *Agent) Workers() []func(ctx context.Context) error {
	return []func(context.Context) error{a.xds.Run, a.reporter.Run, a.runFailModes}
}

// runFailModes steps the policy's clock (sidecar.Expiry) every
// sidecar.ExpiryPeriod until ctx is done, and logs each change of the
// policy's state. Decide reads no clock: this is the clock of the TTL, the
// fail-open decay and the local token buckets.
func (a *Agent) runFailModes(ctx context.Context) error {
	tick := time.NewTicker(sidecar.ExpiryPeriod)
	defer tick.Stop()
	x := sidecar.Expiry{Limiter: a.limiter, Service: a.cfg.Service}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		st, last, changed := x.Step(time.Now())
		if !changed {
			continue
		}
		attrs := []any{"service", a.cfg.Service, "state", st.State.String(), "previous", last.String(),
			"age", st.Age, "fail_mode", st.FailMode.String()}
		switch {
		case st.State == sidecar.Expired:
			a.log.Warn("policy expired: no word from the controller for its TTL; its fail mode is in force", attrs...)
		case last == sidecar.Expired:
			a.log.Info("policy refreshed: the fail mode is over", attrs...)
		case st.State == sidecar.Stale:
			a.log.Info("policy stale: no word from the controller for half its TTL", attrs...)
		}
	}
}

// Close releases the proxy's idle upstream connections.
func (a *Agent) Close() {
	a.proxy.Close()
	if a.fwd != nil {
		_ = a.fwd.Close() // the connection to the app; nothing to do if it fails
	}
}

// Ready is nil once the proxy can take traffic, which is at once: a sidecar
// without a policy admits everything, so it must not hold the pod out of
// service while the controller is away.
func (a *Agent) Ready() error { return nil }

// limiterOptions are the Limiter's options of c, with strategy. A
// descriptor's window is the report interval: the sketch rotates as each
// regular report goes out, so a window's heavy values are what it reports.
func (c Config) limiterOptions(strategy sidecar.Strategy) sidecar.LimiterOptions {
	return sidecar.LimiterOptions{MaxPeers: c.MaxPeers, MaxLeaves: c.MaxLeaves, PeerIdle: c.peerIdle(), Strategy: strategy,
		DescriptorCounters: c.DescriptorCounters, DescriptorHeavy: c.DescriptorHeavy, DescriptorWindow: c.ReportInterval}
}
