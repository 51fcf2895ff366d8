// Package demo runs sluice's whole loop on this machine and narrates it: a
// controller, three zone aggregators and six sidecars in front of a small
// app, all real servers on loopback, and a load generator in which one
// caller surges to ten times its limit while another stays under its own.
package demo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/testbed"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
)

// Options shape the run.
type Options struct {
	Limit       float64       // rps, each caller's limit
	Calm        float64       // rps, web before and after its surge, and mobile throughout
	Surge       float64       // factor over the limit web surges to
	SurgeStart  time.Duration // since load began
	SurgeLength time.Duration
	After       time.Duration // calm after the surge
	Verbose     bool          // log the components to stderr
}

// DefaultOptions is the run the README describes.
func DefaultOptions() Options {
	return Options{
		Limit:       100,
		Calm:        60,
		Surge:       10,
		SurgeStart:  5 * time.Second,
		SurgeLength: 20 * time.Second,
		After:       12 * time.Second,
	}
}

// Command is `demo`.
func Command() *cobra.Command {
	o := DefaultOptions()
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "run the whole sluice loop on loopback and watch it hold a surge",
		Long: `demo starts a controller, three zone aggregators and six sidecars (two per zone)
in front of a small app, all real gRPC and HTTP servers on 127.0.0.1, with built-in
limits: callers "web" and "mobile" may each send --limit rps to service "checkout".
A load generator sends both at --calm rps; after --surge-start, web surges to
--surge times its limit for --surge-length, then calms down again.

Every second it prints what each caller offered and got through, and the
drop ratio the sidecars hold; at the end, a summary. No Postgres, no configuration.`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return Run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.Float64Var(&o.Limit, "limit", o.Limit, "each caller's limit, rps")
	f.Float64Var(&o.Calm, "calm", o.Calm, "rps of a caller that is not surging")
	f.Float64Var(&o.Surge, "surge", o.Surge, "web's surge, as a multiple of its limit")
	duration.Var(f, &o.SurgeStart, "surge-start", o.SurgeStart, "when web's surge begins")
	duration.Var(f, &o.SurgeLength, "surge-length", o.SurgeLength, "how long web's surge lasts")
	duration.Var(f, &o.After, "after", o.After, "how long to keep going after the surge")
	f.BoolVar(&o.Verbose, "verbose", false, "log what the components do, to stderr")
	return cmd
}

func (o Options) validate() error {
	var bad []string
	if !(o.Limit > 0) {
		bad = append(bad, "--limit must be positive")
	}
	if !(o.Calm >= 0) {
		bad = append(bad, "--calm must not be negative")
	}
	if !(o.Surge > 0) {
		bad = append(bad, "--surge must be positive")
	}
	if o.SurgeStart < 0 || o.SurgeLength < time.Second || o.After < 0 {
		bad = append(bad, "--surge-start and --after must not be negative, --surge-length at least 1s")
	}
	if o.Surge*o.Limit+o.Calm > 5000 {
		bad = append(bad, "--surge × --limit + --calm above 5000 rps is more than one machine's loopback demo should send")
	}
	if len(bad) > 0 {
		return fmt.Errorf("invalid options: %s", strings.Join(bad, "; "))
	}
	return nil
}

