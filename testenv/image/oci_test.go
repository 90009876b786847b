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
	cfg := imageConfig{Entrypoint: Entrypoint, Labels: Labels("v1")}
	var archives [][]byte
	for i, name := range []string{"a", "b"} {
		l, err := filesLayer(filepath.Join(dir, name+".layer"), map[string]string{"usr/local/bin/prog": src})
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, name+".oci.tar")
		if err := writeArchive(out, Ref("", "v1"), cfg, []layer{l}); err != nil {
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
		Config imageConfig `json:"config"`
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
