package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/encoding/gzip" // callers may compress; the forwarder must read what they send
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// The gRPC forwarder carries gRPC calls from the sidecar's port to the app on grpc-go's own
// transport, on both legs, without decoding a message: each is handed on as the bytes it
// arrived as.
//
// Why it exists: through net/http's HTTP/2 server and Transport (ReverseProxy), a unary call
// costs the sidecar about three times an HTTP/1.1 request, in writes and wake-ups that no
// setting removes (docs/benchmarks.md, "What the sidecar proxy costs": HEADERS, DATA and
// END_STREAM each flushed on their own toward the app, headers, data and trailers toward the
// caller). grpc-go's transport writes a call's frames together, as its own clients and
// servers do, and with fixed flow-control windows on the forwarder's two legs neither sends
// bandwidth-estimation pings.
//
// What a caller sees is what the HTTP path gives it: the app's headers, messages, trailers
// and status, the status's details included; a trailers-only answer stays trailers-only; the
// deadline travels on (grpc-timeout); the :authority the caller asked for reaches the app;
// x-forwarded-for gets the caller's address appended, and x-forwarded-proto and
// x-forwarded-host are set, as ReverseProxy sets them. What differs: the app sees grpc-go's
// user-agent, not the caller's (grpc-go sets the header itself); a caller's gzip-compressed
// messages reach the app uncompressed (grpc-go decompresses on the way in), and other
// encodings are refused UNIMPLEMENTED; headers the app sends before its first message reach
// the caller with that message (or its status), not before.

// rawCodec hands messages on as the bytes they arrived as. Its name is "proto" so that a
// call without a content-subtype (application/grpc) reaches the app as one it accepts
// (application/grpc+proto) when grpc-go names the codec in the content-type.
type rawCodec struct{}

// frame is one message in flight through the forwarder.
type frame struct{ data mem.BufferSlice }

func (rawCodec) Name() string { return "proto" }

// Marshal hands grpc-go the frame's buffers; grpc-go frees them once written, which ends the
// reference Unmarshal took.
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, status.Errorf(codes.Internal, "sluice: forwarder codec given %T", v)
	}
	out := f.data
	f.data = nil
	return out, nil
}

// Unmarshal keeps the message's buffers past the call (grpc-go frees its reference when
// Unmarshal returns).
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return status.Errorf(codes.Internal, "sluice: forwarder codec given %T", v)
	}
	data.Ref()
	f.data = data
	return nil
}

// free drops a frame that will not be sent.
func (f *frame) free() {
	if f.data != nil {
		f.data.Free()
		f.data = nil
	}
}

// forwardDesc describes every forwarded call: the forwarder does not know a method's shape,
// and a stream open both ways carries any of them.
var forwardDesc = grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// forwardWindow is the fixed HTTP/2 flow-control window of the forwarder's streams and
// connections, on both legs. A fixed window turns off grpc-go's bandwidth estimation and the
// PING it sends with small messages. It is also what a caller can make the forwarder hold
// unread per stream (grpc-go refills a window as data arrives, not as it is read): 1 MiB,
// as net/http's HTTP/2 server buffers per connection, is far above loopback's
// bandwidth-delay product.
const forwardWindow = 1 << 20

// maxHeaderList bounds the metadata of a call either way (grpc-go's default is 16 MiB), as
// net/http's server bounds a request's headers (1 MiB).
const maxHeaderList = 1 << 20

// appConns is how many connections the forwarder spreads calls over, round robin. One would
// cap every call in flight at the app's SETTINGS_MAX_CONCURRENT_STREAMS (250 for Go's HTTP/2
// server, 100 for many others), with calls past it waiting for a stream; net/http's
// Transport opens another connection instead.
const appConns = 4

// GRPCForwarder is the gRPC server of the sidecar's h2c connections: every call, of any
// service, goes through the interceptor it was made with (the limiter's decision: see
// sidecar.ServiceLimiter.StreamServerInterceptor) and then to the app, within the Proxy's
// bounds (MaxRequests; MaxConns bounds the appConns connections it keeps to the app).
type GRPCForwarder struct {
	// Server serves the h2c half of the sidecar's port (SplitH2C); GracefulStop or Stop it
	// on shutdown, then Close the forwarder.
	Server *grpc.Server

	p    *Proxy
	app  [appConns]*grpc.ClientConn
	next atomic.Uint32 // the connection of the next call, mod appConns
}

