package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// testTimeout bounds every wait in these tests; none of them needs more than milliseconds.
const testTimeout = 10 * time.Second

// serve runs srv on a fresh loopback port until the test ends and returns the address.
func serve(t testing.TB, srv *http.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// startProxy runs a Proxy to upstream (host:port) behind NewServer and returns its address.
func startProxy(t testing.TB, upstream string, opts Options) string {
	t.Helper()
	p, err := New(&url.URL{Scheme: "http", Host: upstream}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close) // runs after the server's cleanup: cleanups run last-in, first-out
	return serve(t, NewServer("", p))
}

// deadAddr returns a loopback address nothing listens on: connections to it are refused.
func deadAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func newHTTPClient(t testing.TB) *http.Client {
	t.Helper()
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// wait fails the test if ch is not closed (or sent on) within testTimeout.
func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(testTimeout):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestNewValidates(t *testing.T) {
	tests := []struct {
		name     string
		upstream string
		opts     Options
		wantErr  []string // substrings of the error; none means no error
	}{
		{name: "plain", upstream: "http://127.0.0.1:8080"},
		{name: "trailing slash", upstream: "http://localhost:8080/"},
		{name: "no port", upstream: "http://app"},
		{name: "https", upstream: "https://127.0.0.1:8443", wantErr: []string{"scheme must be http"}},
		{name: "no host", upstream: "http:///x", wantErr: []string{"host missing", `path "/x"`}},
		{name: "path", upstream: "http://127.0.0.1:8080/api", wantErr: []string{`path "/api"`}},
		{name: "query", upstream: "http://127.0.0.1:8080?a=1", wantErr: []string{"query"}},
		{name: "user", upstream: "http://u:p@127.0.0.1:8080", wantErr: []string{"user info"}},
		{
			name:     "negative options, all reported",
			upstream: "http://127.0.0.1:8080",
			opts:     Options{DialTimeout: -1, ResponseHeaderTimeout: -1, IdleConnTimeout: -1, MaxIdleConnsPerHost: -1, ErrorLogInterval: -1},
			wantErr:  []string{"DialTimeout", "ResponseHeaderTimeout", "IdleConnTimeout", "MaxIdleConnsPerHost", "ErrorLogInterval"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := url.Parse(tt.upstream)
			if err != nil {
				t.Fatal(err)
			}
			p, err := New(u, tt.opts)
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				p.Close()
				return
			}
			if err == nil {
				t.Fatal("New: no error")
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("New error %q does not mention %q", err, want)
				}
			}
		})
	}
	if _, err := New(nil, Options{}); err == nil {
		t.Error("New(nil): no error")
	}
}

// echoApp answers with what it received, in headers and body, and tries to leak a hop-by-hop
// header and sends a trailer.
func echoApp(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("X-Method", r.Method)
	h.Set("X-Path", r.URL.Path)
	h.Set("X-Query", r.URL.RawQuery)
	h.Set("X-Proto", r.Proto)
	h.Set("X-Host", r.Host)
	h.Set("X-Got-Custom", r.Header.Get("X-Custom"))
	h.Set("X-Got-Hop", r.Header.Get("X-Hop"))
	h.Set("X-Got-Forwarded-For", r.Header.Get("X-Forwarded-For"))
	h.Set("X-Got-Forwarded-Proto", r.Header.Get("X-Forwarded-Proto"))
	h.Set("Connection", "X-Resp-Hop")
	h.Set("X-Resp-Hop", "leaked")
	h.Set("Trailer", "X-Checksum")
	status := http.StatusOK
	if r.Method == http.MethodPost {
		status = http.StatusCreated
	}
	w.WriteHeader(status)
	w.Write(body)
	h.Set("X-Checksum", "sum-"+r.Method)
}

func TestHTTP1(t *testing.T) {
	app := serve(t, &http.Server{Handler: http.HandlerFunc(echoApp)})
	proxy := startProxy(t, app, Options{})
	client := newHTTPClient(t)

	do := func(t *testing.T, addr, method, pathQuery, body string) (*http.Response, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+pathQuery, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = "orders.example"
		req.Header.Set("X-Custom", "kept")
		req.Header.Set("X-Forwarded-For", "10.1.2.3")
		req.Header.Set("Connection", "X-Hop")
		req.Header.Set("X-Hop", "secret")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, string(got)
	}

	// The app really does send the hop-by-hop header, so its absence below is the proxy's doing.
	if resp, _ := do(t, app, http.MethodGet, "/", ""); resp.Header.Get("X-Resp-Hop") == "" {
		t.Fatal("direct: app did not send X-Resp-Hop; the hop-by-hop check below would prove nothing")
	}

	tests := []struct {
		method, pathQuery, body string
		wantStatus              int
	}{
		{http.MethodGet, "/orders/42?a=1&b=two%20words&c=%2F", "", http.StatusOK},
		{http.MethodPost, "/orders?dry_run=true", `{"item":"tea"}`, http.StatusCreated},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			resp, body := do(t, proxy, tt.method, tt.pathQuery, tt.body)
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if body != tt.body {
				t.Errorf("body %q, want %q", body, tt.body)
			}
			path, query, _ := strings.Cut(tt.pathQuery, "?")
			want := map[string]string{
				"X-Method":              tt.method,
				"X-Path":                path,
				"X-Query":               query,
				"X-Proto":               "HTTP/1.1",
				"X-Host":                "orders.example",
				"X-Got-Custom":          "kept",
				"X-Got-Hop":             "",
				"X-Got-Forwarded-For":   "10.1.2.3, 127.0.0.1",
				"X-Got-Forwarded-Proto": "http",
				"X-Resp-Hop":            "",
			}
			for k, v := range want {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			if got, want := resp.Trailer.Get("X-Checksum"), "sum-"+tt.method; got != want {
				t.Errorf("trailer X-Checksum = %q, want %q", got, want)
			}
		})
	}
}

