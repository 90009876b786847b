package filelock

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestLockSaysWhenWaiting: a second taker of the lock is told once that it
// waits, and gives up when its context ends; once the first releases it, the
// next taker gets it without waiting.
func TestLockSaysWhenWaiting(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".lock")
	unlock, err := Lock(context.Background(), path, func() { t.Error("first taker told to wait") })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	waits := 0
	if _, err := Lock(ctx, path, func() { waits++ }); err == nil {
		t.Fatal("second taker got the lock while the first held it")
	}
	if waits != 1 {
		t.Errorf("told to wait %d times, want 1", waits)
	}
	unlock()
	again, err := Lock(context.Background(), path, func() { t.Error("told to wait for a released lock") })
	if err != nil {
		t.Fatal(err)
	}
	again()
}
