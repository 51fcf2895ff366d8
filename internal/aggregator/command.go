package aggregator

import (
	"context"
	"errors"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/admin"
	"github.com/sluicehq/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/internal/process"
	"github.com/sluicehq/sluice/pkg/liveness"
)

// Command is the aggregator binary.
func Command() *cobra.Command {
	cfg := DefaultConfig()
	var (
		grpcAddr, adminAddr     string
		drainDelay, stopTimeout time.Duration
		logging                 cli.Logging
		tlsFlags                identity.Flags
	)
	cmd := &cobra.Command{
		Use:   "aggregator",
		Short: "sluice zone aggregator: sums its zone's sidecar reports for the controller",
		Long: `The aggregator takes one long-lived load-report stream from every sidecar of its
zone, keeps the latest rate of each live sidecar (a sidecar silent for --stale-after
report windows leaves the sums), and every --flush-interval sends the zone's
per-(service, caller) rates to the controller, failing over across --controllers.
Reports that break its bounds are rejected whole and counted by reason.

Every flag can also be set as SLUICE_AGGREGATOR_<FLAG> or in the --config file;
flags win over the environment, the environment over the file.`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, reg, err := cli.Start(cmd, "aggregator", &logging, func() error { return errors.Join(cfg.Validate(), tlsFlags.Validate()) })
			if err != nil {
				return err
			}
			serverOpts := append([]grpc.ServerOption{grpc.MaxRecvMsgSize(cfg.Bounds.MaxReportSize())}, liveness.ServerOptions()...)
			tlsSrc, err := tlsFlags.Setup(log, reg)
			if err != nil {
				return err
			}
			if tlsSrc != nil {
				if err := tlsSrc.Require(identity.Aggregator, cfg.Zone); err != nil {
					return err
				}
				serverOpts = append(serverOpts, tlsSrc.ServerOption())
				cfg.RequirePeerIdentity = true
				cfg.DialOptions = []grpc.DialOption{tlsSrc.DialOption(identity.Kinds(identity.Controller))}
			}
			svc, err := New(cfg, log, reg)
			if err != nil {
				return err
			}
			g := grpc.NewServer(serverOpts...)
			svc.Register(g)
			ready := func() error {
				if !svc.Ready() {
					return errors.New("no controller connection")
				}
				return nil
			}
			p := &process.Process{
				Logger: log,
				Admin:  admin.New(reg, ready), AdminAddr: adminAddr,
				GRPC: g, GRPCAddr: grpcAddr,
				Workers:         []func(ctx context.Context) error{svc.Run},
				Drain:           []func(){svc.Drain},
				DrainDelay:      drainDelay,
				ShutdownTimeout: stopTimeout,
			}
			log.Info("aggregator starting", "id", cfg.ID, "zone", cfg.Zone, "controllers", cfg.Controllers)
			return p.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&grpcAddr, "grpc-addr", ":18100", "address for load-report streams from sidecars")
	f.StringVar(&adminAddr, "admin-addr", ":19100", "address for /metrics, /healthz, /readyz")
	duration.Var(f, &drainDelay, "drain-delay", 0, "on shutdown, how long to keep serving after /readyz turns 503")
	duration.Var(f, &stopTimeout, "shutdown-timeout", 10*time.Second, "bound on each shutdown step")
	f.StringVar(&cfg.ID, "id", cfg.ID, "this aggregator's id, unique while it runs")
	f.StringVar(&cfg.Zone, "zone", "", "the zone every sidecar reporting here is accounted to (required)")
	f.StringSliceVar(&cfg.Controllers, "controllers", []string{"127.0.0.1:18000"}, "controller addresses, in failover order (with --controller-fanout: one per replica)")
	f.IntVar(&cfg.ControllerShards, "controller-shards", 0, "with --controllers naming {shard} (sluice-controller-{shard}.sluice-controller:18000): the controller shard count to assume at start; each shard is sent its callees' loads, and the count the shards announce is followed")
	f.BoolVar(&cfg.ControllerFanout, "controller-fanout", false, "send every flush to every --controllers address, each a controller replica, so that all replicas publish the same ratios")
	duration.Var(f, &cfg.FlushInterval, "flush-interval", cfg.FlushInterval, "how often the zone's rates go to the controller")
	f.IntVar(&cfg.StaleAfter, "stale-after", cfg.StaleAfter, "report windows a sidecar may miss before it leaves the sums")
	f.IntVar(&cfg.Bounds.MaxPeersPerReport, "max-peers-per-report", cfg.Bounds.MaxPeersPerReport, "callers kept of one report besides unknown and _overflow; the smallest beyond it fold into _overflow (rates kept, counted); reports naming over 10 times as many are rejected")
	f.Float64Var(&cfg.Bounds.MaxRate, "max-rate", cfg.Bounds.MaxRate, "reports claiming a higher rate (rps) for one caller are rejected")
	f.Float64Var(&cfg.Bounds.MaxCostPerRequest, "max-report-cost-per-request", cfg.Bounds.MaxCostPerRequest, "a report's entry claiming a larger cost per request (offered_cost above this times its offered requests; admitted_cost above this times the requests that can have completed in its window) is left out (counted, reason bad_cost)")
	f.IntVar(&cfg.Bounds.MaxSidecars, "max-sidecars", cfg.Bounds.MaxSidecars, "most sidecars held; reports from more are rejected")
	duration.Var(f, &cfg.Bounds.MaxInterval, "max-report-interval", cfg.Bounds.MaxInterval, "reports announcing a longer interval are rejected; one report keeps a sidecar in the sums for at most --stale-after times this")
	f.IntVar(&cfg.Bounds.MaxSidecarsPerIdentity, "max-sidecars-per-identity", cfg.Bounds.MaxSidecarsPerIdentity, "most sidecar ids one identity (service) holds; reports for more are rejected")
	f.IntVar(&cfg.Bounds.MaxPeersPerIdentity, "max-peers-per-identity", cfg.Bounds.MaxPeersPerIdentity, "most distinct callers across one identity's sidecars besides unknown and _overflow; new callers beyond it fold into _overflow (rates kept, counted)")
	f.IntVar(&cfg.Bounds.MaxEntriesPerIdentity, "max-entries-per-identity", cfg.Bounds.MaxEntriesPerIdentity, "most (sidecar, caller) rates kept for one identity besides unknown and _overflow, about 56 bytes each; callers beyond it fold into _overflow (rates kept, counted)")
	f.IntVar(&cfg.Bounds.MaxValuesPerIdentity, "max-values-per-identity", cfg.Bounds.MaxValuesPerIdentity, "most (sidecar, descriptor, value) rates kept for one identity besides _missing and _invalid, at most about 280 bytes each; a report's smallest values beyond it are left out (counted)")
	f.IntVar(&cfg.Bounds.MaxReportValues, "max-report-values", cfg.Bounds.MaxReportValues, "most values of one descriptor taken from one report; the rest are left out (counted)")
	f.IntVar(&cfg.Bounds.MaxDescriptorValues, "max-descriptor-values", cfg.Bounds.MaxDescriptorValues, "most values of one (service, descriptor) in a zone load, the largest by rate; the rest are counted in its values_cut")
	f.IntVar(&cfg.MaxZoneLoadSize, "max-zone-load-size", cfg.MaxZoneLoadSize, "largest zone load sent, in bytes: the controller's receive limit; the services with the most callers are left out until it fits")
	tlsFlags.AddFlags(f)
	logging.AddFlags(f)
	return cmd
}
