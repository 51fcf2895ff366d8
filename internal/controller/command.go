package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/admin"
	"github.com/sluicehq/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/process"
	"github.com/sluicehq/sluice/internal/xdsserver"
	"github.com/sluicehq/sluice/pkg/history"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/shard"
)

// Flags are the controller binary's settings beyond Config.
type Flags struct {
	DatabaseURL     string
	LimitsResync    time.Duration
	Recorder        RecorderConfig
	GRPCAddr        string
	AdminAddr       string
	LimitsFile      string
	LimitsReload    time.Duration
	DrainDelay      time.Duration
	ShutdownTimeout time.Duration
	Logging         cli.Logging

	// ProxylessEndpoints is the file of callees served to proxyless gRPC
	// clients and their backends (xdsserver.LoadEndpoints).
	ProxylessEndpoints string
}

// Command is the controller binary: `controller` runs the service.
func Command() *cobra.Command {
	cfg := DefaultConfig()
	fl := Flags{Recorder: DefaultRecorderConfig()}
	var tlsFlags identity.Flags
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "sluice global controller: zone loads in, drop ratios out over xDS",
		Long: `The controller sums the zone loads its aggregators stream to it, runs the control
law every tick against the configured limits, and serves one DropPolicy resource
per callee ("callee/<service>") over xDS (ADS, delta or state of the world) on the
same gRPC port.

Every flag can also be set as SLUICE_CONTROLLER_<FLAG> (e.g. SLUICE_CONTROLLER_TICK=500ms)
or in the --config file; flags win over the environment, the environment over the file.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: false,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd, &cfg, &fl, &tlsFlags)
		},
	}
	addFlags(cmd.Flags(), &cfg, &fl)
	tlsFlags.AddFlags(cmd.Flags())
	fl.Logging.AddFlags(cmd.Flags())
	cmd.AddCommand(MigrateCommand("controller"), ShardOfCommand())
	return cmd
}

// run is the controller command: settle the configuration, open the limits'
// source, and run the service until ctx ends.
func run(cmd *cobra.Command, cfg *Config, fl *Flags, tlsFlags *identity.Flags) error {
	validate := func() error {
		err := cfg.Validate()
		if fl.DatabaseURL != "" && fl.LimitsFile != "" {
			err = errors.Join(err, errors.New("database-url, limits: they exclude each other: limits come from one place"))
		}
		err = errors.Join(err, tlsFlags.Validate())
		return err
	}
	log, reg, err := cli.Start(cmd, "controller", &fl.Logging, validate)
	if err != nil {
		return err
	}
	if fl.ProxylessEndpoints != "" {
		if cfg.Proxyless, err = xdsserver.LoadEndpoints(fl.ProxylessEndpoints); err != nil {
			return fmt.Errorf("proxyless-endpoints: %w", err)
		}
	}

	ls, err := openLimits(cmd.Context(), fl, log, reg)
	if err != nil {
		return err
	}
	defer ls.close()
	src, workers, flush, recorder := ls.src, ls.workers, ls.flush, ls.recorder
	serverOpts := ServerOptions()
	tlsSrc, err := tlsFlags.Setup(log, reg)
	if err != nil {
		return err
	}
	if tlsSrc != nil {
		if err := tlsSrc.Require(identity.Controller, ""); err != nil {
			return err
		}
		serverOpts = append(serverOpts, tlsSrc.ServerOption())
		cfg.RequirePeerIdentity = true
	}
	svc, err := New(*cfg, src, log, reg)
	if err != nil {
		return err
	}
	if recorder != nil {
		svc.RecordTo(recorder)
	}
	g := grpc.NewServer(append(serverOpts, grpc.ChainStreamInterceptor(svc.StreamInterceptor()))...)
	svc.Register(g)
	adm := admin.New(reg, svc.Ready)
	adm.Handle("GET /debug/sluice/policies", svc.PoliciesHandler())
	p := &process.Process{
		Logger: log,
		Admin:  adm, AdminAddr: fl.AdminAddr,
		GRPC: g, GRPCAddr: fl.GRPCAddr,
		Workers:         append(workers, svc.Run),
		Drain:           []func(){svc.Drain},
		Flush:           flush,
		DrainDelay:      fl.DrainDelay,
		ShutdownTimeout: fl.ShutdownTimeout,
	}
	log.Info("controller starting", "id", cfg.ID, "tick", cfg.Tick, "warmup", cfg.Warmup, "limits", fl.LimitsFile)
	if margin := cfg.RestartMargin(); margin <= 0 {
		log.Warn("warmup is not below half of policy-ttl: if this controller restarts, sidecars' policies expire before it publishes again, and their fail modes take over meanwhile; raise --policy-ttl or run a second controller",
			"warmup", cfg.Warmup, "policy-ttl", cfg.PolicyTTL)
	}
	return p.Run(cmd.Context())
}

// limitSource is where a controller's limits come from, with the workers
// and flush hooks that keep it, and the history recorder when there is one.
type limitSource struct {
	src      limits.Source
	workers  []func(context.Context) error
	flush    []func(context.Context) error
	recorder *Recorder
	close    func()
}

// openLimits opens the Postgres store (--database-url), the limits file
// (--limits), or neither: then the controller only observes.
func openLimits(ctx context.Context, fl *Flags, log *slog.Logger, reg *prometheus.Registry) (*limitSource, error) {
	ls := &limitSource{src: limits.Static{}, close: func() {}}
	reloadErrors := func(help string) func(error) {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controller_limits_reload_errors_total", Help: help})
		reg.MustRegister(c)
		return func(err error) {
			if err != nil {
				c.Inc()
			}
		}
	}
	switch {
	case fl.DatabaseURL != "":
		db, err := history.Open(ctx, fl.DatabaseURL, history.WithLogger(log))
		if err != nil {
			return nil, fmt.Errorf("open the history database: %w", err)
		}
		ls.close = db.Close
		store := limits.NewStore(db, fl.LimitsResync, log)
		store.OnReload = reloadErrors("Reads of the limits that failed; the last limits read stay in force.")
		ls.src = store
		ls.recorder = NewRecorder(fl.Recorder, db, log, reg)
		ls.workers = append(ls.workers, store.Run, ls.recorder.Run)
		ls.flush = append(ls.flush, ls.recorder.Flush)
	case fl.LimitsFile != "":
		f, err := limits.LoadFile(ctx, fl.LimitsFile, fl.LimitsReload, log)
		if err != nil {
			return nil, err
		}
		f.OnReload = reloadErrors("Reloads of the limits file that failed; the last good limits stay in force.")
		ls.src = f
		ls.workers = append(ls.workers, f.Run)
	default:
		log.Warn("no --limits file: no limits are enforced, load is only observed")
	}
	return ls, nil
}

// addFlags declares the controller's flags over cfg and fl.
func addFlags(f *pflag.FlagSet, cfg *Config, fl *Flags) {
	f.StringVar(&fl.GRPCAddr, "grpc-addr", ":18000", "address for zone-load streams from aggregators and xDS from sidecars")
	f.StringVar(&fl.AdminAddr, "admin-addr", ":19000", "address for /metrics, /healthz, /readyz, /debug/sluice/policies")
	f.StringVar(&fl.LimitsFile, "limits", "", "YAML file of limits per callee and caller (see README); re-read when it changes")
	f.StringVar(&fl.ProxylessEndpoints, "proxyless-endpoints", "", "YAML file of callees served to proxyless gRPC clients (xds:///<callee>) and their backends' host:port (docs/dataplanes.md); read at start")
	f.StringVar(&fl.DatabaseURL, "database-url", "", "Postgres URL of the history store: limits come from it (instead of --limits) and minute rows go to it")
	duration.Var(f, &fl.LimitsResync, "limits-resync", time.Minute, "with --database-url: re-read every limit this often, besides on every change notification")
	f.IntVar(&fl.Recorder.MaxBuffered, "history-buffer", fl.Recorder.MaxBuffered, "with --database-url: minute rows held while Postgres is slow or away; the oldest are dropped beyond it")
	duration.Var(f, &fl.Recorder.Retention, "history-retention", fl.Recorder.Retention, "with --database-url: minute history older than this is dropped, a day at a time; 0 keeps everything")
	duration.Var(f, &fl.LimitsReload, "limits-reload", 5*time.Second, "how often to check the limits file for changes; 0 turns reloading off")
	duration.Var(f, &fl.DrainDelay, "drain-delay", 0, "on shutdown, how long to keep serving after /readyz turns 503")
	duration.Var(f, &fl.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "bound on each shutdown step")
	f.StringVar(&cfg.ID, "id", cfg.ID, "name of this replica in logs")
	duration.Var(f, &cfg.Tick, "tick", cfg.Tick, "how often the control law runs")
	f.IntVar(&cfg.StaleAfter, "stale-after", cfg.StaleAfter, "flush intervals an aggregator may miss before its load leaves the sums")
	duration.Var(f, &cfg.Warmup, "warmup", cfg.Warmup, "after start, how long to collect zone loads before publishing any policy")
	duration.Var(f, &cfg.PolicyTTL, "policy-ttl", cfg.PolicyTTL, "TTL written into policies; unchanged policies are re-issued every half TTL")
	duration.Var(f, &cfg.FailOpenDecay, "fail-open-decay", cfg.FailOpenDecay, "how long sidecars in fail mode open take to decay ratios to 0")
	f.Float64Var(&cfg.RepublishThreshold, "republish-threshold", cfg.RepublishThreshold, "relative change of a caller's admitted share that is pushed before the refresh is due")
	f.IntVar(&cfg.Shard.Count, "shards", 1, "how many controller shards split the callees between them (by their name's hash; docs/operations.md, \"Sharded controllers\"); aggregators and sidecars follow the count the shards announce")
	f.IntVar(&cfg.Shard.Index, "shard", 0, "this controller's shard, in [0, --shards): in a StatefulSet, its pod's ordinal (SLUICE_CONTROLLER_SHARD from the apps.kubernetes.io/pod-index label)")
	f.IntVar(&cfg.MaxAggregators, "max-aggregators", cfg.MaxAggregators, "most aggregators whose loads are held")
	f.IntVar(&cfg.MaxDescriptorValues, "max-descriptor-values", cfg.MaxDescriptorValues, "most values of one descriptor a policy lists (and a zone load may carry): reserved, then dropped, then compliant, largest first")
	duration.Var(f, &cfg.CostPayback, "cost-payback", cfg.CostPayback, "window over which a bucket of a callee counting cost pays back what it admitted above its limit (its limit lowered meanwhile)")
	duration.Var(f, &cfg.DescriptorHold, "descriptor-hold", cfg.DescriptorHold, "how long a compliant descriptor value stays listed (ratio 0) after the zones last reported it; 0 lists it only while reported")
	f.Float64Var(&cfg.Law.PMax, "p-max", cfg.Law.PMax, "highest drop ratio ever pushed, in (0, 1)")
	f.Float64Var(&cfg.Law.MinRate, "min-rate", cfg.Law.MinRate, "offered rps below which a caller is never dropped")
	f.Float64Var(&cfg.Law.ReleaseRate, "release-rate", cfg.Law.ReleaseRate, "slow release: factor by which a caller's admitted share may grow per second, > 1")
	f.Float64Var(&cfg.Law.OpenBelow, "open-below", cfg.Law.OpenBelow, "a caller whose offered rate is at most this share of its allowed rate is released at once, not slowly; in [0, 1), 0: never")
}

// MigrateCommand applies the history store's embedded migrations: an
// explicit step, so that a binary never changes a schema by surprise. The
// controller and the configurator both have it.
func MigrateCommand(binary string) *cobra.Command {
	var url string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "apply the history database's schema migrations (forward only, idempotent)",
		Long: `migrate applies the SQL migrations embedded in this binary to the Postgres
database at --database-url, in order, each in its own transaction, under an
advisory lock so that two migrators at once are safe. Applied migrations are
recorded, with whether binaries older than each may run on the database;
running it again changes nothing. Migrations only go forward: see
docs/operations.md, "Upgrade" and "Rollback".`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Apply(cmd.Flags(), binary, os.LookupEnv); err != nil {
				return err
			}
			if url == "" {
				return errors.New("database-url: required")
			}
			// A database newer than this binary, by migrations that let
			// older binaries run, is left alone with a warning on stderr.
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			applied, err := history.Migrate(cmd.Context(), url, history.WithLogger(log))
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "up to date")
			}
			for _, m := range applied {
				fmt.Fprintln(cmd.OutOrStdout(), "applied", m)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&url, "database-url", "", "Postgres URL of the history store")
	return cmd
}

// ShardOfCommand prints the shard that owns each callee: where its policy,
// its proxyless resources and its Envoy RTDS layer are served.
func ShardOfCommand() *cobra.Command {
	var shards int
	cmd := &cobra.Command{
		Use:   "shard-of CALLEE...",
		Short: "print the controller shard that owns each callee under --shards",
		Long: `shard-of prints, for each callee, the index of the controller shard that
computes and publishes its policy when controllers are sharded --shards ways
(pkg/shard: a stable hash of the name). An Envoy RTDS or proxyless gRPC
bootstrap for a callee names its owner, sluice-controller-<shard>.`,
		Args:         cobra.MinimumNArgs(1),
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, callees []string) error {
			if err := (shard.Map{Index: 0, Count: shards}).Validate(); err != nil {
				return err
			}
			for _, c := range callees {
				if err := names.Check(c); err != nil {
					return fmt.Errorf("callee %q: %w", c, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\t%d\n", c, shard.Owner(c, shards))
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&shards, "shards", 1, "the controllers' shard count")
	return cmd
}
