package image

// The OCI writer: layers as uncompressed tarballs on disk, and image layouts
// in a tar that `ctr images import` reads. The isthmus image (Build), the
// container runtime tests' images (testenv/cri) and Kubernetes' test images
// (testenv/kube/e2eimages) are all written here.

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Media types of the OCI image spec (image-spec v1.0).
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// epoch is every time the builder writes: the same inputs give the same digests.
var epoch = time.Unix(0, 0).UTC()

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Layer is an uncompressed layer tarball on disk; its digest is its diff ID.
type Layer struct {
	path   string
	digest string
	size   int64
}

// Path is the layer's tarball.
func (l Layer) Path() string { return l.path }

// Config is the part of the OCI image config the builders set: the
// Dockerfile's ENTRYPOINT, ENV and LABEL, and CMD and USER for images
// whose Dockerfile has them.
type Config struct {
	Entrypoint []string          `json:"Entrypoint"`
	Cmd        []string          `json:"Cmd,omitempty"`
	Env        []string          `json:"Env"`
	User       string            `json:"User,omitempty"`
	Labels     map[string]string `json:"Labels"`
}

func hashLayer(path string) (Layer, error) {
	f, err := os.Open(path)
	if err != nil {
		return Layer{}, fmt.Errorf("hash layer: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return Layer{}, fmt.Errorf("hash layer %s: %w", path, err)
	}
	return Layer{path: path, digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), size: n}, nil
}

// filesLayer writes a layer at path holding files (path in the image,
// without the leading slash, to a file on disk), each root-owned, mode 0755.
func filesLayer(path string, files map[string]string) (Layer, error) {
	var entries []Entry
	for _, name := range slices.Sorted(maps.Keys(files)) {
		entries = append(entries, Entry{Name: name, Src: files[name]})
	}
	return WriteLayer(path, entries)
}

// Entry is one root-owned entry of a layer: a directory when Name ends in
// "/", a symbolic link to Link when Link is set, else a regular file whose
// content is the file Src on disk, or Data when Src is "".
type Entry struct {
	Name string // the path in the image, without the leading slash
	Mode int64  // permission bits; 0 is 0755
	Src  string
	Data []byte
	Link string
}

