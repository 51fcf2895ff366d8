// Package admin serves a sluice process's operational endpoints on its admin
// port: /metrics, /healthz, /readyz and /debug/pprof/.
package admin

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves the admin endpoints. Safe for concurrent use.
type Handler struct {
	mux      *http.ServeMux
	ready    func() error
	draining atomic.Bool
}

// New returns the admin handler of a process whose metrics are in g. ready
// reports why the process can not take traffic yet (nil when it can); it is
// called on every /readyz request.
func New(g prometheus.Gatherer, ready func() error) *Handler {
	h := &Handler{mux: http.NewServeMux(), ready: ready}
	h.mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorLog: nil}))
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		// Liveness says only that the process serves HTTP: restarting a
		// process because its controller is away would not bring it back.
		fmt.Fprintln(w, "ok")
	})
	h.mux.HandleFunc("GET /readyz", h.readyz)
	h.mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	h.mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	h.mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	h.mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	h.mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return h
}

// Handle adds an endpoint, e.g. a service's debug view.
func (h *Handler) Handle(pattern string, handler http.Handler) { h.mux.Handle(pattern, handler) }

// SetDraining makes /readyz fail from now on: the first step of shutdown, so
// that load balancers stop sending before the listeners close.
func (h *Handler) SetDraining() { h.draining.Store(true) }

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

func (h *Handler) readyz(w http.ResponseWriter, _ *http.Request) {
	if h.draining.Load() {
		http.Error(w, "not ready: shutting down", http.StatusServiceUnavailable)
		return
	}
	if h.ready != nil {
		if err := h.ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	fmt.Fprintln(w, "ready")
}
