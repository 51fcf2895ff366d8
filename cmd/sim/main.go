// Command sim is sluice's traffic-surge simulator; see `sim --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/internal/cli"
	"github.com/sluicehq/sluice/sim"
	"github.com/sluicehq/sluice/sim/live"
	"github.com/sluicehq/sluice/sim/scale"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := cli.Versioned(sim.Command()) // `sim run`: deterministic mode
	// The other modes plug in here, each as its package's Command().
	root.AddCommand(live.Command())  // `sim live`: the real binaries on loopback
	root.AddCommand(scale.Command()) // `sim scale`: counted traffic at fleet scale
	if err := root.ExecuteContext(ctx); err != nil {
		os.Exit(1)
	}
}
