// Command aggregator is a sluice zone aggregator; see `aggregator --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/internal/aggregator"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := aggregator.Command().ExecuteContext(ctx); err != nil {
		os.Exit(1)
	}
}
