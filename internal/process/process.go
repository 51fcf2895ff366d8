// Package process runs a sluice server process: its listeners, its workers,
// and the shutdown order every binary shares.
//
// Shutdown, once the context is cancelled (SIGTERM) or a part fails:
//
//  1. not ready: /readyz answers 503, so load balancers stop sending;
//  2. drain delay: keep serving while they notice;
//  3. stop accepting: Drain hooks end long-lived streams politely (clients
//     reconnect elsewhere), then gRPC GracefulStop, then Stop at the deadline;
//     HTTP servers Shutdown, then Close;
//  4. cancel the workers and wait for them;
//  5. Flush hooks, on a context of their own with its own timeout;
//  6. close the admin server.
package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/admin"
)

// Process describes one server process. Fields are read by Run only.
type Process struct {
	Logger *slog.Logger

	// Admin serves /metrics, /healthz, /readyz on AdminAddr.
	Admin     *admin.Handler
	AdminAddr string

	// GRPC, when set, serves on GRPCAddr.
	GRPC     *grpc.Server
	GRPCAddr string

	// HTTP, when set, serves on HTTPAddr (the sidecar's proxy port).
	HTTP     *http.Server
	HTTPAddr string

	// Workers run from start to step 4; an error from one stops the process.
	Workers []func(ctx context.Context) error
	// Drain hooks run at step 3, before GracefulStop.
	Drain []func()
	// Flush hooks run at step 5.
	Flush []func(ctx context.Context) error

	DrainDelay      time.Duration // step 2
	ShutdownTimeout time.Duration // bound of steps 3 and 5 each; default 10s

	// OnListening, when set, is told each bound address ("admin", "grpc",
	// "http"), so that tests and the demo can listen on port 0.
	OnListening func(name string, addr net.Addr)
}

// Run listens, serves, and shuts down in order when ctx is cancelled. It
// returns nil after a clean shutdown and the first failure otherwise.
func (p *Process) Run(ctx context.Context) error {
	log := p.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timeout := p.ShutdownTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}

	// Bind everything first: a port in use is a start-up error, before any
	// worker has done anything.
	type listener struct {
		name string
		ln   net.Listener
	}
	var lns []listener
	closeAll := func() {
		for _, l := range lns {
			l.ln.Close()
		}
	}
	for _, want := range []struct {
		name, addr string
		on         bool
	}{
		{"admin", p.AdminAddr, p.Admin != nil},
		{"grpc", p.GRPCAddr, p.GRPC != nil},
		{"http", p.HTTPAddr, p.HTTP != nil},
	} {
		if !want.on {
			continue
		}
		ln, err := net.Listen("tcp", want.addr)
		if err != nil {
			closeAll()
			return fmt.Errorf("listen %s on %q: %w", want.name, want.addr, err)
		}
		lns = append(lns, listener{want.name, ln})
		log.Info("listening", "listener", want.name, "addr", ln.Addr().String())
		if p.OnListening != nil {
			p.OnListening(want.name, ln.Addr())
		}
	}

	// failed is closed by the first part that fails, to start shutdown.
	failed := make(chan struct{})
	var failOnce sync.Once
	var firstErr error
	fail := func(part string, err error) {
		failOnce.Do(func() {
			firstErr = fmt.Errorf("%s: %w", part, err)
			close(failed)
		})
	}

	var adminSrv *http.Server
	var servers sync.WaitGroup
	for _, l := range lns {
		var serve func() error
		switch l.name {
		case "admin":
			adminSrv = &http.Server{Handler: p.Admin, ReadHeaderTimeout: 5 * time.Second}
			serve = func() error { return adminSrv.Serve(l.ln) }
		case "grpc":
			serve = func() error { return p.GRPC.Serve(l.ln) }
		case "http":
			serve = func() error { return p.HTTP.Serve(l.ln) }
		}
		servers.Add(1)
		go func() {
			defer servers.Done()
			if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
				fail("serve "+l.name, err)
			}
		}()
	}

	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	workers, _ := errgroup.WithContext(workCtx)
	for i, w := range p.Workers {
		workers.Go(func() error {
			if err := w(workCtx); err != nil && !errors.Is(err, context.Canceled) {
				fail(fmt.Sprintf("worker %d", i), err)
				return err
			}
			return nil
		})
	}

	select {
	case <-ctx.Done():
		log.Info("shutting down", "reason", context.Cause(ctx))
	case <-failed:
		log.Error("shutting down after a failure", "err", firstErr) // written before failed closed
	}

	// 1–2: not ready, then give balancers time to notice, unless something
	// already broke.
	if p.Admin != nil {
		p.Admin.SetDraining()
	}
	if p.DrainDelay > 0 && !isClosed(failed) {
		t := time.NewTimer(p.DrainDelay)
		select {
		case <-t.C:
		case <-failed:
			t.Stop()
		}
	}

	// 3: stop accepting.
	for _, d := range p.Drain {
		d()
	}
	if p.GRPC != nil {
		stopGRPC(p.GRPC, timeout)
	}
	if p.HTTP != nil {
		sctx, cancel := context.WithTimeout(context.Background(), timeout)
		if err := p.HTTP.Shutdown(sctx); err != nil {
			p.HTTP.Close()
		}
		cancel()
	}

	// 4: workers.
	cancelWork()
	_ = workers.Wait()

	// 5: flush what the workers left behind.
	for _, f := range p.Flush {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		if err := f(fctx); err != nil {
			log.Error("flush failed", "err", err)
		}
		cancel()
	}

	// 6: admin last, so /metrics is scrapable until the end.
	if adminSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := adminSrv.Shutdown(sctx); err != nil {
			adminSrv.Close()
		}
		cancel()
	}
	servers.Wait()
	// Every part that could fail has returned: firstErr is settled.
	return firstErr
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// stopGRPC stops gracefully, and forcibly once timeout has passed.
func stopGRPC(s *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.Stop()
		<-done
	}
}
