package maps

import (
	"testing"

	"github.com/isthmus-dev/isthmus/bpf"
)

// TestLayoutVersionCurrent fails when the object's map specs change without
// LayoutVersion changing: LayoutSpecHash is the hash of the layout that version
// names.
func TestLayoutVersionCurrent(t *testing.T) {
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	got, err := SpecHash(spec)
	if err != nil {
		t.Fatal(err)
	}
	if got != LayoutSpecHash {
		t.Errorf("the object's map specs hash to %s, LayoutSpecHash is %s: a map's key, value, type, size or flags changed. "+
			"Bump LayoutVersion (now %d), set LayoutSpecHash to the new hash, and add a converter in loader/datapath if a map that is not rewritten from the plan changed",
			got, LayoutSpecHash, LayoutVersion)
	}
}

// TestSpecHashSeesChanges: the hash moves when a map's size or value type changes.
func TestSpecHashSeesChanges(t *testing.T) {
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatal(err)
	}
	base, err := SpecHash(spec)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := SpecHash(spec.Copy())
	if again != base {
		t.Fatalf("hash not stable: %s then %s", base, again)
	}
	resized := spec.Copy()
	resized.Maps[string(MapNat)].MaxEntries++
	if h, _ := SpecHash(resized); h == base {
		t.Error("changing nat max_entries kept the hash")
	}
	retyped := spec.Copy()
	retyped.Maps[string(MapPeers)].Value = retyped.Maps[string(MapRoutes)].Value
	if h, _ := SpecHash(retyped); h == base {
		t.Error("changing the peers value type kept the hash")
	}
	missing := spec.Copy()
	delete(missing.Maps, string(MapNat))
	if _, err := SpecHash(missing); err == nil {
		t.Error("SpecHash of an object without nat: no error")
	}
}
