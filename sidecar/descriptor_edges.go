package sidecar

import (
	"context"
	"net"
	"net/http"
	"net/textproto"
	"sync/atomic"
	"unsafe"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/pkg/descriptor"
)

// The edges' half of descriptors (issue #15): where a request's value comes
// from. The middleware and the server interceptors decide a request's
// descriptors once its bucket admitted it (or its caller decided the
// bucket: see resolveCaller; callers decide no descriptors of their
// callees), every descriptor, so that each counts the request as the
// reports must, even after one dropped it. The request is admitted only if
// all admit; the first that dropped it gives the answer, its rejection
// rendered by the limiter. The edges keep nothing of a request: a value
// goes to DecideDescriptor as the request's own text, and descriptor.Value
// bounds it there before anything keeps it.
//
// An X-Forwarded-For source reads the header as the request brought it to
// the sidecar: the middleware runs before the sidecar's own proxy
// (internal/agent) appends the caller's address, so a source's hops count
// the proxies in front of the sidecar, not the sidecar itself.

// xffKey is X-Forwarded-For's key in an http.Header, and xffMetadata in
// gRPC metadata.
const (
	xffKey      = "X-Forwarded-For"
	xffMetadata = "x-forwarded-for"
)

// descriptorEdge is what one middleware or pair of interceptors keeps to
// decide descriptors. Safe for concurrent use.
type descriptorEdge struct {
	s *ServiceLimiter
	// keys holds the http.Header keys of the last DescriptorSources slice
	// seen, replaced (never modified) when the policy brings another one:
	// a policy swap costs one rendering per edge, a request none.
	keys atomic.Pointer[headerKeys]
}

// headerKeys are the http.Header keys of one DescriptorSources slice's
// Header sources, by index: canonical, as the server stores them
// (textproto's canonical form allocates when it changes the name, so it
// is done here, once). Immutable.
type headerKeys struct {
	sources *descriptor.Source // the slice's first element: its identity
	keys    []string
}

func newDescriptorEdge(s *ServiceLimiter) *descriptorEdge { return &descriptorEdge{s: s} }

// headerKeys returns the keys of srcs, the current DescriptorSources,
// rendering them when they are not the ones the edge has.
func (e *descriptorEdge) headerKeys(srcs []descriptor.Source) []string {
	first := unsafe.SliceData(srcs)
	if k := e.keys.Load(); k != nil && k.sources == first && len(k.keys) == len(srcs) {
		return k.keys
	}
	k := &headerKeys{sources: first, keys: make([]string, len(srcs))}
	for i, src := range srcs {
		if src.Kind == descriptor.Header {
			k.keys[i] = textproto.CanonicalMIMEHeaderKey(src.Header)
		}
	}
	e.keys.Store(k)
	return k.keys
}

// decideHTTP decides r's descriptors: nil when every one admits it, else
// the verdict of the first that dropped it, whose rejection names it. It
// allocates nothing.
func (e *descriptorEdge) decideHTTP(r *http.Request) *verdict {
	srcs := e.s.DescriptorSources()
	if len(srcs) == 0 {
		return nil
	}
	keys := e.headerKeys(srcs)
	var drop *verdict
	for i, src := range srcs {
		drop = firstDrop(drop, e.s.DecideDescriptor(i, httpValue(r, src, keys[i])))
	}
	return drop
}

// decideGRPC decides the descriptors of the call of ctx: see decideHTTP.
// It allocates what grpcValue does.
func (e *descriptorEdge) decideGRPC(ctx context.Context) *verdict {
	srcs := e.s.DescriptorSources()
	var drop *verdict
	for i, src := range srcs {
		drop = firstDrop(drop, e.s.DecideDescriptor(i, grpcValue(ctx, src)))
	}
	return drop
}

// firstDrop returns drop, the verdict of an earlier descriptor's drop, or
// when there was none, d's verdict if d drops. A drop comes with its
// rendered rejection (DecideDescriptor's contract); one without would be
// a limiter's bug, and is admitted rather than answered with nothing.
func firstDrop(drop *verdict, d Decision) *verdict {
	if drop == nil && d.Drop && d.v != nil && d.v.http != nil {
		return d.v
	}
	return drop
}

// httpValue returns r's raw value of src, "" when r has none; key is the
// canonical key of a Header source. A header sent on several lines counts
// by its first. It allocates nothing, and the value is r's own text (or a
// reserved value): DecideDescriptor bounds and checks it before anything
// keeps it.
func httpValue(r *http.Request, src descriptor.Source, key string) string {
	switch src.Kind {
	case descriptor.Header:
		if v := r.Header[key]; len(v) > 0 {
			return v[0]
		}
	case descriptor.ClientIP:
		return descriptor.ClientIPValue(r.RemoteAddr)
	case descriptor.ForwardedFor:
		return descriptor.ForwardedForValue(r.Header[xffKey], src.Hops)
	}
	return ""
}

// grpcValue returns the raw value of src of the call of ctx: a Header
// source reads its incoming metadata key, ForwardedFor x-forwarded-for (as
// a proxy in front writes it) and ClientIP the peer's address. grpc-go
// copies the values of a metadata key it is asked for, one slice per
// present key (BenchmarkGRPCValue), and renders a peer's address afresh
// each time: a call pays one small allocation per descriptor, next to the
// dozens grpc-go makes for every call anyway.
func grpcValue(ctx context.Context, src descriptor.Source) string {
	switch src.Kind {
	case descriptor.Header:
		if v := metadata.ValueFromIncomingContext(ctx, src.Header); len(v) > 0 {
			return v[0]
		}
	case descriptor.ClientIP:
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			return descriptor.ClientIPValue(addrText(p.Addr))
		}
	case descriptor.ForwardedFor:
		return descriptor.ForwardedForValue(metadata.ValueFromIncomingContext(ctx, xffMetadata), src.Hops)
	}
	return ""
}

// addrText returns a peer address's text: a TCP address's IP alone (one
// allocation; its String would join the port too), else the address's
// String, which ClientIPValue reads or finds Invalid (a Unix socket).
func addrText(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	return a.String()
}