// Run starts the cluster, drives the load and writes the narration to out.
func Run(ctx context.Context, out, errOut io.Writer, o Options) error {
	if err := o.validate(); err != nil {
		return err
	}
	logger := slog.New(slog.DiscardHandler)
	if o.Verbose {
		logger = slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	set := limits.NewSet(map[string]*limits.Service{
		"checkout": {
			Name: "checkout", Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: dataplane.FailOpen,
			Callers: map[string]limits.Bucket{
				"web":    {Limit: o.Limit, Mode: dropratio.Enforce},
				"mobile": {Limit: o.Limit, Mode: dropratio.Enforce},
				// Requests that name no caller, or a caller past the
				// sidecars' tables, share a limit too: without one,
				// any client could send unlimited load by naming
				// nobody (or everybody).
				names.Unknown:  {Limit: o.Limit, Mode: dropratio.Enforce},
				names.Overflow: {Limit: o.Limit, Mode: dropratio.Enforce},
			},
		},
	})
	cfg := controller.DefaultConfig()
	cfg.Warmup = 2 * time.Second

	fmt.Fprintf(out, "starting a controller, 3 zone aggregators and 6 sidecars on 127.0.0.1 ...\n")
	c, err := testbed.Start(testbed.Options{Service: "checkout", Limits: set, Controller: &cfg, Logger: logger})
	if err != nil {
		return fmt.Errorf("start the loop: %w", err)
	}
	defer c.Close()
	fmt.Fprintf(out, "  controller  %s (gRPC: zone loads in, xDS out; admin http://%s/debug/sluice/policies)\n", c.ControllerAddr, adminOf(c))
	for _, a := range c.Aggregators {
		fmt.Fprintf(out, "  aggregator  %s  %s\n", a.Addr, a.Name)
	}
	for _, s := range c.Sidecars {
		fmt.Fprintf(out, "  sidecar     %s  %s -> app %s\n", s.URL(), s.Name, c.UpstreamURL)
	}
	fmt.Fprintf(out, "waiting for the controller's warm-up and the first policy ...\n")
	if err := waitPolicy(ctx, c); err != nil {
		return err
	}

	surgeEnd := o.SurgeStart + o.SurgeLength
	total := surgeEnd + o.After
	webRate := func(t time.Duration) float64 {
		if t >= o.SurgeStart && t < surgeEnd {
			return o.Surge * o.Limit
		}
		return o.Calm
	}
	seconds := int(total/time.Second) + 1
	webRatio, mobileRatio := make([]float64, seconds), make([]float64, seconds)
	g, err := loadgen.New(loadgen.Options{
		Targets:  c.SidecarURLs(),
		Callers:  []loadgen.Caller{{Name: "web", Rate: webRate}, {Name: "mobile", Rate: func(time.Duration) float64 { return o.Calm }}},
		Duration: total,
		SecondEnded: func(s int) {
			webRatio[s], mobileRatio[s] = c.Ratio("web"), c.Ratio("mobile")
		},
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "limits: web %g rps, mobile %g rps. web surges to %g rps from t=%v to t=%v.\n", o.Limit, o.Limit, o.Surge*o.Limit, o.SurgeStart, surgeEnd)
	fmt.Fprintf(out, "each second: requests offered and admitted, and the drop ratio the sidecars hold at its end.\n\n")

	// Lines go out as seconds pass, so the columns have fixed widths.
	const row = "%5s │ %8s %8s %7s │ %8s %8s %7s\n"
	fmt.Fprintf(out, row, "", "web", "", "", "mobile", "", "")
	fmt.Fprintf(out, row, "t", "offered", "admitted", "ratio", "offered", "admitted", "ratio")
	err = g.Run(ctx, func(s int) {
		w, m := g.Second("web", s), g.Second("mobile", s)
		fmt.Fprintf(out, row, fmt.Sprintf("%ds", s),
			fmt.Sprint(w.Sent), fmt.Sprint(w.Admitted), fmt.Sprintf("%.3f", webRatio[s]),
			fmt.Sprint(m.Sent), fmt.Sprint(m.Admitted), fmt.Sprintf("%.3f", mobileRatio[s]))
	})
	if err != nil {
		return err
	}
	summarize(out, g, o, webRatio)
	return nil
}

func adminOf(c *testbed.Cluster) string {
	// The controller's admin port is only known to the testbed node.
	return c.ControllerAdminAddr()
}

func waitPolicy(ctx context.Context, c *testbed.Cluster) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		ready := true
		for _, s := range c.Sidecars {
			if s.Agent.Limiter().Policy("checkout") == nil {
				ready = false
			}
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no policy reached the sidecars: %w", ctx.Err())
		case <-t.C:
		}
	}
}

func summarize(out io.Writer, g *loadgen.Generator, o Options, webRatio []float64) {
	start := int(o.SurgeStart / time.Second)
	end := int((o.SurgeStart + o.SurgeLength) / time.Second)
	total := int((o.SurgeStart + o.SurgeLength + o.After) / time.Second)

	enforced := -1
	for s := start; s < end; s++ {
		if math.Abs(float64(g.Second("web", s).Admitted)-o.Limit) <= 0.05*o.Limit {
			enforced = s - start
			break
		}
	}
	steadyFrom := min(start+5, end)
	steady := g.Sum("web", steadyFrom, end)
	steadyRate := float64(steady.Admitted) / float64(max(end-steadyFrom, 1))
	released := -1
	for s := end; s < total; s++ {
		if webRatio[s] == 0 {
			released = s - end
			break
		}
	}
	mobile := g.Sum("mobile", 0, total)
	web := g.Sum("web", 0, total)

	fmt.Fprintf(out, "\nsummary\n")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  web surge\t%g rps offered against a %g rps limit (%g×)\n", o.Surge*o.Limit, o.Limit, o.Surge)
	if enforced >= 0 {
		fmt.Fprintf(tw, "  time to enforce\t%d s (first second web's admitted rate was within ±5 %% of its limit)\n", enforced)
	} else {
		fmt.Fprintf(tw, "  time to enforce\tnot reached\n")
	}
	fmt.Fprintf(tw, "  web admitted, steady state\t%.1f rps (t=%ds..%ds), %+.1f %% from the limit\n", steadyRate, steadyFrom, end, 100*(steadyRate-o.Limit)/o.Limit)
	if released >= 0 {
		fmt.Fprintf(tw, "  ratio back to 0\t%d s after the surge ended (released at once by the first regular tick that sees it back under its limit)\n", released)
	} else {
		fmt.Fprintf(tw, "  ratio back to 0\tnot within the run\n")
	}
	if end < total {
		first, after := g.Second("web", end), g.Sum("web", end+1, total)
		fmt.Fprintf(tw, "  web back under its limit\t%d of %d dropped in the first second (the fall still travels a report, a flush and a tick), %d of %d after\n",
			first.Dropped, first.Sent, after.Dropped, after.Sent)
	}
	fmt.Fprintf(tw, "  web overall\t%d sent, %d admitted, %d dropped with 429\n", web.Sent, web.Admitted, web.Dropped)
	fmt.Fprintf(tw, "  mobile (under its limit)\t%d sent, %d dropped (%.3f %%)\n", mobile.Sent, mobile.Dropped, 100*float64(mobile.Dropped)/math.Max(float64(mobile.Sent), 1))
	if lost := web.Errors + web.Skipped + mobile.Errors + mobile.Skipped; lost > 0 {
		fmt.Fprintf(tw, "  rig losses\t%d requests failed or were not sent: the machine was too busy; numbers are suspect\n", lost)
	}
	tw.Flush()
}
