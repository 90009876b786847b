package agent

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/isthmus-dev/isthmus/loader/health"
)

// Liveness timing: the loop turns at least every heartbeat; /healthz fails when
// it has not turned for staleAfter, or when Start has run for startTimeout.
const (
	heartbeat    = 5 * time.Second
	staleAfter   = 6 * heartbeat
	startTimeout = 5 * time.Minute
)

// Status is what an agent reports to /healthz and /readyz, and its health
// checker's peer states for metrics. It implements metrics.Status. Its methods
// are safe for concurrent use; a Status is created before Start so that the
// endpoints answer while the agent starts.
type Status struct {
	mu       sync.Mutex
	now      func() time.Time
	created  time.Time
	attached bool      // Start finished: programs attached, first sync done
	beat     time.Time // the loop last turned
	syncErr  error     // of the last sync
	rejected error     // of the last plan of this node
	podErr   error     // of the last pod interface scan or attach
	checker  *health.Checker
}

// NewStatus returns the Status of an agent that has not started yet.
func NewStatus() *Status { return newStatus(time.Now) }

func newStatus(now func() time.Time) *Status {
	return &Status{now: now, created: now()}
}

// Live returns nil while the agent is starting (for up to 5 minutes) or its
// loop turned within the last 30 seconds (a start that waits for this node's
// plan turns too, however long it waits).
func (s *Status) Live() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if !s.attached {
		if !s.beat.IsZero() && now.Sub(s.beat) <= staleAfter {
			return nil // waiting for this node's plan, and turning
		}
		if d := now.Sub(s.created); d > startTimeout {
			return fmt.Errorf("agent still starting after %v", d.Round(time.Second))
		}
		return nil
	}
	if d := now.Sub(s.beat); d > staleAfter {
		return fmt.Errorf("agent loop last turned %v ago", d.Round(time.Second))
	}
	return nil
}

// Ready returns nil when the programs are attached and the maps are in sync:
// the last sync succeeded, this node's plan was computed from the last objects
// read (objects set aside elsewhere do not count) and every pod interface is
// attached. Otherwise it says what is missing.
func (s *Status) Ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if !s.attached {
		errs = append(errs, errors.New("datapath not attached yet: first sync not done"))
	}
	if s.syncErr != nil {
		errs = append(errs, fmt.Errorf("last sync failed: %w", s.syncErr))
	}
	if s.rejected != nil {
		errs = append(errs, fmt.Errorf("this node cannot be planned, the last good state is in force: %w", s.rejected))
	}
	if s.podErr != nil {
		errs = append(errs, fmt.Errorf("pod interfaces pending: %w", s.podErr))
	}
	return errors.Join(errs...)
}

// Peers returns the health checker's peer states (nil without health checks).
func (s *Status) Peers() []health.PeerState {
	s.mu.Lock()
	c := s.checker
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.Peers()
}

func (s *Status) update(f func(s *Status)) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *Status) setAttached() { s.update(func(s *Status) { s.attached, s.beat = true, s.now() }) }
func (s *Status) turned()      { s.update(func(s *Status) { s.beat = s.now() }) }
func (s *Status) synced(err error) {
	s.update(func(s *Status) { s.syncErr = err })
}
func (s *Status) loaded(err error)  { s.update(func(s *Status) { s.rejected = err }) }
func (s *Status) podsErr(err error) { s.update(func(s *Status) { s.podErr = err }) }
func (s *Status) setChecker(c *health.Checker) {
	s.update(func(s *Status) { s.checker = c })
}
