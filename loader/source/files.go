package source

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/isthmus-dev/isthmus/loader/objects"
)

// Files is the source of file mode: every *.yaml and *.yml file directly in
// one directory, read with objects.LoadDir, watched with fsnotify.
type Files struct {
	dir    string
	rules  objects.Rules
	w      *fsnotify.Watcher
	n      *notifier
	log    *slog.Logger
	done   chan struct{}
	closed chan struct{}
	once   sync.Once
	blind  atomic.Bool // the watcher is gone: see Generation
}

// NewFiles watches dir; Changed fires after a file in it was created,
// written, removed or renamed: Settle after a lone change, debounce (0:
// DefaultDebounce) of quiet after a burst (see notifier). Snapshot checks
// the objects against rules too. log (nil: slog.Default) gets watch errors.
func NewFiles(dir string, rules objects.Rules, debounce time.Duration, log *slog.Logger) (*Files, error) {
	if log == nil {
		log = slog.Default()
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch objects: %w", err)
	}
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, fmt.Errorf("watch objects %s: %w", dir, err)
	}
	f := &Files{dir: dir, rules: rules, w: w, n: newNotifier(debounce), log: log, done: make(chan struct{}), closed: make(chan struct{})}
	go f.watch()
	return f, nil
}

func (f *Files) watch() {
	defer close(f.closed)
	for {
		select {
		case <-f.done:
			return
		case ev, ok := <-f.w.Events:
			if !ok {
				f.log.Error("watch objects: watcher closed; relying on periodic resyncs", "dir", f.dir)
				f.blind.Store(true)
				return
			}
			if ev.Op&(fsnotify.Create|fsnotify.Write|fsnotify.Remove|fsnotify.Rename) != 0 {
				f.n.poke()
			}
		case err, ok := <-f.w.Errors:
			if !ok {
				return
			}
			f.log.Error("watch objects", "dir", f.dir, "err", err)
		}
	}
}

// Snapshot reads and validates the directory; invalid objects are set aside
// (objects.Rules.LoadDirSettingAside), only a directory that cannot be read
// fails.
func (f *Files) Snapshot() (*objects.Set, []objects.Warning, error) {
	set, warns, err := f.rules.LoadDirSettingAside(f.dir)
	if err != nil {
		return nil, warns, fmt.Errorf("load objects %s: %w", f.dir, err)
	}
	return set, warns, nil
}

// Generation counts the changes seen in the directory (see Generations).
// Once the watcher is gone every call returns a new value: nothing tells
// whether the files changed, so every resync reads them.
func (f *Files) Generation() uint64 {
	if f.blind.Load() {
		return f.n.gen.Add(1)
	}
	return f.n.gen.Load()
}

// TakeSince returns when the oldest file event not yet taken arrived (see
// ChangeTimes).
func (f *Files) TakeSince() time.Time { return f.n.takeSince() }

// Changed fires after files in the directory changed.
func (f *Files) Changed() <-chan struct{} { return f.n.ch }

// Close stops watching.
func (f *Files) Close() error {
	var err error
	f.once.Do(func() {
		close(f.done)
		f.n.stop()
		err = f.w.Close()
		<-f.closed
	})
	return err
}
