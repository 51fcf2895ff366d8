package agent

import (
	"errors"
	"log/slog"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/admin"
	"github.com/sluicehq/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/internal/process"
)

// commandHelp is the sidecar's --help text.
const commandHelp = `The sidecar listens in front of the local app (HTTP/1.1 and h2c, so gRPC works;
HTTP/1.1 and h2 over TLS with --caller-identity mtls),
drops each request with the probability its DropPolicy gives the request's caller,
and proxies the rest to --upstream. A dropped HTTP request gets 429 with Retry-After
(the seconds the controller needs to release the caller's ratio, 1 to 60),
x-envoy-ratelimited (so that Envoy does not retry it) and RateLimit headers; a
dropped gRPC call gets RESOURCE_EXHAUSTED with a RetryInfo of the same delay.
With --ratelimit-headers, admitted responses carry the caller's quota too.
With --rls-listen it also answers Envoy's rate limit service (ShouldRateLimit,
for Envoy's ratelimit filter) on its own gRPC port, from the same limiter: the
descriptor entry --rls-caller-key names the caller, --rls-procedure-key and
--rls-method-key the request, hits_addend its cost (see docs/dataplanes.md).

Who the caller is (--caller-identity): header, the default, reads --caller-header
(default x-sluice-caller), which trusts the network: any client that reaches the port
can name any caller. xfcc reads the SPIFFE ID of the last element of the
x-forwarded-client-cert header, believed only from --trusted-proxies (the local
Envoy). mtls serves the port with TLS 1.3, requires a client certificate (the
--tls-* files) and reads its SPIFFE ID. A request without an identity counts as
"unknown"; a caller header that disagrees with the identity is counted and ignored
(--caller-mismatch reject refuses it). x-sluice-decided marks are honoured only with
--trust-decided, and then only when they name the (authenticated) caller.
The policy comes over xDS from --controllers; every --report-interval the sidecar
reports per-caller counts to its zone aggregator (--aggregators). Without a policy
it admits everything. When the controller is unreachable it keeps the last policy
until the policy's TTL runs out, then follows the policy's fail mode: open (the
ratios decay to 0 over the policy's decay window), hold (they stay), or local
(each caller with a limit gets limit / live instances per second, as a token bucket).

Every flag can also be set as SLUICE_SIDECAR_<FLAG> or in the --config file;
flags win over the environment, the environment over the file.`

