package process

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"time"
)

// h2Preface is how every HTTP/2 connection with prior knowledge opens (RFC 9113, 3.4): the
// h2c connections of gRPC clients. An HTTP/1.x request can not start with it.
var h2Preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")

// Split divides the connections of one listener between an HTTP/1.1 server and a gRPC server
// (the sidecar's gRPC forwarder): a connection that opens with HTTP/2's preface goes to H2C,
// any other to HTTP1. Each connection is read from on a goroutine of its own, so a client that
// connects and says nothing holds no other: it is closed after the timeout, as an HTTP server
// closes one that sends no headers.
//
// Closing H2C or HTTP1 ends that half; the listener underneath closes when both have (the
// process's shutdown stops both servers). An Accept error of the listener underneath ends
// both halves with it.
type Split struct {
	H2C, HTTP1 net.Listener

	l       net.Listener
	timeout time.Duration
	done    chan struct{} // closed when the accept loop ends
	err     error         // why it ended; written before done is closed
	open    sync.WaitGroup
	sorting sync.WaitGroup // connections being read from

	mu      sync.Mutex
	closing bool
	unread  map[net.Conn]struct{} // being read from; cut short when the split closes
}

// SplitH2C starts dividing l's connections, giving each timeout to show which half it
// belongs to; the goroutine that accepts them ends when both halves are closed or l fails.
func SplitH2C(l net.Listener, timeout time.Duration) *Split {
	s := &Split{l: l, timeout: timeout, done: make(chan struct{}), unread: map[net.Conn]struct{}{}}
	h2c, h1 := s.half(), s.half()
	s.H2C, s.HTTP1 = h2c, h1
	s.open.Add(2)
	go func() {
		s.open.Wait()
		l.Close()
		// A connection still being read from would hold Wait for its timeout.
		s.mu.Lock()
		s.closing = true
		for c := range s.unread {
			_ = c.SetReadDeadline(time.Now())
		}
		s.mu.Unlock()
	}()
	go s.accept(h2c, h1)
	return s
}

// Wait returns once the goroutines of s have ended: both halves closed (or the listener
// failed), and no connection is being read from.
func (s *Split) Wait() { <-s.done }

func (s *Split) half() *half {
	return &half{s: s, conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (s *Split) accept(h2c, h1 *half) {
	defer func() {
		s.sorting.Wait()
		close(s.done)
	}()
	var pause time.Duration
	for {
		c, err := s.l.Accept()
		if err != nil {
			// Out of file descriptors (EMFILE, ENFILE), say, until some
			// connections close: wait and accept again, as http.Server
			// and grpc.Server do. Only a closed or broken listener ends
			// the split.
			if ne, ok := err.(interface{ Temporary() bool }); ok && ne.Temporary() && !errors.Is(err, net.ErrClosed) {
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				time.Sleep(pause)
				continue
			}
			s.err = err
			return
		}
		pause = 0
		s.sorting.Add(1)
		go func() {
			defer s.sorting.Done()
			s.sort(c, h2c, h1)
		}()
	}
}

// sort reads the start of c and hands it to the half it belongs to: to HTTP1 as soon as its
// bytes part from the preface (an HTTP/1 request shorter than the preface is not held), to
// H2C once the whole preface has come.
func (s *Split) sort(c net.Conn, h2c, h1 *half) {
	buf := make([]byte, len(h2Preface))
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		c.Close()
		return
	}
	s.unread[c] = struct{}{}
	_ = c.SetReadDeadline(time.Now().Add(s.timeout)) // an error shows in the read
	s.mu.Unlock()
	n := 0
	for n < len(buf) && bytes.Equal(buf[:n], h2Preface[:n]) {
		m, err := c.Read(buf[n:])
		n += m
		if err != nil {
			break
		}
	}
	s.mu.Lock()
	delete(s.unread, c)
	_ = c.SetReadDeadline(time.Time{})
	s.mu.Unlock()
	to := h1
	switch {
	case n == len(buf) && bytes.Equal(buf, h2Preface):
		to = h2c
	case n == 0:
		c.Close() // said nothing in time, or closed
		return
	}
	// A connection that stopped partway (closed, or silent until the deadline) goes to the
	// HTTP server, which answers or closes it as it would have.
	if !to.deliver(&prefixConn{Conn: c, prefix: buf[:n]}) {
		c.Close()
	}
}

// half is one side of a Split, a net.Listener.
type half struct {
	s         *Split
	conns     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
}

func (h *half) deliver(c net.Conn) bool {
	select {
	case h.conns <- c:
		return true
	case <-h.closed:
		return false
	}
}

func (h *half) Accept() (net.Conn, error) {
	select {
	case c := <-h.conns:
		return c, nil
	case <-h.closed:
		return nil, net.ErrClosed
	case <-h.s.done:
		select {
		case <-h.closed:
			return nil, net.ErrClosed
		default:
		}
		return nil, h.s.err
	}
}

func (h *half) Close() error {
	h.closeOnce.Do(func() {
		close(h.closed)
		h.s.open.Done()
	})
	return nil
}

func (h *half) Addr() net.Addr { return h.s.l.Addr() }

// prefixConn is a connection whose first bytes were read already.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
