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
	"cmp"
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

	// HTTP, when set, serves on HTTPAddr (the sidecar's proxy port), with
	// TLS when its TLSConfig is set.
	HTTP     *http.Server
	HTTPAddr string
	// H2C, when set with a plaintext HTTP, takes the connections of
	// HTTPAddr that open with HTTP/2's preface (h2c with prior knowledge,
	// as gRPC clients speak); HTTP keeps the rest (SplitH2C).
	H2C *grpc.Server

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
	r := &run{p: p, log: p.Logger, timeout: p.ShutdownTimeout, failed: make(chan struct{})}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.timeout <= 0 {
		r.timeout = 10 * time.Second
	}
	// Bind everything first: a port in use is a start-up error, before any
	// worker has done anything.
	lns, err := r.listen()
	if err != nil {
		return err
	}
	r.serve(lns)
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	workers := r.startWorkers(workCtx)

	select {
	case <-ctx.Done():
		r.log.Info("shutting down", "reason", context.Cause(ctx))
	case <-r.failed:
		r.log.Error("shutting down after a failure", "err", r.firstErr) // written before failed closed
	}
	r.stopAccepting()
	// 4: workers.
	cancelWork()
	_ = workers.Wait()
	r.flush(ctx)
	r.closeAdmin()
	r.servers.Wait()
	// Every part that could fail has returned: firstErr is settled.
	return r.firstErr
}

// run is one Run's state.
type run struct {
	p       *Process
	log     *slog.Logger
	timeout time.Duration

	// failed is closed by the first part that fails, to start shutdown;
	// firstErr, written once before, says why.
	failed   chan struct{}
	failOnce sync.Once
	firstErr error

	adminSrv *http.Server
	servers  sync.WaitGroup
	// h2c is set when H2C serves half of the HTTP port; only serve writes
	// it, before any shutdown. (HTTP's TLSConfig can not say afterwards:
	// net/http sets one on a plaintext server that speaks HTTP/2.)
	h2c bool
}

type listener struct {
	name string
	ln   net.Listener
}

func (r *run) fail(part string, err error) {
	r.failOnce.Do(func() {
		r.firstErr = fmt.Errorf("%s: %w", part, err)
		close(r.failed)
	})
}

// listen binds every listener the process has, or none.
func (r *run) listen() ([]listener, error) {
	p := r.p
	var lns []listener
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
			for _, l := range lns {
				l.ln.Close()
			}
			return nil, fmt.Errorf("listen %s on %q: %w", want.name, want.addr, err)
		}
		lns = append(lns, listener{want.name, ln})
		r.log.Info("listening", "listener", want.name, "addr", ln.Addr().String())
		if p.OnListening != nil {
			p.OnListening(want.name, ln.Addr())
		}
	}
	return lns, nil
}

// serve serves each listener on a goroutine that r.servers waits for.
func (r *run) serve(lns []listener) {
	for _, l := range lns {
		var serve func() error
		switch l.name {
		case "admin":
			r.adminSrv = &http.Server{Handler: r.p.Admin, ReadHeaderTimeout: 5 * time.Second}
			serve = func() error { return r.adminSrv.Serve(l.ln) }
		case "grpc":
			serve = func() error { return r.p.GRPC.Serve(l.ln) }
		case "http":
			serve = func() error { return r.p.HTTP.Serve(l.ln) }
			switch {
			case r.p.HTTP.TLSConfig != nil:
				// The certificate comes from TLSConfig (GetCertificate).
				serve = func() error { return r.p.HTTP.ServeTLS(l.ln, "", "") }
			case r.p.H2C != nil:
				r.h2c = true
				split := SplitH2C(l.ln, cmp.Or(r.p.HTTP.ReadHeaderTimeout, 10*time.Second))
				serve = func() error { return r.p.HTTP.Serve(split.HTTP1) }
				r.servers.Add(2)
				go func() {
					defer r.servers.Done()
					split.Wait()
				}()
				go func() {
					defer r.servers.Done()
					if err := r.p.H2C.Serve(split.H2C); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
						r.fail("serve h2c", err)
					}
				}()
			}
		}
		r.servers.Add(1)
		go func() {
			defer r.servers.Done()
			if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
				r.fail("serve "+l.name, err)
			}
		}()
	}
}

// startWorkers runs the workers until ctx ends; the group says when they
// have.
func (r *run) startWorkers(ctx context.Context) *errgroup.Group {
	workers, _ := errgroup.WithContext(ctx)
	for i, w := range r.p.Workers {
		workers.Go(func() error {
			if err := w(ctx); err != nil && !errors.Is(err, context.Canceled) {
				r.fail(fmt.Sprintf("worker %d", i), err)
				return err
			}
			return nil
		})
	}
	return workers
}

// stopAccepting is steps 1–3: not ready, the drain delay (unless something
// already broke), then the drain hooks and the servers' graceful stops.
func (r *run) stopAccepting() {
	p := r.p
	if p.Admin != nil {
		p.Admin.SetDraining()
	}
	if p.DrainDelay > 0 && !isClosed(r.failed) {
		t := time.NewTimer(p.DrainDelay)
		select {
		case <-t.C:
		case <-r.failed:
			t.Stop()
		}
	}
	for _, d := range p.Drain {
		d()
	}
	if p.GRPC != nil {
		stopGRPC(p.GRPC, r.timeout)
	}
	// The two halves of the HTTP port stop together: one after the
	// other, each with its own timeout, could outlast the pod's grace.
	var h2c sync.WaitGroup
	if r.h2c {
		h2c.Go(func() { stopGRPC(p.H2C, r.timeout) })
	}
	if p.HTTP != nil {
		sctx, cancel := context.WithTimeout(context.Background(), r.timeout)
		if err := p.HTTP.Shutdown(sctx); err != nil {
			p.HTTP.Close()
		}
		cancel()
	}
	h2c.Wait()
}

// flush is step 5: what the workers left behind, each hook on a context of
// its own.
func (r *run) flush(ctx context.Context) {
	for _, f := range r.p.Flush {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
		if err := f(fctx); err != nil {
			r.log.Error("flush failed", "err", err)
		}
		cancel()
	}
}

// closeAdmin is step 6: admin last, so /metrics is scrapable until the end.
func (r *run) closeAdmin() {
	if r.adminSrv == nil {
		return
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	if err := r.adminSrv.Shutdown(sctx); err != nil {
		r.adminSrv.Close()
	}
	cancel()
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
