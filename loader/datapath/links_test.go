package datapath

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLinkPinRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "links"), 0o700); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		ifname string
		h      Hook
		file   string
	}{
		{"pod-a", HookPodIngress, "pod-a:pod_ingress"},
		{"eth0.100", HookUnderlayXDP, "eth0:100:underlay_xdp"},
		{"isthmus0", HookOverlayEgress, "isthmus0:overlay_egress"},
	}
	for _, c := range cases {
		p := LinkPin(dir, c.ifname, c.h)
		if filepath.Base(p) != c.file {
			t.Errorf("LinkPin(%s, %s) = %s, want %s", c.ifname, c.h, filepath.Base(p), c.file)
		}
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ListLinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(cases) {
		t.Fatalf("ListLinks = %+v", got)
	}
	for _, g := range got {
		found := false
		for _, c := range cases {
			if g.Ifname == c.ifname && g.Hook == c.h {
				found = true
			}
		}
		if !found {
			t.Errorf("ListLinks parsed %+v, which was never pinned", g)
		}
	}
}
