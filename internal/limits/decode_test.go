package limits

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// manyCallers is a limits file of one service with n callers.
func manyCallers(n int) []byte {
	var b bytes.Buffer
	b.WriteString("services:\n  checkout:\n    capacity: 1000\n    callers:\n")
	for i := range n {
		fmt.Fprintf(&b, "      caller-%07d: {limit: %d}\n", i, i%100)
	}
	return b.Bytes()
}

// A 200,000-caller file parses: yaml.v3's decoding into a map compares
// every key with every other, and such a file never finished (issue 13).
// The speed goal is BenchmarkParseCallers's; this test only has to end.
func TestParseManyCallers(t *testing.T) {
	const n = 200_000
	set, err := Parse(bytes.NewReader(manyCallers(n)))
	if err != nil {
		t.Fatal(err)
	}
	co := set.Service("checkout")
	if len(co.Callers) != n || co.Bucket("caller-0199999").Limit != 99 {
		t.Errorf("%d callers, caller-0199999 %+v; want %d, limit 99", len(co.Callers), co.Bucket("caller-0199999"), n)
	}
	dup := append(manyCallers(n), "      caller-0000007: {limit: 1}\n"...)
	if _, err := Parse(bytes.NewReader(dup)); err == nil || !strings.Contains(err.Error(), `services.checkout.callers: line 200005: mapping key "caller-0000007" already defined at line 12`) {
		t.Errorf("a duplicate caller among %d: %v", n, err)
	}
}

// A parse stops when its context ends, with the context's error, so that
// a controller told to stop does not finish reading a large file first.
func TestParseStopsWhenCancelled(t *testing.T) {
	doc := manyCallers(50_000)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	set, err := ParseContext(ctx, bytes.NewReader(doc))
	if set != nil || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled parse = %v, %v; want context.Canceled", set, err)
	}
	// Cancelled midway, by the reader: the parser stops at its next read.
	ctx, cancel = context.WithCancel(context.Background())
	r := &cancelAfter{r: bytes.NewReader(doc), n: len(doc) / 2, cancel: cancel}
	if _, err := ParseContext(ctx, r); !errors.Is(err, context.Canceled) {
		t.Errorf("parse cancelled halfway: %v, want context.Canceled", err)
	}
	if r.read >= len(doc) {
		t.Errorf("the parser read all %d bytes after it was cancelled", r.read)
	}
}

// cancelAfter calls cancel once n bytes have been read from r.
type cancelAfter struct {
	r      *bytes.Reader
	n      int
	read   int
	cancel context.CancelFunc
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.read += k
	if c.read >= c.n {
		c.cancel()
	}
	return k, err
}

// BenchmarkParseCallers parses files of one service with 10,000, 50,000
// and 200,000 callers: the time per caller stays flat.
func BenchmarkParseCallers(b *testing.B) {
	for _, n := range []int{10_000, 50_000, 200_000} {
		doc := manyCallers(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			for b.Loop() {
				if _, err := Parse(bytes.NewReader(doc)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/caller")
		})
	}
}
