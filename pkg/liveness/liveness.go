// Package liveness is how sluice's long-lived gRPC streams notice a peer that is gone or
// frozen: gRPC keepalive pings on every connection, from both ends, and a server policy that
// admits the clients' pings.
//
// Without them a stream to a peer that stopped (SIGSTOP, a hung host, a dropped route with no
// RST) looks open until the kernel gives up on the connection, many minutes later: a sidecar
// would go on reporting itself connected to a frozen controller, and neither fail over nor let
// its policy's fail mode take over. With them a silent peer is found within PingInterval +
// PingTimeout (15s), the connection is closed, and its streams end UNAVAILABLE.
//
// Both ends must agree. A gRPC server without ServerOptions accepts a ping at most every 5
// minutes and answers more frequent ones with GOAWAY (too_many_pings), which ends the client's
// streams every half minute or so: every server that sluice's clients dial (the controller, the
// aggregator, the in-process testbed and simulator) registers ServerOptions, and an upgrade
// replaces controllers and aggregators before sidecars.
package liveness

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

const (
	// PingInterval is how long a connection may be silent before its end pings the other.
	// 10s is the least gRPC clients accept.
	PingInterval = 10 * time.Second
	// PingTimeout is how long a ping may go unanswered before the connection is closed.
	PingTimeout = 5 * time.Second
	// MinPingInterval is the most often a server accepts a client's pings; a client pinging
	// more often is sent GOAWAY (too_many_pings). It is below PingInterval, so that sluice's
	// own clients are never refused.
	MinPingInterval = 5 * time.Second
)

// DialOption makes a client ping its server after PingInterval of silence, with or without a
// stream open, and close the connection when a ping goes unanswered for PingTimeout. A later
// grpc.WithKeepaliveParams overrides it.
func DialOption() grpc.DialOption {
	return grpc.WithKeepaliveParams(keepalive.ClientParameters{
		Time: PingInterval, Timeout: PingTimeout, PermitWithoutStream: true,
	})
}

// ServerOptions make a server admit DialOption's pings and ping its clients in turn, so that
// a frozen client's streams (and the state they hold) end within PingInterval + PingTimeout.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime: MinPingInterval, PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: PingInterval, Timeout: PingTimeout}),
	}
}
