package testkit

import (
	"fmt"
	"net"
)

// ShardPort reserves a port free on each of 127.0.0.10 … 127.0.0.1<n-1>
// (all loopback on Linux), where the n controller shards of a test listen,
// one host each: shard i at fmt.Sprintf("127.0.0.1%d:%d", i, port), which
// the template "127.0.0.1{shard}:<port>" names. n is at most 10.
func ShardPort(t interface {
	Helper()
	Fatalf(string, ...any)
}, n int) int {
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
			return port
		}
	}
	t.Fatalf("no port free on 127.0.0.10-1%d", n-1)
	return 0
}
