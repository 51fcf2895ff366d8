// Command sidecar is sluice's data-plane sidecar; see `sidecar --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/internal/agent"
	"github.com/sluicehq/sluice/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cli.Versioned(agent.Command()).ExecuteContext(ctx); err != nil {
		os.Exit(1)
	}
}
