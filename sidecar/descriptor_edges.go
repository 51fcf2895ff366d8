package sidecar

import (
	"context"
	"net"
	"net/http"

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

// decideDescriptorsHTTP decides r's descriptors: nil when every one admits
// it, else the verdict of the first that dropped it, whose rejection names
// it. The values are taken by the sources of the one policy snapshot they
// are decided under. It allocates nothing.
func (s *ServiceLimiter) decideDescriptorsHTTP(r *http.Request) *verdict {
	dt := s.table.Load().desc
	if dt == nil {
		return nil
	}
	var drop *verdict
	for i, src := range dt.sources {
		drop = firstDrop(drop, s.decideDescriptor(dt, i, httpValue(r, src, dt.headerKeys[i])))
	}
	return drop
}

// decideDescriptorsGRPC decides the descriptors of the call of ctx: see
// decideDescriptorsHTTP. It allocates what grpcValue does.
func (s *ServiceLimiter) decideDescriptorsGRPC(ctx context.Context) *verdict {
	dt := s.table.Load().desc
	if dt == nil {
		return nil
	}
	var drop *verdict
	for i, src := range dt.sources {
		drop = firstDrop(drop, s.decideDescriptor(dt, i, grpcValue(ctx, src)))
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
