package plan

import (
	"net/netip"
	"testing"

	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/testenv"
)

// TestRepliesEnterOnRoutedDeviceLabs runs the model of
// TestRepliesEnterOnRoutedDevice on every built-in lab scenario
// (testenv/scenarios) with its pods: another CNI's pods where the scenario
// places them, declared or not by their site's blocks. What fails here fails
// in that lab under strict rp_filter, found without building one.
func TestRepliesEnterOnRoutedDeviceLabs(t *testing.T) {
	for _, name := range testenv.Builtins() {
		t.Run(name, func(t *testing.T) {
			sc, err := testenv.LoadScenario(name)
			if err != nil {
				t.Fatal(err)
			}
			files, err := sc.ObjectFiles()
			if err != nil {
				t.Fatal(err)
			}
			set, _, err := objects.Load(files)
			if err != nil {
				t.Fatal(err)
			}
			pods := unmanagedPods{declared: map[string][]netip.Addr{}, undeclared: map[string][]netip.Addr{}}
			for _, p := range sc.Pods() {
				switch {
				case !p.Unmanaged:
				case inPrefixes(blockPrefixes(set.Site(p.Site)), p.Address):
					pods.declared[p.Node] = append(pods.declared[p.Node], p.Address)
				default:
					pods.undeclared[p.Node] = append(pods.undeclared[p.Node], p.Address)
				}
			}
			f, errs := newModel(set, pods)
			f.fabricRoutes = map[string]bool{}
			for _, st := range sc.Sites {
				f.fabricRoutes[st.Name] = st.FabricRoutes
			}
			if len(f.plans) == 0 || len(f.plans) != len(set.Nodes) {
				t.Fatalf("%d nodes, %d plans: %v", len(set.Nodes), len(f.plans), errs)
			}
			n, fails := f.check()
			for _, pf := range fails {
				t.Errorf("%s\n    (%s)", pf, f.class(pf))
			}
			t.Logf("%d plans, %d pairs walked both ways, %d failures", len(f.plans), n, len(fails))
		})
	}
}
