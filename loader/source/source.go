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

// DefaultDebounce is the quiet time a burst of changes must leave before
// Changed fires.
const DefaultDebounce = 100 * time.Millisecond

// Settle is how long Changed waits after a change that comes after a quiet
// time: long enough for the writes of one edit (a file's create and write
// events, an informer's add and update) to arrive together, short against
// the rest of a change's way to the maps (the snapshot, the plan, the map
// writes: isthmus_event_to_maps_seconds). Changes that follow within the
// debounce time are a burst and wait for quiet.
const Settle = 10 * time.Millisecond

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

// ChangeTimes is implemented by sources that know when a change reached
// them (the file watcher's event, the informer's handler call). TakeSince
// returns when the oldest change not yet taken arrived and forgets it; zero
// when none arrived since the last call. The agent takes it before each
// Snapshot and measures from it to its last map write
// (isthmus_event_to_maps_seconds).
type ChangeTimes interface {
	TakeSince() time.Time
}

// clock is the time the notifier reads and the timers it starts; tests give
// it a fake one.
type clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) timer
}

type timer interface {
	Reset(d time.Duration) bool
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) timer { return time.AfterFunc(d, f) }

// notifier turns bursts of pokes into one value on a channel. A burst fires
// once no poke has come for its quiet time, or MaxWaitFactor debounce times
// after its first poke, whichever is first. Its quiet time is Settle when it
// began after a quiet time (nothing pending, no fire for the debounce time):
// a lone change goes through at once. A burst that begins within the
// debounce time of the last fire is a storm going on, and waits the debounce
// time. At most one value waits on the channel.
type notifier struct {
	ch       chan struct{}
	debounce time.Duration
	settle   time.Duration
	clock    clock
	gen      atomic.Uint64 // pokes so far
	mu       sync.Mutex
	timer    timer
	first    time.Time     // of the pending burst; zero when none is pending
	quiet    time.Duration // of the pending burst
	lastFire time.Time
	since    time.Time // arrival of the oldest poke not yet taken (takeSince)
	stopped  bool
}

func newNotifier(debounce time.Duration) *notifier {
	return newNotifierClock(debounce, realClock{})
}

func newNotifierClock(debounce time.Duration, c clock) *notifier {
	if debounce <= 0 {
		debounce = DefaultDebounce
	}
	return &notifier{ch: make(chan struct{}, 1), debounce: debounce, settle: min(Settle, debounce), clock: c}
}

// poke counts a change and (re)starts the timer for the burst's quiet time,
// never past the burst's maximum wait.
func (n *notifier) poke() {
	n.gen.Add(1)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return
	}
	now := n.clock.Now()
	if n.since.IsZero() {
		n.since = now
	}
	if n.first.IsZero() {
		n.first = now
		n.quiet = n.debounce
		if n.lastFire.IsZero() || now.Sub(n.lastFire) >= n.debounce {
			n.quiet = n.settle
		}
	}
	wait := max(min(n.quiet, n.first.Add(MaxWaitFactor*n.debounce).Sub(now)), 0)
	if n.timer == nil {
		n.timer = n.clock.AfterFunc(wait, n.fire)
	} else {
		n.timer.Reset(wait)
	}
}

// takeSince returns the arrival of the oldest poke since the last call, or
// zero, and forgets it (see ChangeTimes).
func (n *notifier) takeSince() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := n.since
	n.since = time.Time{}
	return t
}

func (n *notifier) fire() {
	n.mu.Lock()
	n.first = time.Time{}
	n.lastFire = n.clock.Now()
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
