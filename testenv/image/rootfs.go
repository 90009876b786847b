package image

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/isthmus-dev/isthmus/testenv/programs"
)

// mmdebstrapArgs are mmdebstrap's options for the root filesystem:
// debian:trixie-slim's shape (minbase, no recommends, no manuals, no
// documentation but the copyrights, no translations: what debuerreotype's
// slim variant excludes) plus Packages. mmdebstrap removes the apt lists and
// cache itself, as the Dockerfile's `rm -rf /var/lib/apt/lists/*` does.
func mmdebstrapArgs() []string {
	return []string{
		"--mode=root", "--variant=minbase", "--format=tar",
		"--include=" + strings.Join(Packages, ","),
		`--aptopt=APT::Install-Recommends "false"`,
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/groff/*",
		"--dpkgopt=path-exclude=/usr/share/info/*",
		"--dpkgopt=path-exclude=/usr/share/lintian/*",
		"--dpkgopt=path-exclude=/usr/share/linda/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
	}
}

// cacheKey names the cached Debian layer by everything that shapes it.
func cacheKey(mirrors []string) string {
	h := sha256.New()
	fmt.Fprintf(h, "layer-format 1\nsuite %s\n", Suite)
	for _, a := range mmdebstrapArgs() {
		fmt.Fprintf(h, "arg %s\n", a)
	}
	for _, m := range mirrors {
		fmt.Fprintf(h, "mirror %s\n", m)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// baseLayer returns the Debian layer, from the cache or made by mmdebstrap
// (as root) and then cached.
func baseLayer(ctx context.Context, o Options) (layer, error) {
	path := filepath.Join(o.CacheDir, "image-debian-"+Suite+"-"+cacheKey(o.Mirrors)+".tar")
	if l, err := cachedLayer(path); err == nil {
		return l, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return layer{}, err
	}
	if os.Geteuid() != 0 {
		return layer{}, fmt.Errorf("make the Debian layer %s: mmdebstrap needs root", path)
	}
	if err := programs.Require("mmdebstrap"); err != nil {
		return layer{}, fmt.Errorf("make the Debian layer: %w", err)
	}
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return layer{}, fmt.Errorf("make the Debian layer: %w", err)
	}
	tmp, err := os.MkdirTemp(o.CacheDir, "image-debian-tmp-")
	if err != nil {
		return layer{}, fmt.Errorf("make the Debian layer: %w", err)
	}
	defer os.RemoveAll(tmp)
	raw := filepath.Join(tmp, "rootfs.tar")
	o.Log("mmdebstrap %s with %s (a few minutes, cached in %s)", Suite, strings.Join(Packages, " "), path)
	args := append(mmdebstrapArgs(), "--quiet", Suite, raw)
	args = append(args, o.Mirrors...)
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	// mmdebstrap's temporary chroot goes beside the cache, not in a small /tmp.
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		return layer{}, fmt.Errorf("mmdebstrap %s: %w\n%s", Suite, err, out)
	}
	clean := filepath.Join(tmp, "layer.tar")
	if err := containerLayer(raw, clean); err != nil {
		return layer{}, err
	}
	if err := os.Rename(clean, path); err != nil {
		return layer{}, fmt.Errorf("cache the Debian layer: %w", err)
	}
	return cachedLayer(path)
}

// cachedLayer describes the layer file at path (ErrNotExist when it is not
// cached), keeping its digest beside it so a cached build hashes nothing.
func cachedLayer(path string) (layer, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return layer{}, err
	}
	sumPath := path + ".sha256"
	if b, err := os.ReadFile(sumPath); err == nil {
		if d := strings.TrimSpace(string(b)); len(d) == len("sha256:")+64 {
			return layer{path: path, digest: d, size: fi.Size()}, nil
		}
	}
	l, err := hashLayer(path)
	if err != nil {
		return layer{}, err
	}
	if err := os.WriteFile(sumPath, []byte(l.digest+"\n"), 0o644); err != nil {
		return layer{}, fmt.Errorf("cache the layer digest: %w", err)
	}
	return l, nil
}

// containerLayer copies mmdebstrap's tarball to a container layer: paths
// without "./", and /dev empty (the runtime mounts its own /dev; a layer of
// device nodes is what image builders leave out).
func containerLayer(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("read the root filesystem: %w", err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return fmt.Errorf("write the Debian layer: %w", err)
	}
	defer out.Close()
	tr := tar.NewReader(in)
	tw := tar.NewWriter(out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read the root filesystem: %w", err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		if name == "" {
			continue
		}
		if strings.HasPrefix(name, "dev/") && name != "dev/" {
			continue
		}
		h.Name = name
		if h.Typeflag == tar.TypeLink {
			h.Linkname = strings.TrimPrefix(h.Linkname, "./")
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("write the Debian layer: %s: %w", name, err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return fmt.Errorf("write the Debian layer: %s: %w", name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write the Debian layer: %w", err)
	}
	return out.Close()
}
