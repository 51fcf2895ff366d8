// Command aggregator is a sluice zone aggregator; see `aggregator --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/internal/aggregator"
	"github.com/sluicehq/sluice/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cli.Versioned(aggregator.Command()).ExecuteContext(ctx); err != nil {
		os.Exit(1)
	}
}
