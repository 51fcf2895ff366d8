package proxy

import (
	"crypto/tls"
	"net/http"
	"time"
)

const (
	// readHeaderTimeout bounds how long a connection may take to send request headers, against
	// clients that open connections and stall (slowloris).
	readHeaderTimeout = 10 * time.Second

	// idleTimeout closes client connections with no request in flight. gRPC clients redial
	// transparently, but a redial costs a round trip, so it is generous.
	idleTimeout = 5 * time.Minute

	// maxConcurrentStreams per HTTP/2 connection. Go's default (at least 100) is lower than
	// grpc-go's (unlimited): a caller multiplexing many long-lived streams (watches) on one
	// connection would have its new calls queued behind them.
	maxConcurrentStreams = 1000
)

// NewServer returns a server for h that speaks HTTP/1.1 and h2c (cleartext HTTP/2 with prior
// knowledge, as gRPC clients use) on one plaintext port.
//
// It has no ReadTimeout or WriteTimeout: they would cut long-lived gRPC streams and slow
// downloads. Only the headers are bounded. The caller sets ErrorLog (for instance with
// slog.NewLogLogger); nil means the standard library's log package.
func NewServer(addr string, h http.Handler) *http.Server {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		Protocols:         &protos,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: maxConcurrentStreams},
	}
}

// NewTLSServer returns a server for h that speaks HTTP/1.1 and HTTP/2 over
// TLS on one port, chosen by ALPN (h2c does not apply over TLS; gRPC
// clients offer h2). cfg decides the rest: the sidecar's requires and
// verifies a client certificate, TLS 1.3 only. The TLS handshake is bounded
// by the same timeout as the headers.
func NewTLSServer(addr string, h http.Handler, cfg *tls.Config) *http.Server {
	srv := NewServer(addr, h)
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(true)
	srv.Protocols = &protos
	srv.TLSConfig = cfg
	return srv
}
