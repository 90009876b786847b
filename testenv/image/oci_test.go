package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestArchiveReproducibleAndConsistent: the same inputs give the same
// archive byte for byte, and in it every blob is named by its SHA-256, the
// index names the manifest, the manifest the config and the layers, and the
// config's diff IDs are the (uncompressed) layers' digests.
func TestArchiveReproducibleAndConsistent(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "prog")
	if err := os.WriteFile(src, []byte("#!/bin/sh\necho hi\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Entrypoint: Entrypoint, Labels: Labels("v1")}
	var archives [][]byte
	for i, name := range []string{"a", "b"} {
		l, err := filesLayer(filepath.Join(dir, name+".layer"), map[string]string{"usr/local/bin/prog": src})
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, name+".oci.tar")
		if err := WriteArchive(out, cfg, []Layer{l}, Ref("", "v1")); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		archives = append(archives, b)
		if i == 1 && !bytes.Equal(archives[0], b) {
			t.Fatal("two archives of the same inputs differ")
		}
	}

	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(archives[0]))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = b
	}
	blob := func(digest string) []byte {
		t.Helper()
		b, ok := files["blobs/sha256/"+digest[len("sha256:"):]]
		if !ok {
			t.Fatalf("no blob %s in the archive", digest)
		}
		return b
	}
	for name, b := range files {
		if d, ok := bytes.CutPrefix([]byte(name), []byte("blobs/sha256/")); ok && len(d) > 0 {
			sum := sha256.Sum256(b)
			if hex.EncodeToString(sum[:]) != string(d) {
				t.Errorf("blob %s has SHA-256 %x", name, sum)
			}
		}
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v, %d manifests:\n%s", err, len(index.Manifests), files["index.json"])
	}
	if got := index.Manifests[0].Annotations["io.containerd.image.name"]; got != "docker.io/library/isthmus:v1" {
		t.Errorf("index: image name %q", got)
	}
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if err := json.Unmarshal(blob(index.Manifests[0].Digest), &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("manifest: %v, %d layers", err, len(manifest.Layers))
	}
	var config struct {
		Config Config `json:"config"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(blob(manifest.Config.Digest), &config); err != nil {
		t.Fatal(err)
	}
	if len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != manifest.Layers[0].Digest {
		t.Errorf("config diff IDs %v, layer digest %s", config.RootFS.DiffIDs, manifest.Layers[0].Digest)
	}
	if len(config.Config.Entrypoint) != 1 || config.Config.Entrypoint[0] != "isthmus" || config.Config.Labels["org.opencontainers.image.version"] != "v1" {
		t.Errorf("config: %+v", config.Config)
	}
	lr := tar.NewReader(bytes.NewReader(blob(manifest.Layers[0].Digest)))
	h, err := lr.Next()
	if err != nil || h.Name != "usr/local/bin/prog" || h.Mode != 0o755 || h.Uid != 0 {
		t.Errorf("layer's first entry: %+v, %v", h, err)
	}
}

// TestWriteLayerEntriesAndNames: WriteLayer writes directories, symbolic
// links, files from disk and from memory with their modes, root-owned; an
// archive of several names has an index entry for each, all naming the
// same manifest.
func TestWriteLayerEntriesAndNames(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "prog")
	if err := os.WriteFile(src, []byte("program"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := WriteLayer(filepath.Join(dir, "l.tar"), []Entry{
		{Name: "uploads/"},
		{Name: "prog", Src: src},
		{Name: "prog-2", Link: "prog"},
		{Name: "etc/passwd", Data: []byte("root:x:0:0::/:/bin/sh\n"), Mode: 0o644},
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		typ  byte
		mode int64
		link string
		data string
	}
	got := map[string]entry{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: owner %d:%d", h.Name, h.Uid, h.Gid)
		}
		data, _ := io.ReadAll(tr)
		got[h.Name] = entry{h.Typeflag, h.Mode, h.Linkname, string(data)}
	}
	want := map[string]entry{
		"uploads/":   {tar.TypeDir, 0o755, "", ""},
		"prog":       {tar.TypeReg, 0o755, "", "program"},
		"prog-2":     {tar.TypeSymlink, 0o777, "prog", ""},
		"etc/passwd": {tar.TypeReg, 0o644, "", "root:x:0:0::/:/bin/sh\n"},
	}
	if len(got) != len(want) {
		t.Errorf("layer has %d entries, want %d: %v", len(got), len(want), got)
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: %+v, want %+v", name, got[name], w)
		}
	}

	out := filepath.Join(dir, "a.oci.tar")
	refs := []string{"registry.example/a/prog:1.0", "registry.example/a/prog:0.9"}
	if err := WriteArchive(out, Config{Entrypoint: []string{"/prog"}, User: "65535:65535"}, []Layer{l}, refs...); err != nil {
		t.Fatal(err)
	}
	if err := WriteArchive(filepath.Join(dir, "none.oci.tar"), Config{}, []Layer{l}); err == nil {
		t.Error("WriteArchive without a name succeeded")
	}
	ab, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	tr = tar.NewReader(bytes.NewReader(ab))
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no index.json in the archive: %v", err)
		}
		if h.Name != "index.json" {
			continue
		}
		var index struct {
			Manifests []descriptor `json:"manifests"`
		}
		data, _ := io.ReadAll(tr)
		if err := json.Unmarshal(data, &index); err != nil {
			t.Fatal(err)
		}
		if len(index.Manifests) != 2 {
			t.Fatalf("index has %d manifests, want 2:\n%s", len(index.Manifests), data)
		}
		for i, m := range index.Manifests {
			if m.Annotations["io.containerd.image.name"] != refs[i] || m.Digest != index.Manifests[0].Digest {
				t.Errorf("index entry %d: %+v, want name %s and digest %s", i, m, refs[i], index.Manifests[0].Digest)
			}
		}
		return
	}
}
