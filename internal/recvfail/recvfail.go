// Package recvfail tells when a gRPC server stream's Recv failed because of the message the
// client sent (too large for the server's receive limit, or not decodable: bad protobuf,
// invalid UTF-8 in a string), so that services count it as a rejection under its reason like
// any other bad input, and log it at most once a minute per reason.
//
// gRPC ends the stream either way, and that stays: the message is the client's problem, and a
// client that sends one broken message can not be trusted with the rest of its stream.
package recvfail

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/pkg/uplink"
)

// Reasons, as metric label values.
const (
	TooLarge    = "too_large"   // larger than the server's receive limit, refused before decoding
	Unparseable = "unparseable" // not a message of the stream's type, or not decompressible
)

// Reason returns why err, from a server stream's Recv, blames the client's message: TooLarge,
// Unparseable, or "" when it does not (the client went away, the stream was cancelled).
func Reason(err error) string {
	if err == nil {
		return ""
	}
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	switch st.Code() {
	case codes.ResourceExhausted:
		return TooLarge
	case codes.Internal:
		// grpc-go's words when the codec or the decompressor fails (rpc_util.go); other
		// INTERNAL errors (a stream reset by the client, say) are not the message's.
		msg := st.Message()
		if strings.HasPrefix(msg, "grpc: failed to unmarshal") || strings.HasPrefix(msg, "grpc: failed to decompress") {
			return Unparseable
		}
	}
	return ""
}

// Log logs bad messages, at most one line a minute per reason. The zero value is ready; safe
// for concurrent use.
type Log struct{ limit uplink.RejectLog }

// Note logs that a stream of ctx ended on a message rejected for reason, unless a line for
// reason went out in the last minute.
func (l *Log) Note(ctx context.Context, logger *slog.Logger, stream, reason string, err error) {
	if !l.limit.Allow(reason, time.Now()) {
		return
	}
	addr := "unknown"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	logger.Warn("stream ended on a message it could not take (one line a minute per reason)",
		"stream", stream, "reason", reason, "peer", addr, "err", uplink.Truncate(err.Error()))
}

// StreamInterceptor notes, for the streams whose method begins with prefix,
// every Recv that failed on the client's message (Reason), for services
// whose handlers are not sluice's own (go-control-plane's xDS server): note
// is called with the stream's context, its method and the reason, once per
// failed Recv, before the handler sees the error. Other streams pass
// untouched.
func StreamInterceptor(prefix string, note func(ctx context.Context, method, reason string, err error)) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !strings.HasPrefix(info.FullMethod, prefix) {
			return handler(srv, ss)
		}
		return handler(srv, &noting{ServerStream: ss, method: info.FullMethod, note: note})
	}
}

// noting is a ServerStream whose failed Recvs are noted.
type noting struct {
	grpc.ServerStream
	method string
	note   func(ctx context.Context, method, reason string, err error)
}

func (s *noting) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if r := Reason(err); r != "" {
		s.note(s.Context(), s.method, r, err)
	}
	return err
}
