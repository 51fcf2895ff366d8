package proxy

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// gRPC status codes the proxy itself produces (google.golang.org/grpc/codes). They are
// spelled out so that the proxy needs only the standard library.
const (
	grpcCanceled         = 1
	grpcDeadlineExceeded = 4
	grpcUnavailable      = 14
)

// grpcUnavailableMessage is the grpc-message of every UNAVAILABLE the proxy writes. It must
// stay printable ASCII without '%', so that it needs no percent-encoding.
const grpcUnavailableMessage = "sluice: upstream unavailable"

// isGRPC reports whether contentType is gRPC's: application/grpc, with or without a
// +codec suffix or parameters (grpc-web included, which reads a trailers-only status alike).
func isGRPC(contentType string) bool {
	return strings.HasPrefix(contentType, "application/grpc")
}

// writeGRPCStatus answers with a gRPC error in the trailers-only form: HTTP 200 and the status
// in the headers, no body. httputil.ReverseProxy's default would be a bare HTTP 502, which a
// gRPC client can only report as "unexpected HTTP status code", and other clients (or
// proxies in between) may not map to UNAVAILABLE at all.
func writeGRPCStatus(w http.ResponseWriter, code int, msg string) {
	h := w.Header()
	h.Del("Content-Length")
	h.Set("Content-Type", "application/grpc")
	h.Set("Grpc-Status", strconv.Itoa(code))
	h.Set("Grpc-Message", msg)
	// With no body written, the HTTP/2 server sends these headers with END_STREAM: a
	// trailers-only response.
	w.WriteHeader(http.StatusOK)
}

// guardGRPCStream wraps the body of a gRPC response so that an app that fails in the middle of
// the stream (it crashed, or its connection broke) ends the call with UNAVAILABLE in the
// trailers. Without it, ReverseProxy aborts the handler and the HTTP/2 server resets the stream
// with INTERNAL_ERROR, which gRPC clients report as INTERNAL: a bug, not a retryable outage.
//
// It also diverts trailers-only responses (see trailersOnly).
func (p *Proxy) guardGRPCStream(res *http.Response) error {
	if !isGRPC(res.Header.Get("Content-Type")) {
		return nil
	}
	if _, ok := res.Header["Grpc-Status"]; ok {
		return &trailersOnly{res: res}
	}
	if res.Body == nil || res.Body == http.NoBody {
		return nil
	}
	res.Body = &grpcBody{ReadCloser: res.Body, res: res, ctx: res.Request.Context(), p: p}
	return nil
}

// grpcBody is a gRPC response body that turns a read error into a clean end of stream with
// grpc-status UNAVAILABLE in the response's trailers, which ReverseProxy then forwards.
type grpcBody struct {
	io.ReadCloser
	res *http.Response
	ctx context.Context // the forwarded request's
	p   *Proxy
}

func (b *grpcBody) Read(buf []byte) (int, error) {
	n, err := b.ReadCloser.Read(buf)
	if err == nil || err == io.EOF {
		return n, err
	}
	if b.ctx.Err() != nil {
		// The caller cancelled, or its deadline passed: its stream is gone already, and the
		// abort that follows this error is right.
		return n, err
	}
	b.p.noteUpstreamError(err)
	// The Transport writes res.Trailer only when the stream ends cleanly, which it did not;
	// this goroutine is the only writer now.
	if b.res.Trailer == nil {
		b.res.Trailer = make(http.Header, 2)
	}
	b.res.Trailer.Set("Grpc-Status", strconv.Itoa(grpcUnavailable))
	b.res.Trailer.Set("Grpc-Message", grpcUnavailableMessage)
	return n, io.EOF
}

// trailersOnly carries a trailers-only gRPC response (the status in the headers, no body: how
// a gRPC server answers most errors) from ModifyResponse to the error handler, which writes
// it. ReverseProxy itself would flush the headers before copying the empty body (it does with
// FlushInterval -1), and the HTTP/2 server would then send them without END_STREAM followed by
// an empty DATA frame: the client takes them for response headers and fails the call with
// INTERNAL "server closed the stream without sending trailers", losing the app's status.
type trailersOnly struct{ res *http.Response }

func (*trailersOnly) Error() string { return "trailers-only gRPC response" }

// write sends the response as it came: headers only, so that the HTTP/2 server ends the stream
// with them.
func (t *trailersOnly) write(w http.ResponseWriter) {
	h := w.Header()
	for k, vv := range t.res.Header {
		h[k] = append(h[k], vv...)
	}
	w.WriteHeader(t.res.StatusCode)
}