// Command is the sidecar binary.
func Command() *cobra.Command {
	cfg := DefaultConfig()
	var (
		listen, adminAddr       string
		drainDelay, stopTimeout time.Duration
		logging                 cli.Logging
		tlsFlags                identity.Flags
	)
	cmd := &cobra.Command{
		Use:          "sidecar",
		Short:        "sluice sidecar: decides every request locally, proxies the rest to the app",
		Long:         commandHelp,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, reg, err := cli.Start(cmd, "sidecar", &logging, func() error {
				var mtls error
				if cfg.CallerIdentity == MTLSIdentity && !tlsFlags.Enabled() {
					mtls = errors.New("caller-identity: mtls needs --tls-cert, --tls-key and --tls-ca: the proxy port serves TLS and requires client certificates")
				}
				return errors.Join(cfg.Validate(), tlsFlags.Validate(), mtls)
			})
			if err != nil {
				return err
			}
			tlsSrc, err := tlsFlags.Setup(log, reg)
			if err != nil {
				return err
			}
			if err := cfg.useTLS(tlsSrc); err != nil {
				return err
			}
			cfg.TrustDomain = tlsFlags.TrustDomain
			logIdentity(log, cfg)
			if cfg.RLS.Listen != "" {
				log.Info("rate limit service on its own port, plaintext gRPC: the descriptor names the caller, so any client that reaches it "+
					"can spend any caller's limit; keep it on localhost, for the local Envoy", "rls_listen", cfg.RLS.Listen, "rls_domain", cfg.RLS.mapping(cfg.Service).Domain)
			}
			a, err := New(cfg, log, reg)
			if err != nil {
				return err
			}
			defer a.Close()
			p := &process.Process{
				Logger: log,
				Admin:  admin.New(reg, a.Ready), AdminAddr: adminAddr,
				HTTP: a.Server(listen), HTTPAddr: listen, H2C: a.H2C(),
				GRPC: a.RLSServer(), GRPCAddr: cfg.RLS.Listen,
				Workers:         a.Workers(),
				DrainDelay:      drainDelay,
				ShutdownTimeout: stopTimeout,
			}
			log.Info("sidecar starting", "service", cfg.Service, "id", cfg.ID, "upstream", cfg.Upstream,
				"controllers", cfg.Controllers, "aggregators", cfg.Aggregators, "rls_listen", cfg.RLS.Listen)
			return p.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", ":15001", "address the proxy listens on (HTTP/1.1 and h2c; with --caller-identity mtls, HTTP/1.1 and h2 over TLS)")
	f.StringVar(&adminAddr, "admin-addr", ":15020", "address for /metrics, /healthz, /readyz")
	duration.Var(f, &drainDelay, "drain-delay", 0, "on shutdown, how long to keep serving after /readyz turns 503")
	duration.Var(f, &stopTimeout, "shutdown-timeout", 10*time.Second, "bound on each shutdown step")
	f.StringVar(&cfg.Service, "service", "", "name of the service this sidecar fronts (required)")
	f.StringVar(&cfg.ID, "id", cfg.ID, "this sidecar's id, unique while it runs (e.g. the pod name)")
	f.StringVar(&cfg.Zone, "zone", "", "this sidecar's zone, if known; the aggregator has the last word")
	f.StringVar(&cfg.Upstream, "upstream", cfg.Upstream, "the local app's URL")
	f.StringSliceVar(&cfg.Aggregators, "aggregators", cfg.Aggregators, "zone aggregator addresses, in failover order")
	f.StringSliceVar(&cfg.Controllers, "controllers", cfg.Controllers, "xDS server addresses (controllers or relays), in failover order; with sharded controllers, templates where {shard} is a shard's index (sluice-controller-{shard}.sluice-controller:18000): the sidecar subscribes at the shard that owns its service")
	f.IntVar(&cfg.ControllerShards, "controller-shards", 1, "with --controllers naming {shard}: the shard count to assume at start; the shards announce the real one, which the sidecar follows")
	f.StringVar(&cfg.XDSProtocol, "xds-protocol", cfg.XDSProtocol, "xDS variant: delta or sotw")
	duration.Var(f, &cfg.ReportInterval, "report-interval", cfg.ReportInterval, "how often to report load to the aggregator")
	duration.Var(f, &cfg.SurgeCheck, "surge-check", cfg.SurgeCheck, "how often to look for a surge between reports and report it at once; 0 means a tenth of --report-interval, negative none")
	f.BoolVar(&cfg.SurgeProjection, "surge-projection", cfg.SurgeProjection, "project a surge's drop ratio on this sidecar from its share of the caller's global rate until the controller's ratio arrives; needs --surge-check")
	f.BoolVar(&cfg.HealthFastPath, "health-fast-path", cfg.HealthFastPath, "when the app misses the objective (slo) its policy declares, shed a share of the admitted load at once, the least critical first, until the controller's next tick; needs --surge-check")
	f.StringVar(&cfg.CallerHeader, "caller-header", cfg.CallerHeader, "request header that names the caller")
	addIdentityFlags(f, &cfg)
	f.IntVar(&cfg.MaxPeers, "max-peers", cfg.MaxPeers, "distinct callers tracked, besides the ones the policy limits, before the rest share the _overflow bucket")
	f.IntVar(&cfg.DescriptorCounters, "descriptor-counters", cfg.DescriptorCounters, "slots of each descriptor's sketch per window, in lines of 8 (the number of lines the largest power of two within it): more slots, fewer values over-counted; 16 bytes each (two windows), whatever the number of values")
	f.IntVar(&cfg.DescriptorHeavy, "descriptor-heavy", cfg.DescriptorHeavy, "heavy values each descriptor's sketch holds and reports per window")
	f.IntVar(&cfg.MaxLeaves, "max-leaves", cfg.MaxLeaves, "for a callee that declares procedures: distinct (caller, procedure) leaves tracked, besides the ones the policy limits, before a new leaf (c, q) shares (_overflow, q)")
	duration.Var(f, &cfg.PeerIdle, "peer-idle", cfg.PeerIdle, "how long a caller the policy does not limit keeps its place among --max-peers without a request; at least two --report-interval; 0 means 1m or two --report-interval, whichever is longer")
	f.StringVar(&cfg.Strategy, "strategy", cfg.Strategy, "drop decision: diffuse (exact error diffusion) or random")
	f.StringVar(&cfg.RateLimitHeaders, "ratelimit-headers", cfg.RateLimitHeaders, "rate-limit headers on admitted responses: none, draft (RateLimit-Policy and RateLimit) or x-ratelimit (Envoy's X-RateLimit-*, on 429s too)")
	addProxyFlags(f, &cfg)
	addRLSFlags(f, &cfg.RLS)
	tlsFlags.AddFlags(f)
	logging.AddFlags(f)
	return cmd
}

// logIdentity says at start what the caller identity trusts.
func logIdentity(log *slog.Logger, cfg Config) {
	switch cfg.CallerIdentity {
	case HeaderIdentity:
		log.Warn("caller identity from the "+cfg.CallerHeader+" header: any client that reaches the proxy port can name any caller and spend its limit; "+
			"use --caller-identity mtls or xfcc where the network is not trusted", "trust_decided", cfg.TrustDecided)
	case XFCCIdentity:
		log.Info("caller identity from x-forwarded-client-cert, believed from the trusted proxies only",
			"trusted_proxies", cfg.TrustedProxies, "trust_domain", cfg.TrustDomain, "caller_mismatch", cfg.CallerMismatch, "trust_decided", cfg.TrustDecided)
	case MTLSIdentity:
		log.Info("caller identity from the client certificate: the proxy port serves mutual TLS",
			"trust_domain", cfg.TrustDomain, "caller_mismatch", cfg.CallerMismatch, "trust_decided", cfg.TrustDecided)
	}
}

// useTLS makes every link of the sidecar mutual TLS with src's
// certificates; a nil src (plaintext mode) changes nothing.
func (c *Config) useTLS(src *identity.Source) error {
	if src == nil {
		return nil
	}
	// The sidecar speaks for --service alone; its certificate must say
	// so, or the aggregator would refuse every report.
	if err := src.Require(identity.Workload, c.Service); err != nil {
		return err
	}
	c.ReportDialOptions = []grpc.DialOption{src.DialOption(identity.Kinds(identity.Aggregator))}
	// Policies come from a controller or a zone relay.
	c.XDSDialOptions = []grpc.DialOption{src.DialOption(identity.Kinds(identity.Controller, identity.Aggregator))}
	// Callers are workloads.
	c.ServerTLS = src.ServerTLS(identity.Kinds(identity.Workload))
	return nil
}

// addIdentityFlags adds who the caller is, and what is trusted about it.
func addIdentityFlags(f *pflag.FlagSet, cfg *Config) {
	f.StringVar(&cfg.CallerIdentity, "caller-identity", cfg.CallerIdentity, "who the caller is: header (--caller-header; trusts the network), xfcc (the SPIFFE ID in x-forwarded-client-cert, from --trusted-proxies only) or mtls (the verified client certificate's SPIFFE ID; the port serves TLS)")
	f.StringSliceVar(&cfg.TrustedProxies, "trusted-proxies", cfg.TrustedProxies, "CIDRs whose x-forwarded-client-cert is believed with --caller-identity xfcc (the local Envoy); from elsewhere the header is ignored and the caller is unknown")
	f.StringVar(&cfg.CallerMismatch, "caller-mismatch", cfg.CallerMismatch, "with an authenticated --caller-identity, what a caller header naming another caller gets: ignore (decided as the identity) or reject (403, PERMISSION_DENIED); counted either way")
	f.BoolVar(&cfg.TrustDecided, "trust-decided", cfg.TrustDecided, "let requests a caller marked x-sluice-decided (its outbound enforcement decided them) through uncounted when the mark names the (authenticated) caller; only for callers trusted to enforce their own limits")
}

// addProxyFlags adds the proxy's bounds.
func addProxyFlags(f *pflag.FlagSet, cfg *Config) {
	duration.Var(f, &cfg.ProxyBodyTimeout, "proxy-body-timeout", cfg.ProxyBodyTimeout, "time any request body may take to arrive, from the end of its headers, whatever its size; a larger body may take its size at --proxy-min-body-rate more; slower bodies get 408 (gRPC over HTTP/2 is exempt)")
	f.IntVar(&cfg.ProxyMinBodyRate, "proxy-min-body-rate", cfg.ProxyMinBodyRate, "least rate of a request body, in bytes per second, past --proxy-body-timeout: a body of n bytes may take --proxy-body-timeout + n/rate (Kestrel's MinRequestBodyDataRate); 0 for none, the timeout is then a total")
	f.IntVar(&cfg.ProxyMaxRequests, "proxy-max-requests", cfg.ProxyMaxRequests, "requests in flight to the app; more get 503 (gRPC: UNAVAILABLE) at once")
	f.IntVar(&cfg.ProxyMaxConns, "proxy-max-connections", cfg.ProxyMaxConns, "connections open to the app; a request that needs one more gets 503 at once")
	f.BoolVar(&cfg.GRPCForwarder, "grpc-forwarder", cfg.GRPCForwarder, "carry the proxy port's h2c connections (gRPC) on grpc-go's transport, with a third to a half less CPU than net/http's HTTP/2; HTTP/2 with prior knowledge is then gRPC only (other requests get 415); false sends them through net/http. Plaintext only: with --caller-identity mtls, net/http serves the port")
	f.IntVar(&cfg.GRPCMaxMessage, "grpc-max-message-size", cfg.GRPCMaxMessage, "largest gRPC message, in bytes, the forwarder carries either way (it holds each whole on its way); larger ones get RESOURCE_EXHAUSTED. Raise it with the app's own limit")
}
