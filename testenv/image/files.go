package image

import (
	"archive/tar"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// mountDirs are the directories a runtime mounts over (or creates files in:
// /etc/hosts, /etc/resolv.conf), present in an image of files alone.
var mountDirs = []string{"dev/", "etc/", "proc/", "sys/", "tmp/"}

// WriteFiles writes an OCI image archive at path, named ref, for a static
// program: one layer holding files (path in the image to a file on disk,
// each root-owned, mode 0755) and mountDirs, nothing else, with entrypoint.
// The archive imports as Import does; the same inputs give the same digests.
func WriteFiles(path, ref string, files map[string]string, entrypoint []string) (Archive, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return Archive{}, fmt.Errorf("write image %s: %w", ref, err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(path), ".layer-")
	if err != nil {
		return Archive{}, fmt.Errorf("write image %s: %w", ref, err)
	}
	defer os.RemoveAll(tmp)
	lp := filepath.Join(tmp, "layer.tar")
	out, err := os.Create(lp)
	if err != nil {
		return Archive{}, fmt.Errorf("write layer: %w", err)
	}
	defer out.Close()
	tw := tar.NewWriter(out)
	for _, d := range mountDirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return Archive{}, fmt.Errorf("write layer: %w", err)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if err := addFile(tw, strings.TrimPrefix(name, "/"), files[name]); err != nil {
			return Archive{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return Archive{}, fmt.Errorf("write layer: %w", err)
	}
	if err := out.Close(); err != nil {
		return Archive{}, fmt.Errorf("write layer: %w", err)
	}
	l, err := hashLayer(lp)
	if err != nil {
		return Archive{}, err
	}
	cfg := imageConfig{Entrypoint: entrypoint, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}
	if err := writeArchive(path, ref, cfg, []layer{l}); err != nil {
		return Archive{}, err
	}
	return Archive{Path: path, Ref: ref}, nil
}
