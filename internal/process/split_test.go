package process

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// acceptOne accepts one connection from l and reports what it read first, n bytes.
func acceptOne(l net.Listener, n int) <-chan string {
	got := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- "accept: " + err.Error()
			return
		}
		defer c.Close()
		buf := make([]byte, n)
		if _, err := io.ReadFull(c, buf); err != nil {
			got <- "read: " + err.Error()
			return
		}
		got <- string(buf)
	}()
	return got
}

func TestSplitH2CSortsByPreface(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := SplitH2C(ln, 5*time.Second)
	defer func() {
		s.H2C.Close()
		s.HTTP1.Close()
		s.Wait()
	}()

	for _, tc := range []struct {
		name, send string
		to         net.Listener
	}{
		{"h2c", string(h2Preface) + "\x00\x00\x00\x04", s.H2C},
		{"HTTP/1.1", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", s.HTTP1},
		// Shorter than the preface, and the client waits for an answer: sorted at once.
		{"short HTTP/1.0", "GET / HTTP/1.0\r\n\r\n", s.HTTP1},
	} {
		got := acceptOne(tc.to, len(tc.send))
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, tc.send); err != nil {
			t.Fatal(err)
		}
		select {
		case g := <-got:
			if g != tc.send {
				t.Errorf("%s: the half read %q, want %q", tc.name, g, tc.send)
			}
		case <-time.After(3 * time.Second):
			t.Errorf("%s: not delivered within 3s (the sorting timeout is 5s)", tc.name)
		}
		c.Close()
	}
}

// A connection that says nothing is closed after the timeout, and holds no other meanwhile.
func TestSplitH2CClosesSilentConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := SplitH2C(ln, 200*time.Millisecond)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(s.HTTP1) }()
	defer func() {
		s.H2C.Close()
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
		s.Wait()
	}()

	silent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	res, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("a request beside a silent connection: %s", res.Status)
	}
	silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(silent).ReadByte(); !errors.Is(err, io.EOF) {
		t.Errorf("the silent connection: %v, want closed by the split", err)
	}
}

// Closing both halves ends the split at once, a connection being sorted included.
func TestSplitH2CStopsWithItsHalves(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := SplitH2C(ln, time.Minute)
	silent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	io.WriteString(silent, "PRI * HT") // the start of the preface, then nothing
	time.Sleep(50 * time.Millisecond)  // accepted and being sorted; the test holds either way
	s.H2C.Close()
	s.HTTP1.Close()
	waited := make(chan struct{})
	go func() { s.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("the split still runs 5s after both halves closed")
	}
	if _, err := s.H2C.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Error("the listener still accepts after both halves closed")
	}
}
