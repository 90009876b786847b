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

	"github.com/isthmus-dev/isthmus/testenv/filelock"
	"github.com/isthmus-dev/isthmus/testenv/programs"
)

// mmdebstrapArgs are mmdebstrap's options for the root filesystem:
// debian:trixie-slim's shape (minbase, no recommends, no manuals, no
// documentation but the copyrights, no translations: what debuerreotype's
// slim variant excludes) plus packages. mmdebstrap removes the apt lists and
// cache itself, as the Dockerfile's `rm -rf /var/lib/apt/lists/*` does.
func mmdebstrapArgs(packages []string) []string {
	return []string{
		"--mode=root", "--variant=minbase", "--format=tar",
		"--include=" + strings.Join(packages, ","),
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

// Trust: mmdebstrap checks the mirrors' Release signatures with the host's
// keyrings. Debian bookworm's debian-archive-keyring carries trixie's keys
// (debian-archive-trixie-*.gpg) since 2023.3+deb12u2, a stable update, so an
// up-to-date bookworm host needs nothing more; an older keyring fails here
// with apt's NO_PUBKEY in the error (apt-get install debian-archive-keyring).

// cacheKey names the cached Debian layer by everything that shapes it.
func cacheKey(packages, mirrors []string) string {
	h := sha256.New()
	fmt.Fprintf(h, "layer-format 1\nsuite %s\n", Suite)
	for _, a := range mmdebstrapArgs(packages) {
		fmt.Fprintf(h, "arg %s\n", a)
	}
	for _, m := range mirrors {
		fmt.Fprintf(h, "mirror %s\n", m)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Debian says what DebianLayer makes.
type Debian struct {
	// Packages are installed over the suite's minimal base.
	Packages []string
	// CacheDir holds the cached layers; "" is CacheDir().
	CacheDir string
	// Mirrors are apt sources lines; nil is DefaultMirrors.
	Mirrors []string
	// Log, when set, receives a line when mmdebstrap runs.
	Log func(format string, args ...any)
}

// DebianLayer returns a Debian Suite root filesystem with o.Packages as a
// layer: from the cache (a file per package list and mirrors under
// o.CacheDir), or made by mmdebstrap (as root, from Debian's mirrors: a few
// minutes) and then cached.
func DebianLayer(ctx context.Context, o Debian) (Layer, error) {
	if o.CacheDir == "" {
		o.CacheDir = CacheDir()
	}
	if o.Mirrors == nil {
		o.Mirrors = DefaultMirrors
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	path := filepath.Join(o.CacheDir, "image-debian-"+Suite+"-"+cacheKey(o.Packages, o.Mirrors)+".tar")
	if l, err := cachedLayer(path); err == nil {
		return l, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return Layer{}, err
	}
	if os.Geteuid() != 0 {
		return Layer{}, fmt.Errorf("make the Debian layer %s: mmdebstrap needs root", path)
	}
	if err := programs.Require("mmdebstrap"); err != nil {
		return Layer{}, fmt.Errorf("make the Debian layer: %w", err)
	}
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return Layer{}, fmt.Errorf("make the Debian layer: %w", err)
	}
	// One mmdebstrap per layer: another process (a parallel test, another
	// package's) may be making this one; then it is cached once we hold the lock.
	unlock, err := filelock.Lock(ctx, path+".lock", func() { o.Log("waiting for another process that is making %s", path) })
	if err != nil {
		return Layer{}, fmt.Errorf("make the Debian layer: %w", err)
	}
	defer unlock()
	if l, err := cachedLayer(path); err == nil {
		return l, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return Layer{}, err
	}
	tmp, err := os.MkdirTemp(o.CacheDir, "image-debian-tmp-")
	if err != nil {
		return Layer{}, fmt.Errorf("make the Debian layer: %w", err)
	}
	defer os.RemoveAll(tmp)
	raw := filepath.Join(tmp, "rootfs.tar")
	o.Log("mmdebstrap %s with %s (a few minutes, cached in %s)", Suite, strings.Join(o.Packages, " "), path)
	args := append(mmdebstrapArgs(o.Packages), "--quiet", Suite, raw)
	args = append(args, o.Mirrors...)
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	// mmdebstrap's temporary chroot goes beside the cache, not in a small /tmp.
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		return Layer{}, fmt.Errorf("mmdebstrap %s: %w\n%s", Suite, err, out)
	}
	clean := filepath.Join(tmp, "layer.tar")
	if err := containerLayer(raw, clean); err != nil {
		return Layer{}, err
	}
	if err := os.Rename(clean, path); err != nil {
		return Layer{}, fmt.Errorf("cache the Debian layer: %w", err)
	}
	return cachedLayer(path)
}

// cachedLayer describes the layer file at path (ErrNotExist when it is not
// cached), keeping its digest beside it so a cached build hashes nothing.
func cachedLayer(path string) (Layer, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Layer{}, err
	}
	sumPath := path + ".sha256"
	if b, err := os.ReadFile(sumPath); err == nil {
		if d := strings.TrimSpace(string(b)); len(d) == len("sha256:")+64 {
			return Layer{path: path, digest: d, size: fi.Size()}, nil
		}
	}
	l, err := hashLayer(path)
	if err != nil {
		return Layer{}, err
	}
	if err := os.WriteFile(sumPath, []byte(l.digest+"\n"), 0o644); err != nil {
		return Layer{}, fmt.Errorf("cache the layer digest: %w", err)
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
