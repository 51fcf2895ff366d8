// Package ocibuild assembles sluice's container images without a Docker
// engine: one static binary on an empty base, owned by root, run as the
// unprivileged user 65532, the way the repository's Dockerfile builds them
// on a distroless base. `make images` writes them as tarballs that `docker
// load`, `kind load image-archive` and registries' tools read.
package ocibuild

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entrypoint is where the binary sits in every image, the same in the
// Dockerfile's: one path whatever the binary, so that manifests never
// depend on which image holds which file.
const Entrypoint = "/usr/local/bin/sluice"

// UID is the user (and group) the images run as: distroless's "nonroot".
const UID = 65532

// Image builds the image of one binary. name is the binary's name (for the
// image's labels); the binary must be a static Linux executable.
func Image(binaryPath, name, version string) (v1.Image, error) {
	bin, err := os.ReadFile(binaryPath)
	if err != nil {
		return nil, fmt.Errorf("read the binary: %w", err)
	}
	arch, err := CheckStatic(bin)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", binaryPath, err)
	}
	layerTar, err := rootfs(bin)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("build the layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("append the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()} // reproducible
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", UID, UID),
		Entrypoint: []string{Entrypoint},
		WorkingDir: "/",
		Labels: map[string]string{
			"org.opencontainers.image.title":   "sluice-" + name,
			"org.opencontainers.image.source":  "https://github.com/sluicehq/sluice",
			"org.opencontainers.image.version": version,
		},
	}
	return mutate.ConfigFile(img, cf)
}

// rootfs is the image's one layer: the binary, root-owned and not writable
// by its user, and passwd/group entries so that tools show a name for 65532.
func rootfs(bin []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: epoch})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, UID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", UID)
	err := errors.Join(
		dir("etc/"), file("etc/passwd", 0o644, []byte(passwd)), file("etc/group", 0o644, []byte(group)),
		dir("usr/"), dir("usr/local/"), dir("usr/local/bin/"), file(Entrypoint[1:], 0o755, bin),
		tw.Close(),
	)
	if err != nil {
		return nil, fmt.Errorf("write the layer: %w", err)
	}
	return buf.Bytes(), nil
}

// CheckStatic reports the GOARCH of a static Linux executable, or why bin
// is not one: an image on an empty base has no dynamic loader and no libc.
func CheckStatic(bin []byte) (arch string, err error) {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return "", fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", errors.New("dynamically linked (it names an interpreter): build with CGO_ENABLED=0")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		return "", fmt.Errorf("needs shared libraries %v: build with CGO_ENABLED=0", libs)
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	}
	return "", fmt.Errorf("machine %v is not amd64 or arm64", f.Machine)
}