// TestHTTP1Streams checks that a chunk the app flushes reaches the client while the app is
// still writing: the proxy does not buffer responses.
func TestHTTP1Streams(t *testing.T) {
	release := make(chan struct{})
	app := serve(t, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "second\n")
	})})
	proxy := startProxy(t, app, Options{})

	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+proxy+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := newHTTPClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	// The app blocks until release, so this read returns only if "first" was not held back.
	if line, err := br.ReadString('\n'); err != nil || line != "first\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(release)
	if rest, err := io.ReadAll(br); err != nil || string(rest) != "second\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}
}

func TestHTTP1CancelPropagates(t *testing.T) {
	started := make(chan struct{})
	appSawCancel := make(chan struct{})
	app := serve(t, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		select {
		case <-r.Context().Done():
			close(appSawCancel)
		case <-time.After(testTimeout):
		}
	})})
	proxy := startProxy(t, app, Options{})

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+proxy+"/slow", nil)
	if err != nil {
		t.Fatal(err)
	}
	client := newHTTPClient(t)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("request returned %s, want a cancellation error", resp.Status)
		}
	})
	wait(t, started, "the app to get the request")
	cancel()
	wait(t, appSawCancel, "the app's request context to be cancelled")
}

func TestHTTP1UpstreamDown(t *testing.T) {
	logs := &recordHandler{}
	proxy := startProxy(t, deadAddr(t), Options{Logger: slog.New(logs), ErrorLogInterval: time.Hour})
	client := newHTTPClient(t)
	for range 3 {
		ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+proxy+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusBadGateway || string(body) != "upstream unavailable\n" {
			t.Errorf("got %d %q, want 502 %q", resp.StatusCode, body, "upstream unavailable\n")
		}
	}
	// Three failures inside one ErrorLogInterval: one line, not one per request.
	if got := logs.messages(); len(got) != 1 || got[0] != "upstream request failed" {
		t.Errorf("log lines %q, want exactly one upstream failure", got)
	}
}

// recordHandler is a slog.Handler that keeps the messages it is given.
type recordHandler struct {
	mu   sync.Mutex // guards msgs
	msgs []string
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}

func (h *recordHandler) messages() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.msgs...)
}

// TestHandleError covers every answer the proxy makes up when the app gave none.
func TestHandleError(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel()
	upstreamErr := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")

	tests := []struct {
		name        string
		ctx         context.Context
		contentType string
		wantCode    int
		wantGRPC    string // grpc-status; empty for a plain HTTP answer
	}{
		{"http upstream down", context.Background(), "", http.StatusBadGateway, ""},
		{"http cancelled", canceled, "text/plain", StatusClientClosedRequest, ""},
		{"http deadline", expired, "", http.StatusGatewayTimeout, ""},
		{"grpc upstream down", context.Background(), "application/grpc", http.StatusOK, "14"},
		{"grpc+proto upstream down", context.Background(), "application/grpc+proto", http.StatusOK, "14"},
		{"grpc cancelled", canceled, "application/grpc", http.StatusOK, "1"},
		{"grpc deadline", expired, "application/grpc", http.StatusOK, "4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(&url.URL{Scheme: "http", Host: "127.0.0.1:1"}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequestWithContext(tt.ctx, http.MethodPost, "/x", nil)
			if tt.contentType != "" {
				r.Header.Set("Content-Type", tt.contentType)
			}
			w := httptest.NewRecorder()
			p.handleError(w, r, upstreamErr)
			if w.Code != tt.wantCode || w.Header().Get("Grpc-Status") != tt.wantGRPC {
				t.Errorf("got %d grpc-status %q, want %d %q", w.Code, w.Header().Get("Grpc-Status"), tt.wantCode, tt.wantGRPC)
			}
			if tt.wantGRPC != "" && (w.Header().Get("Content-Type") != "application/grpc" || w.Body.Len() != 0) {
				t.Errorf("gRPC answer has content type %q and %d body bytes; want application/grpc, none",
					w.Header().Get("Content-Type"), w.Body.Len())
			}
			// Only a failure of the app counts as one; the caller's own cancellation does not.
			wantFailures := int64(0)
			if tt.ctx.Err() == nil {
				wantFailures = 1
			}
			if got := p.failures.Load(); got != wantFailures {
				t.Errorf("failures %d, want %d", got, wantFailures)
			}
		})
	}
}
