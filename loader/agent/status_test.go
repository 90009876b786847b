package agent

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestStatus walks a Status through start, a failed sync, rejected objects, a
// pod interface that will not attach and a loop that stops turning.
func TestStatus(t *testing.T) {
	now := time.Unix(1000, 0)
	s := newStatus(func() time.Time { return now })
	wantErr := func(what string, err error, substr string) {
		t.Helper()
		switch {
		case substr == "" && err != nil:
			t.Errorf("%s: %v, want nil", what, err)
		case substr != "" && (err == nil || !strings.Contains(err.Error(), substr)):
			t.Errorf("%s: %v, want an error containing %q", what, err, substr)
		}
	}
	wantErr("live while starting", s.Live(), "")
	wantErr("ready while starting", s.Ready(), "not attached")
	now = now.Add(startTimeout + time.Second)
	wantErr("live after a start too long", s.Live(), "still starting")
	s.turned() // waiting for this node's plan: the loop turns
	wantErr("live while waiting for the plan", s.Live(), "")
	now = now.Add(staleAfter + time.Second)
	wantErr("live when the wait stopped turning", s.Live(), "still starting")

	s.synced(nil)
	s.setAttached()
	wantErr("live after start", s.Live(), "")
	wantErr("ready after start", s.Ready(), "")

	s.synced(errors.New("write routes: boom"))
	wantErr("ready after a failed sync", s.Ready(), "last sync failed: write routes: boom")
	s.synced(nil)
	s.loaded(errors.New("parse site.yaml: bad"))
	wantErr("ready when this node cannot be planned", s.Ready(), "cannot be planned")
	s.loaded(nil)
	s.podsErr(errors.New("attach pod-x: no"))
	wantErr("ready with a pod interface pending", s.Ready(), "pod interfaces pending")
	s.podsErr(nil)
	wantErr("ready again", s.Ready(), "")

	now = now.Add(staleAfter - time.Second)
	wantErr("live before stale", s.Live(), "")
	now = now.Add(2 * time.Second)
	wantErr("live when stale", s.Live(), "last turned")
	s.turned()
	wantErr("live after a turn", s.Live(), "")
	if p := s.Peers(); p != nil {
		t.Errorf("Peers without a checker = %v, want nil", p)
	}
	var nilStatus *Status
	nilStatus.synced(nil) // a nil Status records nothing
}
