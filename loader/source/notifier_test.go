package source

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock whose time moves only in step; timers due by then run
// in step, in deadline order, with Now at their deadline.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c        *fakeClock
	deadline time.Time
	active   bool
	f        func()
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, deadline: c.now.Add(d), active: true, f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.deadline, t.active = t.c.now.Add(d), true
	return was
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.active = false
	return was
}

// step moves the time on by d, running the timers that fall due.
func (c *fakeClock) step(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		var due *fakeTimer
		for _, t := range c.timers {
			if t.active && !t.deadline.After(end) && (due == nil || t.deadline.Before(due.deadline)) {
				due = t
			}
		}
		if due == nil {
			break
		}
		due.active = false
		if due.deadline.After(c.now) {
			c.now = due.deadline
		}
		c.mu.Unlock()
		due.f() // without the lock: fire reads Now
		c.mu.Lock()
	}
	c.now = end
	c.mu.Unlock()
}

// runNotifier pokes a notifier on a fake clock at the given times (offsets
// from the start, ascending) and returns when it fired, in 1 ms steps up to
// until.
func runNotifier(t *testing.T, pokes []time.Duration, until time.Duration) []time.Duration {
	t.Helper()
	c := &fakeClock{now: time.Unix(1_000_000, 0)}
	n := newNotifierClock(DefaultDebounce, c)
	defer n.stop()
	var fired []time.Duration
	for at := time.Duration(0); at <= until; at += time.Millisecond {
		for len(pokes) > 0 && pokes[0] <= at {
			n.poke()
			pokes = pokes[1:]
		}
		c.step(time.Millisecond)
		select {
		case <-n.ch:
			fired = append(fired, at+time.Millisecond)
		default:
		}
	}
	return fired
}

// every returns the times from start to end (exclusive), step apart.
func every(start, end, step time.Duration) []time.Duration {
	var out []time.Duration
	for at := start; at < end; at += step {
		out = append(out, at)
	}
	return out
}

// TestNotifierTiming checks, on a fake clock, when Changed fires: Settle
// after a lone change, Settle after the last of a quick burst, the debounce
// time after a change that follows a fire closely, and at most
// MaxWaitFactor debounce times into a storm that never goes quiet.
func TestNotifierTiming(t *testing.T) {
	const ms = time.Millisecond
	maxWait := MaxWaitFactor * DefaultDebounce
	for _, tc := range []struct {
		name  string
		pokes []time.Duration
		until time.Duration
		want  []time.Duration
	}{
		{"a lone change", []time.Duration{0}, 500 * ms, []time.Duration{Settle}},
		{"two lone changes", []time.Duration{0, 300 * ms}, 500 * ms, []time.Duration{Settle, 300*ms + Settle}},
		{"one edit's events together", []time.Duration{0, 2 * ms, 5 * ms}, 500 * ms, []time.Duration{5*ms + Settle}},
		{"a change soon after a fire", []time.Duration{0, 50 * ms}, 500 * ms, []time.Duration{Settle, 50*ms + DefaultDebounce}},
		{"a storm", every(0, 2500*ms, 2*ms), 3000 * ms,
			// Never 10 ms quiet: the maximum wait, then bursts that wait
			// for 100 ms of quiet, capped the same, and the tail's quiet.
			[]time.Duration{maxWait, 2 * maxWait, 2498*ms + DefaultDebounce}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := runNotifier(t, tc.pokes, tc.until); !slices.Equal(got, tc.want) {
				t.Errorf("fired at %v, want %v", got, tc.want)
			}
		})
	}
}

// TestNotifierTakeSince checks on a fake clock that takeSince returns the
// arrival of the oldest change not yet taken, across a fire, and forgets it.
func TestNotifierTakeSince(t *testing.T) {
	const ms = time.Millisecond
	start := time.Unix(1_000_000, 0)
	c := &fakeClock{now: start}
	n := newNotifierClock(DefaultDebounce, c)
	defer n.stop()
	if got := n.takeSince(); !got.IsZero() {
		t.Fatalf("before any change: %v, want zero", got)
	}
	n.poke()
	c.step(2 * ms)
	n.poke() // the same edit's second event
	c.step(Settle)
	select {
	case <-n.ch:
	default:
		t.Fatal("no fire after the burst settled")
	}
	c.step(5 * ms)
	if got := n.takeSince(); !got.Equal(start) {
		t.Errorf("after a burst: %v, want its first change at %v", got.Sub(start), time.Duration(0))
	}
	if got := n.takeSince(); !got.IsZero() {
		t.Errorf("taken twice: %v, want zero", got.Sub(start))
	}
	// A change that arrives before the last one was taken keeps the older time.
	c.step(300 * ms)
	n.poke()
	c.step(Settle)
	n.poke()
	if got, want := n.takeSince(), start.Add(2*ms+Settle+5*ms+300*ms); !got.Equal(want) {
		t.Errorf("two fires, one take: %v, want %v", got.Sub(start), want.Sub(start))
	}
}