// NewGRPCForwarder returns p's gRPC forwarder; intercept, when not nil, sees every call
// first.
func (p *Proxy) NewGRPCForwarder(intercept grpc.StreamServerInterceptor) (*GRPCForwarder, error) {
	host := strings.TrimPrefix(p.upstream, "http://")
	d := &net.Dialer{Timeout: p.dialTimeout, KeepAlive: 30 * time.Second}
	dial := p.bounds.dialer(d.DialContext)
	f := &GRPCForwarder{p: p}
	for i := range f.app {
		conn, err := p.dialApp(host, dial)
		if err != nil {
			f.Close()
			return nil, err
		}
		f.app[i] = conn
	}
	opts := []grpc.ServerOption{
		grpc.UnknownServiceHandler(f.forward),
		grpc.ForceServerCodecV2(rawCodec{}),
		// Each message is held whole on its way: bounded, or one caller could make the
		// sidecar hold gigabytes (grpc-go would take up to 2 GiB).
		grpc.MaxRecvMsgSize(p.grpcMaxMessage),
		grpc.MaxSendMsgSize(p.grpcMaxMessage),
		grpc.MaxHeaderListSize(maxHeaderList),
		grpc.MaxConcurrentStreams(maxConcurrentStreams),
		grpc.InitialWindowSize(forwardWindow),
		grpc.InitialConnWindowSize(forwardWindow),
		grpc.ConnectionTimeout(readHeaderTimeout),
		// As lenient with keepalive pings as net/http's server, which answers any: grpc-go's
		// default (one per 5 minutes) would close the connection of a caller that pings
		// every 10 seconds, a common client setting.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idleTimeout}),
	}
	if intercept != nil {
		opts = append(opts, grpc.StreamInterceptor(intercept))
	}
	f.Server = grpc.NewServer(opts...)
	return f, nil
}

// dialApp makes one of the forwarder's (lazy) connections to the app at host.
func (p *Proxy) dialApp(host string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+host,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return dial(ctx, "tcp", addr) }),
		// HTTP_PROXY from the environment must never apply to the local app.
		grpc.WithNoProxy(),
		// The app restarts in place: redial it within a second, as the HTTP path dials per
		// request, not after grpc-go's default backoff of up to two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: p.dialTimeout,
		}),
		grpc.WithInitialWindowSize(forwardWindow),
		grpc.WithInitialConnWindowSize(forwardWindow),
		grpc.WithMaxHeaderListSize(maxHeaderList),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{}), grpc.MaxCallRecvMsgSize(p.grpcMaxMessage), grpc.MaxCallSendMsgSize(p.grpcMaxMessage)),
	)
}

// Close closes the connections to the app; calls still in flight fail. Call it once Server
// has stopped.
func (f *GRPCForwarder) Close() error {
	var errs []error
	for _, c := range f.app {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// forward carries one call to the app and its answer back. It returns once the answer is
// complete; the goroutine that carries the caller's messages ends when the call does (the
// handler's return ends the call, and its RecvMsg then returns).
func (f *GRPCForwarder) forward(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return status.Error(codes.Internal, "sluice: a call without a method")
	}
	if !f.p.bounds.admit() {
		ss.SetTrailer(overloaded)
		return status.Error(codes.Unavailable, msgMaxRequests)
	}
	defer f.p.bounds.done()
	in := ss.Context()
	md, _ := metadata.FromIncomingContext(in)
	out, authority, subtype := outgoing(md, in)
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(in, out))
	defer cancel()
	opts := make([]grpc.CallOption, 0, 2)
	if authority != "" {
		opts = append(opts, grpc.CallAuthority(authority))
	}
	if subtype != "" {
		opts = append(opts, grpc.CallContentSubtype(subtype))
	}
	app := f.app[f.next.Add(1)%appConns]
	cs, err := app.NewStream(ctx, &forwardDesc, method, opts...)
	if err != nil {
		// No stream: the app was not reached.
		return f.unreached(in, err)
	}
	go f.upload(ss, cs, cancel)
	for first := true; ; first = false {
		var m frame
		err := cs.RecvMsg(&m)
		if first {
			// The app's headers go with its first message, or alone before its status;
			// an answer without them (trailers-only) stays without.
			if h, herr := cs.Header(); herr == nil && len(h) > 0 {
				_ = ss.SetHeader(h) // fails only once headers are sent, and none are yet
			}
		}
		if err != nil {
			ss.SetTrailer(cs.Trailer())
			if errors.Is(err, io.EOF) {
				return nil
			}
			return f.upstreamErr(in, err)
		}
		if err := ss.SendMsg(&m); err != nil {
			m.free()
			return err // the caller went away; cancel ends the app's side
		}
	}
}

