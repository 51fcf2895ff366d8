package controller

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/pkg/history"
)

// rawCodec sends []byte as they are, under the proto codec's name: what a
// hostile client can put on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }
func (rawCodec) Name() string                       { return "proto" }

// TestZoneLoadsCountsUnparseable: a zone load that is not protobuf, or
// carries invalid UTF-8 in a string, ends its stream (INTERNAL, as gRPC
// answers) and is counted as rejected, reason unparseable.
func TestZoneLoadsCountsUnparseable(t *testing.T) {
	reg := prometheus.NewRegistry()
	svc, err := New(DefaultConfig(), limits.NewStore(history.NewMemory(), time.Hour, nil), nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	svc.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })

	valid, err := proto.Marshal(&sluicev1.StreamZoneLoadsRequest{Load: &sluicev1.ZoneLoad{AggregatorId: "AGGREGATOR"}})
	if err != nil {
		t.Fatal(err)
	}
	for i, msg := range [][]byte{
		{0xff, 0xff, 0xff}, // field 0 and a truncated varint: not protobuf
		bytes.Replace(valid, []byte("AGGREGATOR"), bytes.Repeat([]byte{0xff}, 10), 1), // invalid UTF-8
	} {
		desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
		cs, err := cc.NewStream(context.Background(), desc, sluicev1.ZoneLoadService_StreamZoneLoads_FullMethodName, grpc.ForceCodec(rawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		if err := cs.SendMsg(msg); err != nil {
			t.Fatal(err)
		}
		// The handler ends the stream without a status of its own: the
		// client's message is its problem, its stream is over.
		if err := cs.RecvMsg(new(sluicev1.StreamZoneLoadsResponse)); status.Code(err) == codes.OK {
			t.Errorf("message %d: stream answered, want it ended", i)
		}
		// grpc-go writes the stream's status inside Recv, before the
		// receiving goroutine has the error to count: the client may see
		// the end first. Wait for the count, boundedly.
		testkit.WaitFor(t, 5*time.Second, fmt.Sprintf("after message %d: rejected{reason=unparseable} = %d", i, i+1), func() bool {
			return testutil.ToFloat64(svc.m.rejected.WithLabelValues("unparseable")) == float64(i+1)
		})
	}
}