// WriteLayer writes a layer at path holding entries, in their order (a
// directory before what it holds), each with the fixed time of every
// builder's output: the same entries give the same digest.
func WriteLayer(path string, entries []Entry) (Layer, error) {
	out, err := os.Create(path)
	if err != nil {
		return Layer{}, fmt.Errorf("write layer: %w", err)
	}
	defer out.Close()
	tw := tar.NewWriter(out)
	for _, e := range entries {
		if err := addEntry(tw, e); err != nil {
			return Layer{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return Layer{}, fmt.Errorf("write layer: %w", err)
	}
	if err := out.Close(); err != nil {
		return Layer{}, fmt.Errorf("write layer: %w", err)
	}
	return hashLayer(path)
}

func addEntry(tw *tar.Writer, e Entry) error {
	h := &tar.Header{Typeflag: tar.TypeReg, Name: e.Name, Mode: e.Mode, ModTime: epoch, Format: tar.FormatPAX}
	if h.Mode == 0 {
		h.Mode = 0o755
	}
	var content io.Reader
	switch {
	case strings.HasSuffix(e.Name, "/"):
		h.Typeflag = tar.TypeDir
	case e.Link != "":
		h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.Link, 0o777
	case e.Src != "":
		f, err := os.Open(e.Src)
		if err != nil {
			return fmt.Errorf("write layer: %w", err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("write layer: %w", err)
		}
		h.Size, content = fi.Size(), f
	default:
		h.Size, content = int64(len(e.Data)), bytes.NewReader(e.Data)
	}
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("write layer %s: %w", e.Name, err)
	}
	if content != nil {
		if _, err := io.Copy(tw, content); err != nil {
			return fmt.Errorf("write layer %s: %w", e.Name, err)
		}
	}
	return nil
}

// WriteArchive writes an OCI image layout as a tar at path, as
// `ctr images import` reads it: one image for this machine's platform with
// cfg and layers, bottom first, under each of refs (an index entry each,
// annotation io.containerd.image.name; org.opencontainers.image.ref.name
// holds its tag for other tools). A ref is stored as given: containerd
// imports "isthmus:dev" as that, so a name a kubelet looks up
// ("docker.io/library/isthmus:dev") must be given whole (Ref).
func WriteArchive(path string, cfg Config, layers []Layer, refs ...string) error {
	if len(refs) == 0 {
		return fmt.Errorf("write image archive %s: no image name", path)
	}
	diffIDs := make([]string, len(layers))
	layerDescs := make([]descriptor, len(layers))
	for i, l := range layers {
		diffIDs[i] = l.digest // uncompressed: the diff ID is the digest
		layerDescs[i] = descriptor{MediaType: mediaLayer, Digest: l.digest, Size: l.size}
	}
	config, err := jsonBlob(mediaConfig, map[string]any{
		"created":      epoch.Format(time.RFC3339),
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       cfg,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	if err != nil {
		return err
	}
	manifest, err := jsonBlob(mediaManifest, map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        config.desc,
		"layers":        layerDescs,
		"annotations":   map[string]string{"org.opencontainers.image.version": cfg.Labels["org.opencontainers.image.version"]},
	})
	if err != nil {
		return err
	}
	var entries []descriptor
	for _, ref := range refs {
		_, tag := splitRef(ref)
		entry := manifest.desc
		entry.Annotations = map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag}
		entry.Platform = &platform{Architecture: runtime.GOARCH, OS: "linux"}
		entries = append(entries, entry)
	}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mediaIndex, "manifests": entries})
	if err != nil {
		return fmt.Errorf("write image index: %w", err)
	}

	// A temporary file of its own: two builds of the same archive at once
	// (two tests) each rename a complete one into place.
	out, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-")
	if err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	tmp := out.Name()
	defer os.Remove(tmp)
	defer out.Close()
	tw := tar.NewWriter(out)
	put := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "blobs/", Mode: 0o755, ModTime: epoch}); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "blobs/sha256/", Mode: 0o755, ModTime: epoch}); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	for _, l := range layers {
		if err := addBlobFile(tw, l); err != nil {
			return err
		}
	}
	for _, f := range []struct {
		name string
		data []byte
	}{
		{blobPath(config.desc.Digest), config.data},
		{blobPath(manifest.desc.Digest), manifest.data},
		{"index.json", index},
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
	} {
		if err := put(f.name, f.data); err != nil {
			return fmt.Errorf("write image archive: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	return nil
}

// addBlobFile copies a layer into the archive's blobs, checking that the
// file still has the digest the manifest names.
func addBlobFile(tw *tar.Writer, l Layer) error {
	f, err := os.Open(l.path)
	if err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	defer f.Close()
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: blobPath(l.digest), Mode: 0o644, Size: l.size, ModTime: epoch}); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tw, h), f); err != nil {
		return fmt.Errorf("write image archive: %s: %w", filepath.Base(l.path), err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != l.digest {
		return fmt.Errorf("write image archive: %s has digest %s, want %s: remove it (and its .sha256) to rebuild", l.path, got, l.digest)
	}
	return nil
}

type blob struct {
	desc descriptor
	data []byte
}

func jsonBlob(mediaType string, v any) (blob, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return blob{}, fmt.Errorf("marshal %s: %w", mediaType, err)
	}
	sum := sha256.Sum256(b)
	return blob{desc: descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(b))}, data: b}, nil
}

func blobPath(digest string) string { return "blobs/sha256/" + digest[len("sha256:"):] }

// splitRef splits name:tag at the tag's colon.
func splitRef(ref string) (name, tag string) {
	i := len(ref) - 1
	for i >= 0 && ref[i] != ':' && ref[i] != '/' {
		i--
	}
	if i < 0 || ref[i] != ':' {
		return ref, "latest"
	}
	return ref[:i], ref[i+1:]
}
