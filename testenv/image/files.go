package image

import (
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
	var entries []Entry
	for _, d := range mountDirs {
		entries = append(entries, Entry{Name: d})
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		entries = append(entries, Entry{Name: strings.TrimPrefix(name, "/"), Src: files[name]})
	}
	l, err := WriteLayer(filepath.Join(tmp, "layer.tar"), entries)
	if err != nil {
		return Archive{}, fmt.Errorf("write image %s: %w", ref, err)
	}
	cfg := Config{Entrypoint: entrypoint, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}
	if err := WriteArchive(path, cfg, []Layer{l}, ref); err != nil {
		return Archive{}, err
	}
	return Archive{Path: path, Ref: ref}, nil
}
