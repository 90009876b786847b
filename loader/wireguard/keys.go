package wireguard

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Key file names inside the key directory.
const (
	// KeyFile holds the private key, base64 as `wg genkey` writes it.
	KeyFile = "wireguard.key"
	// PreviousKeyFile holds the key RotateKey replaced.
	PreviousKeyFile = "wireguard.key.previous"
)

// LoadOrCreateKey returns the private key in dir/wireguard.key, creating dir
// (0700) and the key (0600) on the first call. The key is written to a
// temporary file, synced and then linked into place, so a crash never leaves a
// half-written key and two concurrent first calls agree on one key.
//
// A key file that does not parse is an error, never replaced: the peers know
// its public key. A key file open to group or others is an error too.
func LoadOrCreateKey(dir string) (wgtypes.Key, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return wgtypes.Key{}, fmt.Errorf("create key directory: %w", err)
	}
	path := filepath.Join(dir, KeyFile)
	k, err := readKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	k, err = wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("generate wireguard key: %w", err)
	}
	tmp, err := writeTemp(dir, k)
	if err != nil {
		return wgtypes.Key{}, err
	}
	defer os.Remove(tmp)
	// link, unlike rename, fails when another caller created the key first:
	// theirs is kept and read back.
	if err := os.Link(tmp, path); errors.Is(err, fs.ErrExist) {
		return readKey(path)
	} else if err != nil {
		return wgtypes.Key{}, fmt.Errorf("install key file %s: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		return wgtypes.Key{}, err
	}
	return k, nil
}

// LoadKey returns the private key in dir/wireguard.key, as LoadOrCreateKey
// would load it, without creating one.
func LoadKey(dir string) (wgtypes.Key, error) {
	return readKey(filepath.Join(dir, KeyFile))
}

// RotateKey replaces the private key in dir with a new one and keeps the one it
// replaces as dir/wireguard.key.previous (0600); it returns the new key. Both
// files are replaced atomically, previous first: a crash in between leaves the
// current key in place. The current key must exist and load as
// LoadOrCreateKey would load it.
func RotateKey(dir string) (wgtypes.Key, error) {
	path := filepath.Join(dir, KeyFile)
	old, err := readKey(path)
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("rotate wireguard key: %w", err)
	}
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("generate wireguard key: %w", err)
	}
	if err := replaceKey(dir, PreviousKeyFile, old); err != nil {
		return wgtypes.Key{}, err
	}
	if err := replaceKey(dir, KeyFile, k); err != nil {
		return wgtypes.Key{}, err
	}
	return k, nil
}

// readKey reads and parses a key file, refusing one open to group or others.
func readKey(path string) (wgtypes.Key, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("read key file: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return wgtypes.Key{}, fmt.Errorf("read key file %s: mode %04o lets group or others at the private key: chmod 600 %s", path, perm, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("read key file: %w", err)
	}
	k, err := wgtypes.ParseKey(strings.TrimSpace(string(b)))
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("parse key file %s: want one base64 key as `wg genkey` writes it (the file is left as it is: peers know its public key): %w", path, err)
	}
	return k, nil
}

// replaceKey writes k to dir/name atomically, over any file there.
func replaceKey(dir, name string, k wgtypes.Key) error {
	tmp, err := writeTemp(dir, k)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("install key file: %w", err)
	}
	return syncDir(dir)
}

// writeTemp writes k to a new 0600 file in dir, synced, and returns its path.
func writeTemp(dir string, k wgtypes.Key) (string, error) {
	f, err := os.CreateTemp(dir, "."+KeyFile+".*")
	if err != nil {
		return "", fmt.Errorf("create temporary key file: %w", err)
	}
	_, werr := f.WriteString(k.String() + "\n")
	if werr == nil {
		werr = f.Sync()
	}
	if err := f.Close(); werr == nil {
		werr = err
	}
	if werr != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("write temporary key file: %w", werr)
	}
	return f.Name(), nil
}

// syncDir makes a rename or link in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync key directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync key directory %s: %w", dir, err)
	}
	return nil
}
