package recvfail

import (
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{io.EOF, ""},
		{errors.New("plain"), ""},
		{status.Error(codes.Canceled, "context canceled"), ""},
		{status.Error(codes.ResourceExhausted, "grpc: received message larger than max (70 vs. 64)"), TooLarge},
		{status.Error(codes.Internal, "grpc: failed to unmarshal the received message: proto: cannot parse invalid wire-format data"), Unparseable},
		{status.Error(codes.Internal, "grpc: failed to decompress the received message: gzip: invalid header"), Unparseable},
		{status.Error(codes.Internal, "stream terminated by RST_STREAM with error code: INTERNAL_ERROR"), ""},
	} {
		if got := Reason(tc.err); got != tc.want {
			t.Errorf("Reason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
