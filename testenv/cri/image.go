package cri

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"

	"github.com/isthmus-dev/isthmus/testenv/image"
)

// Images of the tests, built locally: no registry is reachable.
const (
	// PauseImage is the sandbox image every pod starts with.
	PauseImage = "isthmus.test/pause:1"
	// ProbeImage holds /probe (testenv/cri/probe): an HTTP server that
	// answers with the source address it saw, and its client.
	ProbeImage = "isthmus.test/probe:1"
)

// imageDirs are the directories a runtime mounts over, which an image of a
// single static program lacks.
var imageDirs = []string{"dev/", "etc/", "proc/", "sys/", "tmp/"}

// OCIArchive writes an OCI image archive at path (testenv/image's writer), as
// `ctr images import` reads it: one image named name for this machine's
// platform, whose single uncompressed layer holds the directories a runtime
// mounts over and files (path in the image to content, mode 0755), and whose
// entrypoint is entrypoint.
func OCIArchive(path, name string, files map[string][]byte, entrypoint []string) error {
	var entries []image.Entry
	for _, d := range imageDirs {
		entries = append(entries, image.Entry{Name: d})
	}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		entries = append(entries, image.Entry{Name: p, Data: files[p]})
	}
	l, err := image.WriteLayer(path+".layer", entries)
	if err != nil {
		return fmt.Errorf("pack %s: %w", name, err)
	}
	defer os.Remove(path + ".layer")
	if err := image.WriteArchive(path, image.Config{Entrypoint: entrypoint}, []image.Layer{l}, name); err != nil {
		return fmt.Errorf("pack %s: %w", name, err)
	}
	return nil
}

// BuildImages builds the pause and probe programs statically from this
// source tree and writes PauseImage and ProbeImage as OCI archives into dir;
// it returns their paths.
func BuildImages(ctx context.Context, dir string) (pause, probe string, err error) {
	src, err := sourceDir()
	if err != nil {
		return "", "", err
	}
	for _, img := range []struct {
		name, prog string
		out        *string
	}{{PauseImage, "pause", &pause}, {ProbeImage, "probe", &probe}} {
		bin := filepath.Join(dir, img.prog)
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./"+img.prog)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // static: the image has no libc
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("build %s: %w\n%s", img.prog, err, out)
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			return "", "", fmt.Errorf("read %s: %w", img.prog, err)
		}
		*img.out = filepath.Join(dir, img.prog+".oci.tar")
		if err := OCIArchive(*img.out, img.name, map[string][]byte{img.prog: data}, []string{"/" + img.prog}); err != nil {
			return "", "", err
		}
	}
	return pause, probe, nil
}

// sourceDir is this package's directory, from which the programs build.
func sourceDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("find testenv/cri: no caller information")
	}
	return filepath.Dir(file), nil
}

// BuildLoopback builds the reference CNI plugin "loopback"
// (containernetworking/plugins, already a dependency) into binDir. containerd
// up to 2.0 runs it for every sandbox, to bring up the pod's lo, before the
// network's own plugins; on a node it comes with the runtime's CNI plugins
// package (Debian's containernetworking-plugins), which the tests do without.
func BuildLoopback(ctx context.Context, binDir string) error {
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", binDir, err)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(binDir, "loopback"), "github.com/containernetworking/plugins/plugins/main/loopback")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the loopback plugin: %w\n%s", err, out)
	}
	return nil
}
