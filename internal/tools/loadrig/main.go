// Command loadrig serves internal/loadgen/rig: the end-to-end tests' load
// generator and app, in a process built without the race detector.
//
//	loadrig --listen 127.0.0.1:0
//
// It logs {"msg":"listening","listener":"http","addr":…} as sluice's
// binaries do, and stops on SIGTERM or SIGINT.
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
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve the app and /rig/run on")
	format := flag.String("log-format", "json", "log format; json, the only one, which internal/child reads")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if *format != "json" {
		log.Error("loadrig: --log-format: want json", "got", *format)
		os.Exit(2)
	}
	if err := run(*listen, log); err != nil {
		log.Error("loadrig", "err", err)
		os.Exit(1)
	}
}

func run(addr string, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	log.Info("listening", "listener", "http", "addr", ln.Addr().String())
	srv := &http.Server{Handler: &rig.Server{}, ReadHeaderTimeout: 10 * time.Second}
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
