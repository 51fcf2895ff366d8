package testkit

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

func TestEncode(t *testing.T) {
	got, err := Encode([]byte("a\x00"), "b\"", uint64(7), int64(-3), uint8(255), math.Copysign(0, -1))
	want := "go test fuzz v1\n[]byte(\"a\\x00\")\nstring(\"b\\\"\")\nuint64(7)\nint64(-3)\nbyte(255)\nmath.Float64frombits(0x8000000000000000)\n"
	if err != nil || got != want {
		t.Errorf("Encode = %q, %v; want %q", got, err, want)
	}
	if _, err := Encode(3); err == nil {
		t.Error("Encode(int) did not fail")
	}
}

// TestCheckCorpusFindsStaleFiles: a missing or changed file fails the
// check; the right one passes.
func TestCheckCorpusFindsStaleFiles(t *testing.T) {
	t.Chdir(t.TempDir())
	seeds := []Seed{{"good", []any{"x"}}}
	rec := &recorder{TB: t}
	CheckCorpus(rec, "FuzzX", seeds)
	if rec.errors != 1 {
		t.Fatalf("missing file: %d errors, want 1", rec.errors)
	}
	content, _ := Encode("x")
	if err := os.MkdirAll(filepath.Join("testdata", "fuzz", "FuzzX"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "fuzz", "FuzzX", "good")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	rec = &recorder{TB: t}
	if CheckCorpus(rec, "FuzzX", seeds); rec.errors != 0 {
		t.Errorf("current file: %d errors, want 0", rec.errors)
	}
	if err := os.WriteFile(path, []byte(content+"string(\"y\")\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec = &recorder{TB: t}
	if CheckCorpus(rec, "FuzzX", seeds); rec.errors != 1 {
		t.Errorf("stale file: %d errors, want 1", rec.errors)
	}
}

// recorder counts Errorf calls instead of failing the test.
type recorder struct {
	testing.TB
	errors int
}

func (r *recorder) Errorf(string, ...any) { r.errors++ }
func (r *recorder) Helper()               {}

func TestWaitFor(t *testing.T) {
	n := 0
	WaitFor(t, time.Minute, "the third look", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Errorf("cond called %d times, want 3", n)
	}
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		WaitFor(rec, 20*time.Millisecond, "never", func() bool { return false })
	}()
	<-done
	if rec.msg != "timed out after 20ms waiting until never" {
		t.Errorf("Fatalf(%q)", rec.msg)
	}
}

// fatalRecorder records Fatalf and ends the goroutine, as testing.T does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
