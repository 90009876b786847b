package ipamd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/loader/ipamd/ipamdtest"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// siteObjects is one Site and its node n1 (InternalIP 172.16.1.10); podCIDR
// empty means the node has none yet.
type siteObjects struct {
	blocks  string // the Site's cidrBlocks, a YAML list
	manage  bool
	podCIDR string
	mtu     int
}

func (o siteObjects) yaml() string {
	return ipamdtest.Objects(o.blocks, o.manage, o.mtu, o.podCIDR)
}

func load(t *testing.T, o siteObjects) *objects.Set {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "objects.yaml"), []byte(o.yaml()), 0o644); err != nil {
		t.Fatal(err)
	}
	set, _, err := objects.LoadDir(dir)
	if err != nil {
		t.Fatalf("load objects: %v", err)
	}
	return set
}

func TestVerify(t *testing.T) {
	good := siteObjects{blocks: "[10.10.0.0/16]", manage: true, podCIDR: "10.10.1.0/24"}
	for _, tc := range []struct {
		name   string
		objs   siteObjects
		node   string
		ranges string
		mtu    int
		reason string
	}{
		{name: "verified", objs: good, node: "n1", ranges: "[10.10.1.0/24]", mtu: 1450},
		{name: "site tunnelMTU wins", objs: siteObjects{blocks: "[10.10.0.0/16]", manage: true, podCIDR: "10.10.1.0/24", mtu: 1400},
			node: "n1", ranges: "[10.10.1.0/24]", mtu: 1400},
		{name: "no such node", objs: good, node: "n2", reason: `node "n2" is not in the API`},
		{name: "delayed podCIDR", objs: siteObjects{blocks: "[10.10.0.0/16]", manage: true}, node: "n1", reason: "has no podCIDR yet"},
		{name: "unmanaged site", objs: siteObjects{blocks: "[10.10.0.0/16]", podCIDR: "10.10.1.0/24"}, node: "n1", reason: "manageCniPlugin: false"},
		{name: "podCIDR outside the pools", objs: siteObjects{blocks: "[10.20.0.0/16]", manage: true, podCIDR: "10.10.1.0/24"},
			node: "n1", reason: "outside the podCidrAssignments"},
		{name: "podCIDR larger than the pool", objs: siteObjects{blocks: "[10.10.1.0/25]", manage: true, podCIDR: "10.10.1.0/24"},
			node: "n1", reason: "outside the podCidrAssignments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Verify(load(t, tc.objs), tc.node, 1500)
			if tc.reason != "" {
				if v.Ready() || !strings.Contains(v.Reason, tc.reason) {
					t.Fatalf("verdict %+v, want not ready because %q", v, tc.reason)
				}
				return
			}
			if !v.Ready() || fmt.Sprint(v.Ranges) != tc.ranges || v.MTU != tc.mtu {
				t.Fatalf("verdict %+v, want ranges %s MTU %d", v, tc.ranges, tc.mtu)
			}
		})
	}
}

// objectsBox is a Snapshot whose objects and failure a test changes.
type objectsBox struct {
	mu  sync.Mutex
	set *objects.Set
	err error
}

func (b *objectsBox) put(set *objects.Set, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.set, b.err = set, err
}

func (b *objectsBox) snapshot() (*objects.Set, []objects.Warning, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.set, nil, b.err
}

type started struct {
	srv    *Server
	client *ipam.Client
	stop   func()
	ready  *atomic.Int32 // OnReady calls
}

func startServer(t *testing.T, dir, sock string, box *objectsBox, links map[string]bool) started {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := new(atomic.Int32)
	srv, done, err := Start(ctx, Config{Node: "n1", Socket: sock, Store: ipam.Store{Dir: dir}, Snapshot: box.snapshot,
		OnReady: func(Verdict) { ready.Add(1) }, UnderlayMTU: 1500, VerifyInterval: time.Hour, LeakInterval: time.Hour, LeakGrace: time.Nanosecond,
		LinkExists: func(name string) bool { return links[name] }})
	if err != nil {
		cancel()
		t.Fatalf("start: %v", err)
	}
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}
	t.Cleanup(func() { cancel() })
	return started{srv, ipam.NewClient(sock), stop, ready}
}

func add(c *ipam.Client, id string) (ipam.AddResponse, error) {
	return c.Add(context.Background(), ipam.AddRequest{Attachment: ipam.Attachment{ContainerID: id, IfName: "eth0"},
		NetNS: "/nonexistent/" + id, HostIface: "pod-" + id})
}

