package kube_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/loader/ipamd"
)

// TestIPAMVerifiesAgainstAPI: the agent's IPAM server on the Kubernetes
// source, with a real kube-apiserver and the real controller (seed 001). The
// node's podCIDR arrives late (the controller assigns it): until then STATUS
// is not ready and ADD is refused; then addresses come from it; through an API
// server outage allocation goes on from the verified range; a Site edit that
// moves the pools away from the podCIDR stops allocation and says why.
func TestIPAMVerifiesAgainstAPI(t *testing.T) {
	s := startWithCRDs(t)
	cs := clientset(t, s)
	createSite(t, s, "site-a", managedSite)
	src := startSource(t, s)
	createNode(t, cs, "a1", "172.16.1.11")

	ctx, cancel := context.WithCancel(context.Background())
	sock := filepath.Join(t.TempDir(), "ipam.sock")
	_, done, err := ipamd.Start(ctx, ipamd.Config{Node: "a1", Socket: sock, Store: ipam.Store{Dir: t.TempDir()},
		Snapshot: src.Snapshot, UnderlayMTU: 1500, VerifyInterval: 100 * time.Millisecond, Log: testLogger(t, "ipam")})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ipam server: %v", err)
		}
	})
	c := ipam.NewClient(sock)
	status := func(ready bool, reason string) func() error {
		return func() error {
			st, err := c.Status(context.Background())
			if err != nil {
				return err
			}
			if st.Ready != ready || !strings.Contains(st.Reason, reason) {
				return fmt.Errorf("status %+v, want ready %v, reason containing %q", st, ready, reason)
			}
			return nil
		}
	}
	add := func(id string) (ipam.AddResponse, error) {
		return c.Add(context.Background(), ipam.AddRequest{Attachment: ipam.Attachment{ContainerID: id, IfName: "eth0"}})
	}

	eventually(t, 30*time.Second, "not ready while a1 has no podCIDR", status(false, "no podCIDR yet"))
	if _, err := add("early"); err == nil {
		t.Fatal("ADD succeeded before the podCIDR verified")
	}

	runController(t, s)
	eventually(t, 30*time.Second, "ready once the controller assigned a1's podCIDR", status(true, ""))
	podCIDR := netip.MustParsePrefix(getNode(t, cs, "a1").Spec.PodCIDR)
	got, err := add("p1")
	if err != nil || len(got.Addrs) != 1 || !podCIDR.Contains(got.Addrs[0].Addr()) {
		t.Fatalf("ADD: %+v %v, want an address of %s", got, err, podCIDR)
	}

	if err := s.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // many verifications against the cache
	if got, err := add("p2"); err != nil || !podCIDR.Contains(got.Addrs[0].Addr()) {
		t.Fatalf("ADD during the API outage: %+v %v", got, err)
	}
	if err := status(true, "")(); err != nil {
		t.Fatalf("during the outage: %v", err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer scancel()
	if err := s.StartAPIServer(sctx); err != nil {
		t.Fatal(err)
	}

	editSite(t, s, "site-a", `{"spec":{"podCidrAssignments":[{"cidrBlocks":["10.250.0.0/16"],"nodeBlockSizes":{"ipv4":24}}]}}`)
	eventually(t, 60*time.Second, "not ready after the Site edit", status(false, "outside the podCidrAssignments"))
	var e *ipam.Error
	if _, err := add("p3"); !errors.As(err, &e) || e.Code != ipam.CodeTryAgainLater {
		t.Fatalf("ADD after the Site edit: %v, want try again later", err)
	}
}
