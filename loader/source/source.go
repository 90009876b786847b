// Package source hands the agent its objects: a validated objects.Set and a
// signal when it may have changed. Files reads a directory of YAML (file
// mode); Kubernetes reads Nodes and the isthmus resources through client-go
// informers. Both validate with the loader/objects rules, so the plan sees the
// same kind of Set whichever the source.
package source

import (
	"sync"
	"time"

	"github.com/isthmus-dev/isthmus/loader/objects"
)

// Source is where the agent's objects come from.
type Source interface {
	// Snapshot returns the current objects, validated, with invalid objects
	// set aside in the Set's Rejected. An error (an unreadable directory, a
	// cache that does not convert) means the caller should keep what it has;
	// a later Snapshot may succeed.
	Snapshot() (*objects.Set, []objects.Warning, error)
	// Changed receives a value, debounced and coalesced, after the objects
	// may have changed. It is never closed.
	Changed() <-chan struct{}
	// Close stops watching. Snapshot must not be called after Close.
	Close() error
}

// DefaultDebounce is the quiet time after a change before Changed fires.
const DefaultDebounce = 100 * time.Millisecond

// notifier turns bursts of pokes into one value on a channel: the value is
// sent once no poke has come for the debounce time, and at most one value
// waits on the channel.
type notifier struct {
	ch       chan struct{}
	debounce time.Duration
	mu       sync.Mutex
	timer    *time.Timer
	stopped  bool
}

func newNotifier(debounce time.Duration) *notifier {
	if debounce <= 0 {
		debounce = DefaultDebounce
	}
	return &notifier{ch: make(chan struct{}, 1), debounce: debounce}
}

// poke (re)starts the debounce timer.
func (n *notifier) poke() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return
	}
	if n.timer == nil {
		n.timer = time.AfterFunc(n.debounce, n.fire)
		return
	}
	n.timer.Reset(n.debounce)
}

func (n *notifier) fire() {
	select {
	case n.ch <- struct{}{}:
	default: // one is already waiting
	}
}

func (n *notifier) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stopped = true
	if n.timer != nil {
		n.timer.Stop()
	}
}