// The server's life on one node: not ready until the podCIDR arrives and
// verifies, ready while it does, kept through an outage, not ready when a
// Site edit leaves the podCIDR outside the pools, reservations kept across a
// restart, and leaks collected.
func TestServerLifecycle(t *testing.T) {
	dir, sock := t.TempDir(), filepath.Join(t.TempDir(), "ipam.sock")
	box := &objectsBox{}
	box.put(load(t, siteObjects{blocks: "[10.10.0.0/16]", manage: true}), nil)
	s := startServer(t, dir, sock, box, map[string]bool{})
	ctx := context.Background()

	st, err := s.client.Status(ctx)
	if err != nil || st.Ready || !strings.Contains(st.Reason, "no podCIDR yet") {
		t.Fatalf("status before the podCIDR: %+v %v", st, err)
	}
	var e *ipam.Error
	if _, err := add(s.client, "a"); !errors.As(err, &e) || e.Code != ipam.CodeTryAgainLater {
		t.Fatalf("add before the podCIDR: %v, want a try-again-later error", err)
	}

	box.put(load(t, siteObjects{blocks: "[10.10.0.0/16]", manage: true, podCIDR: "10.10.1.0/24"}), nil)
	s.srv.Verify()
	if st, _ := s.client.Status(ctx); !st.Ready || st.MTU != 1450 {
		t.Fatalf("status after the podCIDR: %+v", st)
	}
	if n := s.ready.Load(); n != 1 {
		t.Fatalf("OnReady ran %d times after the first verification, want 1 (the conflist is written then)", n)
	}
	got, err := add(s.client, "a")
	if err != nil || fmt.Sprint(got.Addrs) != "[10.10.1.2/32]" || got.MTU != 1450 {
		t.Fatalf("add: %+v %v", got, err)
	}

	// API outage: the last verdict stays in force.
	box.put(nil, errors.New("connection refused"))
	s.srv.Verify()
	if _, err := add(s.client, "b"); err != nil {
		t.Fatalf("add during an outage: %v", err)
	}

	// A Site edit moves the pools away from the node's podCIDR.
	box.put(load(t, siteObjects{blocks: "[10.20.0.0/16]", manage: true, podCIDR: "10.10.1.0/24"}), nil)
	s.srv.Verify()
	st, _ = s.client.Status(ctx)
	if st.Ready || !strings.Contains(st.Reason, "outside the podCidrAssignments") {
		t.Fatalf("status after the Site edit: %+v", st)
	}
	if _, err := add(s.client, "c"); err == nil {
		t.Fatal("add after the Site edit succeeded")
	}
	// ... and the controller gives the node a podCIDR in the new pool.
	box.put(load(t, siteObjects{blocks: "[10.20.0.0/16]", manage: true, podCIDR: "10.20.5.0/24"}), nil)
	s.srv.Verify()
	got, err = add(s.client, "c")
	if err != nil || fmt.Sprint(got.Addrs) != "[10.20.5.2/32]" {
		t.Fatalf("add in the new pool: %+v %v", got, err)
	}
	if n := s.ready.Load(); n != 2 {
		t.Fatalf("OnReady ran %d times, want 2: once more when the new podCIDR verified", n)
	}
	st, _ = s.client.Status(ctx)
	if fmt.Sprint(st.Outside) != "[10.10.1.2 10.10.1.3]" {
		t.Fatalf("reservations outside the ranges: %v, want the two running pods of the old podCIDR", st.Outside)
	}

	// Restart: a second server on the same socket fails while the first lives.
	if _, _, err := Start(ctx, Config{Node: "n1", Socket: sock, Store: ipam.Store{Dir: dir}, Snapshot: box.snapshot}); err == nil {
		t.Fatal("a second server took the socket of a live one")
	}
	s.stop()
	s = startServer(t, dir, sock, box, map[string]bool{"pod-c": true})
	again, err := add(s.client, "c")
	if err != nil || fmt.Sprint(again.Addrs) != fmt.Sprint(got.Addrs) {
		t.Fatalf("add after restart: %+v %v, want the kept %v", again, err, got.Addrs)
	}

	// Leaks: a and b have neither netns nor host interface; c's host side exists.
	freed, err := s.srv.CollectLeaks()
	if err != nil || len(freed) != 2 {
		t.Fatalf("collect leaks: %v %v, want a and b", freed, err)
	}
	list, _ := ipam.Store{Dir: dir}.List()
	if len(list) != 1 || list[0].ContainerID != "c" {
		t.Fatalf("after leak collection: %v", list)
	}
	s.stop()
}
