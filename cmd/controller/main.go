// Command controller is sluice's global controller; see `controller --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/controller"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cli.Versioned(controller.Command()).ExecuteContext(ctx); err != nil {
		os.Exit(1)
	}
}
