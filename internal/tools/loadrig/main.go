// Command loadrig serves internal/loadgen/rig: the end-to-end tests' load
// generator and app, in a process built without the race detector.
//
//	loadrig --listen 127.0.0.1:0
//
// It logs {"msg":"listening","listener":"http","addr":…} as sluice's
// binaries do, and stops on SIGTERM or SIGINT. With --knee-workers its app
// is a knee: latency that rises with load past workers/service.
package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/internal/loadgen/rig"
	"github.com/sluicehq/sluice/internal/testkit/knee"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve the app and /rig/run on")
	format := flag.String("log-format", "json", "log format; json, the only one, which internal/child reads")
	var kc knee.Config
	flag.IntVar(&kc.Workers, "knee-workers", 0, "serve a knee (internal/testkit/knee) with this many workers instead of answering at once")
	flag.DurationVar(&kc.Service, "knee-service", 20*time.Millisecond, "the knee's service time")
	flag.IntVar(&kc.Queue, "knee-queue", 0, "the knee's queue")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if *format != "json" {
		log.Error("loadrig: --log-format: want json", "got", *format)
		os.Exit(2)
	}
	srv := &rig.Server{}
	if kc.Workers > 0 {
		app, err := knee.New(kc)
		if err != nil {
			log.Error("loadrig", "err", err)
			os.Exit(2)
		}
		srv.App = app
	}
	if err := run(*listen, srv, log); err != nil {
		log.Error("loadrig", "err", err)
		os.Exit(1)
	}
}

func run(addr string, app *rig.Server, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	log.Info("listening", "listener", "http", "addr", ln.Addr().String())
	srv := &http.Server{Handler: app, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shut); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
