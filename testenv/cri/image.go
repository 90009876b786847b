package cri

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"time"
)

// Images of the tests, built locally: no registry is reachable.
const (
	// PauseImage is the sandbox image every pod starts with.
	PauseImage = "isthmus.test/pause:1"
	// ProbeImage holds /probe (testenv/cri/probe): an HTTP server that
	// answers with the source address it saw, and its client.
	ProbeImage = "isthmus.test/probe:1"
)

// Media types of the OCI image spec (image-spec v1.0).
const (
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// blob is one file of an image layout's blobs/sha256.
type blob struct {
	desc descriptor
	data []byte
}

func newBlob(mediaType string, data []byte) blob {
	sum := sha256.Sum256(data)
	return blob{desc: descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(data))}, data: data}
}

func jsonBlob(mediaType string, v any) blob {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("marshal %s: %v", mediaType, err)) // plain structs and maps always marshal
	}
	return newBlob(mediaType, b)
}

// OCIArchive returns an OCI image layout as a tar, as `ctr images import`
// reads it: one image named name (annotation io.containerd.image.name) for
// this machine's platform, whose single uncompressed layer holds the
// directories a runtime mounts over and files (path in the image to
// content, mode 0755), and whose entrypoint is entrypoint.
func OCIArchive(name string, files map[string][]byte, entrypoint []string) ([]byte, error) {
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	// Fixed times: the same inputs give the same digests.
	epoch := time.Unix(0, 0)
	for _, d := range []string{"dev/", "etc/", "proc/", "sys/", "tmp/"} {
		if err := lw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch}); err != nil {
			return nil, fmt.Errorf("write layer: %w", err)
		}
	}
	for _, path := range slices.Sorted(maps.Keys(files)) {
		data := files[path]
		if err := lw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: path, Mode: 0o755, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return nil, fmt.Errorf("write layer: %w", err)
		}
		if _, err := lw.Write(data); err != nil {
			return nil, fmt.Errorf("write layer: %w", err)
		}
	}
	if err := lw.Close(); err != nil {
		return nil, fmt.Errorf("write layer: %w", err)
	}
	layerBlob := newBlob(mediaLayer, layer.Bytes())
	// An uncompressed layer's diff ID is its digest.
	config := jsonBlob(mediaConfig, map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": entrypoint},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerBlob.desc.Digest}},
	})
	manifest := jsonBlob(mediaManifest, map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        config.desc,
		"layers":        []descriptor{layerBlob.desc},
	})
	index := manifest.desc
	index.Annotations = map[string]string{"io.containerd.image.name": name}

	var out bytes.Buffer
	w := tar.NewWriter(&out)
	put := func(path string, data []byte) error {
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: path, Mode: 0o644, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := w.Write(data)
		return err
	}
	indexJSON, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []descriptor{index}})
	for _, f := range []struct {
		path string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", indexJSON},
		{blobPath(layerBlob), layerBlob.data},
		{blobPath(config), config.data},
		{blobPath(manifest), manifest.data},
	} {
		if err := put(f.path, f.data); err != nil {
			return nil, fmt.Errorf("write image archive: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("write image archive: %w", err)
	}
	return out.Bytes(), nil
}

func blobPath(b blob) string { return "blobs/sha256/" + b.desc.Digest[len("sha256:"):] }

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
		archive, err := OCIArchive(img.name, map[string][]byte{img.prog: data}, []string{"/" + img.prog})
		if err != nil {
			return "", "", fmt.Errorf("pack %s: %w", img.name, err)
		}
		*img.out = filepath.Join(dir, img.prog+".oci.tar")
		if err := os.WriteFile(*img.out, archive, 0o644); err != nil {
			return "", "", fmt.Errorf("write %s: %w", *img.out, err)
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
