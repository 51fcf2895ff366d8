package webhook

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"github.com/sluicehq/sluice/internal/admin"
	"github.com/sluicehq/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/internal/process"
	"github.com/sluicehq/sluice/internal/webhook/inject"
)

// Command is the injector binary.
func Command() *cobra.Command { return command(nil) }

// command takes a hook that is told every bound address ("webhook",
// "admin"), so that tests can listen on port 0.
func command(onListening func(name string, addr net.Addr)) *cobra.Command {
	cfg := Config{ShutdownTimeout: 10 * time.Second}
	var (
		listen, adminAddr, pullPolicy string
		drainDelay                    time.Duration
		logging                       cli.Logging
	)
	cmd := &cobra.Command{
		Use:   "injector",
		Short: "sluice injector: the admission webhook that adds the sidecar to pods",
		Long: `The injector is a mutating admission webhook. The API server sends it every pod
that is created in a namespace labelled sluice.io/inject=enabled (path /inject/namespace)
and every pod labelled sluice.io/inject=true elsewhere (path /inject); it answers with a
JSON patch that adds the sluice sidecar, or with a denial that names a bad annotation.
It needs no access to the Kubernetes API.

It serves HTTPS (TLS 1.3) on --listen with the certificate in --tls-cert-file and
--tls-key-file, and reloads them when they change (cert-manager renewals need no
restart). With --tls-client-ca-file it requires the API server's client certificate.

--sidecar-caller-identity says whom the sidecars believe a request comes from: under
Istio, xfcc (the SPIFFE ID the pod's Envoy appends to x-forwarded-client-cert after
verifying the caller's certificate); pods choose their own with sluice.io/caller-identity.

Every flag can also be set as SLUICE_INJECTOR_<FLAG> or in the --config file;
flags win over the environment, the environment over the file.`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			validate := func() error {
				cfg.Inject.PullPolicy = corev1.PullPolicy(pullPolicy)
				return cfg.Validate()
			}
			log, reg, err := cli.Start(cmd, "injector", &logging, validate)
			if err != nil {
				return err
			}
			srv, err := New(cfg, log, reg)
			if err != nil {
				return err
			}
			// Bound before anything runs, like process.Run's listeners: a
			// port in use is a start-up error.
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen webhook on %q: %w", listen, err)
			}
			log.Info("listening", "listener", "webhook", "addr", ln.Addr().String())
			if onListening != nil {
				onListening("webhook", ln.Addr())
			}
			p := &process.Process{
				Logger: log,
				Admin:  admin.New(reg, nil), AdminAddr: adminAddr,
				// The HTTPS server is a worker: it stops at step 4, after
				// /readyz turned 503 and the drain delay passed.
				Workers:         []func(context.Context) error{func(ctx context.Context) error { return srv.Serve(ctx, ln) }},
				DrainDelay:      drainDelay,
				ShutdownTimeout: cfg.ShutdownTimeout,
				OnListening:     onListening,
			}
			log.Info("injector starting", "image", cfg.Inject.Image, "aggregators", cfg.Inject.Aggregators,
				"controllers", cfg.Inject.Controllers, "cert_not_after", srv.KeyPair().Leaf().NotAfter)
			err = p.Run(cmd.Context())
			ln.Close() // closed already unless start-up failed
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", ":9443", "address of the HTTPS webhook")
	f.StringVar(&adminAddr, "admin-addr", ":19200", "address for /metrics, /healthz, /readyz")
	duration.Var(f, &drainDelay, "drain-delay", 0, "on shutdown, how long to keep serving after /readyz turns 503")
	duration.Var(f, &cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "bound on each shutdown step")
	f.StringVar(&cfg.CertFile, "tls-cert-file", "/etc/sluice/tls/tls.crt", "serving certificate (PEM); reloaded when it changes")
	f.StringVar(&cfg.KeyFile, "tls-key-file", "/etc/sluice/tls/tls.key", "serving certificate's private key (PEM); reloaded when it changes")
	f.StringVar(&cfg.ClientCAFile, "tls-client-ca-file", "", "CA bundle (PEM) the API server's client certificate must chain to; reloaded when it changes. Empty: callers are not authenticated (a warning at start)")
	f.StringVar(&cfg.Inject.Image, "sidecar-image", "", "image of the injected sidecar (required)")
	f.StringVar(&pullPolicy, "sidecar-image-pull-policy", "IfNotPresent", "pull policy of the sidecar image: Always, IfNotPresent or Never")
	f.StringSliceVar(&cfg.Inject.Aggregators, "aggregators", []string{"sluice-aggregator.sluice-system.svc:18100"},
		"the sidecar's --aggregators: the zone-local aggregator Service")
	f.StringSliceVar(&cfg.Inject.Controllers, "controllers", []string{"sluice-controller-{shard}.sluice-controller.sluice-system.svc:18000"},
		"the sidecar's --controllers: the controller shards' names (xDS), {shard} standing for a shard's index")
	f.IntVar(&cfg.Inject.ControllerShards, "controller-shards", 1, "the sidecar's --controller-shards: the controller shard count it assumes at start (it follows the count the shards announce)")
	f.StringVar(&cfg.SidecarTLS.TrustDomain, "sidecar-trust-domain", "", "give injected sidecars mutual TLS in this SPIFFE trust domain, with certificates from cert-manager's csi-driver-spiffe (the pod's service account must be its service); empty: sidecars in plaintext")
	f.StringVar(&cfg.Inject.CallerHeader, "caller-header", "", "the sidecar's --caller-header; empty keeps the sidecar's default")
	f.StringVar(&cfg.Inject.CPURequest, "sidecar-cpu-request", "50m", "the sidecar's CPU request; pods override it with sluice.io/cpu-request")
	f.StringVar(&cfg.Inject.MemoryRequest, "sidecar-memory-request", "64Mi", "the sidecar's memory request; pods override it with sluice.io/memory-request")
	f.StringVar(&cfg.Inject.CPULimit, "sidecar-cpu-limit", "", "the sidecar's CPU limit, none by default (throttling would add latency to every request); pods set it with sluice.io/cpu-limit")
	f.StringVar(&cfg.Inject.MemoryLimit, "sidecar-memory-limit", "256Mi", "the sidecar's memory limit; pods override it with sluice.io/memory-limit")
	f.Int32Var(&cfg.Inject.ProxyPort, "sidecar-proxy-port", inject.DefaultProxyPort,
		"the sidecar's proxy port (its --listen), outside Istio's ports so that both sidecars fit in a pod; pods override it with "+inject.ProxyPortAnnotation)
	f.Int32Var(&cfg.Inject.AdminPort, "sidecar-admin-port", inject.DefaultAdminPort,
		"the sidecar's port for /metrics, /healthz, /readyz (its --admin-addr); pods override it with "+inject.AdminPortAnnotation)
	f.StringVar(&cfg.Inject.CallerIdentity, "sidecar-caller-identity", inject.IdentityHeader,
		"the sidecar's --caller-identity: header (the caller header; trusts the network), xfcc (the SPIFFE ID the pod's Envoy appends to x-forwarded-client-cert: the mode under Istio) "+
			"or mtls (the sidecar's port serves TLS; needs --sidecar-trust-domain); pods override it with "+inject.CallerIdentityAnnotation)
	f.BoolVar(&cfg.Inject.TrustDecided, "sidecar-trust-decided", false,
		"the sidecar's --trust-decided: let requests their caller marked x-sluice-decided through uncounted; pods override it with "+inject.TrustDecidedAnnotation)
	logging.AddFlags(f)
	return cmd
}
