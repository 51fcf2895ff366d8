package ocibuild

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// TestImageOfTheSidecar builds the sidecar binary as the images are built
// (static, CGO_ENABLED=0), assembles its image, writes it as a tarball,
// reads it back, and checks what a container runtime would see: the config
// (user, entrypoint, platform), the one layer's files, and that the
// entrypoint it names runs.
func TestImageOfTheSidecar(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the images hold Linux binaries")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "sidecar")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "../../../cmd/sidecar")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	built, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}

	img, err := Image(bin, "sidecar", "v0.0.0-test")
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag("ghcr.io/sluicehq/sluice-sidecar:v0.0.0-test")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "sidecar.tar")
	if err := tarball.WriteToFile(path, ref, img); err != nil {
		t.Fatal(err)
	}
	loaded, err := tarball.ImageFromPath(path, &ref)
	if err != nil {
		t.Fatalf("read the tarball back: %v", err)
	}
	if err := validate.Image(loaded); err != nil {
		t.Fatalf("the image does not validate (digests, sizes, diff ids): %v", err)
	}

	cf, err := loaded.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	if cf.Config.User != "65532:65532" || !slices.Equal(cf.Config.Entrypoint, []string{Entrypoint}) || len(cf.Config.Cmd) > 0 {
		t.Errorf("config user %q entrypoint %q cmd %q", cf.Config.User, cf.Config.Entrypoint, cf.Config.Cmd)
	}
	if cf.Config.Labels["org.opencontainers.image.version"] != "v0.0.0-test" {
		t.Errorf("labels %v", cf.Config.Labels)
	}

	layers, err := loaded.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers, %v: want exactly one on an empty base", len(layers), err)
	}
	files := layerFiles(t, layers[0])
	var names []string
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	want := []string{"etc/", "etc/group", "etc/passwd", "usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/sluice"}
	if !slices.Equal(names, want) {
		t.Errorf("layer holds %q, want %q", names, want)
	}
	entry := files["usr/local/bin/sluice"]
	if entry.hdr == nil || entry.hdr.Mode != 0o755 || entry.hdr.Uid != 0 || !bytes.Equal(entry.data, built) {
		t.Fatalf("entrypoint in the layer: %+v, %d bytes (built %d)", entry.hdr, len(entry.data), len(built))
	}
	if !strings.Contains(string(files["etc/passwd"].data), "nonroot:x:65532:65532:") {
		t.Errorf("passwd %q", files["etc/passwd"].data)
	}

	// The file the entrypoint names is a static executable that runs.
	if _, err := CheckStatic(entry.data); err != nil {
		t.Fatal(err)
	}
	extracted := filepath.Join(dir, "extracted")
	if err := os.WriteFile(extracted, entry.data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, extracted, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Usage:\n  sidecar") {
		t.Errorf("%s --help: %v\n%s", Entrypoint, err, out)
	}
}

type tarEntry struct {
	hdr  *tar.Header
	data []byte
}

func layerFiles(t *testing.T, l v1.Layer) map[string]tarEntry {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]tarEntry{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[hdr.Name] = tarEntry{hdr, data}
	}
}

func TestCheckStaticRefusesDynamicBinaries(t *testing.T) {
	for _, p := range []string{"/bin/sh", "/usr/bin/env"} {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if _, err := CheckStatic(data); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
			t.Errorf("%s: %v, want it refused as dynamically linked", p, err)
		}
		return
	}
	t.Skip("no dynamically linked binary to try")
}

func TestCheckStaticRefusesNonELF(t *testing.T) {
	if _, err := CheckStatic([]byte("#!/bin/sh\necho hi\n")); err == nil {
		t.Error("a shell script passed as an executable")
	}
}

// TestDockerfile holds the repository's Dockerfile to what the images here
// are (it can not be built on this machine: there is no Docker engine): a
// static build of an existing binary, on a non-root distroless base, at the
// same entrypoint.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile("../../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(data)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^FROM golang:\S+ AS build$`),
		regexp.MustCompile(`CGO_ENABLED=0 go build -trimpath`),
		regexp.MustCompile(`(?m)^FROM gcr\.io/distroless/static-debian\d+:nonroot$`),
		regexp.MustCompile(`(?m)^USER 65532:65532$`),
		regexp.MustCompile(`(?m)^COPY --from=build /out/sluice ` + regexp.QuoteMeta(Entrypoint) + `$`),
		regexp.MustCompile(`(?m)^ENTRYPOINT \["` + regexp.QuoteMeta(Entrypoint) + `"\]$`),
	} {
		if !want.MatchString(df) {
			t.Errorf("Dockerfile lacks %s", want)
		}
	}
	// Every binary the Dockerfile's comment offers exists.
	m := regexp.MustCompile(`BINARY is one of ([a-z, ]+)\.`).FindStringSubmatch(df)
	if m == nil {
		t.Fatal("Dockerfile does not list its binaries")
	}
	for _, b := range strings.Split(m[1], ", ") {
		if _, err := os.Stat(filepath.Join("../../../cmd", b, "main.go")); err != nil {
			t.Errorf("Dockerfile offers %s: %v", b, err)
		}
	}
}