// upload carries the caller's messages to the app, then half-closes the app's side. A caller
// that fails (it reset the stream) cancels the app's side too.
func (f *GRPCForwarder) upload(ss grpc.ServerStream, cs grpc.ClientStream, cancel context.CancelFunc) {
	for {
		var m frame
		err := ss.RecvMsg(&m)
		if errors.Is(err, io.EOF) {
			_ = cs.CloseSend() // an error here ends the app's side, which forward reports
			return
		}
		if err != nil {
			cancel()
			return
		}
		if err := cs.SendMsg(&m); err != nil {
			// The app ended the call (its status comes through RecvMsg) or the call was
			// cancelled: nothing more to carry. grpc-go frees what it was given either way.
			return
		}
	}
}

// upstreamErr is the status a caller gets for a call the app did not complete: CANCELLED or
// DEADLINE_EXCEEDED when the caller went away or ran out of time first, else the status the
// app's leg ended with, the app's own when it answered one.
func (f *GRPCForwarder) upstreamErr(in context.Context, err error) error {
	switch in.Err() {
	case context.Canceled:
		return status.Error(codes.Canceled, "sluice: request cancelled")
	case context.DeadlineExceeded:
		return status.Error(codes.DeadlineExceeded, "sluice: deadline exceeded before upstream answered")
	}
	return err
}

// unreached is the status of a call that could not be opened to the app: UNAVAILABLE, counted
// and logged as the HTTP path's failures are (once per ErrorLogInterval), unless the caller
// went away or ran out of time first.
func (f *GRPCForwarder) unreached(in context.Context, err error) error {
	if in.Err() != nil {
		return f.upstreamErr(in, err)
	}
	if errors.Is(err, errMaxConns) || strings.Contains(err.Error(), errMaxConns.Error()) {
		// grpc-go reports a dial error as text in an UNAVAILABLE status.
		f.p.bounds.refusedMaxConns.Inc()
		return status.Error(codes.Unavailable, msgMaxConns)
	}
	f.p.noteUpstreamError(err)
	return status.Error(codes.Unavailable, grpcUnavailableMessage)
}

// overloaded marks a call the forwarder refused at its bound, as the HTTP path's 503 is marked
// (see refuse): an Envoy in front does not retry it.
var overloaded = metadata.Pairs("x-envoy-overloaded", "true")

// outgoing is the metadata the app gets for a call that came with md: md without the keys
// grpc-go sets itself, with x-forwarded-* as ReverseProxy sets them; and the call's :authority
// and content-subtype, for the app's leg.
func outgoing(md metadata.MD, ctx context.Context) (out metadata.MD, authority, subtype string) {
	out = make(metadata.MD, len(md)+3)
	for k, v := range md {
		switch k {
		case ":authority":
			if len(v) > 0 {
				authority = v[0]
			}
			continue
		case "content-type":
			if len(v) > 0 {
				subtype = contentSubtype(v[0])
			}
			continue
		case "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host":
			continue
		case "grpc-accept-encoding":
			// The app's answer is decoded on the forwarder's leg, which
			// offers its own encodings: the caller's could name one the
			// leg can not read (the caller then reads the leg's encoding).
			continue
		}
		out[k] = v
	}
	xff := md["x-forwarded-for"]
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		if ap, err := netip.ParseAddrPort(p.Addr.String()); err == nil {
			// Keep the chain of addresses from earlier proxies and append the caller's.
			ip := ap.Addr().Unmap().String()
			if len(xff) > 0 {
				ip = strings.Join(xff, ", ") + ", " + ip
			}
			xff = []string{ip}
		}
	}
	if len(xff) > 0 {
		out["x-forwarded-for"] = xff
	}
	out["x-forwarded-proto"] = []string{"http"}
	if authority != "" {
		out["x-forwarded-host"] = []string{authority}
	}
	return out, authority, subtype
}

// contentSubtype is the codec named by a gRPC content-type (application/grpc+json: json), ""
// for none.
func contentSubtype(ct string) string {
	rest, ok := strings.CutPrefix(ct, "application/grpc")
	if !ok || !strings.HasPrefix(rest, "+") {
		return ""
	}
	sub, _, _ := strings.Cut(rest[1:], ";")
	return strings.ToLower(sub)
}
