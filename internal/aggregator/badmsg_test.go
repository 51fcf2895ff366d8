package aggregator

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit"
)

// rawCodec sends []byte as they are, under the proto codec's name: what a
// hostile client can put on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }
func (rawCodec) Name() string                       { return "proto" }

// sendRaw sends msg as the first message of a load report stream and
// returns the error the stream ends with.
func sendRaw(t *testing.T, addr string, msg []byte) error {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
	cs, err := cc.NewStream(context.Background(), desc, sluicev1.LoadReportService_StreamLoadReports_FullMethodName, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(msg); err != nil {
		t.Fatal(err)
	}
	return cs.RecvMsg(new(sluicev1.StreamLoadReportsResponse))
}

// TestServiceCountsUnparseableReports: a report that is not protobuf, or
// carries invalid UTF-8 in a string, ends its stream (INTERNAL, as gRPC
// answers) and is counted as rejected, reason unparseable.
func TestServiceCountsUnparseableReports(t *testing.T) {
	h := startService(t, Config{Controllers: []string{"127.0.0.1:1"}})
	valid, err := proto.Marshal(&sluicev1.StreamLoadReportsRequest{Report: &sluicev1.LoadReport{SidecarId: "SIDECAR"}})
	if err != nil {
		t.Fatal(err)
	}
	for i, msg := range [][]byte{
		{0xff, 0xff, 0xff}, // field 0 and a truncated varint: not protobuf
		bytes.Replace(valid, []byte("SIDECAR"), []byte("\xff\xfe\xfd\xfc\xfb\xfa\xf9"), 1), // invalid UTF-8
	} {
		if err := sendRaw(t, h.addr, msg); status.Code(err) != codes.Internal {
			t.Errorf("message %d: stream ended with %v, want INTERNAL", i, err)
		}
		// grpc-go writes the stream's status inside Recv, before the
		// handler has the error to count: the client may see the end
		// first. Wait for the count, boundedly.
		testkit.WaitFor(t, 5*time.Second, fmt.Sprintf("after message %d: rejected{reason=unparseable} = %d", i, i+1), func() bool {
			return metric(t, h.reg, "sluice_aggregator_reports_rejected_total", "reason", ReasonUnparseable) == float64(i+1)
		})
	}
}
