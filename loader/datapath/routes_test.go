package datapath

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeTable is a RouteTable that records each operation as a line of text.
type fakeTable struct {
	routes map[netip.Prefix]Route
	log    []string
}

func (f *fakeTable) List() ([]Route, error) {
	var out []Route
	for _, r := range f.routes {
		out = append(out, r)
	}
	return out, nil
}

func (f *fakeTable) Replace(r Route) error {
	f.log = append(f.log, "replace "+r.String())
	f.routes[r.Prefix] = r
	return nil
}

func (f *fakeTable) Delete(r Route) error {
	f.log = append(f.log, "delete "+r.String())
	delete(f.routes, r.Prefix)
	return nil
}

func TestSyncRoutesTranscript(t *testing.T) {
	p := netip.MustParsePrefix
	src := netip.MustParseAddr("10.10.1.1")
	f := &fakeTable{routes: map[netip.Prefix]Route{
		p("10.20.1.0/24"): {Prefix: p("10.20.1.0/24"), Ifindex: 7, Src: src},
		p("10.20.9.0/24"): {Prefix: p("10.20.9.0/24"), Ifindex: 7, Src: src},
		p("10.30.0.0/16"): {Prefix: p("10.30.0.0/16"), Ifindex: 7}, // no src yet
	}}
	desired := OverlayRoutes([]netip.Prefix{p("10.30.0.0/16"), p("10.20.1.0/24"), p("10.20.2.7/24"), p("fd00::/64")}, 7, src)
	res, err := SyncRoutes(f, desired)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"replace 10.20.2.0/24 dev#7 src 10.10.1.1 proto 201",
		"replace 10.30.0.0/16 dev#7 src 10.10.1.1 proto 201",
		"replace fd00::/64 dev#7 proto 201", // no source of another family
		"delete 10.20.9.0/24 dev#7 src 10.10.1.1 proto 201",
	}
	if diff := cmp.Diff(want, f.log); diff != "" {
		t.Fatalf("transcript (-want +got):\n%s", diff)
	}
	if res != (RouteResult{Replaced: 3, Deleted: 1}) {
		t.Fatalf("result = %+v", res)
	}
	f.log = nil
	if _, err := SyncRoutes(f, desired); err != nil || len(f.log) != 0 {
		t.Fatalf("second sync wrote %q (%v)", f.log, err)
	}
	// Without a tunnel address the routes carry no src.
	if r := OverlayRoutes([]netip.Prefix{p("10.20.1.0/24")}, 7, netip.Addr{}); r[0].Src.IsValid() {
		t.Fatalf("route without tunnel address has src %v", r[0].Src)
	}
}

func TestCheckBPFFSRejectsOtherFilesystems(t *testing.T) {
	err := CheckBPFFS(t.TempDir() + "/isthmus/pins")
	if !errors.Is(err, ErrNotBPFFS) {
		t.Fatalf("CheckBPFFS on a tmp dir = %v, want ErrNotBPFFS", err)
	}
}

func TestParseDecapMode(t *testing.T) {
	for _, s := range []string{"auto", "tc", "xdp"} {
		if m, err := ParseDecapMode(s); err != nil || string(m) != s {
			t.Errorf("ParseDecapMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := ParseDecapMode("skb"); err == nil {
		t.Error("ParseDecapMode(skb) must fail")
	}
	if TunnelMTU(1500, 0, 50) != 1450 || TunnelMTU(1500, 0, 110) != 1390 || TunnelMTU(1500, 1400, 110) != 1400 {
		t.Error("TunnelMTU: want underlay less the overhead unless the plan sets one")
	}
}
