package wireguard

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func TestLoadOrCreateKeyCreatesThenLoads(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "wg") // two levels missing
	k, err := LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if k == (wgtypes.Key{}) {
		t.Fatal("LoadOrCreateKey returned the zero key")
	}
	assertMode(t, dir, fs.ModeDir|0o700)
	path := filepath.Join(dir, KeyFile)
	assertMode(t, path, 0o600)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), k.String()+"\n"; got != want {
		t.Errorf("key file holds %q, want %q (base64 and a newline, as wg genkey writes)", got, want)
	}
	again, err := LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if again != k {
		t.Errorf("second LoadOrCreateKey returned another key: %v, want %v", again, k)
	}
	assertOnlyFiles(t, dir, KeyFile)
}

func TestLoadOrCreateKeyReadsWgGenkeyOutput(t *testing.T) {
	dir := t.TempDir()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, KeyFile), []byte(k.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got != k {
		t.Errorf("loaded %v, want the key in the file %v", got, k)
	}
}

func TestLoadOrCreateKeyRefusesGarbage(t *testing.T) {
	for _, content := range []string{"", "not a key\n", "aGVsbG8=\n"} {
		dir := t.TempDir()
		path := filepath.Join(dir, KeyFile)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadOrCreateKey(dir)
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("content %q: err = %v, want an error naming %s", content, err, path)
		}
		b, _ := os.ReadFile(path)
		if string(b) != content {
			t.Errorf("content %q: the file was changed to %q; it must be left alone", content, b)
		}
	}
}

func TestLoadOrCreateKeyRefusesOpenModes(t *testing.T) {
	for _, mode := range []os.FileMode{0o640, 0o604, 0o644, 0o660} {
		dir := t.TempDir()
		path := filepath.Join(dir, KeyFile)
		k, _ := wgtypes.GeneratePrivateKey()
		if err := os.WriteFile(path, []byte(k.String()+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err := LoadOrCreateKey(dir)
		if err == nil || !strings.Contains(err.Error(), "chmod 600 "+path) {
			t.Errorf("mode %04o: err = %v, want one telling to chmod 600 %s", mode, err, path)
		}
	}
}

// Several agents starting at once on an empty directory must end up with the
// one key the file holds, not each with its own.
func TestLoadOrCreateKeyConcurrentFirstCalls(t *testing.T) {
	dir := t.TempDir()
	const n = 8
	keys := make([]wgtypes.Key, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { keys[i], errs[i] = LoadOrCreateKey(dir) })
	}
	wg.Wait()
	onDisk, err := LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if errs[i] != nil {
			t.Errorf("call %d: %v", i, errs[i])
		} else if keys[i] != onDisk {
			t.Errorf("call %d returned %v, but the file holds %v", i, keys[i], onDisk)
		}
	}
	assertOnlyFiles(t, dir, KeyFile)
}

func TestRotateKeyKeepsPrevious(t *testing.T) {
	dir := t.TempDir()
	first, err := LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	second, err := RotateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if second == first {
		t.Fatal("RotateKey returned the old key")
	}
	assertKeyFile(t, filepath.Join(dir, KeyFile), second)
	assertKeyFile(t, filepath.Join(dir, PreviousKeyFile), first)
	if got, err := LoadOrCreateKey(dir); err != nil || got != second {
		t.Errorf("LoadOrCreateKey after rotation = %v, %v; want the new key %v", got, err, second)
	}
	third, err := RotateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	assertKeyFile(t, filepath.Join(dir, KeyFile), third)
	assertKeyFile(t, filepath.Join(dir, PreviousKeyFile), second)
	assertOnlyFiles(t, dir, KeyFile, PreviousKeyFile)
}

func TestRotateKeyNeedsAKey(t *testing.T) {
	_, err := RotateKey(t.TempDir())
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("RotateKey on an empty directory: err = %v, want one wrapping fs.ErrNotExist", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, KeyFile), []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := RotateKey(dir); err == nil {
		t.Error("RotateKey over an unparsable key succeeded; it must refuse (the previous key would be lost)")
	}
	if _, err := os.Stat(filepath.Join(dir, PreviousKeyFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a failed rotation left %s (stat: %v)", PreviousKeyFile, err)
	}
}

// assertKeyFile checks path holds k with mode 0600.
func assertKeyFile(t *testing.T, path string, k wgtypes.Key) {
	t.Helper()
	assertMode(t, path, 0o600)
	got, err := readKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != k {
		t.Errorf("%s holds %v, want %v", path, got, k)
	}
}

func assertMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (fs.ModeDir | fs.ModePerm); got != want {
		t.Errorf("%s: mode %v, want %v", path, got, want)
	}
}

// assertOnlyFiles checks dir holds exactly names: no temporary file is left.
func assertOnlyFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if strings.Join(got, " ") != strings.Join(names, " ") {
		t.Errorf("%s holds %v, want %v", dir, got, names)
	}
}
