// Package source hands the agent its objects: a validated objects.Set and a
// signal when it may have changed. Files reads a directory of YAML (file
// mode); Kubernetes reads Nodes and the isthmus resources through client-go
// informers. Both validate with the loader/objects rules, so the plan sees the
// same kind of Set whichever the source.
package source

import (
	"sync"
	"sync/atomic"
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

// MaxWaitFactor bounds a burst: Changed fires at the latest this many
// debounce times after the first change of a burst, however busy the
// objects are (5,000 Nodes changing every 10 s never leave 100 ms quiet).
const MaxWaitFactor = 10

// Generations is implemented by sources that count their changes: a
// Generation equal to an earlier one means nothing changed in between, so a
// periodic resync may reuse the plan it computed then.
type Generations interface {
	Generation() uint64
}

// notifier turns bursts of pokes into one value on a channel: the value is
// sent once no poke has come for the debounce time, or MaxWaitFactor
// debounce times after the first poke of the burst, and at most one value
// waits on the channel.
type notifier struct {
	ch       chan struct{}
	debounce time.Duration
	gen      atomic.Uint64 // pokes so far
	mu       sync.Mutex
	timer    *time.Timer
	first    time.Time // of the pending burst; zero when none is pending
	stopped  bool
}

func newNotifier(debounce time.Duration) *notifier {
	if debounce <= 0 {
		debounce = DefaultDebounce
	}
	return &notifier{ch: make(chan struct{}, 1), debounce: debounce}
}

// poke counts a change and (re)starts the debounce timer, unless the burst
// has waited its maximum already.
func (n *notifier) poke() {
	n.gen.Add(1)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return
	}
	now := time.Now()
	switch {
	case n.timer == nil:
		n.first = now
		n.timer = time.AfterFunc(n.debounce, n.fire)
	case n.first.IsZero():
		n.first = now
		n.timer.Reset(n.debounce)
	default:
		// Never past the burst's deadline: fire then at the latest.
		wait := min(n.debounce, n.first.Add(MaxWaitFactor*n.debounce).Sub(now))
		n.timer.Reset(max(wait, 0))
	}
}

func (n *notifier) fire() {
	n.mu.Lock()
	n.first = time.Time{}
	n.mu.Unlock()
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
