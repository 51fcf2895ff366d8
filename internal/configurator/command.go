package configurator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/internal/cli"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

// binary names the configurator in SLUICE_CONFIGURATOR_<FLAG> variables.
const binary = "configurator"

// Options hold what tests replace; the zero value is the real thing.
type Options struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Open opens the store at a database URL; nil means history.Open.
	Open func(ctx context.Context, url string) (history.Store, error)
	// Migrate applies migrations and returns what it applied; nil means
	// history.Migrate.
	Migrate func(ctx context.Context, url string) ([]string, error)
	// LookupEnv reads the environment; nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// CurrentUser names the OS user, the default --actor; nil means
	// os/user.Current's Username.
	CurrentUser func() (string, error)
}

// app is the state the subcommands share.
type app struct {
	opts        Options
	databaseURL string
	actor       string
	now         timeValue // --now; zero: the clock
	logging     cli.Logging
	log         *slog.Logger
}

// Command is the configurator binary.
func Command() *cobra.Command { return NewCommand(Options{}) }

// NewCommand is Command with opts.
func NewCommand(opts Options) *cobra.Command {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	if opts.CurrentUser == nil {
		opts.CurrentUser = func() (string, error) {
			u, err := user.Current()
			if err != nil {
				return "", err
			}
			return u.Username, nil
		}
	}
	a := &app{opts: opts}
	if a.opts.Open == nil {
		// Late bound: the logger exists once the flags are parsed.
		a.opts.Open = func(ctx context.Context, url string) (history.Store, error) {
			return openPostgres(a.log)(ctx, url)
		}
	}
	if a.opts.Migrate == nil {
		a.opts.Migrate = func(ctx context.Context, url string) ([]string, error) {
			return history.Migrate(ctx, url, history.WithLogger(a.log))
		}
	}
	root := &cobra.Command{
		Use:   "configurator",
		Short: "sluice limit review: derive limits from history, review, approve, audit",
		Long: `The configurator is the operator's tool for sluice's limits, kept in Postgres.

The limit lifecycle:
  observe   the controller writes every bucket's per-minute load to Postgres
            (for a demo: history seed --synthetic 4w)
  derive    propose limits: the peak over --lookback (4w) × (1 + --headroom) (25%)
  review    compare proposals with the limits in force
  backtest  replay stored minutes through the control law: what would have been dropped
  approve   put proposals in force (or reject them), with a --reason
  shadow    observe a limit without enforcing it; enforce when it looks right
  audit     who changed what, when, and why

A bucket is one callee/caller pair, written "checkout/web"; a callee alone
("checkout") stands for the service's own settings or all its buckets. For a
callee that declares procedures (configurator routes, or gRPC methods), a
(caller, procedure) leaf is "checkout/web/create-charge" and a procedure's own
capacity "checkout/*/create-charge"; the procedure is everything after the
second '/': "checkout/web//shop.Checkout/Pay".

Settings (the global flags, -o, and the tuning of derive and backtest) can also
be set as SLUICE_CONFIGURATOR_<FLAG> (e.g. SLUICE_CONFIGURATOR_DATABASE_URL) or
in the --config file, one file for every subcommand; flags win over the
environment, the environment over the file.`,
		SilenceUsage: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.databaseURL, "database-url", "", "Postgres URL of the limits and history store, e.g. postgres://sluice@db:5432/sluice (required)")
	pf.StringVar(&a.actor, "actor", defaultActor(a.opts.CurrentUser, a.opts.LookupEnv),
		"who makes the changes, as the audit log records it; default: the OS user (os/user, else $USER), and commands that write refuse to run without one")
	pf.Var(&a.now, "now", "take this time (UTC: 2026-11-30T03:03 or RFC 3339) as now for the windows over history of derive, history, backtest and history seed: for a past view or a reproducible demo; changes are still stamped with the real time, from which audit --since counts back")
	a.logging.AddFlags(pf)
	setting(pf, "database-url", "actor", "now", "log-level", "log-format", cli.ConfigFlag)

	root.AddCommand(
		a.migrateCommand(),
		a.deriveCommand(),
		a.reviewCommand(),
		a.decideCommand("approve"),
		a.decideCommand("reject"),
		a.setCommand(),
		a.routesCommand(),
		a.modeCommand(dropratio.Shadow),
		a.modeCommand(dropratio.Enforce),
		a.auditCommand(),
		a.historyCommand(),
		a.backtestCommand(),
	)
	return root
}

// defaultActor is the OS user: os/user's name for this process's uid, else
// $USER, else "" (and then a command that writes asks for --actor). Never a
// placeholder: the audit log must name a person or a system.
func defaultActor(currentUser func() (string, error), lookupEnv func(string) (string, bool)) string {
	if u, err := currentUser(); err == nil && strings.TrimSpace(u) != "" {
		return u
	}
	if u, ok := lookupEnv("USER"); ok && strings.TrimSpace(u) != "" {
		return u
	}
	return ""
}

