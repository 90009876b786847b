package datapath

import (
	"os"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/isthmus-dev/isthmus/loader/metrics"
	"github.com/isthmus-dev/isthmus/maps"
)

// TestAttachTracer: the kfree_skb tracer is attached on the collection's own pinned
// redirect maps with its link pinned at TracerPin, outside links/ (which the pod
// sync prunes); attaching again (a restarted agent) replaces the link; Uninstall
// removes it.
func TestAttachTracer(t *testing.T) {
	dir := migrationEnv(t)
	inNewNetns(t, "trc0")
	dp, err := Load(dir, Options{NatEntries: 1024})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	defer dp.Close()
	if _, ok := dp.Collection.Programs[maps.ProgKfreeSkbTracer]; ok {
		t.Fatal("the tracer was loaded with the collection: it must load apart, so a kernel without BTF still gets the datapath")
	}
	if TracerAttached(dir) {
		t.Fatal("tracer attached before AttachTracer")
	}
	if err := dp.AttachTracer(); err != nil {
		t.Fatalf("attach tracer: %v", err)
	}
	if !TracerAttached(dir) {
		t.Fatal("no tracer link pinned after AttachTracer")
	}
	firstLink, prog := linkProg(t, TracerPin(dir))
	p, err := ebpf.NewProgramFromID(prog)
	if err != nil {
		t.Fatalf("open tracer program: %v", err)
	}
	info, err := p.Info()
	p.Close()
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := info.MapIDs()
	for _, n := range []maps.Name{maps.MapRedirectLast, maps.MapRedirectDrops} {
		if id := pinnedMapID(t, dir, n); !slices.Contains(ids, id) {
			t.Errorf("tracer uses maps %v, not the pinned %s (%d)", ids, n, id)
		}
	}
	if drops, attached, err := (metrics.Pinned{Dir: dir}).RedirectDrops(); err != nil || !attached || len(drops) != 0 {
		t.Errorf("metrics read %v, attached %v, err %v; want no drops yet, attached", drops, attached, err)
	}
	if pins, err := ListLinks(dir); err != nil || len(pins) != 0 {
		t.Errorf("links/ holds %v (%v); the tracer's pin must stay out of it", pins, err)
	}

	if err := dp.AttachTracer(); err != nil {
		t.Fatalf("attach tracer again: %v", err)
	}
	if again, _ := linkProg(t, TracerPin(dir)); again == firstLink {
		t.Errorf("second AttachTracer kept link %d; want a new link replacing it", again)
	}

	if err := Uninstall(dir); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	if _, err := os.Stat(TracerPin(dir)); !os.IsNotExist(err) {
		t.Errorf("tracer pin still there after Uninstall: %v", err)
	}
	if _, attached, _ := (metrics.Pinned{Dir: dir}).RedirectDrops(); attached {
		t.Error("metrics say the tracer is attached after Uninstall")
	}
}
