package testkit

import (
	"fmt"
	"net"

	"github.com/sluicehq/sluice/pkg/shard"
)

// ShardAddrs reserves a port free on 127.0.0.10 … 127.0.0.1<n-1> (all
// loopback on Linux), where the controller shards of a test listen, one
// host each, and returns the template every client is given,
// "127.0.0.1{shard}:port", and shard i's address. n is at most 10.
func ShardAddrs(t interface {
	Helper()
	Fatalf(string, ...any)
}, n int) (template string, addr func(i int) string) {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.10:0")
		if err != nil {
			t.Fatalf("loopback 127.0.0.10: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		free := true
		for i := range n {
			m, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1%d:%d", i, port))
			if err != nil {
				free = false
				break
			}
			m.Close()
		}
		if free {
			tmpl := fmt.Sprintf("127.0.0.1%s:%d", shard.Placeholder, port)
			return tmpl, func(i int) string { return shard.Addrs([]string{tmpl}, i)[0] }
		}
	}
	t.Fatalf("no port free on 127.0.0.10-1%d", n-1)
	return "", nil
}