// settingAnnotation marks the flags that are settings: taken from the
// environment and the config file too. The others (--reason, --limit, --id,
// …) say what one invocation does, and only the command line may say that.
const settingAnnotation = "sluice_setting"

func setting(fs *pflag.FlagSet, names ...string) {
	for _, n := range names {
		if err := fs.SetAnnotation(n, settingAnnotation, []string{"true"}); err != nil {
			panic(err) // a typo in a flag name: a bug, caught by every test
		}
	}
}

func isSetting(f *pflag.Flag) bool { return len(f.Annotations[settingAnnotation]) > 0 }

// setup applies the environment and the config file to cmd's settings and
// builds the logger. A setting of another subcommand (the file is shared)
// is accepted and ignored.
func (a *app) setup(cmd *cobra.Command) error {
	fs := pflag.NewFlagSet(binary, pflag.ContinueOnError)
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if isSetting(f) {
			fs.AddFlag(f)
		}
	})
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if isSetting(f) && fs.Lookup(f.Name) == nil {
				fs.Var(ignored{}, f.Name, "")
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cmd.Root())
	if err := cli.Apply(fs, binary, a.opts.LookupEnv); err != nil {
		return err
	}
	log, err := a.logging.Logger(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	a.log = log
	return nil
}

// clock is now for windows over history: --now when given, else the
// clock. (Changes are stamped by the store's clock, never by --now.)
func (a *app) clock() time.Time {
	if !a.now.t.IsZero() {
		return a.now.t
	}
	return a.opts.Now()
}

// ignored is a setting of another subcommand, met in the config file.
type ignored struct{}

func (ignored) Set(string) error { return nil }
func (ignored) String() string   { return "" }
func (ignored) Type() string     { return "string" }

// requireURL names the flag and its variable when no URL was given.
func (a *app) requireURL() error {
	if a.databaseURL == "" {
		return fmt.Errorf("--database-url is required (or set %s)", cli.EnvName(binary, "database-url"))
	}
	return nil
}

// withStore is a RunE that sets up, opens the store, runs fn and closes it.
func (a *app) withStore(fn func(cmd *cobra.Command, args []string, st history.Store) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := a.setup(cmd); err != nil {
			return err
		}
		if err := a.requireURL(); err != nil {
			return err
		}
		st, err := a.opts.Open(cmd.Context(), a.databaseURL)
		if err != nil {
			return fmt.Errorf("open store: %w", err)
		}
		defer st.Close()
		return fn(cmd, args, st)
	}
}

func (a *app) change(reason string) history.Change {
	return history.Change{Actor: a.actor, Reason: reason}
}

// requireChange names what the audit log lacks: a --reason, or an actor.
func (a *app) requireChange(reason string) error {
	var errs []error
	if strings.TrimSpace(reason) == "" {
		errs = append(errs, errors.New(`--reason is required: say why, for the audit log (e.g. --reason "black friday headroom")`))
	}
	return errors.Join(append(errs, a.requireActor())...)
}

// requireActor refuses a write without a name for the audit log.
func (a *app) requireActor() error {
	if strings.TrimSpace(a.actor) == "" {
		return fmt.Errorf("--actor is required: no OS user was found (os/user, $USER) to name who makes this change in the audit log; give --actor NAME or set %s",
			cli.EnvName(binary, "actor"))
	}
	return nil
}

// timeValue is a pflag.Value over parseTime.
type timeValue struct{ t time.Time }

func (v *timeValue) Set(s string) error {
	t, err := parseTime("now", s)
	if err != nil {
		return err
	}
	v.t = t
	return nil
}

func (v *timeValue) String() string {
	if v.t.IsZero() {
		return ""
	}
	return v.t.Format(time.RFC3339)
}

func (v *timeValue) Type() string { return "time" }

func (a *app) migrateCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "apply the embedded database migrations",
		Long: `Applies the SQL migrations embedded in this binary that the database does not
have yet, in order, and prints them ("up to date" when there were none).
Safe to run again, and from two places at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.setup(cmd); err != nil {
				return err
			}
			if err := a.requireURL(); err != nil {
				return err
			}
			applied, err := a.opts.Migrate(cmd.Context(), a.databaseURL)
			if err != nil {
				return fmt.Errorf("migrate: %w", err)
			}
			w := cmd.OutOrStdout()
			if len(applied) == 0 {
				fmt.Fprintln(w, "up to date")
				return nil
			}
			for _, m := range applied {
				fmt.Fprintf(w, "applied %s\n", m)
			}
			return nil
		},
	}
}
