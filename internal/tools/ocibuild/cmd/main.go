// Command ocibuild builds sluice's binaries statically and writes one image
// tarball per binary, without a Docker engine: `make images`.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sluicehq/sluice/internal/tools/ocibuild"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "ocibuild:", err)
		os.Exit(1)
	}
}

// The variables internal/cli reads for --version and sluice_build_info.
const (
	versionVar  = "github.com/sluicehq/sluice/internal/cli.version"
	revisionVar = "github.com/sluicehq/sluice/internal/cli.revision"
)

func run(ctx context.Context) error {
	out := flag.String("out", "bin/images", "directory for the image tarballs")
	repo := flag.String("repo", "ghcr.io/sluicehq", "image repository prefix: <repo>/sluice-<binary>")
	tag := flag.String("tag", "dev", "image tag")
	arch := flag.String("arch", "amd64", "GOARCH of the images")
	version := flag.String("version", "", "what the binaries' --version and sluice_build_info say; default the tag")
	revision := flag.String("revision", "", "the commit the binaries were built from, for --version and sluice_build_info")
	flag.Parse()
	bins := flag.Args()
	if len(bins) == 0 {
		bins = []string{"controller", "aggregator", "sidecar", "configurator", "injector"}
	}
	tmp, err := os.MkdirTemp("", "sluice-ocibuild-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	for _, b := range bins {
		bin := filepath.Join(tmp, b)
		ldflags := "-s -w -X " + versionVar + "=" + cmp.Or(*version, *tag) + " -X " + revisionVar + "=" + *revision
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags="+ldflags, "-o", bin, "./cmd/"+b)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+*arch)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("build %s: %w", b, err)
		}
		img, err := ocibuild.Image(bin, b, *tag)
		if err != nil {
			return err
		}
		ref, err := name.NewTag(fmt.Sprintf("%s/sluice-%s:%s", *repo, b, *tag))
		if err != nil {
			return err
		}
		path := filepath.Join(*out, "sluice-"+b+".tar")
		if err := tarball.WriteToFile(path, ref, img); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		fmt.Println(ref.String(), "→", path)
	}
	return nil
}
