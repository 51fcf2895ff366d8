// Command injector is sluice's sidecar-injection admission webhook; see
// `injector --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/webhook"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cli.Versioned(webhook.Command()).ExecuteContext(ctx); err != nil {
		os.Exit(1)
	}
}
