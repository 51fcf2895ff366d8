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

// A connection that says nothing holds no other while it is read from, and is closed after
// the timeout.
func TestSplitH2CClosesSilentConnections(t *testing.T) {
	for _, tc := range []struct {
		name, send string
	}{
		{"silent", ""},
		// The start of the preface, then nothing: the split can not tell yet.
		{"half a preface", "PRI * HTTP/2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			const timeout = 3 * time.Second
			s := SplitH2C(ln, timeout)
			srv := &http.Server{ReadHeaderTimeout: timeout,
				Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })}
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
			io.WriteString(silent, tc.send)
			began := time.Now()
			// Well within the split's timeout: a split that read one connection at a
			// time would hold this request behind the silent one.
			client := &http.Client{Timeout: timeout / 2}
			res, err := client.Get("http://" + ln.Addr().String() + "/")
			if err != nil {
				t.Fatalf("a request beside a silent connection: %v", err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusOK {
				t.Errorf("a request beside a silent connection: %s", res.Status)
			}
			// Closed by the split (silent), or by the HTTP server after its own header
			// timeout (half a preface, which the split hands it when its time is up).
			silent.SetReadDeadline(time.Now().Add(4 * timeout))
			_, err = io.ReadAll(bufio.NewReader(silent))
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("the connection is still open %v after it was opened (timeouts %v)", time.Since(began), timeout)
			}
			if waited := time.Since(began); waited < timeout/2 {
				t.Errorf("the connection ended %v after it was opened, before the split's timeout of %v", waited, timeout)
			}
		})
	}
}

// tempErr is a temporary Accept error, as EMFILE is.
type tempErr struct{}

func (tempErr) Error() string   { return "too many open files (test)" }
func (tempErr) Temporary() bool { return true }
func (tempErr) Timeout() bool   { return false }

// flakyListener fails its first Accepts with a temporary error.
type flakyListener struct {
	net.Listener
	fails int
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails > 0 {
		l.fails--
		return nil, tempErr{}
	}
	return l.Listener.Accept()
}

// A temporary Accept error (out of file descriptors) pauses the split; it does not end it.
func TestSplitH2CSurvivesTemporaryErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := SplitH2C(&flakyListener{Listener: ln, fails: 3}, 5*time.Second)
	defer func() {
		s.H2C.Close()
		s.HTTP1.Close()
		s.Wait()
	}()
	send := "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
	got := acceptOne(s.HTTP1, len(send))
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, send)
	select {
	case g := <-got:
		if g != send {
			t.Errorf("after temporary errors the half read %q, want %q", g, send)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no connection delivered 5s after three temporary Accept errors")
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
