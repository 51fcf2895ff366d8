// Command configurator is sluice's operator CLI for limits: derive them from
// history, review, approve, audit, backtest; see `configurator --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/configurator"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cli.Versioned(configurator.Command()).ExecuteContext(ctx); err != nil {
		os.Exit(1)
	}
}
