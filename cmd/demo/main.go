// Command demo runs the whole sluice loop on loopback and narrates a surge;
// see `demo --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/demo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cli.Versioned(demo.Command()).ExecuteContext(ctx); err != nil {
		os.Exit(1)
	}
}
